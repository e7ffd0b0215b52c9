# Two threads burning CPU in different functions; prints each thread's native id.
import threading


def spin_alpha():
    n = 0
    while True: n = (n * 31 + 7) % 1000003


def spin_beta():
    n = 0
    while True: n = (n * 17 + 3) % 1000003


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


alpha = start(spin_alpha)
beta = start(spin_beta)
print(f"alpha {alpha}", flush=True)
print(f"beta {beta}", flush=True)
print("ready", flush=True)
threading.Event().wait()
