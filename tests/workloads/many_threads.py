# N threads (argv[1], default 32), each burning CPU in its own function `worker_<i>`;
# prints "thread <i> <native id>" for each, then "ready".
import sys
import threading


def spin():
    n = 0
    while True: n = (n * 31 + 7) % 1000003  # LINE:spin


def make_worker(i):
    # A distinct code object per thread, so every thread has its own stack.
    code = spin.__code__.replace(co_name=f"worker_{i}", co_qualname=f"worker_{i}")
    return type(spin)(code, globals(), f"worker_{i}")


count = int(sys.argv[1]) if len(sys.argv) > 1 else 32
started = threading.Barrier(count + 1)
tids = {}


def run(i):
    tids[i] = threading.get_native_id()
    started.wait()
    make_worker(i)()


for i in range(count):
    threading.Thread(target=run, args=(i,), name=f"w{i}", daemon=True).start()
started.wait()
for i in range(count):
    print(f"thread {i} {tids[i]}", flush=True)
print("ready", flush=True)
threading.Event().wait()
