# One thread spinning in pure Python (holds the GIL), one hashing a large buffer in C, which
# releases the GIL for the whole digest (hashlib does so for inputs over 2 KiB).
# With argv[1] = SECONDS the spinning thread stops after that long, prints `spin_cpu CPU` (its
# own CPU time, time.thread_time) and the program exits; without, both run until killed.
import hashlib
import sys
import threading
import time

DATA = b"x" * (32 << 20)
SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else None
report = {}


def spin_python():
    deadline = time.monotonic() + SECONDS if SECONDS else float("inf")
    n = 0
    while time.monotonic() < deadline:
        n = (n * 31 + 7) % 1000003
    report["spin_cpu"] = time.thread_time()


def spin_hash():
    while True: hashlib.sha256(DATA).digest()


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
    return ids["tid"], thread


python_tid, python_thread = start(spin_python)
hash_tid, _ = start(spin_hash)
print(f"python {python_tid}", flush=True)
print(f"hash {hash_tid}", flush=True)
print("ready", flush=True)
python_thread.join()
print(f"spin_cpu {report['spin_cpu']:.3f}", flush=True)
