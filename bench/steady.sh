#!/bin/bash
# Steady-state cost of pyebpf on one busy target, outside `cargo xtask bench`:
# BPF run time per sample (kernel.bpf_stats_enabled) and pyebpf's own CPU and context
# switches over 5 s after start-up (perf stat).
#
# usage: sudo bench/steady.sh [PYTHON] [DEPTH] [RATE]    (defaults: python3, 2, 1000)
#   PYEBPF_BIN=path    another pyebpf build (default: target/release/pyebpf)
#   PYEBPF_ARGS="..."  extra `record` arguments, e.g. "--debug-bpf"
set -euo pipefail
PY=${1:-python3}; DEPTH=${2:-2}; RATE=${3:-1000}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${PYEBPF_BIN:-$ROOT/target/release/pyebpf}
OUT=$(mktemp -d)
trap 'kill $TARGET 2>/dev/null; rm -rf "$OUT"' EXIT
"$PY" "$ROOT/bench/busy.py" "$DEPTH" & TARGET=$!
sleep 3   # an established process: no eager samples
sysctl -qw kernel.bpf_stats_enabled=1
"$BIN" record -p "$TARGET" -r "$RATE" -d 12 -f collapsed -o "$OUT/out.txt" \
    --stats-json "$OUT/stats.json" ${PYEBPF_ARGS:-} 2>/dev/null & PROFILER=$!
sleep 4
perf stat -e task-clock,context-switches -p "$PROFILER" -- sleep 5 2>&1 \
    | grep -E "task-clock|context-switches" | sed 's/^ */pyebpf over 5 s: /'
wait "$PROFILER"
python3 - "$OUT/stats.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
k = s["kernel"]
# Runs for other tasks (not_python) return after one map lookup: ~0.1 us each.
bpf = (s["bpf_run_time_ns"] - 100 * k["not_python"]) / k["emitted"] / 1e3
print(f"{k['emitted']} samples, BPF {bpf:.2f} us/sample, program {s.get('bpf_xlated_bytes', '?')} bytes, "
      f"{k['chunk_copies'] / k['emitted']:.2f} chunk copies/sample, {k['new_code']} new-code wake-ups")
PY
