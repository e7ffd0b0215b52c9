# Started after a recording began: burns CPU in `first_second` until 0.8 s after argv[1] (the
# wall-clock time the test launched the process, so interpreter start-up counts), then in
# `afterwards` until 2.5 s after it.
import sys
import time

launched = float(sys.argv[1])


def spin(until):
    n = 0
    while time.time() < until:
        n = (n * 31 + 7) % 1000003


def first_second(until):
    spin(until)


def afterwards(until):
    spin(until)


first_second(launched + 0.8)
print("ready", flush=True)
afterwards(launched + 2.5)
