#!/bin/bash
# `--async` on a task tree (tests/workloads/task_tree.py: pyperformance async_tree's shape,
# TaskGroup and gather levels, default task names, tens of thousands of tasks a second, a
# named task beside it), outside `cargo xtask bench`: the share of task samples that lose
# their task, how many distinct stacks the profile has, and the BPF time per sample with and
# without --async.
#
# usage: sudo bench/async_tree.sh [VERSION] [SECONDS] [RATE]    (defaults: 3.14, 10, 997)
#   runs pythonVERSION of the sid root (`cargo xtask sidroot`; PYEBPF_SID_ROOT overrides
#   /var/cache/pyebpf/sid-root)
#   PYEBPF_BIN=path    another pyebpf build (default: target/release/pyebpf)
set -euo pipefail
VERSION=${1:-3.14}; SECONDS_=${2:-10}; RATE=${3:-997}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${PYEBPF_BIN:-$ROOT/target/release/pyebpf}
SID=${PYEBPF_SID_ROOT:-/var/cache/pyebpf/sid-root}
OUT=$(mktemp -d)
trap 'kill $TARGET 2>/dev/null; rm -rf "$OUT" "$SID/tmp/pyebpf-bench-task_tree.py"' EXIT
cp "$ROOT/tests/workloads/task_tree.py" "$SID/tmp/pyebpf-bench-task_tree.py"
chroot "$SID" "python$VERSION" /tmp/pyebpf-bench-task_tree.py >/dev/null & TARGET=$!
sleep 3   # past start-up: the tree is running
sysctl -qw kernel.bpf_stats_enabled=1
cpu() { awk '{print ($14 + $15) / 100}' "/proc/$TARGET/stat"; }
for mode in async plain; do
    args=(); [ "$mode" = async ] && args=(--async)
    CPU0=$(cpu)
    "$BIN" record -p "$TARGET" -r "$RATE" -d "$SECONDS_" -f collapsed -o "$OUT/$mode.txt" \
        --stats-json "$OUT/$mode.json" "${args[@]}" 2>/dev/null
    awk -v a="$(cpu)" -v b="$CPU0" 'BEGIN { print a - b }' > "$OUT/$mode.cpu"
done
python3 - "$OUT" "$VERSION" "$RATE" <<'PY'
import json, re, sys
out, version, rate = sys.argv[1], sys.argv[2], float(sys.argv[3])
def bpf_us(s):
    k = s["kernel"]
    # Runs for other tasks (not_python) return after one map lookup: ~0.1 us each.
    return (s["bpf_run_time_ns"] - 100 * k["not_python"]) / max(k["emitted"], 1) / 1e3
s = json.load(open(f"{out}/async.json"))
a = s["async"]
# Builds before issue 20 did not count unreadable tasks apart: they are the rest.
a.setdefault("task_unreadable", a["task_samples"] - a["rewritten"] - a["frame_not_found"])
stacks = [l.rsplit(" ", 1) for l in open(f"{out}/async.txt") if l.strip()]
tasks = [(st.split(";"), int(c)) for st, c in stacks if "<task " in st]
by_function = {tuple(re.sub(r" \(.*\)$", "", f) for f in st) for st, _ in tasks}
names = {f for st, _ in tasks for f in st if f.startswith("<task ")}
pct = lambda n: 100.0 * n / max(a["task_samples"], 1)
cpu = float(open(f"{out}/async.cpu").read())
print(f"python{version}: {s['kernel']['emitted']} samples for {cpu:.2f} CPU s at {rate:.0f} Hz; "
      f"{a['task_samples']} ran a task: {pct(a['rewritten']):.1f} % rewritten, "
      f"{pct(a['frame_not_found']):.1f} % coroutine frame not in the stack, "
      f"{pct(a['task_unreadable']):.1f} % task unreadable")
print(f"  {len(stacks)} distinct stacks, {len(tasks)} with task frames "
      f"({sum(c for _, c in tasks)} samples; {len(by_function)} by function); "
      f"{len(names)} distinct task frames: {', '.join(sorted(names)[:4])}{', ...' if len(names) > 4 else ''}")
print(f"  BPF {bpf_us(s):.2f} us/sample with --async, "
      f"{bpf_us(json.load(open(f'{out}/plain.json'))):.2f} without")
PY
