# Burns CPU in `before_exec` for argv[1] seconds, then replaces itself (os.execv, same pid) with
# this script in its second role, which burns CPU in `after_exec` until killed.
import os
import sys
import time


def spin(until):
    n = 0
    while time.time() < until:
        n = (n * 31 + 7) % 1000003


def before_exec(seconds):
    spin(time.time() + seconds)


def after_exec():
    spin(float("inf"))


if sys.argv[1:2] == ["after"]:
    after_exec()
else:
    print("ready", flush=True)
    before_exec(float(sys.argv[1]))
    os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), "after"])
