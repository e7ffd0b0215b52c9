//! `pyebpf record`: sample until Ctrl-C, a duration, or the targets' exit, then write a profile.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::cli::RecordArgs;
use crate::discovery::PythonProcess;
use crate::driver::{self, Flow, Options, Scope, Sink, Stop};
use crate::output::otlp::ProcessFacts;
use crate::output::{self, destination};
use crate::session::{Resolved, Session};

mod stats;

/// Processes `-f otlp` keeps facts of.
const MAX_FACTS: usize = 1 << 16;

use crate::aggregate::stacks::Aggregator;
use crate::aggregate::Profile;
use stats::{stats_json, MapReport};

pub(crate) fn run(mut args: RecordArgs) -> Result<i32> {
    if args.asyncio.task_labels && !args.format.has_labels() {
        return Err(crate::UsageError(format!(
            "--task-labels: the {} format has no sample labels; use -f pprof or -f otlp, or drop it",
            clap::ValueEnum::to_possible_value(&args.format)
                .map_or_else(String::new, |v| v.get_name().to_string())
        ))
        .into());
    }
    crate::check::preflight(&args.targets.pids)?;
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

/// `record`'s sink: samples into the aggregator; once a second, the progress line and the map
/// sizes `--stats-json` reports.
struct Recorder {
    aggregator: Aggregator,
    /// `-f otlp`: what each process's resource says beyond its samples' labels, kept from
    /// when it was watched (it may have exited by the end).
    facts: Option<BTreeMap<u32, ProcessFacts>>,
    maps: Option<MapReport>,
    progress: bool,
    started: Instant,
}

impl Sink for Recorder {
    type Input = std::convert::Infallible;

    fn sample(&mut self, sample: &Resolved, process: &PythonProcess) {
        self.aggregator.add(sample, process);
    }

    fn processes(&mut self, session: &Session, _added: &[u32], _gone: &[u32]) {
        self.aggregator.note_processes(session);
        if let Some(facts) = self.facts.as_mut() {
            for p in session.watched() {
                if facts.len() >= MAX_FACTS && !facts.contains_key(&p.pid) {
                    break;
                }
                facts.entry(p.pid).or_insert_with(|| ProcessFacts {
                    executable: std::fs::read_link(format!("/proc/{}/exe", p.pid))
                        .ok()
                        .and_then(|e| Some(e.file_name()?.to_string_lossy().into_owned()))
                        .unwrap_or_else(|| p.identity.comm.clone()),
                    python_version: p.identity.python_version.clone(),
                });
            }
        }
    }

    fn period(&self) -> Option<Duration> {
        (self.progress || self.maps.is_some()).then_some(Duration::from_secs(1))
    }

    fn on_period(&mut self, session: &Session) -> Result<Flow> {
        if let Some(maps) = self.maps.as_mut() {
            maps.observe(session);
        }
        if self.progress {
            let st = session.stats();
            eprint!(
                "\rpyebpf: {:.0}s, {} samples from {} processes ({} truncated) - Ctrl-C to stop ",
                self.started.elapsed().as_secs_f64(),
                st.samples,
                session.watched().count(),
                st.truncated
            );
        }
        Ok(Flow::Continue)
    }
}

async fn record(args: RecordArgs) -> Result<i32> {
    let scope = if !args.command.is_empty() {
        Scope::Command(args.command.clone())
    } else if !args.targets.pids.is_empty() {
        Scope::Pids(args.targets.pids.clone())
    } else {
        Scope::Host
    };
    let multi = match &scope {
        Scope::Host => true,
        Scope::Pids(pids) => pids.len() > 1,
        Scope::Command(_) => false,
    };
    let options = Options {
        scope,
        rate_hz: args.targets.rate,
        debug: args.debug.bits(),
        gil: args.gil,
        idle: args.idle,
        duration: args.duration.map(Duration::from_secs_f64),
        end_with_targets: true,
        subsample: 1,
        drain_interval: driver::DRAIN_INTERVAL,
        first_look: Duration::ZERO,
        native: args.native.options(),
        async_tasks: args.asyncio.async_tasks,
        task_labels: args.asyncio.task_labels,
    };
    let mut session = driver::start(&options)?;
    let mut aggregator = Aggregator::new(Profile::default(), multi, args.threads)
        .with_labels(args.format.has_labels());
    aggregator.gil_only = args.gil;
    let mut recorder = Recorder {
        aggregator,
        facts: (args.format == output::Format::Otlp).then(BTreeMap::new),
        maps: args
            .stats_json
            .is_some()
            .then(|| MapReport::start(&session)),
        progress: std::io::stderr().is_terminal(),
        started: Instant::now(),
    };
    let mut ended = driver::run(&options, &mut session, &mut recorder).await?;
    if let Stop::CommandNotProfiled(code) = ended.stop {
        return Ok(code);
    }
    if recorder.progress {
        eprintln!();
    }
    let Recorder {
        aggregator,
        maps,
        facts,
        ..
    } = recorder;
    let facts = facts.unwrap_or_default();
    let mut saved = finish(&args, &session, aggregator, &facts, ended.elapsed)?;
    if let (Some(path), Some(mut maps)) = (&args.stats_json, maps) {
        maps.finish(&session);
        let text = stats_json(&session, ended.elapsed, &maps)?;
        saved &= report_save(destination::save(
            path,
            text.as_bytes(),
            "stats.json",
            "the stats",
        ))?;
    }
    let command_status = ended.wait_command(&args.command.join(" ")).await;
    if !saved {
        // The data is safe in the fallback file, but not where it was asked for: scripts must
        // notice.
        return Ok(1);
    }
    Ok(command_status.unwrap_or(0))
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
    facts: &BTreeMap<u32, ProcessFacts>,
    elapsed: Duration,
) -> Result<bool> {
    let gil_dropped = aggregator.gil_dropped;
    let mut profile = aggregator.profile;
    let start = std::time::SystemTime::now()
        .checked_sub(elapsed)
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
    profile.timing = crate::aggregate::Timing {
        start_unix_ns: start.map_or(0, |t| t.as_nanos() as u64),
        duration_ns: elapsed.as_nanos() as u64,
        period_ns: 1_000_000_000 / args.targets.rate.max(1),
    };
    let st = session.stats();
    let kernel = session.kernel_stats();
    let processes = session.profiled() as usize;
    let truncated_pct = if st.samples > 0 {
        100.0 * st.truncated as f64 / st.samples as f64
    } else {
        0.0
    };
    let errors = kernel.read_errors + st.unknown_frames + st.malformed_samples;
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
    if let Some(n) = session.native_stats() {
        let native = st.native_merged + st.native_partial + st.native_failed + st.native_missing;
        let pct = |x: u64| 100.0 * x as f64 / native.max(1) as f64;
        eprintln!(
            "pyebpf: native stacks: {:.1}% merged whole, {:.1}% merged until the native stack \
             ended, {:.1}% not merged (Python frames kept), {:.1}% without a native part; \
             {} frame-pointer walks, {} stack copies ({} where a frame-pointer chain broke), {} \
             unwinding failures",
            pct(st.native_merged),
            pct(st.native_partial),
            pct(st.native_failed),
            pct(st.native_missing),
            kernel.native_frame_pointers,
            kernel.native_stack_copies,
            kernel.native_fp_fallbacks,
            n.unwind_failures,
        );
    }
    if let Some(a) = session.async_stats() {
        let pct = |x: u64| 100.0 * x as f64 / a.task_samples.max(1) as f64;
        eprintln!(
            "pyebpf: async: {} of {} processes with task frames; {} samples ran a task: {:.1}% \
             rewritten with <task> frames, {:.1}% kept (coroutine frame not in the stack), \
             {:.1}% kept (task unreadable); chains cut: {} too deep, {} cycles; {} task reads, \
             {} cache evictions",
            a.processes,
            a.processes + a.processes_unsupported + a.processes_pending,
            a.task_samples,
            pct(a.rewritten),
            pct(a.frame_not_found),
            pct(a.task_unreadable),
            a.truncated_depth,
            a.truncated_cycle,
            a.cache_misses,
            a.cache_evictions,
        );
    }
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
            "pyebpf: --idle: {} off-CPU samples from {} stack reads in {} passes ({} walks skipped over the per-pass cap, {} stacks moved while copied, {} runnable threads waiting for a CPU not counted, {} errors)",
            idle.samples, idle.stacks, idle.passes, idle.skipped, idle.changed, idle.runnable, idle.errors
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
    output::write(
        &profile,
        args.format,
        &title,
        &|pid| facts.get(&pid).cloned(),
        &mut bytes,
    )
    .context("rendering the profile")?;
    let saved = destination::save(&path, &bytes, args.format.extension(), "the profile");
    if let Ok(destination::Saved::AtPath) = saved {
        eprintln!("pyebpf: {summary}; wrote {}", path.display());
        return Ok(true);
    }
    eprintln!("pyebpf: {summary}");
    report_save(saved)
}
