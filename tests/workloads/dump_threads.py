# Three named threads in known places, for `pyebpf dump`:
#   spinner  burns CPU in spin(rounds, label) (always on a CPU);
#   sleeper  sleeps in nap(seconds) with known locals of every shown type;
#   waiter   blocks on an Event in wait_here(event).
# The main thread sleeps in main(). A heartbeat thread notes the longest gap between its beats
# in a file (argv[1]): a dump that paused the process would show as a long gap.
import ctypes
import os
import sys
import threading
import time

libc = ctypes.CDLL(None)


def name_thread(name):
    # CPython 3.14+ names OS threads after threading.Thread.name; older ones do not.
    libc.prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME


def spin(rounds, label):
    count = 0
    while True:  # LINE:spin_loop
        count = (count * 31 + rounds) % 1000003  # LINE:spin


def nap(seconds):
    name = "sleeper"
    data = b"\x00ab'"
    ratio = 0.25
    flag = True
    nothing = None
    big = 2**70
    neg = -12345
    items = [1, 2]
    while True:
        time.sleep(seconds)  # LINE:nap


def wait_here(event):
    event.wait()  # LINE:wait


def heartbeat(path):
    last = time.monotonic()
    worst = 0.0
    beats = 0
    while True:
        time.sleep(0.01)
        now = time.monotonic()
        worst = max(worst, now - last)
        last = now
        beats += 1
        if beats % 10 == 0:
            # Replaced whole, so that a reader never sees the file empty mid-write.
            with open(path + ".tmp", "w") as f:
                f.write(f"{beats} {worst:.4f}\n")
            os.replace(path + ".tmp", path)


def start(name, target, *args):
    ready = threading.Event()
    ids = {}

    def run():
        name_thread(name)
        ids["tid"] = threading.get_native_id()
        ready.set()
        target(*args)

    threading.Thread(target=run, name=name, daemon=True).start()
    ready.wait()
    return ids["tid"]


def main():
    tids = {
        "spinner": start("spinner", spin, 7, "spin-label"),
        "sleeper": start("sleeper", nap, 30.5),
        "waiter": start("waiter", wait_here, threading.Event()),
    }
    start("heartbeat", heartbeat, sys.argv[1])
    for name, tid in tids.items():
        print(f"{name} {tid}", flush=True)
    print(f"main {threading.get_native_id()}", flush=True)
    print("ready", flush=True)
    while True:
        time.sleep(3600)  # LINE:main


main()
