//! `pyebpf dump`: one look at every thread of the named processes, then exit.
//!
//! Every dump runs a short sampling window on the one driver (`window`): threads on a CPU get
//! their stacks from the BPF sampler's interrupt, threads off CPU are copied from userspace and
//! checked (`userspace`), and the window ends as soon as every thread has its stack. What was
//! captured is then named and given its variables (`assemble`). `--native` keeps each sampled
//! thread's native frames (`native`); `--async` adds the asyncio task tree (`tasks`).

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::cli::DumpArgs;
use crate::discovery::{inspect_requested, Caches, PythonProcess};
use crate::driver::{self, Options, Scope};
use crate::python::asyncio::AsyncError;
use crate::session::Session;
use crate::symbolize::Symbolizer;

mod assemble;
pub(crate) mod native;
pub(crate) mod snapshot;
pub(crate) mod tasks;
mod text;
mod userspace;
mod window;

use assemble::Wanted;
use snapshot::ProcessDump;
use window::{Capture, WindowSink};

/// Sampling rate of the window, per CPU: a thread on a CPU is caught within about a
/// millisecond.
const WINDOW_RATE_HZ: u64 = 997;

/// How the window went, for `--json`.
#[derive(Clone, Debug, serde::Serialize)]
struct WindowReport {
    /// Milliseconds from the window opening until every thread had its stack (or it ended).
    ms: f64,
    /// `--window`: the longest it may take.
    limit_ms: u64,
    /// The BPF sampler ran (else every stack was copied from userspace).
    sampler: bool,
    /// Milliseconds spent loading the sampler before the window opened.
    setup_ms: f64,
    /// Samples the sampler delivered.
    samples: u64,
    /// Remote reads of the userspace copies.
    reads: u64,
}

pub(crate) fn run(args: DumpArgs) -> Result<i32> {
    let started = Instant::now();
    if args.native.native {
        crate::privileges::check()?;
    }
    // Every pid is checked before anything is printed: a typo gets one line and exit 2.
    let caches = Caches::default();
    let mut procs: Vec<PythonProcess> = Vec::with_capacity(args.pids.len());
    for &pid in &args.pids {
        if procs.iter().any(|p| p.pid == pid) {
            continue;
        }
        procs.push(inspect_requested(pid, &caches)?);
    }
    let window = Duration::from_millis(args.window);
    let native = args.native.options();
    let mut capture = Capture::new(procs.clone(), false, args.locals);
    let sampler = match crate::privileges::missing().is_empty() {
        true => start_sampler(&procs, native, args.asyncio),
        false => Err(anyhow::anyhow!(
            "it needs CAP_BPF and CAP_PERFMON (missing: {})",
            crate::privileges::missing().join(", ")
        )),
    };
    let setup = started.elapsed();
    match sampler {
        Ok(mut session) => {
            capture.sampling = true;
            let options = Options {
                scope: Scope::Pids(procs.iter().map(|p| p.pid).collect()),
                rate_hz: WINDOW_RATE_HZ,
                debug: Default::default(),
                gil: true,
                idle: false,
                duration: Some(window),
                end_with_targets: true,
                subsample: 1,
                drain_interval: window.min(driver::DRAIN_INTERVAL),
                first_look: Duration::ZERO,
                native,
                async_tasks: false,
                task_labels: false,
            };
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            capture.open();
            let mut sink = WindowSink {
                capture: &mut capture,
                native: native.is_some(),
            };
            runtime.block_on(driver::run(&options, &mut session, &mut sink))?;
        }
        Err(e) => {
            eprintln!(
                "pyebpf: note: without the BPF sampler ({e:#}), running threads are copied \
                 from memory and checked by their frames"
            );
            capture.open();
            window::run_unsampled(&mut capture, window);
        }
    }
    let closed = capture.settled_at.unwrap_or_else(Instant::now);
    capture.finish();
    let report = WindowReport {
        ms: (closed
            .saturating_duration_since(capture.opened)
            .as_secs_f64()
            * 1e4)
            .round()
            / 10.0,
        limit_ms: args.window,
        sampler: capture.sampling,
        setup_ms: (setup.as_secs_f64() * 1e4).round() / 10.0,
        samples: capture.sample_count,
        reads: capture.reads,
    };
    let wanted = Wanted {
        locals: args.locals,
        native: native.is_some(),
        window,
    };
    let mut symbols = Symbolizer::default();
    let mut dumps: Vec<ProcessDump> = Vec::with_capacity(capture.procs.len());
    for p in &capture.procs {
        let mut dump = assemble::process(&capture, p, &mut symbols, wanted);
        if let Some(e) = &dump.error {
            eprintln!(
                "pyebpf: error: {} {}: {e}",
                p.proc.command,
                p.proc.id_label()
            );
        }
        if args.asyncio {
            let samples: Vec<&window::Sampled> = capture
                .samples
                .iter()
                .filter(|((pid, _), _)| *pid == p.proc.pid)
                .map(|(_, s)| s)
                .collect();
            match tasks::tasks(&p.proc, &mut symbols, args.locals, &samples) {
                Ok(tasks) => dump.tasks = Some(tasks),
                Err(e) => {
                    let proc = &p.proc;
                    let why = match e {
                        AsyncError::Unsupported { .. } => "--async needs CPython 3.14+ \
                            (earlier versions publish no asyncio task layout)"
                            .to_string(),
                        other => format!("no task tree: {other}"),
                    };
                    eprintln!(
                        "pyebpf: pid {} ({}, CPython {}): {why}; its threads are shown \
                         without the task tree",
                        proc.pid, proc.command, proc.layout.version
                    );
                }
            }
        }
        dumps.push(dump);
    }
    let out = match args.json {
        true => {
            let doc = serde_json::json!({ "window": report, "processes": dumps });
            serde_json::to_string_pretty(&doc)? + "\n"
        }
        false => text::render(&dumps),
    };
    // A reader that stopped early (`| head`) has what it wanted.
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            return Err(anyhow::Error::new(e).context("writing the dump"))
        }
        _ => {}
    }
    let any = dumps.iter().any(|d| d.threads.iter().any(assemble::shown));
    Ok(if any { 0 } else { 1 })
}

/// The sampler, loaded and watching `procs` (`--native` stacks, GIL flags, and with `--async`
/// each sample's running task).
fn start_sampler(
    procs: &[PythonProcess],
    native: Option<crate::native::NativeOptions>,
    asyncio: bool,
) -> Result<Session> {
    let mut session = Session::start_brief(WINDOW_RATE_HZ, native)?;
    session.want_gil();
    // Only where there are tasks to capture: for an older interpreter the session would say
    // (again) that it has none.
    if asyncio && procs.iter().any(|p| p.layout.coroutines.is_some()) {
        session.capture_running_tasks();
    }
    for p in procs {
        session.add(p.pid)?;
    }
    Ok(session)
}
