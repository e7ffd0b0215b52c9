# Two threads burning CPU in different functions; prints each thread's native id and its
# `threading` name (the default one, `Thread-N (run)`).
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

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait()
    return ids["tid"], thread.name


alpha, alpha_name = start(spin_alpha)
beta, beta_name = start(spin_beta)
print(f"alpha {alpha}", flush=True)
print(f"beta {beta}", flush=True)
print(f"alpha_name {alpha_name}", flush=True)
print(f"beta_name {beta_name}", flush=True)
print("ready", flush=True)
threading.Event().wait()
