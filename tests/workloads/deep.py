# Recursion DEPTH (argv[1], default 1000) deep, then a busy leaf: stacks far deeper than the
# kernel records, for completion tests.
import sys

sys.setrecursionlimit(100000)
DEPTH = int(sys.argv[1]) if len(sys.argv) > 1 else 1000


def leaf():
    n = 0
    while True: n = (n * 31 + 7) % 1000003  # LINE:leaf


def rec(depth):
    if depth == 0:
        leaf()  # LINE:rec_leaf
    rec(depth - 1)  # LINE:rec


print("ready", flush=True)
rec(DEPTH)  # LINE:module
