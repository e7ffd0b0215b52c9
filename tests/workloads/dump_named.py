# One busy thread and three sleeping ones, all named through `threading` only (no prctl), for
# `pyebpf dump`: before 3.14 the OS calls every thread of the program `python3.X`; the names
# must come from `threading`. The names are longer than the 15 bytes an OS name holds.
#   busy-cruncher-thread   burns CPU in crunch()
#   sleeping-in-time-sleep  sleeps in doze()
#   waiting-on-an-event     blocks in wait_event()
#   blocked-on-a-lock       blocks in hold_lock()
# The main thread (MainThread) waits in main().
import threading
import time


def crunch():
    x = 0
    while True:  # LINE:crunch_loop
        x = (x * 31 + 7) % 1000003  # LINE:crunch


def doze():
    while True:
        time.sleep(30)  # LINE:doze


def wait_event(event):
    event.wait()  # LINE:wait_event


def hold_lock(lock):
    lock.acquire()  # LINE:hold_lock


def start(name, target, *args):
    ready = threading.Event()
    ids = {}

    def run():
        ids["tid"] = threading.get_native_id()
        ready.set()
        target(*args)

    threading.Thread(target=run, name=name, daemon=True).start()
    ready.wait()
    print(f"{name} {ids['tid']}", flush=True)


def main():
    lock = threading.Lock()
    lock.acquire()
    start("busy-cruncher-thread", crunch)
    start("sleeping-in-time-sleep", doze)
    start("waiting-on-an-event", wait_event, threading.Event())
    start("blocked-on-a-lock", hold_lock, lock)
    print(f"MainThread {threading.get_native_id()}", flush=True)
    print("ready", flush=True)
    while True:
        time.sleep(3600)  # LINE:main


main()
