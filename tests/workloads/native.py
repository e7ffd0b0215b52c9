# C code under Python frames, for `--native`: zlib compressing, hashlib hashing, and libc's
# qsort calling back into Python through ctypes (and, when asked, pure Python spinning). One
# thread each, so every stack has one of them at its leaf. Markers name the lines the tests expect under the native frames.
import ctypes
import ctypes.util
import hashlib
import os
import sys
import threading
import zlib

DATA = os.urandom(1 << 20) + b"x" * (3 << 20)
libc = ctypes.CDLL(ctypes.util.find_library("c"))
CMP = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))


def compress_it():
    while True:
        zlib.compress(DATA, 6)  # LINE:compress


def hash_it():
    while True:
        hashlib.sha256(DATA).digest()  # LINE:hash


def py_compare(a, b):
    return a[0] - b[0]  # LINE:compare


def sort_it():
    compare = CMP(py_compare)
    values = list(range(2000, 0, -1))
    array = (ctypes.c_int * len(values))()
    while True:
        array[:] = values
        libc.qsort(array, len(array), ctypes.sizeof(ctypes.c_int), compare)  # LINE:qsort


def spin_it():
    n = 0
    while True:
        n = (n * 31 + 7) % 1000003  # LINE:spin


which = sys.argv[1:] or ["compress", "hash", "sort"]
targets = {"compress": compress_it, "hash": hash_it, "sort": sort_it, "spin": spin_it}
for name in which:
    threading.Thread(target=targets[name], daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
