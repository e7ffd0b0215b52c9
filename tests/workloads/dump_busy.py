# CPU-bound, for `pyebpf dump` of a busy process: the main thread recurses 5 to 40 deep,
# alternating red -> green -> blue -> red ..., ends in a short leaf and returns, over and over:
# its stack changes depth and functions tens of thousands of times a second, never sleeping.
# Every line a frame can be on is marked (`LINE:<function>_<what>`). Progress: an 8-byte
# counter in a file (argv[1]) mapped into memory, updated with no system call, so a dump that
# paused the process would show as a counter standing still.
import mmap
import sys

PATH = sys.argv[1]
with open(PATH, "wb") as f:
    f.write(bytes(8))
progress_file = open(PATH, "r+b")
progress = mmap.mmap(progress_file.fileno(), 8)


def leaf(k):  # LINE:leaf_def
    x = 0  # LINE:leaf_init
    for i in range(k):  # LINE:leaf_loop
        x += i * i  # LINE:leaf_add
    return x  # LINE:leaf_return


def red(n, k):  # LINE:red_def
    if n <= 0:  # LINE:red_if
        return leaf(k)  # LINE:red_leaf
    return green(n - 1, k)  # LINE:red_call


def green(n, k):  # LINE:green_def
    if n <= 0:  # LINE:green_if
        return leaf(k)  # LINE:green_leaf
    return blue(n - 1, k)  # LINE:green_call


def blue(n, k):  # LINE:blue_def
    if n <= 0:  # LINE:blue_if
        return leaf(k)  # LINE:blue_leaf
    return red(n - 1, k)  # LINE:blue_call


print("ready", flush=True)
count = 0  # LINE:module_count0
while True:  # LINE:module_loop
    red(5 + (count * 7) % 36, 8 + count % 5)  # LINE:module_call
    count += 1  # LINE:module_count
    if count % 64 == 0:  # LINE:module_every
        progress[:8] = count.to_bytes(8, "little")  # LINE:module_progress
