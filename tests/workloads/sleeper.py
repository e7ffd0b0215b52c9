# Sleeps until killed, after printing what `pyebpf check` should report about this interpreter,
# found the interpreter's own way: its version, and the address the dynamic linker gives its
# `_PyRuntime` (the test finds the file mapped there: the executable of a static build,
# libpython of a shared one). Needs no /proc, so it runs in a bare chroot too.
import ctypes
import platform
import time

runtime = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
print("version", platform.python_version(), flush=True)
print("runtime", hex(runtime), flush=True)
print("ready", flush=True)
while True:
    time.sleep(3600)
