# Two call chains that alternate every ~2 ms so their frames land at the same addresses:
#   chain_a -> branch_x -> [rec x DEPTH] -> leaf   and   chain_b -> branch_y -> [rec x DEPTH] -> leaf
# DEPTH = argv[1] (default 0: shallow chains the kernel records whole; use > 128 to exercise
# userspace completion, where the deep part must never be spliced from the other chain).
import sys
import time

sys.setrecursionlimit(100000)
DEPTH = int(sys.argv[1]) if len(sys.argv) > 1 else 0
SLICE = 0.002


def leaf(until):
    n = 0
    while time.perf_counter() < until:
        n = (n * 31 + 7) % 1000003


def rec(depth, until):
    if depth == 0:
        return leaf(until)
    return rec(depth - 1, until)


def branch_x(until):
    return rec(DEPTH, until)


def branch_y(until):
    return rec(DEPTH, until)


def chain_a():
    branch_x(time.perf_counter() + SLICE)


def chain_b():
    branch_y(time.perf_counter() + SLICE)


print("ready", flush=True)
while True:
    chain_a()
    chain_b()
