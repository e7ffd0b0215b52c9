#!/usr/bin/env python3
"""Fleet agent benchmark: what `pyebpf agent` costs on a busy host, next to `record -r 19`.

The workload is bench/scale.py's: LONG (default 256) long-lived, mostly idle interpreters of
every supported version on this machine, plus CHURN (default 50) short-lived interpreters per
second for SECONDS (default 60). On it, side by side in the same run (or one after the other
with --sequential, the long-lived interpreters staying up):

  agent       `pyebpf agent --listen 127.0.0.1:P --pyroscope http://127.0.0.1:R` (19 Hz,
              --subsample 4, the defaults)
  agent-sub1  the same with --subsample 1 (no random subsampling)
  agent-otlp  `agent` with a second exporter: --otlp to the same receiver, so each window is
              encoded twice (pprof for Pyroscope, one OTLP request) and sent by two queues
  record-19   `pyebpf record -r 19` (whole host), the previous baseline

Each agent pushes to its own small HTTP receiver in this script, which counts the POSTs to
/push.v1.PusherService/Push (and to OTLP's /v1development/profiles) and answers 200 with an
empty body (for OTLP, an empty ExportProfilesServiceResponse). After WARMUP seconds (start-up:
loading the BPF programs, finding the long-lived interpreters) the measured window opens and
the churn runs; at both ends every profiler is measured from outside: CPU from
/proc/PID/stat (user + system, all threads), BPF program run time from
/proc/PID/fdinfo of its programs (kernel.bpf_stats_enabled=1 during the run, restored after),
and for the agents a /metrics scrape (pyebpf_cpu_seconds_total by mode, samples, exports,
drops, queue). Resident memory is polled from /proc/PID/status (VmRSS) every 0.5 s; VmHWM
gives the kernel's exact peak. Results are printed as a table; --json FILE saves them.

Usage: sudo python3 bench/agent.py [--long 256] [--churn 50] [--seconds 60] [--warmup 10]
           [--interval 15] [--configs agent,agent-sub1,agent-otlp,record-19] [--sequential]
           [--pyebpf PATH] [--json FILE] [--perf PREFIX] [--idle-procs N] [--exec-churn N]
       sudo python3 bench/agent.py --timer-irq 10 [--rounds 3]

--perf PREFIX records each profiler with `perf record --call-graph dwarf` over the window;
--idle-procs N and --exec-churn N add N idle non-Python processes, or N short non-Python
execs per second, to see what those cost the agent. --timer-irq measures what the perf
events' timer interrupts cost outside the agent's counters (see timer_irq_cost).
"""
import argparse
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scale import ROOT, churn, interpreters, start_long_lived, stop_long_lived  # noqa: E402

PUSH_PATH = "/push.v1.PusherService/Push"
OTLP_PATH = "/v1development/profiles"
CLK_TCK = os.sysconf("SC_CLK_TCK")
BPF_PROG_TYPE_PERF_EVENT = 7


def proto_fields(buf):
    """(field number, value) of a protobuf message: length-delimited values as bytes, varints
    as ints (the only wire types a PushRequest's series and labels use)."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(buf, i)
        elif wire == 2:
            n, i = varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire}")
        yield field, value


def varint(buf, i):
    value = shift = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def push_services(body):
    """service_name of every series in a Pyroscope PushRequest."""
    services = []
    for field, series in proto_fields(body):
        if field != 1:  # PushRequest.series
            continue
        for f, label in proto_fields(series):
            if f != 1:  # RawProfileSeries.labels
                continue
            pair = dict(proto_fields(label))  # LabelPair: name = 1, value = 2
            if pair.get(1) == b"service_name":
                services.append(pair.get(2, b"").decode())
    return services


class Receiver:
    """A stand-in for Pyroscope on 127.0.0.1: counts pushes (and the service_name of each
    series), answers 200 with an empty body."""

    def __init__(self):
        stats = self.stats = {"push": 0, "push_bytes": 0, "otlp": 0, "otlp_bytes": 0,
                              "other": 0, "content_types": {}, "services": {}, "undecodable": 0}
        lock = self.lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with lock:
                    if self.path == PUSH_PATH:
                        stats["push"] += 1
                        stats["push_bytes"] += len(body)
                        ct = self.headers.get("Content-Type", "")
                        stats["content_types"][ct] = stats["content_types"].get(ct, 0) + 1
                        try:
                            for svc in push_services(body):
                                stats["services"][svc] = stats["services"].get(svc, 0) + 1
                        except (ValueError, IndexError):
                            stats["undecodable"] += 1
                    elif self.path == OTLP_PATH:
                        stats["otlp"] += 1
                        stats["otlp_bytes"] += len(body)
                    else:
                        stats["other"] += 1
                self.send_response(200 if self.path in (PUSH_PATH, OTLP_PATH) else 404)
                self.send_header("Content-Type", "application/proto")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def snapshot(self):
        with self.lock:
            return json.loads(json.dumps(self.stats))

    def close(self):
        self.server.shutdown()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_cpu(pid):
    """(user, system) CPU seconds of PID, all its threads (live and exited)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def proc_status(pid):
    """{VmRSS, VmHWM, RssAnon, RssFile} in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    return out


def bpf_programs(pid):
    """{prog_id: {type, run_time_ns, run_cnt}} of the BPF programs PID holds."""
    progs = {}
    fddir = f"/proc/{pid}/fdinfo"
    for fd in os.listdir(fddir):
        try:
            with open(os.path.join(fddir, fd)) as f:
                text = f.read()
        except OSError:
            continue
        if "prog_id:" not in text or "run_time_ns:" not in text:
            continue
        info = dict(re.findall(r"^(\w+):\s+(\S+)", text, re.M))
        progs[int(info["prog_id"])] = {
            "type": int(info["prog_type"]),
            "run_time_ns": int(info["run_time_ns"]),
            "run_cnt": int(info["run_cnt"]),
        }
    return progs


def scrape(url):
    """/metrics as {name{labels}: value}."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


class Profiler:
    def __init__(self, name, args, interval):
        self.name = name
        self.receiver = None
        self.metrics_url = None
        self.stats_json = None
        if name.startswith("agent"):
            self.receiver = Receiver()
            port = free_port()
            self.metrics_url = f"http://127.0.0.1:{port}"
            self.argv = [args.pyebpf, "agent", "--listen", f"127.0.0.1:{port}",
                         "--pyroscope", self.receiver.url, "--interval", str(interval)]
            if name == "agent-sub1":
                self.argv += ["--subsample", "1"]
            elif name == "agent-otlp":
                self.argv += ["--otlp", self.receiver.url]
        elif name == "record-19":
            self.stats_json = "/tmp/pyebpf-agent-bench-record.json"
            if os.path.exists(self.stats_json):
                os.unlink(self.stats_json)
            self.argv = [args.pyebpf, "record", "-r", "19", "-f", "collapsed",
                         "-o", "/tmp/pyebpf-agent-bench-record.txt", "--stats-json", self.stats_json]
        else:
            sys.exit(f"unknown configuration {name}")
        self.rss = []
        self.stop_polling = threading.Event()

    def start(self):
        self.t_launch = time.monotonic()
        # A file, not a pipe: a full pipe would stall the profiler.
        self.log = f"/tmp/pyebpf-agent-bench-{self.name}.log"
        self.proc = subprocess.Popen(self.argv, stderr=open(self.log, "w"),
                                     stdout=subprocess.DEVNULL)
        self.pid = self.proc.pid
        threading.Thread(target=self._poll_rss, daemon=True).start()

    def wait_up(self, timeout=180):
        """Until the agent answers /metrics, or record's sampler program is loaded."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"{self.name} exited: {open(self.log).read()}")
            try:
                if self.metrics_url:
                    scrape(self.metrics_url)
                    break
                if any(p["type"] == BPF_PROG_TYPE_PERF_EVENT
                       for p in bpf_programs(self.pid).values()):
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        else:
            sys.exit(f"{self.name} did not come up in {timeout}s")
        self.up_after = time.monotonic() - self.t_launch
        self.at_up = self.measure()

    def _poll_rss(self):
        while not self.stop_polling.is_set():
            try:
                self.rss.append((time.monotonic(), proc_status(self.pid)["VmRSS"]))
            except (OSError, KeyError):
                break
            self.stop_polling.wait(0.5)

    def measure(self):
        m = {"t": time.monotonic()}
        m["user"], m["system"] = proc_cpu(self.pid)
        progs = bpf_programs(self.pid)
        m["bpf_sampler_ns"] = sum(p["run_time_ns"] for p in progs.values()
                                  if p["type"] == BPF_PROG_TYPE_PERF_EVENT)
        m["bpf_sampler_runs"] = sum(p["run_cnt"] for p in progs.values()
                                    if p["type"] == BPF_PROG_TYPE_PERF_EVENT)
        m["bpf_other_ns"] = sum(p["run_time_ns"] for p in progs.values()
                                if p["type"] != BPF_PROG_TYPE_PERF_EVENT)
        m["bpf_other_runs"] = sum(p["run_cnt"] for p in progs.values()
                                  if p["type"] != BPF_PROG_TYPE_PERF_EVENT)
        m.update(proc_status(self.pid))
        if self.metrics_url:
            m["metrics"] = scrape(self.metrics_url)
        if self.receiver:
            m["receiver"] = self.receiver.snapshot()
        return m

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stop_polling.set()
        err = open(self.log).read()
        self.stderr_tail = err.strip().splitlines()[-1] if err.strip() else ""
        self.after_exit = {"receiver": self.receiver.snapshot()} if self.receiver else {}
        if self.stats_json and os.path.exists(self.stats_json):
            self.after_exit["record"] = json.load(open(self.stats_json))
        if self.receiver:
            self.receiver.close()

    def result(self, start, end):
        dt = end["t"] - start["t"]
        d = lambda k: end[k] - start[k]  # noqa: E731
        r = {
            "name": self.name, "argv": self.argv, "pid": self.pid,
            "up_after_s": round(self.up_after, 2), "window_s": round(dt, 1),
            "startup_cpu_s": round(self.at_up["user"] + self.at_up["system"], 2),
            "proc_user_s": round(d("user"), 2), "proc_system_s": round(d("system"), 2),
            "bpf_sampler_s": round(d("bpf_sampler_ns") / 1e9, 3),
            "bpf_sampler_runs": d("bpf_sampler_runs"),
            "bpf_lifecycle_s": round(d("bpf_other_ns") / 1e9, 3),
            "bpf_lifecycle_runs": d("bpf_other_runs"),
            "rss_start": start["VmRSS"], "rss_end": end["VmRSS"],
            "rss_peak_polled": max((v for t, v in self.rss if start["t"] <= t <= end["t"]),
                                   default=end["VmRSS"]),
            "rss_hwm_end": end["VmHWM"], "stderr_tail": self.stderr_tail,
            "rss_anon_start": start["RssAnon"], "rss_anon_end": end["RssAnon"],
            "rss_file_end": end["RssFile"],
        }
        cpu = d("user") + d("system") + d("bpf_sampler_ns") / 1e9 + d("bpf_other_ns") / 1e9
        r["proc_cpu_pct"] = round(100 * cpu / dt, 2)
        r["bpf_sampler_ns_per_run"] = (round(d("bpf_sampler_ns") / d("bpf_sampler_runs"))
                                       if d("bpf_sampler_runs") else None)
        if "metrics" in end:
            ms, me = start["metrics"], end["metrics"]
            md = lambda k: me.get(k, 0) - ms.get(k, 0)  # noqa: E731
            r["metrics"] = {
                "cpu_user_s": round(md('pyebpf_cpu_seconds_total{mode="user"}'), 2),
                "cpu_system_s": round(md('pyebpf_cpu_seconds_total{mode="system"}'), 2),
                "cpu_bpf_s": round(md('pyebpf_cpu_seconds_total{mode="bpf"}'), 3),
                "samples": int(md("pyebpf_samples_total")),
                "pushes_ok": int(md('pyebpf_exports_total{backend="pyroscope",result="ok"}')),
                "otlp_ok": int(md('pyebpf_exports_total{backend="otlp",result="ok"}')),
                "otlp_dictionary_end": int(me.get('pyebpf_export_dictionary_entries{backend="otlp"}', 0)),
                "pushes_failed": int(sum(v - ms.get(k, 0) for k, v in me.items()
                                         if k.startswith("pyebpf_exports_total")
                                         and 'result="ok"' not in k)),
                "export_dropped": int(sum(v - ms.get(k, 0) for k, v in me.items()
                                          if k.startswith("pyebpf_export_dropped_total"))),
                "samples_dropped": {re.search(r'reason="(\w+)"', k).group(1): int(v - ms.get(k, 0))
                                    for k, v in me.items()
                                    if k.startswith("pyebpf_dropped_samples_total")},
                "errors": {re.search(r'kind="(\w+)"', k).group(1): int(v - ms.get(k, 0))
                           for k, v in me.items() if k.startswith("pyebpf_errors_total")},
                "truncated": int(md("pyebpf_truncated_stacks_total")),
                "processes_start": int(ms.get("pyebpf_processes", 0)),
                "processes_end": int(me.get("pyebpf_processes", 0)),
                "processes_profiled": int(md("pyebpf_processes_profiled_total")),
                "windows": int(md("pyebpf_windows_total")),
                "queue_depth_end": int(me.get("pyebpf_push_queue_depth", 0)),
                "rss_start": int(ms.get("pyebpf_resident_memory_bytes", 0)),
                "rss_end": int(me.get("pyebpf_resident_memory_bytes", 0)),
            }
            mm = r["metrics"]
            mm["cpu_pct"] = round(100 * (mm["cpu_user_s"] + mm["cpu_system_s"] + mm["cpu_bpf_s"])
                                  / dt, 2)
            r["receiver_window"] = end["receiver"]["push"] - start["receiver"]["push"]
            r["receiver_total"] = self.after_exit["receiver"]
        if "record" in self.after_exit:
            s = self.after_exit["record"]
            r["record"] = {"samples_whole_run": s["session"]["samples"],
                           "ringbuf_drops": s["kernel"]["ringbuf_drops"],
                           "duration_s": s["duration_s"], "lifecycle": s["lifecycle"]}
        return r


def exec_churn(per_second, stop):
    """PER_SECOND short non-Python processes per second until STOP."""
    t0, n = time.monotonic(), 0
    while not stop.is_set():
        while n < int((time.monotonic() - t0) * per_second):
            subprocess.Popen(["/bin/true"]).wait()
            n += 1
        time.sleep(0.005)
    print(f"exec churn: {n} non-Python processes in {time.monotonic() - t0:.1f}s", flush=True)


def timer_interrupts(seconds):
    """(interrupts/s, µs/s spent in them) of the local timer interrupt on every CPU, from the
    irq_vectors:local_timer_entry/exit tracepoints over SECONDS."""
    data = "/tmp/pyebpf-agent-bench-irq.data"
    subprocess.run(["perf", "record", "-q", "-a", "-e", "irq_vectors:local_timer_entry",
                    "-e", "irq_vectors:local_timer_exit", "-o", data, "--", "sleep", str(seconds)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = subprocess.run(["perf", "script", "-i", data, "-F", "cpu,time,event"],
                         capture_output=True, text=True, check=True).stdout
    entered, count, total = {}, 0, 0.0
    for m in re.finditer(r"\[(\d+)\]\s+([\d.]+):\s+irq_vectors:local_timer_(entry|exit)", out):
        cpu, t = int(m.group(1)), float(m.group(2))
        if m.group(3) == "entry":
            entered[cpu] = t
        elif cpu in entered:
            total += t - entered.pop(cpu)
            count += 1
    return count / seconds, total / seconds * 1e6


def timer_irq_cost(args):
    """What the perf events' timer interrupts cost, which no counter of the agent sees (they
    run in the context of whatever task they interrupt): both CPUs kept busy by non-Python
    loops, the timer interrupts traced with no profiler, and with the agent at --subsample 1,
    4 (default) and 64 (to make the per-tick cost stand out of the noise)."""
    configs = [("none", None), ("agent --subsample 1", "1"), ("agent (--subsample 4)", "4"),
               ("agent --subsample 64", "64")]
    busy = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(os.cpu_count())]
    rows = {name: [] for name, _ in configs}
    try:
        for _ in range(args.rounds):
            for name, sub in configs:
                agent = None
                if sub:
                    url = f"http://127.0.0.1:{free_port()}"
                    agent = subprocess.Popen(
                        [args.pyebpf, "agent", "--listen", url[len("http://"):], "--subsample", sub],
                        stderr=subprocess.DEVNULL)
                    for _ in range(100):
                        try:
                            scrape(url)
                            break
                        except OSError:
                            time.sleep(0.1)
                    time.sleep(2)
                rows[name].append(timer_interrupts(args.timer_irq))
                if agent:
                    agent.send_signal(signal.SIGTERM)
                    agent.wait()
                print(f"{name}: {rows[name][-1][0]:.0f} timer interrupts/s, "
                      f"{rows[name][-1][1]:.0f} µs/s in them", flush=True)
    finally:
        for b in busy:
            b.kill()
            b.wait()
    print("\n| | timer interrupts/s (all CPUs) | µs/s in timer interrupts | per extra interrupt |")
    print("|---|---|---|---|")
    base = rows["none"]
    for name, _ in configs:
        per = [(us - b_us) / (n - b_n) for (n, us), (b_n, b_us) in zip(rows[name], base)
               if n - b_n > 50]
        print(f"| {name} | " + " / ".join(f"{n:.0f}" for n, _ in rows[name]) + " | "
              + " / ".join(f"{us:.0f}" for _, us in rows[name]) + " | "
              + (" / ".join(f"{p:.1f} µs" for p in per) if name != "none" and per else "")
              + " |")
    print("(one figure per round)")
    return 0


def mib(n):
    return f"{n / 2**20:.1f}"


def report(results, churn_stats):
    print()
    for r in results:
        print(f"== {r['name']}: {' '.join(r['argv'][1:])}")
        print(f"   up after {r['up_after_s']} s (start-up CPU {r['startup_cpu_s']} s); "
              f"window {r['window_s']} s")
        print(f"   /proc: user {r['proc_user_s']} s + system {r['proc_system_s']} s; "
              f"BPF sampler {r['bpf_sampler_s']} s ({r['bpf_sampler_runs']} runs, "
              f"{r['bpf_sampler_ns_per_run']} ns/run); BPF exec/exit hooks "
              f"{r['bpf_lifecycle_s']} s ({r['bpf_lifecycle_runs']} runs) "
              f"=> {r['proc_cpu_pct']} % of one CPU")
        if "metrics" in r:
            m = r["metrics"]
            print(f"   /metrics: user {m['cpu_user_s']} + system {m['cpu_system_s']} + bpf "
                  f"{m['cpu_bpf_s']} s => {m['cpu_pct']} % of one CPU; samples {m['samples']}; "
                  f"pushes ok {m['pushes_ok']} (OTLP {m['otlp_ok']}) failed {m['pushes_failed']}; export dropped "
                  f"{m['export_dropped']}; samples dropped {m['samples_dropped']}; errors "
                  f"{m['errors']}; truncated {m['truncated']}; processes {m['processes_start']}"
                  f"->{m['processes_end']} ({m['processes_profiled']} new); windows "
                  f"{m['windows']}; queue at end {m['queue_depth_end']}")
            print(f"   receiver: {r['receiver_window']} pushes in the window; after exit "
                  f"{r['receiver_total']}")
            print(f"   RSS (/metrics) start {mib(m['rss_start'])} MiB, end {mib(m['rss_end'])} MiB")
        if "record" in r:
            print(f"   record: {r['record']}")
        print(f"   RSS (/proc) start {mib(r['rss_start'])} MiB, peak {mib(r['rss_peak_polled'])} "
              f"MiB (VmHWM {mib(r['rss_hwm_end'])}), end {mib(r['rss_end'])} MiB; anonymous "
              f"{mib(r['rss_anon_start'])} -> {mib(r['rss_anon_end'])} MiB, file-backed at end "
              f"{mib(r['rss_file_end'])} MiB")
        print(f"   exit: {r['stderr_tail']}")
    print()
    print("| | " + " | ".join(r["name"] for r in results) + " |")
    print("|---|" + "---|" * len(results))
    rows = [
        ("CPU, % of one core (/proc user+system + BPF)", lambda r: f"{r['proc_cpu_pct']:.2f} %"),
        ("… from /metrics (user+system+bpf)",
         lambda r: f"{r['metrics']['cpu_pct']:.2f} %" if "metrics" in r else "—"),
        ("user / system / BPF sampler / BPF exec-exit, s",
         lambda r: f"{r['proc_user_s']} / {r['proc_system_s']} / {r['bpf_sampler_s']} / "
                   f"{r['bpf_lifecycle_s']}"),
        ("sampler runs (perf events) / ns per run",
         lambda r: f"{r['bpf_sampler_runs']} / {r['bpf_sampler_ns_per_run']}"),
        ("samples", lambda r: str(r["metrics"]["samples"]) if "metrics" in r
         else f"{r['record']['samples_whole_run']} (whole run)" if "record" in r else "—"),
        ("RSS start / peak / end, MiB",
         lambda r: f"{mib(r['rss_start'])} / {mib(r['rss_peak_polled'])} / {mib(r['rss_end'])}"),
        ("OTLP exports ok (window) / dictionary entries at end",
         lambda r: f"{r['metrics']['otlp_ok']} / {r['metrics']['otlp_dictionary_end']}"
         if "metrics" in r else "—"),
        ("pushes ok / failed / dropped (window)",
         lambda r: f"{r['metrics']['pushes_ok']} / {r['metrics']['pushes_failed']} / "
                   f"{r['metrics']['export_dropped']}" if "metrics" in r else "—"),
        ("samples dropped (ring buffer)",
         lambda r: str(r["metrics"]["samples_dropped"].get("ring_buffer", 0)) if "metrics" in r
         else str(r["record"]["ringbuf_drops"]) if "record" in r else "—"),
    ]
    for label, f in rows:
        print(f"| {label} | " + " | ".join(f(r) for r in results) + " |")
    print(f"\nchurn: {churn_stats}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--long", type=int, default=256)
    ap.add_argument("--churn", type=int, default=50, help="short-lived processes per second")
    ap.add_argument("--seconds", type=int, default=60, help="measured window (churn runs in it)")
    ap.add_argument("--warmup", type=float, default=10)
    ap.add_argument("--interval", type=float, default=15, help="the agent's --interval")
    ap.add_argument("--configs", default="agent,agent-sub1,record-19")
    ap.add_argument("--sequential", action="store_true",
                    help="one configuration at a time instead of side by side")
    ap.add_argument("--pyebpf", default=os.path.join(ROOT, "target", "release", "pyebpf"))
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--idle-procs", type=int, default=0, metavar="N",
                    help="also keep N idle non-Python processes (sleep) on the host")
    ap.add_argument("--exec-churn", type=int, default=0, metavar="N",
                    help="also exec N short non-Python processes (/bin/true) per second in the window")
    ap.add_argument("--timer-irq", type=float, metavar="SECONDS",
                    help="instead: trace the timer interrupts for SECONDS per configuration "
                         "(no workload; CPUs kept busy by `yes`), to see what subsampling costs "
                         "outside the agent's own counters")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of --timer-irq")
    ap.add_argument("--perf", metavar="PREFIX",
                    help="also `perf record --call-graph dwarf` each profiler over the window, "
                         "to PREFIX-NAME.data")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (sudo): pyebpf and /proc/PID/fdinfo need it")
    if args.timer_irq:
        return timer_irq_cost(args)
    interps = interpreters()
    print(f"interpreters: {', '.join(i[0] for i in interps)}", flush=True)
    with open("/proc/sys/kernel/bpf_stats_enabled") as f:
        bpf_stats_before = f.read().strip()
    subprocess.run(["sysctl", "-q", "kernel.bpf_stats_enabled=1"], check=False)
    long_lived = start_long_lived(interps, args.long)
    idle = [subprocess.Popen(["sleep", "infinity"]) for _ in range(args.idle_procs)]
    configs = args.configs.split(",")
    groups = [[c] for c in configs] if args.sequential else [configs]
    results, churns, loads = [], [], []
    profilers = []
    try:
        for group in groups:
            profilers = [Profiler(name, args, args.interval) for name in group]
            for p in profilers:
                p.start()
            for p in profilers:
                p.wait_up()
            print(f"{', '.join(group)} up; warming up {args.warmup:.0f}s", flush=True)
            time.sleep(args.warmup)
            load = [open("/proc/loadavg").read().split()[0]]
            perfs = [subprocess.Popen(
                ["perf", "record", "-q", "-F", "999", "--call-graph", "dwarf,16384", "-p",
                 str(p.pid), "-o", f"{args.perf}-{p.name}.data"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for p in profilers] if args.perf else []
            starts = [p.measure() for p in profilers]
            stop_exec = threading.Event()
            execs = threading.Thread(target=exec_churn, args=(args.exec_churn, stop_exec))
            if args.exec_churn:
                execs.start()
            churns.append(churn(interps, args.churn, args.seconds))
            stop_exec.set()
            if args.exec_churn:
                execs.join()
            ends = [p.measure() for p in profilers]
            load.append(open("/proc/loadavg").read().split()[0])
            for perf in perfs:
                perf.send_signal(signal.SIGINT)
                perf.wait()
            loads.append(load)
            for p in profilers:
                p.stop()
            results += [p.result(s, e) for p, s, e in zip(profilers, starts, ends)]
            profilers = []
    finally:
        for p in profilers:
            if p.proc.poll() is None:
                p.proc.kill()
        stop_long_lived(long_lived)
        for p in idle:
            p.kill()
            p.wait()
        subprocess.run(["sysctl", "-q", f"kernel.bpf_stats_enabled={bpf_stats_before}"],
                       check=False)
    report(results, [f"{n} in {t:.1f}s ({n / t:.1f}/s)" for n, t in churns])
    print(f"load average (1 min) at window start/end: {loads}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "churn": churns, "load": loads, "args": vars(args),
                       "uname": os.uname().release, "cpus": os.cpu_count()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
