//! `pyebpf record`: sample until Ctrl-C, a duration, or the targets' exit, then write a profile.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::io::unix::AsyncFd;

use crate::cli::RecordArgs;
use crate::output::{self, destination};
use crate::session::{alive, Session};
use crate::UsageError;

mod stacks;
mod stats;

use stacks::Aggregator;
use stats::{stats_json, MapReport};

/// How long a launched command may take to become a recognizable interpreter.
const CHILD_DISCOVERY_TIMEOUT: Duration = Duration::from_secs(5);
/// System-wide recordings look for new interpreters this often.
const RESCAN_INTERVAL: Duration = Duration::from_secs(1);

/// What is being profiled.
enum Scope {
    Host,
    Pids(Vec<u32>),
    Child,
}

pub fn run(mut args: RecordArgs) -> Result<i32> {
    crate::check::preflight(&args.pids)?;
    // Before anything is recorded: a recording cannot be repeated, its output path can be fixed.
    let output = args
        .output
        .take()
        .unwrap_or_else(|| default_output(args.format));
    destination::probe(&output, "the profile")?;
    args.output = Some(output);
    if let Some(path) = &args.stats_json {
        destination::probe(path, "the stats")?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(record(args))
}

/// Why the recording loop ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// The duration passed, the targets exited, or the launched command ended.
    Done,
    /// Ctrl-C (SIGINT), which the terminal also delivered to a launched command.
    Interrupted,
    /// SIGTERM or SIGHUP: sent to pyebpf alone, so it is passed on to a launched command.
    Signal(nix::sys::signal::Signal),
}

async fn record(args: RecordArgs) -> Result<i32> {
    // Service managers stop with SIGTERM and a closed terminal sends SIGHUP: both end the
    // recording like Ctrl-C, with the profile written. Installed first, so that one arriving
    // while the sampler loads still ends the recording cleanly.
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigterm = signal(SignalKind::terminate()).context("handling SIGTERM")?;
    let mut sighup = signal(SignalKind::hangup()).context("handling SIGHUP")?;
    let scope = if !args.command.is_empty() {
        Scope::Child
    } else if !args.pids.is_empty() {
        Scope::Pids(args.pids.clone())
    } else {
        Scope::Host
    };
    let multi = match &scope {
        Scope::Host => true,
        Scope::Pids(pids) => pids.len() > 1,
        Scope::Child => false,
    };
    let mut session = Session::start(args.rate, args.debug.bits())?;
    if args.gil {
        session.want_gil();
    }
    if args.idle {
        session.enable_idle(args.rate);
    }
    let mut warn = |e: &crate::discovery::DiscoveryError| log::warn!("{e}");
    match &scope {
        Scope::Pids(pids) => {
            for &pid in pids {
                session.add(pid)?;
            }
        }
        Scope::Host => {
            session.scan(&mut warn);
        }
        Scope::Child => {}
    }
    let mut child = match &scope {
        Scope::Child => Some(spawn(&args.command)?),
        _ => None,
    };
    if let Some(child) = child.as_mut() {
        let pid = child.id().context("launched command has no pid")?;
        if let Err(e) = await_interpreter(&mut session, pid).await {
            eprintln!("pyebpf: error: {e:#}");
            let status = child_wait(child).await;
            return Ok(status.unwrap_or(2).max(2));
        }
    }

    let mut aggregator = Aggregator::new(multi, args.threads);
    aggregator.gil_only = args.gil;
    aggregator.note_processes(&session);
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
    let system_wide = matches!(scope, Scope::Host);
    let mut maps = MapReport::start(&session);
    let started = Instant::now();
    let deadline = args.duration.map(|d| started + Duration::from_secs_f64(d));
    // One timer for draining and housekeeping: every wake-up costs a context switch, which at
    // low sampling rates is most of what recording costs.
    let mut tick = tokio::time::interval(crate::session::DRAIN_INTERVAL);
    // Idle passes (`--idle`); without it the branch never fires.
    let mut idle_tick = session.idle_period().map(|period| {
        let mut t = tokio::time::interval(period);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    let mut last_scan = Instant::now();
    let progress = std::io::stderr().is_terminal();
    let mut last_progress = Instant::now();
    let mut child_status: Option<i32> = None;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut stop = Stop::Done;
    loop {
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
        let idle_due = async {
            match idle_tick.as_mut() {
                Some(t) => {
                    t.tick().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = idle_due => {
                // Samples first: the threads the kernel saw on a CPU are not idle.
                let ring = events.get_mut();
                drain_samples(ring, &mut session, &mut aggregator);
                session.idle_pass(&mut |s, cmd| aggregator.add(s, cmd));
            }
            guard = proc_events.readable_mut() => {
                let mut guard = guard.context("waiting for process events")?;
                // Readiness is cleared before draining, not after: the kernel wakes the reader
                // only when the buffer was empty, so an event queued between the last read and
                // a later clear would wait for the next one (seconds, for a quiet host).
                guard.clear_ready();
                // Samples first: an exiting process's last samples are already queued.
                let ring = events.get_mut();
                drain_samples(ring, &mut session, &mut aggregator);
                drain_proc_events(guard.get_inner_mut(), &mut session, system_wide);
                if !session.poll_execs(&mut warn).is_empty() {
                    aggregator.note_processes(&session);
                }
            }
            _ = exec_due => {
                if !session.poll_execs(&mut warn).is_empty() {
                    aggregator.note_processes(&session);
                }
            }
            guard = events.readable_mut() => {
                let mut guard = guard.context("waiting for samples")?;
                guard.clear_ready();
                let ring = guard.get_inner_mut();
                drain_samples(ring, &mut session, &mut aggregator);
            }
            _ = tick.tick() => {
                let ring = events.get_mut();
                drain_samples(ring, &mut session, &mut aggregator);
                // Whatever the lifecycle buffer holds, in case a wake-up was missed.
                drain_proc_events(proc_events.get_mut(), &mut session, system_wide);
                if !session.poll_execs(&mut warn).is_empty() {
                    aggregator.note_processes(&session);
                }
                session.reap();
                if last_scan.elapsed() >= RESCAN_INTERVAL {
                    if matches!(scope, Scope::Host) {
                        session.scan(&mut warn);
                        aggregator.note_processes(&session);
                    }
                    if args.stats_json.is_some() {
                        maps.observe(&session);
                    }
                    last_scan = Instant::now();
                }
                if let Some(c) = child.as_mut() {
                    if let Ok(Some(status)) = c.try_wait() {
                        child_status = Some(exit_code_of(status));
                        break;
                    }
                }
                if let Scope::Pids(pids) = &scope {
                    // Exit events empty the watch list; /proc has the last word (an exec'd
                    // target is briefly unwatched until its new image is inspected).
                    if session.watched().next().is_none() && pids.iter().all(|&p| !alive(p)) {
                        log::info!("every target exited");
                        break;
                    }
                }
                if progress && last_progress.elapsed() >= Duration::from_secs(1) {
                    let st = session.stats;
                    eprint!(
                        "\rpyebpf: {:.0}s, {} samples from {} processes ({} truncated) - Ctrl-C to stop ",
                        started.elapsed().as_secs_f64(),
                        st.samples,
                        session.watched().count(),
                        st.truncated
                    );
                    last_progress = Instant::now();
                }
            }
            _ = &mut ctrl_c => {
                stop = Stop::Interrupted;
                break;
            }
            _ = sigterm.recv() => {
                stop = Stop::Signal(nix::sys::signal::Signal::SIGTERM);
                break;
            }
            _ = sighup.recv() => {
                stop = Stop::Signal(nix::sys::signal::Signal::SIGHUP);
                break;
            }
            _ = sleep => break,
        }
    }
    if progress {
        eprintln!();
    }
    // Whatever the kernel already queued belongs to this recording.
    let ring = events.get_mut();
    drain_samples(ring, &mut session, &mut aggregator);
    drain_proc_events(proc_events.get_mut(), &mut session, false);
    session.flush_bpf_logs();
    let elapsed = started.elapsed();
    let mut saved = finish(&args, &session, aggregator, elapsed)?;
    if let Some(path) = &args.stats_json {
        maps.finish(&session);
        let text = stats_json(&session, elapsed, &maps)?;
        saved &= report_save(destination::save(
            path,
            text.as_bytes(),
            "stats.json",
            "the stats",
        ))?;
    }
    if let Some(c) = child.as_mut() {
        if child_status.is_none() {
            if let Stop::Signal(sig) = stop {
                // The command did not get the signal that stopped us; pass it on, or we
                // would wait for a program that was meant to stop too.
                if let Some(pid) = c.id() {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
                }
            }
            eprintln!(
                "pyebpf: recording stopped; waiting for `{}` to exit",
                args.command.join(" ")
            );
            child_status = child_wait(c).await;
        }
    }
    log::debug!("recording ended: {stop:?}");
    if !saved {
        // The data is safe in the fallback file, but not where it was asked for: scripts must
        // notice.
        return Ok(1);
    }
    Ok(child_status.unwrap_or(0))
}

/// Prints where [`destination::save`] put a file; `Ok(false)` when it had to fall back.
fn report_save(saved: Result<destination::Saved, destination::Lost>) -> Result<bool> {
    match saved? {
        destination::Saved::AtPath => Ok(true),
        destination::Saved::Fallback { error, fallback } => {
            eprintln!(
                "pyebpf: error: writing the output failed ({error}); it was saved to {} instead",
                fallback.display()
            );
            Ok(false)
        }
    }
}

/// Symbolizes and aggregates every sample queued in the ring buffer.
fn drain_samples(
    ring: &mut aya::maps::RingBuf<aya::maps::MapData>,
    session: &mut Session,
    aggregator: &mut Aggregator,
) {
    while let Some(item) = ring.next() {
        session.process_record(&item, &mut |s, cmd| aggregator.add(s, cmd));
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
    loop {
        match session.add(pid) {
            Ok(_) => return Ok(()),
            Err(e) => {
                // Before exec the child is still a copy of pyebpf: not Python yet.
                let still_us = std::fs::read_link(format!("/proc/{pid}/exe")).ok()
                    == std::env::current_exe().ok();
                if !alive(pid) || (!still_us && started.elapsed() > CHILD_DISCOVERY_TIMEOUT) {
                    return Err(e.into());
                }
                if !still_us && !e.is_benign() {
                    return Err(e.into());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn child_wait(child: &mut tokio::process::Child) -> Option<i32> {
    child.wait().await.ok().map(exit_code_of)
}

fn exit_code_of(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

fn default_output(format: output::Format) -> PathBuf {
    PathBuf::from(format!(
        "pyebpf-{}.{}",
        destination::timestamp(),
        format.extension()
    ))
}

/// Prints the summary and writes the profile. `Ok(false)`: it went to a fallback file.
fn finish(
    args: &RecordArgs,
    session: &Session,
    aggregator: Aggregator,
    elapsed: Duration,
) -> Result<bool> {
    let gil_dropped = aggregator.gil_dropped;
    let profile = aggregator.profile;
    let st = session.stats;
    let kernel = session.kernel_stats();
    let processes = session.seen.values().filter(|c| !c.is_empty()).count();
    let truncated_pct = if st.samples > 0 {
        100.0 * st.truncated as f64 / st.samples as f64
    } else {
        0.0
    };
    let errors = kernel.read_errors + st.unknown_frames + st.malformed_records;
    let summary = format!(
        "{} samples from {} process{} in {:.1}s, {:.1}% truncated, {} errors, {} dropped",
        st.samples,
        processes,
        if processes == 1 { "" } else { "es" },
        elapsed.as_secs_f64(),
        truncated_pct,
        errors,
        kernel.ringbuf_drops
    );
    let c = session.completion_stats();
    let deep = c.cache + c.chunks + c.truncated;
    if deep > 0 {
        let pct = |n: u64| 100.0 * n as f64 / (c.kernel + deep).max(1) as f64;
        eprintln!(
            "pyebpf: stacks: {:.1}% whole from the kernel, {:.1}% completed from cache, {:.1}% from stack-chunk copies, {:.1}% left truncated; {:.2} remote reads per sample",
            pct(c.kernel),
            pct(c.cache),
            pct(c.chunks),
            pct(c.truncated),
            crate::memory::REMOTE_READS.load(std::sync::atomic::Ordering::Relaxed) as f64 / st.samples.max(1) as f64
        );
    }
    if args.gil {
        eprintln!(
            "pyebpf: --gil: {} samples held the GIL, {} left out",
            profile.samples, gil_dropped
        );
    }
    if let Some(idle) = session.idle_stats() {
        eprintln!(
            "pyebpf: --idle: {} off-CPU samples from {} stack reads in {} passes ({} walks skipped over the per-pass cap, {} stacks moved while copied, {} errors)",
            idle.samples, idle.stacks, idle.passes, idle.skipped, idle.changed, idle.errors
        );
    }
    if profile.samples == 0 {
        eprintln!("pyebpf: {summary}; no Python samples collected, so no profile was written (was the target busy in Python?)");
        return Ok(true);
    }
    let path = args
        .output
        .clone()
        .unwrap_or_else(|| default_output(args.format));
    let title = format!("pyebpf record: {summary}");
    let mut bytes = Vec::new();
    output::write(&profile, args.format, &title, &mut bytes).context("rendering the profile")?;
    let saved = destination::save(&path, &bytes, args.format.extension(), "the profile");
    if let Ok(destination::Saved::AtPath) = saved {
        eprintln!("pyebpf: {summary}; wrote {}", path.display());
        return Ok(true);
    }
    eprintln!("pyebpf: {summary}");
    report_save(saved)
}
