"""A CPU-bound loop at the bottom of a chain of `argv[1] + 3` Python frames, forever.

Target for bench/steady.sh: `<module>`, `descend` x (N + 1), `work`.
"""
import sys


def work(n):
    x = 0
    for i in range(n):
        x += (i * i) % 7
    return x


def descend(d):
    if d > 0:
        return descend(d - 1)
    while True:
        work(10000)


descend(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
