"""Fixed-work, CPU-bound benchmark target for `cargo xtask bench`.

The work is `--chunks` repetitions of `work_a(7 * N)` then `work_b(3 * N)`: two functions with
the same loop body, so the CPU split between them is 70/30 by construction. Each chunk is also
timed with the thread's CPU clock, so the measured split (the ground truth a sampling profiler
should report) is printed too. Both run at the bottom of a call chain of exactly `--depth`
Python frames (`<module>`, `main`, `descend` x (depth - 3), `work_a`/`work_b`).

Protocol (stdout, one line each):
  ready <pid>             the call chain is built, waiting for a line on stdin
  (bench writes "go")     the timed work starts
  {"wall_s": ..., ...}    the result as JSON; then the process exits

`--calibrate SECONDS` instead runs chunks for that much CPU time and prints
{"chunks_per_s": ...} (per CPU second).
"""

import json
import os
import sys
import time

N = 1000  # loop iterations per tenth of a chunk: work_a does 7 * N, work_b 3 * N


def work_a(n):
    x = 0
    for i in range(n):
        x += (i * i) % 7
    return x


def work_b(n):
    x = 0
    for i in range(n):
        x += (i * i) % 7
    return x


def leaf(chunks, wait):
    if wait:
        print(f"ready {os.getpid()}", flush=True)
        sys.stdin.readline()
    clock = time.thread_time_ns
    t_a = t_b = 0
    wall0 = time.perf_counter()
    cpu0 = time.process_time()
    for _ in range(chunks):
        t0 = clock()
        work_a(7 * N)
        t1 = clock()
        work_b(3 * N)
        t2 = clock()
        t_a += t1 - t0
        t_b += t2 - t1
    return {
        "wall_s": time.perf_counter() - wall0,
        "cpu_s": time.process_time() - cpu0,
        "chunks": chunks,
        "truth_a": t_a / max(1, t_a + t_b),
    }


def descend(levels, chunks, wait):
    if levels > 0:
        return descend(levels - 1, chunks, wait)
    return leaf(chunks, wait)


def main():
    args = sys.argv[1:]
    opts = {"--depth": 5, "--chunks": 1000, "--calibrate": 0.0}
    for i in range(0, len(args), 2):
        if args[i] not in opts or i + 1 >= len(args):
            sys.exit(f"usage: workload.py [--depth D] [--chunks C] [--calibrate SECONDS]; got {args}")
        opts[args[i]] = type(opts[args[i]])(args[i + 1])
    depth = opts["--depth"]
    if depth < 4:
        sys.exit("--depth must be >= 4 (<module>, main, descend, work_*)")
    sys.setrecursionlimit(depth + 100)
    if opts["--calibrate"] > 0:
        # CPU time, not wall time: the machine may be busy with other work.
        start = time.process_time()
        deadline = start + opts["--calibrate"]
        done = 0
        while time.process_time() < deadline:
            work_a(7 * N)
            work_b(3 * N)
            done += 1
        print(json.dumps({"chunks_per_s": done / (time.process_time() - start)}), flush=True)
        return
    # <module> + main + descend(levels .. 0) + leaf + work_x == depth frames.
    result = descend(depth - 5, opts["--chunks"], True)
    result["depth"] = depth
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
