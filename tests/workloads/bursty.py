# A mostly idle interpreter: every `period` seconds (argv[1], default 0.2) it burns CPU for
# `burst` seconds (argv[2], default 0.004) in `burst_<tag>` (argv[3], default "x").
import sys
import time

period = float(sys.argv[1]) if len(sys.argv) > 1 else 0.2
burst = float(sys.argv[2]) if len(sys.argv) > 2 else 0.004
tag = sys.argv[3] if len(sys.argv) > 3 else "x"


def spin(seconds):
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n = (n * 31 + 7) % 1000003


def bursts():
    while True:
        spin(burst)
        time.sleep(period - burst)


code = bursts.__code__.replace(co_name=f"burst_{tag}", co_qualname=f"burst_{tag}")
print("ready", flush=True)
type(bursts)(code, globals())()
