# One thread burning CPU, one sleeping inside a named function; prints each thread's native id.
import threading
import time


def busy_loop():
    n = 0
    while True: n = (n * 31 + 7) % 1000003


def sleepy_wait():
    while True:
        time.sleep(3600)  # LINE:sleep


def start(target):
    ready = threading.Event()
    ids = {}

    def run():
        ids["tid"] = threading.get_native_id()
        ready.set()
        target()

    threading.Thread(target=run, daemon=True).start()
    ready.wait()
    return ids["tid"]


busy = start(busy_loop)
sleepy = start(sleepy_wait)
print(f"busy {busy}", flush=True)
print(f"sleepy {sleepy}", flush=True)
print("ready", flush=True)
threading.Event().wait()
