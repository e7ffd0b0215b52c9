# Started after a recording began: burns CPU in `first_second` until 0.8 s after argv[1] (the
# wall-clock time the test launched the process, so interpreter start-up counts), then in
# `afterwards` until 2.5 s after it. Both times are multiplied by argv[2] if given (the
# tests' slowdown factor on an emulated machine). `first_second` runs at least 0.3 s (scaled)
# all the same: where start-up alone eats the window (seen under emulation, once in several
# runs), the test still measures how soon pyebpf picked the process up, not start-up speed.
import sys
import time

launched = float(sys.argv[1])
scale = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0


def spin(until):
    n = 0
    while time.time() < until:
        n = (n * 31 + 7) % 1000003


def first_second(until):
    spin(until)


def afterwards(until):
    spin(until)


first_second(max(launched + 0.8 * scale, time.time() + 0.3 * scale))
print("ready", flush=True)
afterwards(launched + 2.5 * scale)
