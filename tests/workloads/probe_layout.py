"""Dumps raw memory of this interpreter for tests/tests/layouts.rs.

Usage: python probe_layout.py READ_SIZE

The probe knows no CPython layout. It finds addresses only through the C API
(PyThreadState_Get, PyInterpreterState_Head/Next/ThreadHead, PyThreadState_Next, the
_PyRuntime symbol), id() of objects, and one assumption it shares with no layout under test:
PyFrameObject begins {PyObject_HEAD; f_back; f_frame}, so f_frame (the frame's
_PyInterpreterFrame) is the word after f_back: at 24 with the GIL, at 40 in a free-threaded
build, whose object header is larger (object.__basicsize__ is sizeof(PyObject) in both). The
Rust test cross-checks that word against
the frame it reaches from the thread state through the layout.

Memory is copied with write(2) into a pipe, so an unreadable address yields EFAULT instead of
a crash, and no /proc is needed (the sid interpreters run in a chroot without one).
Where the layout is unknown, "chasing" dumps a few bytes at every pointer-like word of a
region; that is how C-stack structures (3.11/3.12 _PyCFrame, entry frames) and stack chunks
get into the dump without the probe knowing where they are.

Prints one JSON object on stdout.
"""

import ctypes
import json
import os
import sys
import threading
import time

READ_SIZE = int(sys.argv[1])
RECURSION = 300  # deep enough that the frames span more than one 16 KiB stack chunk

api = ctypes.pythonapi
for _name, _args in [
    ("PyThreadState_Get", []),
    ("PyInterpreterState_Get", []),
    ("PyInterpreterState_Main", []),
    ("PyInterpreterState_Head", []),
    ("PyInterpreterState_Next", [ctypes.c_void_p]),
    ("PyInterpreterState_ThreadHead", [ctypes.c_void_p]),
    ("PyThreadState_Next", [ctypes.c_void_p]),
]:
    _fn = getattr(api, _name)
    _fn.restype = ctypes.c_void_p
    _fn.argtypes = _args

libc = ctypes.CDLL(None, use_errno=True)
WRITE = libc.write
WRITE.restype = ctypes.c_ssize_t
WRITE.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
PIPE_R, PIPE_W = os.pipe()
# The same write(2) through PyDLL: ctypes keeps the GIL across the call, so what it copies
# shows the GIL held by this thread (CDLL functions release it around the call).
WRITE_HOLDING_GIL = ctypes.PyDLL(None).write
WRITE_HOLDING_GIL.restype = ctypes.c_ssize_t
WRITE_HOLDING_GIL.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]

RUNTIME = ctypes.addressof(ctypes.c_char.in_dll(api, "_PyRuntime"))
F_FRAME = object.__basicsize__ + 8  # PyObject_HEAD, f_back

# (addr, bytes, phase) in dump order. Phases: "snapshot" (copied inline in probe_here: the
# thread state and its current frame at one instant), "stack" (while probe_here runs, so the
# whole frame chain is live), "late" (everything else; long-lived objects only). The reader
# takes frame data from the first two, and prefers later dumps: memory freed and reused since
# an earlier dump must not answer.
REGIONS = []
SEEN = set()
PHASE = "late"


def drain(n):
    """Collects what the last WRITE put into the pipe (n = its return value)."""
    if n <= 0:
        return b""
    out = b""
    while len(out) < n:
        out += os.read(PIPE_R, n - len(out))
    return out


def record(addr, data, phase=None):
    phase = phase or PHASE
    if data and (addr, data, phase) not in SEEN:  # same bytes again add nothing
        SEEN.add((addr, data, phase))
        REGIONS.append((addr, data, phase))


def dump(addr, size, write=WRITE):
    """Copies [addr, addr+size) (or its readable prefix) into the dump; returns the bytes."""
    if not addr or addr < 4096:
        return b""
    data = drain(write(PIPE_W, addr, size))
    record(addr, data)
    return data


def dump_gil_states(interps):
    """The runtime and interpreter states twice: copied while this thread holds the GIL
    (phase "gil_held") and while nobody does (phase "gil_released": CDLL's write drops the GIL
    and the worker thread is blocked, not waiting for it). The GIL state lives in one of them
    (3.11: _PyRuntime; 3.12+: an interpreter state) in every GIL build."""
    global PHASE
    for phase, write in (("gil_held", WRITE_HOLDING_GIL), ("gil_released", WRITE)):
        PHASE = phase
        dump(RUNTIME, max(4096, READ_SIZE), write)
        for interp in interps:
            dump(interp, 16384, write)
    PHASE = "late"


def words(data, limit=None):
    data = data[: limit if limit is not None else len(data)]
    return [int.from_bytes(data[i : i + 8], "little") for i in range(0, len(data) - 7, 8)]


def pointer_like(p, aligned=True):
    return p >= 4096 and (p % 8 == 0 or not aligned) and p < (1 << 47)


def chase(data, size, limit=None, aligned=True):
    """Dumps `size` bytes at every pointer-like word of `data` (first `limit` bytes)."""
    out = []
    for p in words(data, limit):
        if pointer_like(p, aligned):
            got = dump(p, size)
            if got:
                out.append(got)
    return out


def u64(addr):
    return int.from_bytes(ctypes.string_at(addr, 8), "little")


STATE = {}


def probe_here():
    """The frame the test finds through the thread state: snapshots are taken inline."""
    me = sys._getframe()
    iframe = u64(id(me) + F_FRAME)
    tstate = STATE["tstate"]
    # One line: both copies happen while this frame executes this line's CALLs, and the
    # cframe / entry-frame words are chased right after, still inside this frame.
    n_ts = WRITE(PIPE_W, tstate, 1024); ts = drain(n_ts); n_fr = WRITE(PIPE_W, iframe, 128); fr = drain(n_fr); line = sys._getframe().f_lineno  # noqa: E702
    chased = []
    for p in words(ts):
        if pointer_like(p):
            n = WRITE(PIPE_W, p, 128)
            chased.append((p, drain(n)))
    # Recorded last so they win (the reader prefers later dumps): a chased copy of this frame
    # (3.13+ tstates point at it) was taken a line later.
    for p, data in chased:
        record(p, data, "snapshot")
    record(tstate, ts, "snapshot")
    record(iframe, fr, "snapshot")
    global PHASE
    PHASE = "stack"
    # Second level, headers only: the previous stack chunk, the outer _PyCFrame.
    for _, data in chased:
        chase(data, 64, limit=24)
    STATE["snapshot_line"] = line
    STATE["frames"] = describe_frames(me)
    PHASE = "late"


def describe_frames(top):
    frames = []
    f = top
    while f is not None:
        code = f.f_code
        iframe = u64(id(f) + F_FRAME)
        frames.append(
            {
                "pyframe": id(f),
                "iframe": iframe,
                "code": id(code),
                "lineno": f.f_lineno,
                "generator": code.co_flags & 0x20 != 0,  # CO_GENERATOR
            }
        )
        describe_code(code)
        f = f.f_back
    # Frame headers: 128 bytes each; the frames near the shims and the bottom ones are chased
    # (entry frames, a 3.15 base frame) since Python cannot see those.
    for i, fr in enumerate(frames):
        head = dump(fr["iframe"], 128)
        bottom = i >= len(frames) - 3
        if i < 8 or bottom:
            for data in chase(head[:96], 128):
                if bottom:
                    chase(data[:96], 128)
    return frames


CODES = {}


def describe_string(s):
    dump(id(s), sys.getsizeof(s) + 8)
    return {"addr": id(s), "text": s}


STRINGS = []


def describe_code(code):
    if id(code) in CODES:
        return
    dump(id(code), max(512, sys.getsizeof(code)) + len(code.co_code))
    for s in (code.co_filename, code.co_name, code.co_qualname):
        STRINGS.append(describe_string(s))
    lt = code.co_linetable
    dump(id(lt), sys.getsizeof(lt))
    CODES[id(code)] = {
        "filename": code.co_filename,
        "filename_addr": id(code.co_filename),
        "name": code.co_name,
        "name_addr": id(code.co_name),
        "qualname": code.co_qualname,
        "qualname_addr": id(code.co_qualname),
        "firstlineno": code.co_firstlineno,
        "linetable": lt.hex(),
        "linetable_addr": id(lt),
        "co_code": code.co_code.hex(),
        "co_code_len": len(code.co_code),
        "nlocalsplus": len(code.co_varnames) + len(code.co_cellvars) + len(code.co_freevars),
        "stacksize": code.co_stacksize,
    }


def gen_π():
    probe_here()
    yield 1


class Probe:
    def keyfunc(self, x):
        # next() is C: the generator runs in a nested eval loop (an entry frame below it).
        return next(gen_π())


def recurse(n):
    if n == 0:
        # sorted() is C: keyfunc runs in a nested eval loop.
        return sorted([1], key=Probe().keyfunc)
    return recurse(n - 1)


def make_dead_frame():
    return sys._getframe()  # returned frame outlives its call: owned by the frame object


def worker_main(ready, stop, info):
    info["tstate"] = api.PyThreadState_Get()
    info["native_id"] = threading.get_native_id()
    info["ident"] = threading.get_ident()
    ready.set()
    stop.wait()


def new_subinterpreter():
    for name in ("_interpreters", "_xxsubinterpreters"):
        try:
            mod = __import__(name)
        except ImportError:
            continue
        return mod, mod.create()
    return None, None


def run_probe():
    ready, stop, worker = threading.Event(), threading.Event(), {}
    thread = threading.Thread(target=worker_main, args=(ready, stop, worker))
    thread.start()
    ready.wait()
    sub_mod, sub_id = new_subinterpreter()

    STATE["tstate"] = api.PyThreadState_Get()
    dump(RUNTIME, max(4096, READ_SIZE))
    recurse(RECURSION)

    interps = []
    threads = {}
    interp = api.PyInterpreterState_Head()
    while interp and len(interps) < 16:
        interps.append(interp)
        dump(interp, 16384)
        tlist = []
        t = api.PyInterpreterState_ThreadHead(interp)
        while t and len(tlist) < 64:
            tlist.append(t)
            dump(t, 1024)
            t = api.PyThreadState_Next(t)
        threads[str(interp)] = tlist
        interp = api.PyInterpreterState_Next(interp)

    # Let the worker settle in stop.wait() (blocked, not asking for the GIL).
    time.sleep(0.1)
    dump_gil_states(interps)

    dead = make_dead_frame()
    dead_iframe = u64(id(dead) + F_FRAME)
    dump(dead_iframe, 128)
    describe_code(dead.f_code)

    for text in ("plain ascii", "café", "gen_π", "🐍 snake"):
        STRINGS.append(describe_string(text))
    types = {}
    for name, obj in (("code", dead.f_code), ("str", "x"), ("bytes", b"x")):
        t = type(obj)
        head = dump(id(t), 512)
        chase(head[:64], 64, aligned=False)  # tp_name: a C string, any alignment
        types[name] = {"object": id(obj), "type": id(t)}
        dump(id(obj), 64)

    stop.set()
    thread.join()
    out = {
        "hexversion": sys.hexversion,
        # Free-threaded builds (3.13+) say whether their GIL is on; others always have one.
        "gil_enabled": getattr(sys, "_is_gil_enabled", lambda: True)(),
        "version": list(sys.version_info[:3]),
        "runtime": RUNTIME,
        "none": id(None),
        "interp": api.PyInterpreterState_Get(),
        "main_interp": api.PyInterpreterState_Main(),
        "subinterpreter": sub_mod is not None,
        "interps": interps,
        "threads": threads,
        "tstate": STATE["tstate"],
        "native_id": threading.get_native_id(),
        "ident": threading.get_ident(),
        "worker": worker,
        "snapshot_line": STATE["snapshot_line"],
        "frames": STATE["frames"],
        "dead_frame": {"iframe": dead_iframe, "code": id(dead.f_code)},
        "codes": {str(k): v for k, v in CODES.items()},
        "strings": STRINGS,
        "types": types,
        "regions": [{"addr": a, "hex": d.hex(), "phase": ph} for a, d, ph in REGIONS],
    }
    if sub_mod is not None:
        sub_mod.destroy(sub_id)
    return out


print(json.dumps(run_probe()))
