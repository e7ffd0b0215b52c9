//! `pyebpf agent`: continuous, system-wide profiling for a fleet. A sink on the one driver.
//!
//! - [`window`]: every `--interval`, one pprof profile per service, labelled for its series.
//! - [`push`]: those profiles to Grafana Pyroscope through a bounded, retrying queue.
//! - [`server`]: `/debug/pprof/profile` (pull: Parca, Alloy, `go tool pprof`), `/metrics`
//!   ([`metrics`]) and `/healthz`, answered by the sampling loop itself.
//!
//! Cost: the agent samples at 19 Hz with random subsampling (see `AgentArgs::rate`), drains the
//! kernel's ring buffer once a second, and does nothing per sample but aggregate; profiles are
//! encoded once per interval. BENCHMARKS.md has the measured CPU and memory.

pub(crate) mod metrics;
pub mod push;
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
use push::{PushConfig, PushTarget, Pusher};
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
    let listen = match args.listen.as_str() {
        "off" | "none" | "" => None,
        addr => Some(addr.to_string()),
    };
    if target.is_none() && listen.is_none() {
        return Err(UsageError(
            "with --listen off and no --pyroscope URL the profiles would go nowhere: give one of them".into(),
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
    runtime.block_on(agent(args, operator, target, listen, hostname))
}

async fn agent(
    args: AgentArgs,
    operator: OperatorLabels,
    target: Option<PushTarget>,
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
    let pusher = match target {
        Some(target) => {
            let pusher =
                Pusher::new(target, PushConfig::default()).context("starting the push thread")?;
            eprintln!(
                "pyebpf agent: pushing every {}s to {}",
                args.interval,
                pusher.endpoint()
            );
            Some(pusher)
        }
        None => None,
    };
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
        windows: pusher
            .is_some()
            .then(|| Windows::new(hostname, operator.clone())),
        operator,
        pusher,
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
    if let Some(pusher) = &sink.pusher {
        let left = pusher.flush(Instant::now() + Duration::from_secs_f64(args.flush_timeout));
        if left.requests > 0 {
            eprintln!(
                "pyebpf agent: {} profiles ({} bytes) could not be pushed before the {}s flush timeout",
                left.requests, left.bytes, args.flush_timeout
            );
        }
        let st = pusher.stats();
        eprintln!(
            "pyebpf agent: stopped ({stop:?}); {} samples, {} profiles pushed, {} failed, {} dropped",
            session.stats().samples,
            st.ok,
            st.failed_rejected + st.failed_exhausted,
            st.dropped_queue_full + st.dropped_too_large
        );
    } else {
        eprintln!(
            "pyebpf agent: stopped ({stop:?}); {} samples",
            session.stats().samples
        );
    }
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
    /// Only with a push target: without one, nobody would read them.
    windows: Option<Windows>,
    operator: OperatorLabels,
    pusher: Option<Pusher>,
    pulls: Vec<Pull>,
    requests: Option<mpsc::UnboundedReceiver<Request>>,
    metrics: metrics::Metrics,
    bpf_stats: bool,
    pull_served: u64,
    pull_refused: u64,
}

impl Agent {
    /// Cuts every service's window and queues it for push.
    fn cut_windows(&mut self) {
        let (Some(windows), Some(pusher)) = (self.windows.as_mut(), self.pusher.as_ref()) else {
            return;
        };
        for cut in windows.cut(self.rate_hz) {
            let summary = format!("{} ({} samples)", cut.service, cut.samples);
            pusher.push(cut.push_request(), summary);
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
            let (pprof, _) =
                pull.window
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
            push: self.pusher.as_ref().map(Pusher::stats),
            pull_served: self.pull_served,
            pull_refused: self.pull_refused,
            async_tasks: session.async_stats(),
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
