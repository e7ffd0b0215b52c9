//! The one sampling loop. Every command that samples (`record`, `top`, `agent`) runs it and
//! plugs in a [`Sink`]; the loop owns everything else.
//!
//! What the driver owns: the [`Session`] (BPF programs, maps, symbolization), the two ring
//! buffers (samples; exec/exit notifications), every timer (drain and housekeeping every
//! [`DRAIN_INTERVAL`], rescans, exec retries, `--idle` passes, the sink's own period), the
//! launched command of `record -- CMD`, and the signals that end a run (Ctrl-C, SIGTERM,
//! SIGHUP). What a sink sees: resolved samples, processes coming and going, its own period,
//! its input (top's keys), and how the run ended. Nothing of the loop.
//!
//! Why one loop: two copies had drifted apart (`top` never took the process events, so an
//! interpreter that re-exec'd under it stayed "watched" with no kernel entry; `record` alone
//! stopped cleanly on SIGTERM). Wake-ups are what sampling costs at low rates, so every
//! periodic job shares the one drain tick; only a sink's period and exec retries have timers
//! of their own.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::io::unix::AsyncFd;

use crate::bpf::DebugBpf;
use crate::discovery::{DiscoveryError, PythonProcess};
use crate::procfs::alive;
use crate::session::{Resolved, Session};
use crate::UsageError;

/// How often the driver drains the sample ring buffer and does its housekeeping. The kernel
/// wakes userspace only when the buffer fills up, for a young process's samples and for
/// samples running code new to the sampler (what must be read before it may be freed);
/// everything else can wait, and every wake-up costs a context switch.
pub(crate) const DRAIN_INTERVAL: Duration = Duration::from_millis(250);
/// System-wide runs look for new interpreters this often (exec events find most of them at
/// once; the scan catches processes that `dlopen` libpython late or whose event was lost).
const RESCAN_INTERVAL: Duration = Duration::from_secs(1);
/// How long a launched command may take to become a recognizable interpreter.
const CHILD_DISCOVERY_TIMEOUT: Duration = Duration::from_secs(5);

/// What a run profiles.
#[derive(Clone, Debug)]
pub(crate) enum Scope {
    /// Every Python process on the host, including ones that start later.
    Host,
    /// These processes (and what they exec into).
    Pids(Vec<u32>),
    /// A command the driver launches.
    Command(Vec<String>),
}

/// How a run is set up.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    pub scope: Scope,
    pub rate_hz: u64,
    pub debug: DebugBpf,
    /// Have the kernel flag samples whose thread holds the GIL (`--gil`).
    pub gil: bool,
    /// Off-CPU stacks from the thread lists (`--idle`).
    pub idle: bool,
    /// End after this long.
    pub duration: Option<Duration>,
    /// With [`Scope::Pids`]: end when every target has exited (`top` keeps showing them).
    pub end_with_targets: bool,
    /// Random subsampling: perf events this many times faster, one in this many kept (1:
    /// a fixed sampling clock). See the kernel's `SUBSAMPLE`.
    pub subsample: u32,
    /// How often samples are drained and housekeeping runs ([`DRAIN_INTERVAL`] by default).
    pub drain_interval: Duration,
    /// System-wide: how long after its exec a new program is first looked at (see
    /// `Lifecycle::delay_first_look`); zero for `record` and `top`.
    pub first_look: Duration,
    /// Native frames with the Python ones (`--native`).
    pub native: Option<crate::native::NativeOptions>,
    /// `<task NAME>` frames and awaiter chains for asyncio programs (`--async`).
    pub async_tasks: bool,
    /// With `async_tasks`: each task sample's running task's raw name as its `task_name`
    /// label (`--task-labels`).
    pub task_labels: bool,
}

/// Whether a sink wants the run to go on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    Continue,
    Stop,
}

/// Why a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// `--duration` passed.
    Duration,
    /// Every `-p` target exited.
    TargetsExited,
    /// The launched command exited with this code.
    CommandExited(i32),
    /// The launched command never became an interpreter pyebpf can profile; its exit code
    /// (at least 2) is what pyebpf should exit with. The reason was printed.
    CommandNotProfiled(i32),
    /// The sink asked to stop (`top`'s `q`, its snapshot count).
    Sink,
    /// Ctrl-C (SIGINT), which the terminal also delivered to a launched command.
    Interrupted,
    /// SIGTERM or SIGHUP: sent to pyebpf alone, so it is passed on to a launched command.
    Signal(nix::sys::signal::Signal),
}

/// Where the driver's samples and process changes go: `record`'s aggregator, `top`'s table,
/// the agent's windows.
pub(crate) trait Sink {
    /// What [`Sink::input`] delivers (top's key events); `Infallible` for sinks without input.
    type Input;

    /// One sample, from the kernel or (`--idle`) from a thread list, and its process.
    fn sample(&mut self, sample: &Resolved, process: &PythonProcess);

    /// The watched set changed: `added` were registered (their samples follow), `gone` are no
    /// longer watched (their queued samples were delivered first).
    fn processes(&mut self, _session: &Session, _added: &[u32], _gone: &[u32]) {}

    /// A process could not be profiled (unsupported version, unreadable runtime): once each.
    fn warn(&mut self, problem: &DiscoveryError) {
        log::warn!("{problem}");
    }

    /// How often [`Sink::on_period`] runs; `None`: never.
    fn period(&self) -> Option<Duration> {
        None
    }

    /// The sink's own periodic work (refresh a table, cut a window), after the samples so far
    /// were delivered.
    fn on_period(&mut self, _session: &Session) -> Result<Flow> {
        Ok(Flow::Continue)
    }

    /// Input to wait on (taken once, when the run starts).
    fn input(&mut self) -> Option<tokio::sync::mpsc::UnboundedReceiver<Self::Input>> {
        None
    }

    /// One input, with the session as it is now (the agent's `/metrics` reads its counters).
    fn on_input(&mut self, _session: &Session, _input: Self::Input) -> Result<Flow> {
        Ok(Flow::Continue)
    }
}

/// How a run ended, and what the caller still has to finish.
pub(crate) struct Ended {
    pub stop: Stop,
    pub elapsed: Duration,
    /// The launched command, still running when the run ended for another reason: wait for
    /// it with [`Ended::wait_command`] once the outputs are written.
    command: Option<tokio::process::Child>,
}

impl Ended {
    /// Waits for a launched command that outlived the run; its exit code. A command stopped
    /// by SIGTERM/SIGHUP did not get that signal (it was sent to pyebpf), so it is passed on.
    pub(crate) async fn wait_command(&mut self, what: &str) -> Option<i32> {
        match self.stop {
            Stop::CommandExited(code) | Stop::CommandNotProfiled(code) => return Some(code),
            _ => {}
        }
        let child = self.command.as_mut()?;
        if let (Stop::Signal(sig), Some(pid)) = (self.stop, child.id()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
        }
        eprintln!("pyebpf: recording stopped; waiting for `{what}` to exit");
        child.wait().await.ok().map(exit_code_of)
    }
}

/// Starts the session for `options`: the BPF programs loaded and the first targets
/// registered. Separate from [`run`] so that a caller can look at the session first.
pub(crate) fn start(options: &Options) -> Result<Session> {
    let mut session = Session::start(
        options.rate_hz,
        options.debug,
        options.subsample,
        options.native,
    )?;
    if options.gil {
        session.want_gil();
    }
    if options.idle {
        session.enable_idle(options.rate_hz);
    }
    if options.async_tasks {
        session.enable_async(options.task_labels);
    }
    session.delay_first_look(options.first_look);
    if let Scope::Pids(pids) = &options.scope {
        for &pid in pids {
            session.add(pid)?;
        }
    }
    Ok(session)
}

/// Runs until a stop condition; the sink sees everything sampled until then, the last
/// queued samples included.
pub(crate) async fn run<S: Sink>(
    options: &Options,
    session: &mut Session,
    sink: &mut S,
) -> Result<Ended> {
    // Service managers stop with SIGTERM and a closed terminal sends SIGHUP: both end a run
    // like Ctrl-C, with its output written. Installed before anything slow.
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigterm = signal(SignalKind::terminate()).context("handling SIGTERM")?;
    let mut sighup = signal(SignalKind::hangup()).context("handling SIGHUP")?;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);

    let system_wide = matches!(options.scope, Scope::Host);
    let mut watched = Watched::default();
    if system_wide {
        session.scan(&mut |e| sink.warn(e));
    }
    let mut command = match &options.scope {
        Scope::Command(argv) => Some(spawn(argv)?),
        _ => None,
    };
    if let Some(child) = command.as_mut() {
        let pid = child.id().context("launched command has no pid")?;
        if let Err(e) = await_interpreter(session, pid).await {
            eprintln!("pyebpf: error: {e:#}");
            let status = child.wait().await.ok().map(exit_code_of);
            return Ok(Ended {
                stop: Stop::CommandNotProfiled(status.unwrap_or(2).max(2)),
                elapsed: Duration::ZERO,
                command: None,
            });
        }
    }
    watched.sync(session, sink);

    let events = session.take_events().context("ring buffer already taken")?;
    // SAFETY: the ring buffer owns its map fd, which stays open and unchanged while it lives.
    let mut events = unsafe { AsyncFd::register(events) }
        .map_err(std::io::Error::from)
        .context("polling the ring buffer")?;
    let proc_events = session
        .take_proc_events()
        .context("lifecycle ring buffer already taken")?;
    // SAFETY: as above.
    let mut proc_events = unsafe { AsyncFd::register(proc_events) }
        .map_err(std::io::Error::from)
        .context("polling the lifecycle ring buffer")?;

    let started = Instant::now();
    let deadline = options.duration.map(|d| started + d);
    let mut tick = tokio::time::interval(options.drain_interval);
    let mut idle_tick = session.idle_period().map(every);
    let mut period = sink.period().map(|p| {
        let mut t = every(p);
        t.reset();
        t
    });
    let mut input = sink.input();
    let mut last_scan = Instant::now();
    let stop = loop {
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        let exec_due = session.next_exec_due();
        let exec_due = async {
            match exec_due {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        let idle_due = tick_of(idle_tick.as_mut());
        let period_due = tick_of(period.as_mut());
        let input_due = async {
            match input.as_mut() {
                Some(rx) => match rx.recv().await {
                    Some(event) => event,
                    None => std::future::pending().await,
                },
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            guard = events.readable_mut() => {
                let mut guard = guard.context("waiting for samples")?;
                // Cleared before draining: a sample queued during the drain wakes us again.
                guard.clear_ready();
                drain_samples(guard.get_inner_mut(), session, sink);
            }
            guard = proc_events.readable_mut() => {
                let mut guard = guard.context("waiting for process events")?;
                // Cleared before draining, not after: the kernel wakes the reader only when
                // the buffer was empty, so an event queued between the last read and a later
                // clear would wait for the next one.
                guard.clear_ready();
                // Samples first: an exiting process's last samples are already queued.
                drain_samples(events.get_mut(), session, sink);
                drain_proc_events(guard.get_inner_mut(), session, system_wide);
                session.poll_execs(&mut |e| sink.warn(e));
                watched.sync(session, sink);
            }
            _ = exec_due => {
                session.poll_execs(&mut |e| sink.warn(e));
                watched.sync(session, sink);
            }
            _ = idle_due => {
                // Samples first: the threads the kernel saw on a CPU are not idle.
                drain_samples(events.get_mut(), session, sink);
                session.idle_pass(&mut |s, p| sink.sample(s, p));
            }
            _ = tick.tick() => {
                drain_samples(events.get_mut(), session, sink);
                // Whatever the lifecycle buffer holds, in case a wake-up was missed.
                drain_proc_events(proc_events.get_mut(), session, system_wide);
                session.poll_execs(&mut |e| sink.warn(e));
                session.reap();
                if system_wide && last_scan.elapsed() >= RESCAN_INTERVAL {
                    session.scan(&mut |e| sink.warn(e));
                    last_scan = Instant::now();
                }
                watched.sync(session, sink);
                if let Some(child) = command.as_mut() {
                    if let Ok(Some(status)) = child.try_wait() {
                        break Stop::CommandExited(exit_code_of(status));
                    }
                }
                if let (Scope::Pids(pids), true) = (&options.scope, options.end_with_targets) {
                    // Exit events empty the watch list; /proc has the last word (an exec'd
                    // target is briefly unwatched until its new image is inspected).
                    if session.watched().next().is_none() && pids.iter().all(|&p| !alive(p)) {
                        log::info!("every target exited");
                        break Stop::TargetsExited;
                    }
                }
            }
            _ = period_due => {
                drain_samples(events.get_mut(), session, sink);
                if sink.on_period(session)? == Flow::Stop {
                    break Stop::Sink;
                }
            }
            event = input_due => {
                if sink.on_input(session, event)? == Flow::Stop {
                    break Stop::Sink;
                }
            }
            _ = &mut ctrl_c => break Stop::Interrupted,
            _ = sigterm.recv() => break Stop::Signal(nix::sys::signal::Signal::SIGTERM),
            _ = sighup.recv() => break Stop::Signal(nix::sys::signal::Signal::SIGHUP),
            _ = sleep => break Stop::Duration,
        }
    };
    // Whatever the kernel already queued belongs to this run.
    drain_samples(events.get_mut(), session, sink);
    drain_proc_events(proc_events.get_mut(), session, false);
    session.flush_bpf_logs();
    log::debug!("run ended: {stop:?}");
    Ok(Ended {
        stop,
        elapsed: started.elapsed(),
        command,
    })
}

/// The pids a sink has been told about, to tell it about changes.
#[derive(Default)]
struct Watched {
    pids: HashSet<u32>,
    added: Vec<u32>,
    gone: Vec<u32>,
    /// The registry's generation at the last sync.
    generation: Option<u64>,
}

impl Watched {
    fn sync<S: Sink>(&mut self, session: &Session, sink: &mut S) {
        // Most wake-ups change nothing: diff the sets only when the registry moved.
        let generation = Some(session.watched_generation());
        if generation == self.generation {
            return;
        }
        self.generation = generation;
        self.added.clear();
        self.gone.clear();
        let now: HashSet<u32> = session.watched().map(|p| p.pid).collect();
        self.added.extend(now.difference(&self.pids));
        self.gone.extend(self.pids.difference(&now));
        if !self.added.is_empty() || !self.gone.is_empty() {
            self.pids = now;
            sink.processes(session, &self.added, &self.gone);
        }
    }
}

fn every(period: Duration) -> tokio::time::Interval {
    let mut t = tokio::time::interval(period);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}

async fn tick_of(interval: Option<&mut tokio::time::Interval>) {
    match interval {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Symbolizes every sample queued in the ring buffer and hands it to the sink.
fn drain_samples<S: Sink>(
    ring: &mut aya::maps::RingBuf<aya::maps::MapData>,
    session: &mut Session,
    sink: &mut S,
) {
    while let Some(item) = ring.next() {
        session.process_record(&item, &mut |s, p| sink.sample(s, p));
    }
}

/// Hands every queued exec/exit notification to the session.
fn drain_proc_events(
    ring: &mut aya::maps::RingBuf<aya::maps::MapData>,
    session: &mut Session,
    system_wide: bool,
) {
    while let Some(item) = ring.next() {
        session.handle_proc_event(&item, system_wide);
    }
}

fn spawn(command: &[String]) -> Result<tokio::process::Child> {
    let (program, args) = command.split_first().context("empty command")?;
    tokio::process::Command::new(program)
        .args(args)
        .spawn()
        .map_err(|e| UsageError(format!("cannot run `{program}`: {e}")).into())
}

/// Waits until the launched process has exec'd an interpreter and registers it.
async fn await_interpreter(session: &mut Session, pid: u32) -> Result<()> {
    let started = Instant::now();
    let exe = || std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    loop {
        let before = exe();
        match session.add(pid) {
            Ok(_) => return Ok(()),
            Err(e) => {
                // Before exec the child is still a copy of pyebpf: not Python yet.
                let after = exe();
                let still_us = after == std::env::current_exe().ok();
                if !alive(pid) || (!still_us && started.elapsed() > CHILD_DISCOVERY_TIMEOUT) {
                    return Err(e.into());
                }
                // A launcher (`chroot`, `env`) that exec'd while it was being inspected leaves
                // files that vanished mid-read: look again at what it became.
                if !still_us && !e.is_benign() && before == after {
                    return Err(e.into());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn exit_code_of(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}
