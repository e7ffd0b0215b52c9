# Four threads, each in its own pair of functions, all busy at once; on a free-threaded build
# they run truly in parallel. Each thread's stack changes millions of times a second (its
# work_N calls its step_N in a loop). Prints `tN TID` for each thread, then `ready`.
# With argv[1] = SECONDS the threads stop once each has had that much CPU time (or after a
# minute: a shared machine may starve them), `cpuN SECONDS` gives each one's own CPU time
# (time.thread_time) and the program exits; without, they run until killed.
import sys
import threading
import time

CPU_SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else None
WALL_LIMIT = 60.0
running = True


def step_0(n): return (n * 31 + 7) % 1000003  # LINE:step_0
def work_0():
    n = 0
    while running: n = step_0(n)  # LINE:work_0


def step_1(n): return (n * 17 + 3) % 1000033  # LINE:step_1
def work_1():
    n = 1
    while running: n = step_1(n)  # LINE:work_1


def step_2(n): return (n * 13 + 5) % 1000037  # LINE:step_2
def work_2():
    n = 2
    while running: n = step_2(n)  # LINE:work_2


def step_3(n): return (n * 11 + 1) % 1000039  # LINE:step_3
def work_3():
    n = 3
    while running: n = step_3(n)  # LINE:work_3


cpu = {}


def start(i, target):
    ready = threading.Event()
    ids = {}

    def run():
        ids["tid"] = threading.get_native_id()
        ready.set()
        target()
        cpu[i] = time.thread_time()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait()
    return ids["tid"], thread


started = [start(i, work) for i, work in enumerate((work_0, work_1, work_2, work_3))]
for i, (tid, _) in enumerate(started):
    print(f"t{i} {tid}", flush=True)
print("ready", flush=True)
if CPU_SECONDS is None:
    threading.Event().wait()
clocks = [time.pthread_getcpuclockid(thread.ident) for _, thread in started]
give_up = time.monotonic() + WALL_LIMIT
while time.monotonic() < give_up:
    if all(time.clock_gettime(c) >= CPU_SECONDS for c in clocks):
        break
    time.sleep(0.05)
running = False
for _, thread in started:
    thread.join()
for i in range(4):
    print(f"cpu{i} {cpu[i]:.3f}", flush=True)
