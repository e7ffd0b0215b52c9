#!/usr/bin/env python3
"""Scale benchmark for issue 5: many interpreters at once, plus process churn.

Starts LONG (default 256) long-lived, mostly idle interpreters of every supported version on
this machine (bursty.py: a short CPU burst every second), then records the whole host with
`pyebpf record -r 100` while CHURN (default 50) short-lived interpreters per second start and
exit for SECONDS (default 60). Reports: which long-lived processes appear in the profile, the
kernel map and userspace cache sizes before/peak/after, lifecycle counters, and pyebpf's own
CPU (user+system, and BPF program run time with kernel.bpf_stats_enabled=1).

Usage: sudo python3 bench/scale.py [--long 256] [--churn 50] [--seconds 60] [--pyebpf PATH]

bench/agent.py runs `pyebpf agent` on the same workload (start_long_lived, churn).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = os.path.join(ROOT, "tests", "workloads")
SID = os.environ.get("PYEBPF_SID_ROOT", "/var/cache/pyebpf/sid-root")


def interpreters():
    """(label, argv prefix, script dir as the interpreter sees it) for every interpreter."""
    found = []
    if os.path.exists("/usr/bin/python3.11"):
        found.append(("debian 3.11", ["/usr/bin/python3.11"], WORKLOADS))
    pyenv = "/root/.pyenv/versions"
    for name in sorted(os.listdir(pyenv)) if os.path.isdir(pyenv) else []:
        m = re.match(r"3\.(\d+)\.", name)
        if m and int(m.group(1)) >= 11:
            exe = os.path.join(pyenv, name, "bin", f"python3.{m.group(1)}")
            if os.path.exists(exe):
                found.append((f"pyenv {name}", [exe], WORKLOADS))
    inside = "/tmp/pyebpf-bench"
    for minor in (13, 14, 15):
        if os.path.exists(os.path.join(SID, f"usr/bin/python3.{minor}")):
            found.append((f"sid 3.{minor}", ["chroot", SID, f"/usr/bin/python3.{minor}"], inside))
    if any(i[0].startswith("sid") for i in found):
        os.makedirs(os.path.join(SID, inside.lstrip("/")), exist_ok=True)
        for script in ("bursty.py", "short_lived.py"):
            with open(os.path.join(WORKLOADS, script)) as src, open(
                os.path.join(SID, inside.lstrip("/"), script), "w"
            ) as dst:
                dst.write(src.read())
    return found


def start_long_lived(interps, count):
    """COUNT mostly idle interpreters (bursty.py), round-robin over INTERPS, once all are ready:
    [(Popen, label, tag)]."""
    long_lived = []
    started = time.monotonic()
    for i in range(count):
        label, argv, sdir = interps[i % len(interps)]
        # One 3 ms burst per second: 256 of them need ~0.8 CPU of the VM's 2.
        p = subprocess.Popen(
            argv + [os.path.join(sdir, "bursty.py"), "1.0", "0.003", f"L{i}"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        long_lived.append((p, label, f"L{i}"))
    for p, label, tag in long_lived:
        if p.stdout.readline().strip() != "ready":
            stop_long_lived(long_lived)
            sys.exit(f"{label} {tag} did not start")
    print(f"{count} long-lived interpreters ready in {time.monotonic() - started:.1f}s", flush=True)
    return long_lived


def stop_long_lived(long_lived):
    for p, _, _ in long_lived:
        p.kill()
    for p, _, _ in long_lived:
        p.wait()


def churn(interps, per_second, seconds):
    """PER_SECOND short-lived interpreters per second for SECONDS, each burning 20 ms over two
    threads; waits for the last to exit. Returns (started, elapsed seconds)."""
    churned = 0
    t0 = time.monotonic()
    running = []
    while time.monotonic() - t0 < seconds:
        due = int((time.monotonic() - t0) * per_second)
        while churned < due:
            label, argv, sdir = interps[churned % len(interps)]
            running.append(subprocess.Popen(
                argv + [os.path.join(sdir, "short_lived.py"), "0.02"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))
            churned += 1
        running = [p for p in running if p.poll() is None]
        time.sleep(0.005)
    elapsed = time.monotonic() - t0
    for p in running:
        p.wait()
    print(f"churn: {churned} short-lived interpreters in {elapsed:.1f}s "
          f"({churned / elapsed:.1f}/s)", flush=True)
    return churned, elapsed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--long", type=int, default=256)
    ap.add_argument("--churn", type=int, default=50, help="short-lived processes per second")
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--rate", type=int, default=100)
    ap.add_argument("--pyebpf", default=os.path.join(ROOT, "target", "release", "pyebpf"))
    args = ap.parse_args()
    interps = interpreters()
    print(f"interpreters: {', '.join(i[0] for i in interps)}", flush=True)
    subprocess.run(["sysctl", "-q", "kernel.bpf_stats_enabled=1"], check=False)

    long_lived = start_long_lived(interps, args.long)

    out = "/tmp/pyebpf-scale.txt"
    stats = "/tmp/pyebpf-scale.json"
    duration = args.seconds + 10
    rec = subprocess.Popen(
        [args.pyebpf, "record", "-r", str(args.rate), "-d", str(duration), "-f", "collapsed",
         "-o", out, "--stats-json", stats],
        stderr=subprocess.PIPE, text=True,
    )
    time.sleep(5)
    churn(interps, args.churn, args.seconds)
    _, err = rec.communicate()
    stop_long_lived(long_lived)
    print(err.strip().splitlines()[-1] if err.strip() else "(no pyebpf output)")

    roots = {}
    with open(out) as f:
        for line in f:
            stack, count = line.rstrip("\n").rsplit(" ", 1)
            root = stack.split(";", 1)[0]
            roots[root] = roots.get(root, 0) + int(count)
    seen = set()
    for root in roots:
        m = re.search(r"\((\d+)", root)
        if m:
            seen.add(int(m.group(1)))
    missing = [(label, tag, p.pid) for p, label, tag in long_lived if p.pid not in seen]
    per_version = {}
    for p, label, _ in long_lived:
        ok = p.pid in seen
        a, b = per_version.get(label, (0, 0))
        per_version[label] = (a + ok, b + 1)
    s = json.load(open(stats))
    cpu = s["user_cpu_s"] + s["system_cpu_s"]
    print(f"long-lived interpreters in the profile: {args.long - len(missing)}/{args.long}")
    for label, (a, b) in sorted(per_version.items()):
        print(f"  {label}: {a}/{b}")
    if missing:
        print(f"  missing: {missing[:10]}")
    print(f"maps: {json.dumps({k: s['maps'][k] for k in ('start', 'peak', 'end')})}")
    print(f"caches: {json.dumps({k: s['maps'][k] for k in ('caches_start', 'caches_peak', 'caches_end')})}")
    print(f"lifecycle: {json.dumps(s['lifecycle'])}")
    print(f"samples: {s['session']['samples']}, ring buffer drops: {s['kernel']['ringbuf_drops']}, "
          f"lifecycle event drops: {s['kernel']['proc_event_drops']}")
    print(f"pyebpf CPU: user {s['user_cpu_s']:.2f}s + system {s['system_cpu_s']:.2f}s = {cpu:.2f}s "
          f"over {s['duration_s']:.1f}s ({100 * cpu / s['duration_s']:.1f}% of one CPU)")
    if s["bpf_run_count"]:
        print(f"BPF sampler: {s['bpf_run_count']} runs, {s['bpf_run_time_ns'] / 1e6:.0f} ms total, "
              f"{s['bpf_run_time_ns'] / s['bpf_run_count']:.0f} ns/run "
              f"({100 * s['bpf_run_time_ns'] / 1e9 / s['duration_s']:.2f}% of one CPU)")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
