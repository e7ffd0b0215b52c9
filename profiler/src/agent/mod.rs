//! `pyebpf agent`: continuous, system-wide profiling for a fleet. A sink on the one driver.
//!
//! - [`window`]: every `--interval`, one pprof profile per service, labelled for its series.
//! - [`export`]: those profiles to the backends (Grafana Pyroscope, an OpenTelemetry
//!   Collector), each through its own bounded, retrying queue.
//! - [`server`]: `/debug/pprof/profile` (pull: Parca, Alloy, `go tool pprof`), `/metrics`
//!   ([`metrics`]) and `/healthz`, answered by the sampling loop itself.
//!
//! Cost: the agent samples at 19 Hz with random subsampling (see `AgentArgs::rate`), drains the
//! kernel's ring buffer once a second, and does nothing per sample but aggregate; profiles are
//! encoded once per interval. BENCHMARKS.md has the measured CPU and memory.

pub(crate) mod export;
pub(crate) mod metrics;

/// The Pyroscope push under the names it had before the exporters shared one queue
/// (`profiler/tests/agent_push.rs` drives it over real HTTP).
pub mod push {
    pub use super::export::pyroscope::{PushTarget, TargetError};
    pub use super::export::queue::{
        AttemptErrors, Backoff, ExportQueue as Pusher, ExportStats as PushStats, Leftover,
        QueueConfig as PushConfig, Queued,
    };
}
pub(crate) mod server;
pub(crate) mod window;

use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use tokio::sync::{mpsc, oneshot};

use crate::cli::AgentArgs;
use crate::discovery::PythonProcess;
use crate::driver::{self, Flow, Options, Scope, Sink};
use crate::identity::{self, OperatorLabels};
use crate::session::{Resolved, Session};
use crate::UsageError;
use export::otlp::{Otlp, OtlpSettings};
use export::pyroscope::{PushTarget, Pyroscope};
use export::queue::QueueConfig;
use export::Export;
use server::{Filter, Request};
use window::{Window, Windows};

/// Pulls being collected at once; more are refused (503) until one ends.
pub(crate) const MAX_PULLS: usize = 4;
/// Distinct (labels, stack) keys of one pull's profile.
const MAX_PULL_STACKS: usize = 65_536;
/// How often the agent checks for a window or a pull that is due.
const PERIOD: Duration = Duration::from_secs(1);
/// The agent's drain interval: the kernel still wakes it early when the ring buffer fills.
const AGENT_DRAIN: Duration = Duration::from_secs(1);

pub fn run(args: AgentArgs) -> Result<i32> {
    let operator =
        OperatorLabels::parse(&args.labels).map_err(|e| UsageError(format!("--label: {e}")))?;
    let target = args
        .pyroscope
        .as_deref()
        .map(|url| PushTarget::new(url, args.basic_auth.as_deref(), args.tenant.as_deref()))
        .transpose()
        .map_err(|e| UsageError(e.to_string()))?;
    if target.is_none() && (args.basic_auth.is_some() || args.tenant.is_some()) {
        return Err(UsageError(
            "--basic-auth and --tenant are for --pyroscope URL, which is not set".into(),
        )
        .into());
    }
    let otlp = args
        .otlp
        .as_deref()
        .map(|flag| OtlpSettings::new(flag, &|name| std::env::var(name).ok()))
        .transpose()
        .map_err(|e| UsageError(e.to_string()))?;
    let listen = match args.listen.as_str() {
        "off" | "none" | "" => None,
        addr => Some(addr.to_string()),
    };
    if target.is_none() && otlp.is_none() && listen.is_none() {
        return Err(UsageError(
            "with --listen off and no --pyroscope or --otlp URL the profiles would go nowhere: give one of them".into(),
        )
        .into());
    }
    crate::check::preflight(&[])?;
    let hostname = identity::hostname().unwrap_or_else(|e| {
        log::warn!("cannot read the host name ({e}); profiles carry no hostname label");
        String::new()
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let backends = Backends {
        pyroscope: target,
        otlp,
    };
    runtime.block_on(agent(args, operator, backends, listen, hostname))
}

/// Where the windows go.
struct Backends {
    pyroscope: Option<PushTarget>,
    otlp: Option<OtlpSettings>,
}

async fn agent(
    args: AgentArgs,
    operator: OperatorLabels,
    backends: Backends,
    listen: Option<String>,
    hostname: String,
) -> Result<i32> {
    let requests = match &listen {
        Some(addr) => {
            let (rx, local) = server::serve(addr).await.map_err(|e| {
                UsageError(format!(
                    "--listen {addr}: {e}; choose another address, or --listen off"
                ))
            })?;
            eprintln!("pyebpf agent: serving /debug/pprof/profile, /metrics and /healthz on http://{local}");
            Some(rx)
        }
        None => None,
    };
    let mut exports = Vec::new();
    if let Some(target) = backends.pyroscope {
        exports.push(
            Export::start(Box::new(Pyroscope), target.http(), QueueConfig::default())
                .context("starting the Pyroscope export thread")?,
        );
    }
    if let Some(settings) = backends.otlp {
        let config = QueueConfig {
            timeout: settings.timeout,
            ..QueueConfig::default()
        };
        let otlp = Otlp::new(&settings, &hostname, &operator);
        exports.push(
            Export::start(Box::new(otlp), settings.http(), config)
                .context("starting the OTLP export thread")?,
        );
    }
    for export in &exports {
        eprintln!(
            "pyebpf agent: pushing every {}s to {}",
            args.interval,
            export.endpoint()
        );
    }
    let options = Options {
        scope: Scope::Host,
        rate_hz: args.rate,
        debug: args.debug.bits(),
        gil: false,
        idle: false,
        duration: args.duration.map(Duration::from_secs_f64),
        end_with_targets: false,
        subsample: args.subsample,
        drain_interval: AGENT_DRAIN,
        first_look: Duration::from_millis(args.first_look_ms),
        native: args.native.options(),
        async_tasks: args.asyncio.async_tasks,
        task_labels: args.asyncio.task_labels,
    };
    let mut session = driver::start(&options)?;
    // The kernel counts the sampler's run time only while someone holds this fd.
    let bpf_stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .map_err(|e| log::info!("no BPF run-time statistics ({e}): /metrics shows no bpf CPU"))
        .ok();
    let mut sink = Agent {
        rate_hz: args.rate,
        interval: Duration::from_secs_f64(args.interval),
        windows: (!exports.is_empty()).then(|| Windows::new(hostname, operator.clone())),
        operator,
        exports,
        pulls: Vec::new(),
        requests,
        metrics: metrics::Metrics::default(),
        bpf_stats: bpf_stats.is_some(),
        pull_served: 0,
        pull_refused: 0,
    };
    let ended = driver::run(&options, &mut session, &mut sink).await?;
    let stop = ended.stop;
    // The last window and every pull in progress get what was collected: nothing is lost.
    sink.cut_windows();
    let pending = sink.finish_pulls(true);
    if pending > 0 {
        // Let the server write those answers.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The exporters flush side by side: each has its own thread, all share one deadline.
    let deadline = Instant::now() + Duration::from_secs_f64(args.flush_timeout);
    let left = Export::flush_all(&sink.exports, deadline);
    let mut pushed = Vec::new();
    for (export, left) in sink.exports.iter().zip(left) {
        if left.requests > 0 {
            eprintln!(
                "pyebpf agent: {} profiles ({} bytes) could not be pushed to {} before the {}s flush timeout",
                left.requests, left.bytes, export.name(), args.flush_timeout
            );
        }
        let st = export.stats().queue;
        pushed.push(format!(
            "{}: {} requests pushed, {} failed, {} dropped",
            export.name(),
            st.ok,
            st.failed_rejected + st.failed_exhausted,
            st.dropped_queue_full + st.dropped_too_large
        ));
    }
    eprintln!(
        "pyebpf agent: stopped ({stop:?}); {} samples{}{}",
        session.stats().samples,
        if pushed.is_empty() { "" } else { "; " },
        pushed.join("; ")
    );
    drop(bpf_stats);
    Ok(0)
}

/// A `/debug/pprof/profile` being collected.
struct Pull {
    filter: Filter,
    until: Instant,
    started: SystemTime,
    started_at: Instant,
    window: Window,
    reply: oneshot::Sender<Result<Vec<u8>, String>>,
}

/// The agent's sink: windows for push, pulls for scrapes, counters for `/metrics`.
struct Agent {
    rate_hz: u64,
    interval: Duration,
    /// Only with an exporter: without one, nobody would read them.
    windows: Option<Windows>,
    operator: OperatorLabels,
    exports: Vec<Export>,
    pulls: Vec<Pull>,
    requests: Option<mpsc::UnboundedReceiver<Request>>,
    metrics: metrics::Metrics,
    bpf_stats: bool,
    pull_served: u64,
    pull_refused: u64,
}

impl Agent {
    /// Cuts every service's window and hands it to every exporter.
    fn cut_windows(&mut self) {
        let Some(windows) = self.windows.as_mut() else {
            return;
        };
        let cuts = windows.cut(self.rate_hz);
        if cuts.is_empty() {
            return;
        }
        for export in &mut self.exports {
            export.export(&cuts);
        }
    }

    /// Answers the pulls whose time is up (all of them with `all`); how many were answered.
    fn finish_pulls(&mut self, all: bool) -> usize {
        let now = Instant::now();
        let (done, running): (Vec<Pull>, Vec<Pull>) = std::mem::take(&mut self.pulls)
            .into_iter()
            .partition(|p| all || now >= p.until || p.reply.is_closed());
        self.pulls = running;
        let answered = done.len();
        for pull in done {
            if pull.reply.is_closed() {
                continue;
            }
            let pprof = pull
                .window
                .pprof(pull.started, pull.started_at.elapsed(), self.rate_hz);
            if pull.reply.send(Ok(pprof)).is_ok() {
                self.pull_served += 1;
            }
        }
        answered
    }

    fn snapshot(&self, session: &Session) -> metrics::Snapshot {
        let st = session.stats();
        let k = session.kernel_stats();
        let (user, system) = metrics::own_cpu();
        let windows = self.windows.as_ref();
        metrics::Snapshot {
            samples: st.samples,
            truncated: st.truncated,
            dropped: vec![
                ("ring_buffer", k.ringbuf_drops),
                (
                    "services_limit",
                    windows.map_or(0, |w| w.services_over_limit),
                ),
                ("stack_limit", windows.map_or(0, |w| w.stacks_over_limit)),
            ],
            errors: vec![
                ("read", k.read_errors),
                ("unknown_frame", st.unknown_frames),
                ("malformed_sample", st.malformed_samples),
                ("proc_events_lost", k.proc_event_drops),
            ],
            processes: session.watched().count() as u64,
            processes_profiled: session.profiled(),
            services: windows.map_or(0, |w| w.services() as u64),
            windows: windows.map_or(0, |w| w.cut),
            cpu_user_seconds: user,
            cpu_system_seconds: system,
            cpu_bpf_seconds: self
                .bpf_stats
                .then(|| session.program_runtime().0 as f64 / 1e9),
            resident_bytes: metrics::own_rss(),
            exports: self.exports.iter().map(Export::stats).collect(),
            pull_served: self.pull_served,
            pull_refused: self.pull_refused,
            async_tasks: session.async_stats(),
            identity: session.identity_stats(),
        }
    }
}

impl Sink for Agent {
    type Input = Request;

    fn sample(&mut self, sample: &Resolved, process: &PythonProcess) {
        if let Some(windows) = self.windows.as_mut() {
            windows.add(sample, process);
        }
        for pull in &mut self.pulls {
            let wanted = pull.filter.pid.is_none_or(|pid| pid == process.pid)
                && pull
                    .filter
                    .service
                    .as_deref()
                    .is_none_or(|s| s == window::service_of(&self.operator, process));
            if wanted {
                pull.window.add(sample, process);
            }
        }
    }

    fn period(&self) -> Option<Duration> {
        Some(PERIOD)
    }

    fn on_period(&mut self, _session: &Session) -> Result<Flow> {
        // The period ticks once a second, a little late or early: a window within half a
        // tick of its interval is due now, not a whole tick later.
        if self
            .windows
            .as_ref()
            .is_some_and(|w| w.age() + PERIOD / 2 >= self.interval)
        {
            self.cut_windows();
        }
        self.finish_pulls(false);
        Ok(Flow::Continue)
    }

    fn input(&mut self) -> Option<mpsc::UnboundedReceiver<Request>> {
        self.requests.take()
    }

    fn on_input(&mut self, session: &Session, request: Request) -> Result<Flow> {
        match request {
            Request::Health(reply) => {
                let _ = reply.send(());
            }
            Request::Metrics(reply) => {
                let _ = reply.send(self.metrics.render(&self.snapshot(session)));
            }
            Request::Profile {
                seconds,
                filter,
                reply,
            } => {
                self.finish_pulls(false);
                if self.pulls.len() >= MAX_PULLS {
                    self.pull_refused += 1;
                    let _ = reply.send(Err(format!(
                        "busy: {MAX_PULLS} profiles are being collected; try again when one ends"
                    )));
                } else {
                    self.pulls.push(Pull {
                        filter,
                        until: Instant::now() + Duration::from_secs(seconds),
                        started: SystemTime::now(),
                        started_at: Instant::now(),
                        window: Window::new(MAX_PULL_STACKS),
                        reply,
                    });
                }
            }
        }
        Ok(Flow::Continue)
    }
}
