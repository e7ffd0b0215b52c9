# Two call chains that alternate every ~2 ms so their frames land at the same addresses:
#   chain_a -> branch_x -> [rec x DEPTH] -> leaf_x   and   chain_b -> branch_y -> [rec x DEPTH] -> leaf_y
# DEPTH = argv[1] (default 0: shallow chains the kernel records whole; use > 128 to exercise
# userspace completion, where the deep part must never be spliced from the other chain). Each
# chain has its own leaf (in the part the kernel records) and its own root-side frames (in
# the part completion adds), so a tail spliced from the other chain shows as a mismatch.
import sys
import time

sys.setrecursionlimit(100000)
DEPTH = int(sys.argv[1]) if len(sys.argv) > 1 else 0
SLICE = 0.002


def leaf_x(until):
    n = 0
    while time.perf_counter() < until:
        n = (n * 31 + 7) % 1000003


def leaf_y(until):
    n = 0
    while time.perf_counter() < until:
        n = (n * 17 + 3) % 1000003


def rec(depth, until, leaf):
    if depth == 0:
        return leaf(until)
    return rec(depth - 1, until, leaf)


def branch_x(until):
    return rec(DEPTH, until, leaf_x)


def branch_y(until):
    return rec(DEPTH, until, leaf_y)


def chain_a():
    branch_x(time.perf_counter() + SLICE)


def chain_b():
    branch_y(time.perf_counter() + SLICE)


print("ready", flush=True)
while True:
    chain_a()
    chain_b()
