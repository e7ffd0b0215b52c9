//! The command line, in the shape py-spy users know.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::output::Format;

#[derive(Parser, Debug)]
#[command(
    name = "pyebpf",
    version,
    about = "System-wide sampling profiler for CPython 3.11–3.15, built on BPF",
    long_about = "System-wide sampling profiler for CPython 3.11–3.15, built on BPF.\n\n\
        A BPF program samples every CPU at a fixed rate and walks the Python frames of whichever \
        interpreter thread is running; the target is never paused, ptraced or modified. \
        Needs root (or CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE).",
    after_help = "Examples:\n  \
        sudo pyebpf record -o profile.svg -- python3 app.py     profile a new program\n  \
        sudo pyebpf record -p 1234 -d 30 -f speedscope -o out.json\n  \
        sudo pyebpf record -d 10                                  every Python process on the host\n  \
        sudo pyebpf check                                         can this host run pyebpf?"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// More log output (-v info, -vv debug); RUST_LOG works too.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Sample Python stacks and write a flame graph, speedscope profile or collapsed stacks.
    Record(RecordArgs),
    /// Live view of the Python functions using the most CPU, across every interpreter.
    Top(TopArgs),
    /// Whether this host can run pyebpf, what to fix if not, and which Python processes it
    /// can profile.
    #[command(
        long_about = "Whether this host can run pyebpf, what to fix if not, and which Python \
            processes it can profile.\n\n\
            Each line is one fact: ✔ as pyebpf needs it, ✘ a problem (followed by its fix), · \
            information.\n\n\
            Host: the kernel release, kernel BTF (/sys/kernel/btf/vmlinux), the capabilities \
            pyebpf holds (CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE, or CAP_SYS_ADMIN), \
            kernel.perf_event_paranoid (it only matters without CAP_PERFMON), the kernel \
            lockdown mode (`confidentiality` refuses BPF reads) and \
            kernel.unprivileged_bpf_disabled.\n\n\
            BPF: the real sampler is loaded and attached to every CPU for a moment, then \
            removed; a program the kernel refuses is named with the kernel's answer. Nothing \
            is inferred from version numbers.\n\n\
            Python processes: for every interpreter pyebpf can see, its pid, CPython version, \
            the binary holding the runtime (the executable, or libpython for a shared build), \
            where its layout comes from (a table built into pyebpf for 3.11 and 3.12, the \
            target's own _Py_DebugOffsets for 3.13 and newer) and whether it lives in another \
            pid or mount namespace (a container); then the ones pyebpf cannot profile, with \
            the reason, and the processes it may not read at all.\n\n\
            Exit status: 0 when ready (no ✘), 1 when not. Run it as the user that will run \
            pyebpf: without root it reports what is missing.",
        after_help = "Examples:\n  \
            sudo pyebpf check                 is this host ready, and what runs Python here?\n  \
            sudo pyebpf check --json | jq .ready\n  \
            pyebpf check                      what an unprivileged user lacks"
    )]
    Check(CheckArgs),
    /// What each thread of a running Python program is doing right now: its name, its state
    /// and its whole Python stack (py-spy's `dump`), taken without stopping it.
    #[command(
        long_about = "What each thread of a running Python program is doing right now: its \
            name, whether it is on a CPU or idle, whether it holds the GIL, and its Python \
            frames, most recent call first, as `function (file:line)`.\n\n\
            The target is never paused, ptraced or written to. A running thread's frames change \
            thousands of times a second, so copying them from outside races with it; instead \
            every dump samples the target with the BPF sampler for a short window (--window, \
            100 ms at most) and takes a running thread's stack from the sampler's copy, made in \
            the timer interrupt while the thread stood on its CPU, completed and named as \
            `record` does. A thread that is off CPU does not change its frames: it is copied \
            from memory (process_vm_readv), and the copy is kept only if the thread did not run \
            meanwhile (its context-switch counts did not move); one that ran is copied again, \
            and if it keeps running it is taken from the interrupt. The window ends as soon as \
            every thread has its stack. A stack that cannot be had says why, with the number of \
            copies tried; the exit status is 1 only when no thread could be shown.\n\n\
            Thread names are Python's: threading.Thread.name, read from the target's \
            threading._active (no code runs in the target), so a 3.11 program's threads show \
            as MainThread, worker-1, ... instead of all being called python3.11; threads that \
            threading does not know keep their OS name (/proc/PID/task/TID/comm).\n\n\
            Works for every supported CPython (3.11-3.15) and for processes in containers (pass \
            the host pid). Needs root, or CAP_SYS_PTRACE, CAP_BPF and CAP_PERFMON; with \
            CAP_SYS_PTRACE alone there is no sampler, and a running thread is copied from \
            memory and kept only if its current frame and instruction did not move during the \
            copy.",
        after_help = "Examples:\n  \
            sudo pyebpf dump -p 1234                  every thread's Python stack\n  \
            sudo pyebpf dump -p 1234 --locals         with each frame's arguments and variables\n  \
            sudo pyebpf dump -p 1234 -p 5678 --json   several processes, for a script\n  \
            sudo pyebpf dump -p 1234 --native         native frames of the threads on a CPU\n  \
            sudo pyebpf dump -p 1234 --async          the asyncio task tree too (3.14+)"
    )]
    Dump(DumpArgs),
    /// Profile every Python process on the host, continuously, for a profiling backend:
    /// push to Grafana Pyroscope, or be scraped as pprof (Parca, Alloy, `go tool pprof`).
    #[command(
        long_about = "Profile every Python process on the host, continuously, for a profiling \
            backend.\n\n\
            Runs until stopped (SIGTERM pushes the current window and exits 0). Processes that \
            start later are picked up, processes that exit are dropped. Each process is named \
            by a service: OTEL_SERVICE_NAME, service.name in OTEL_RESOURCE_ATTRIBUTES or \
            PYROSCOPE_APPLICATION_NAME from its environment, else its Kubernetes pod as \
            NAMESPACE/CONTAINER (from the container runtime's OCI bundle, found on the node), \
            else its container (cgroup), else its program (script, -m module, or the app of \
            gunicorn/uvicorn/celery-style launchers). Every --interval, one pprof profile per \
            service is cut and, with --pyroscope, pushed with the labels service_name, \
            hostname, python_version, and pid, comm, container_id, namespace, pod, container \
            and pod_uid when all of the service's processes share them, plus every --label. \
            Samples inside a profile carry pid, tid, thread_name, process, service_name and, \
            where known, container_id, namespace, pod, container and pod_uid. With --otlp, \
            each window also goes to an OpenTelemetry Collector as OTLP profiles: one resource \
            per process (service.name, process.pid, process.executable.name, \
            process.runtime.*, host.name, container.id), thread.id and thread.name on each \
            sample.\n\n\
            Served on --listen (plain HTTP; keep it on loopback or a private network):\n  \
            GET /debug/pprof/profile?seconds=N[&pid=P][&service=S]  gzipped pprof of the next N \
            seconds (what Parca, Alloy's pyroscope.scrape and `go tool pprof` fetch)\n  \
            GET /metrics   Prometheus/OpenMetrics counters: samples, drops, errors, truncated \
            stacks, processes, the agent's own CPU (user, system, BPF), exports, push queue, \
            identity sources missing\n  \
            GET /healthz   ok while the sampling loop runs\n\n\
            Every flag can be set from the environment variable named after it \
            (PYEBPF_INTERVAL, PYEBPF_PYROSCOPE_URL, PYEBPF_LABELS=k=v,k=v, ...). Needs \
            root, or CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE, plus CAP_DAC_READ_SEARCH to \
            open interpreters installed behind private directories (see the systemd unit in \
            packaging/pyebpf-agent.service; on Kubernetes, the DaemonSet in \
            packaging/kubernetes/daemonset.yaml).",
        after_help = "Examples:\n  \
            sudo pyebpf agent --pyroscope http://pyroscope:4040\n  \
            sudo pyebpf agent --otlp http://otel-collector:4318        OTLP profiles to a Collector\n  \
            sudo pyebpf agent --listen 0.0.0.0:7071 --label env=prod     scraped by Parca or Alloy\n  \
            go tool pprof http://localhost:7071/debug/pprof/profile?seconds=10"
    )]
    Agent(AgentArgs),
}

#[derive(Args, Debug)]
pub struct AgentArgs {
    /// Samples per second per CPU. 19 Hz, as Parca Agent's default: low enough to cost well
    /// under 1% of a core on a busy host, and a prime, so it doesn't beat in step with the
    /// 10 ms, 100 ms and 1 s timers applications run on.
    #[arg(short, long, value_name = "HZ", default_value_t = 19, env = "PYEBPF_RATE",
          value_parser = clap::value_parser!(u64).range(1..=1_000))]
    pub rate: u64,
    /// Random subsampling against aliasing: the CPU clock fires N times faster and one tick in
    /// N, chosen at random, is sampled, so the mean rate stays --rate but no periodic work can
    /// hide between samples. 1 turns it off.
    #[arg(long, value_name = "N", default_value_t = 4, env = "PYEBPF_SUBSAMPLE",
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub subsample: u32,
    /// Milliseconds a new program runs before the agent looks at it. Inspecting a process
    /// costs about half a millisecond of CPU; programs that exit sooner (shell helpers,
    /// short-lived interpreters started dozens of times a second) are never inspected, and
    /// the others lose their first moments' samples (at 19 Hz, rarely more than one).
    #[arg(long, value_name = "MS", default_value_t = 100, env = "PYEBPF_FIRST_LOOK_MS",
          value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub first_look_ms: u64,
    /// Seconds per profile: every interval, each service's samples become one profile.
    #[arg(long, value_name = "SECONDS", default_value_t = 15.0, env = "PYEBPF_INTERVAL",
          value_parser = parse_interval)]
    pub interval: f64,
    /// Address to serve /debug/pprof/profile, /metrics and /healthz on; `off` to serve
    /// nothing.
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:7071",
        env = "PYEBPF_LISTEN"
    )]
    pub listen: String,
    /// Push each profile to this Grafana Pyroscope (or Grafana Cloud Profiles) URL, e.g.
    /// http://pyroscope:4040.
    #[arg(long, value_name = "URL", env = "PYEBPF_PYROSCOPE_URL")]
    pub pyroscope: Option<String>,
    /// Send each window as OTLP profiles (OTLP/HTTP, protobuf, gzip) to an OpenTelemetry
    /// Collector or another OTLP receiver: URL is its base (http://collector:4318; the path
    /// /v1development/profiles is appended). Without URL: OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT,
    /// else OTEL_EXPORTER_OTLP_ENDPOINT, else http://localhost:4318. Honours
    /// OTEL_EXPORTER_OTLP_[PROFILES_]HEADERS, _COMPRESSION (gzip|none), _TIMEOUT (ms), and
    /// OTEL_RESOURCE_ATTRIBUTES (the host's attributes, e.g. k8s.node.name=NODE). Can run
    /// alongside --pyroscope.
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "",
          env = "PYEBPF_OTLP_URL", hide_env_values = true)]
    pub otlp: Option<String>,
    /// Basic auth for --pyroscope, USER:PASSWORD (prefer the environment variable: flags show
    /// in `ps`).
    #[arg(
        long,
        value_name = "USER:PASSWORD",
        env = "PYEBPF_BASIC_AUTH",
        hide_env_values = true
    )]
    pub basic_auth: Option<String>,
    /// Tenant for --pyroscope, sent as X-Scope-OrgID (multi-tenant Pyroscope, Grafana Cloud).
    #[arg(long, value_name = "ID", env = "PYEBPF_TENANT")]
    pub tenant: Option<String>,
    /// Add label NAME=VALUE to every profile (repeatable); overrides the agent's own labels,
    /// service_name included.
    #[arg(
        long = "label",
        value_name = "NAME=VALUE",
        env = "PYEBPF_LABELS",
        value_delimiter = ','
    )]
    pub labels: Vec<String>,
    /// Stop after this many seconds, pushing the last window (default: run until SIGTERM or
    /// Ctrl-C).
    #[arg(short, long, value_name = "SECONDS", value_parser = parse_duration)]
    pub duration: Option<f64>,
    /// On shutdown, how long to keep pushing what is queued before giving up on it.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0, env = "PYEBPF_FLUSH_TIMEOUT",
          value_parser = parse_duration)]
    pub flush_timeout: f64,
    #[command(flatten)]
    pub asyncio: AsyncArgs,
    #[command(flatten)]
    pub native: NativeArgs,
    #[command(flatten)]
    pub debug: DebugArgs,
}

#[derive(Args, Debug)]
pub struct DumpArgs {
    /// The process to look at (repeat for several).
    #[arg(short = 'p', long = "pid", value_name = "PID", required = true)]
    pub pids: Vec<u32>,
    /// Print one JSON document: {window: {ms, limit_ms, sampler, setup_ms, samples, reads},
    /// processes: [{pid, command, python_version, binary, threads: [{tid, name, name_source
    /// (threading|os), os_name, state, os_state, holds_gil, frames: [{function, file, line,
    /// locals?}], truncated, consistent, source (interrupt|userspace), taken_ms, attempts,
    /// error?, native?}], tasks?}]}.
    #[arg(long)]
    pub json: bool,
    /// Show each frame's arguments and local variables. int, float, bool, None, str and bytes
    /// are shown by value (str and bytes cut at 80 characters); anything else as
    /// `<type at 0x...>`. Values are read from the target's memory: no code runs in it, so no
    /// `__repr__` is called. An idle thread's variables are read with its frames; a running
    /// thread's after its frames were taken (marked so), and not at all for a frame that
    /// returned meanwhile.
    #[arg(long)]
    pub locals: bool,
    /// Also show the asyncio task tree (CPython 3.14+): every task, its name, the coroutine
    /// stack it is suspended in, and the tasks awaiting it, as `python -m asyncio pstree PID`
    /// shows them, read from the task lists the interpreter publishes for debuggers. The task
    /// running on a CPU gets its stack from the sampler, like its thread. Older versions don't
    /// publish them: their threads are shown, with a note.
    #[arg(long = "async")]
    pub asyncio: bool,
    /// The longest the sampling window may last, in milliseconds. It ends as soon as every
    /// thread has its stack (usually within a few milliseconds); a thread still running without
    /// a sample then is copied from memory and checked by its frames.
    #[arg(long, value_name = "MS", default_value_t = 100, alias = "native-window",
          value_parser = clap::value_parser!(u64).range(10..=10_000))]
    pub window: u64,
    #[command(flatten)]
    pub native: NativeArgs,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// Print the same facts as one JSON document: {ready, host: [{id, status, text, fix}],
    /// processes: {supported, unsupported, unreadable}}.
    #[arg(long)]
    pub json: bool,
}

/// What `record` and `top` sample, and how often.
#[derive(Args, Debug)]
pub struct TargetArgs {
    /// Only this process (repeat for several). Default: every Python process on the host,
    /// including ones that start later (and, for `record`, not with a COMMAND to launch).
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Samples per second per CPU.
    #[arg(short, long, value_name = "HZ", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=20_000))]
    pub rate: u64,
}

#[derive(Args, Debug)]
pub struct RecordArgs {
    #[command(flatten)]
    pub targets: TargetArgs,
    /// Stop after this many seconds (default: until Ctrl-C, SIGTERM or SIGHUP, or until the
    /// targets exit; each writes the profile).
    #[arg(short, long, value_name = "SECONDS", value_parser = parse_duration)]
    pub duration: Option<f64>,
    /// Where to write the profile (default: pyebpf-<date>-<time>.<format extension>). Checked
    /// before sampling starts; if writing still fails at the end, the profile is saved to a
    /// file in the temporary directory and the message names it (exit code 1).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Flamegraph)]
    pub format: Format,
    /// Split stacks by thread (adds a `thread <tid> (<name>)` frame).
    #[arg(long)]
    pub threads: bool,
    /// Also sample threads that are off-CPU (sleeping, waiting for I/O, a lock or the GIL).
    /// Their stacks are read from each interpreter's thread list several times a second and
    /// count once per sampling period the thread was not on a CPU, so every thread gets about
    /// rate × seconds samples whether it ran or waited. Off-CPU stacks end in an `<idle>`
    /// frame, so in a flame graph waiting sits on top of the function that waits, next to its
    /// CPU time. A runnable thread that only waited for a free CPU is not idle.
    #[arg(long)]
    pub idle: bool,
    /// Keep only samples whose thread holds the GIL: threads running C code that released it
    /// (hashing, compression, I/O) or waiting for it are left out. Builds that do not expose
    /// their GIL are named in a warning.
    #[arg(long)]
    pub gil: bool,
    /// Also write the recording's counters (samples, errors, drops, kernel and userspace
    /// costs) as JSON to this file, for scripts and benchmarks.
    #[arg(long, value_name = "FILE")]
    pub stats_json: Option<PathBuf>,
    #[command(flatten)]
    pub asyncio: AsyncArgs,
    #[command(flatten)]
    pub native: NativeArgs,
    #[command(flatten)]
    pub debug: DebugArgs,
    /// Program to launch and profile; pyebpf exits with its exit code.
    #[arg(last = true, value_name = "COMMAND", conflicts_with = "pids")]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct TopArgs {
    #[command(flatten)]
    pub targets: TargetArgs,
    /// Seconds between refreshes; %Own and %Total cover the last interval.
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0, value_parser = parse_duration)]
    pub delay: f64,
    /// Print one plain-text snapshot after one interval and exit.
    #[arg(long, conflicts_with = "iterations")]
    pub once: bool,
    /// Print N plain-text snapshots, one per interval, and exit.
    #[arg(short = 'n', long = "iterations", value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub iterations: Option<u64>,
    /// Aggregate by line instead of by function (key `l` toggles in the live view).
    #[arg(long)]
    pub lines: bool,
    /// Column to sort by (keys 1-7 change it in the live view).
    #[arg(long, value_enum, default_value_t = TopSort::Own)]
    pub sort: TopSort,
    /// Also count asyncio tasks (CPython 3.14+): each task a sample ran in, and every task
    /// awaiting it, is a `<task NAME>` row whose %Total is the time spent on its behalf (see
    /// `record --async`; asyncio's default `Task-<n>` names show the task's coroutine).
    #[arg(long = "async")]
    pub async_tasks: bool,
    #[command(flatten)]
    pub debug: DebugArgs,
}

/// `--async`, shared by `record` and `agent`.
#[derive(Args, Debug, Default)]
pub struct AsyncArgs {
    /// Show asyncio tasks: a sample taken while a task runs ends, below that task's
    /// coroutine, in a `<task NAME>` frame, then the coroutine frames of the task awaiting it
    /// (`await task`, `gather`, a `TaskGroup`'s parent), its own `<task …>` frame, and so on
    /// down to the root task, instead of the event loop's frames. So each task's CPU time sits
    /// under the chain of tasks that wait for it. A task the program named shows its name; one
    /// asyncio named (`Task-<n>`) shows its coroutine, `<task AsyncTree.recurse>`, so that
    /// thousands of short-lived tasks add up instead of each being a stack of its own. Needs
    /// CPython 3.14+, whose `_asyncio` module publishes its task layout (`.AsyncioDebug`); a
    /// process on 3.11-3.13 is named once and sampled without task frames. The kernel captures
    /// the chain with each sample that runs a task (a few reads per task: see BENCHMARKS.md),
    /// so tasks that finish within milliseconds are still shown as they were.
    #[arg(long = "async")]
    pub async_tasks: bool,
    /// With --async, give each sample taken while a task ran a `task_name` label holding the
    /// task's own name (`Task-<n>` for asyncio's default names), in pprof and OTLP (a sample
    /// attribute) and in what the agent exports. Off by default: a program that makes many tasks makes as many
    /// label values, and the profile grows with them.
    #[arg(long, requires = "async_tasks")]
    pub task_labels: bool,
}

/// `--native` and its settings, shared by `record`, `agent` and `dump`.
#[derive(Args, Debug, Default)]
pub struct NativeArgs {
    /// Show native (C, C++, Rust) frames with the Python ones, in call order: a numpy kernel,
    /// zlib, a C extension or libc appears under the Python line that called it. The user stack
    /// is captured in the same interrupt as the Python frames; nothing is paused. Each
    /// eval-loop frame is replaced by the Python frames it ran; interpreter plumbing between
    /// them is dropped. Costs more per sample than Python frames alone (see BENCHMARKS.md).
    #[arg(long)]
    pub native: bool,
    /// How `--native` captures user stacks: `auto` walks frame pointers in the kernel for
    /// interpreters built with them (3.15 by default, PEP 831; told from the first
    /// instructions of the eval loop and two small functions), and copies the top of the
    /// stack, unwound with the binaries' CFI, for the others. A frame-pointer sample taken in
    /// a library without frame pointers carries a stack copy instead.
    #[arg(
        long,
        value_enum,
        default_value = "auto",
        value_name = "HOW",
        requires = "native"
    )]
    pub native_unwind: crate::native::Unwind,
    /// KiB of user stack copied per sample in stack-copy mode (1-32). More reaches deeper C
    /// stacks and costs more per sample; a stack that goes deeper ends in a
    /// `<native stack truncated>` frame.
    #[arg(long, value_name = "KIB", default_value_t = 16, requires = "native",
          value_parser = clap::value_parser!(u32).range(1..=32))]
    pub native_stack: u32,
}

impl NativeArgs {
    /// The driver's setting: `None` without `--native`.
    pub fn options(&self) -> Option<crate::native::NativeOptions> {
        self.native.then_some(crate::native::NativeOptions {
            unwind: self.native_unwind,
            stack_bytes: self.native_stack << 10,
        })
    }
}

/// `--debug-bpf`, shared by the commands that load the BPF programs.
#[derive(Args, Debug, Default)]
pub struct DebugArgs {
    /// Log the BPF programs' own diagnostics, as warnings on stderr (through aya-log): frames
    /// whose owner the layout doesn't know, failed reads of target memory with their
    /// addresses, limits hit, layouts that don't validate. `--debug-bpf=reads,limits` picks
    /// kinds. Without the flag the BPF programs loaded carry no log code at all.
    #[arg(long, value_enum, value_delimiter = ',', num_args = 0.., require_equals = true, value_name = "KINDS")]
    pub debug_bpf: Option<Vec<BpfDiagnostic>>,
}

impl DebugArgs {
    /// The kinds asked for, as the kernel's bits: every kind when none is named.
    pub fn bits(&self) -> crate::bpf::DebugBpf {
        debug_bpf(&self.debug_bpf)
    }
}

/// Kinds of BPF-side diagnostics (`--debug-bpf`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BpfDiagnostic {
    /// Frames whose owner code the layout does not know.
    Owners,
    /// Failed reads of target or kernel memory, with their addresses.
    Reads,
    /// Limits hit: frames recorded, thread walks, chunk copies, deep digest, ring buffer.
    Limits,
    /// Layouts that don't validate.
    Layout,
}

fn debug_bpf(kinds: &Option<Vec<BpfDiagnostic>>) -> crate::bpf::DebugBpf {
    use crate::bpf::DebugBpf;
    match kinds {
        None => DebugBpf::OFF,
        Some(kinds) if kinds.is_empty() => DebugBpf::ALL,
        Some(kinds) => DebugBpf(kinds.iter().fold(0, |bits, kind| {
            bits | match kind {
                BpfDiagnostic::Owners => DebugBpf::OWNERS,
                BpfDiagnostic::Reads => DebugBpf::READS,
                BpfDiagnostic::Limits => DebugBpf::LIMITS,
                BpfDiagnostic::Layout => DebugBpf::LAYOUT,
            }
        })),
    }
}

/// Columns of `pyebpf top`, in display order.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopSort {
    /// %Own: share of the last interval's samples with the function as the leaf.
    Own,
    /// %Total: share of the last interval's samples with the function anywhere on the stack.
    Total,
    /// Cumulative CPU time as the leaf, since `top` started.
    OwnTime,
    /// Cumulative CPU time anywhere on the stack, since `top` started.
    TotalTime,
    /// Function name.
    Function,
    /// Process id.
    Process,
    /// Thread name (`threading`'s, else the OS's).
    Thread,
}

fn parse_interval(s: &str) -> Result<f64, String> {
    match parse_duration(s)? {
        v if (1.0..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "`{s}`: the interval must be between 1 and 3600 seconds"
        )),
    }
}

fn parse_duration(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("`{s}` is not a positive number of seconds")),
    }
}
