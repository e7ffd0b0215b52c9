# One thread spinning in pure Python (holds the GIL), one hashing a large buffer in C, which
# releases the GIL for the whole digest (hashlib does so for inputs over 2 KiB).
import hashlib
import threading

DATA = b"x" * (32 << 20)


def spin_python():
    n = 0
    while True: n = (n * 31 + 7) % 1000003


def spin_hash():
    while True: hashlib.sha256(DATA).digest()


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


python_tid = start(spin_python)
hash_tid = start(spin_hash)
print(f"python {python_tid}", flush=True)
print(f"hash {hash_tid}", flush=True)
print("ready", flush=True)
threading.Event().wait()
