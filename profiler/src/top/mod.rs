//! `pyebpf top`: a live table of the Python functions using the most CPU, across every
//! interpreter on the host (or the `-p` ones).
//!
//! The driver here runs one sampling [`Session`] on a current-thread tokio runtime, like
//! `record`: ring-buffer records are symbolized and counted into a [`table::Table`] as they
//! arrive; every 200 ms exited processes are dropped (and, system-wide, the host is rescanned
//! for new interpreters once a second); every `--delay` the table's interval ends and becomes a
//! [`Snapshot`], which is drawn by [`render`] (a terminal) or printed by [`text`] (a pipe, or
//! `--once` / `-n N`).

pub(crate) mod render;
pub(crate) mod table;
pub(crate) mod text;

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::cli::TopArgs;
use crate::discovery::{DiscoveryError, PythonProcess};
use crate::driver::{self, Flow, Options, Scope, Sink};
use crate::procfs::alive;
use crate::python::code::CodeInfo;
use crate::python::thread_names::ThreadNames;
use crate::resolve::Mixed;
use crate::session::{PyFrame, Resolved, Session};
use table::{Counted, Granularity, Location, Row, Table, ViewOptions};

/// Everything one refresh shows.
#[derive(Clone, Debug, Default)]
pub(crate) struct Snapshot {
    pub counted: Counted,
    /// Length of the interval the percentages cover.
    pub interval: Duration,
    /// Since `top` started.
    pub elapsed: Duration,
    pub rate_hz: u64,
    /// Interpreters being sampled.
    pub processes: usize,
    /// Share of all CPU samples in the interval that were Python samples (None: no samples).
    pub python_share: Option<f64>,
    /// Samples lost because the ring buffer was full: in the interval, and since start.
    pub dropped_interval: u64,
    pub dropped_total: u64,
    /// Something to tell the user, such as "every target exited".
    pub note: Option<String>,
}

impl Snapshot {
    /// The one-line totals shown above the table.
    pub(crate) fn summary(&self) -> String {
        let secs = self.interval.as_secs_f64();
        let rate = if secs > 0.0 {
            self.counted.interval_samples as f64 / secs
        } else {
            0.0
        };
        let share = match self.python_share {
            Some(s) => format!("{:.1}%", 100.0 * s),
            None => "-".into(),
        };
        format!(
            "{rate:.0} samples/s, {} process{}, {} thread{}, {share} in Python, {} dropped ({} total), {:.0}s elapsed",
            self.processes,
            if self.processes == 1 { "" } else { "es" },
            self.counted.threads,
            if self.counted.threads == 1 { "" } else { "s" },
            self.dropped_interval,
            self.dropped_total,
            self.elapsed.as_secs_f64(),
        )
    }
}

/// Widths of the Process column's text (`pid command`) and of the Thread column's.
const PROCESS_WIDTH: usize = text::WIDTHS[4];
const THREAD_WIDTH: usize = text::WIDTHS[5];

/// `text` cut to `width` characters, with `…` where it was cut.
fn fit(text: &str, width: usize) -> String {
    match text.chars().count() > width {
        true => text.chars().take(width - 1).collect::<String>() + "…",
        false => text.to_string(),
    }
}

/// A row's cells in display order: %Own, %Total, OwnTime, TotalTime, Process, Thread,
/// Function.
pub(crate) fn cells(row: &Row, snap: &Snapshot) -> [String; 7] {
    let interval = snap.counted.interval_samples;
    [
        format!("{:.1}%", table::percent(row.own_interval, interval)),
        format!("{:.1}%", table::percent(row.total_interval, interval)),
        table::format_time(row.own, snap.rate_hz),
        table::format_time(row.total, snap.rate_hz),
        fit(&format!("{} {}", row.key.pid, row.command), PROCESS_WIDTH),
        fit(&row.thread, THREAD_WIDTH),
        row.key.label(),
    ]
}

pub(crate) fn run(args: TopArgs) -> Result<i32> {
    crate::check::preflight(&args.targets.pids)?;
    let interactive = std::io::stdout().is_terminal() && !args.once && args.iterations.is_none();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(top(args, interactive))
}

/// A code object (kept alive, so its address is not reused) and its interned qualname and file.
type Names = (Arc<CodeInfo>, Arc<str>, Arc<str>);

/// Resolved samples → table rows.
#[derive(Default)]
struct Counter {
    table: Table,
    /// Thread names for the Thread column.
    threads: ThreadNames,
    /// Threads named in this interval: each is looked up (its start time read from `/proc`)
    /// once per interval, not once per sample.
    named: std::collections::HashSet<(u32, u32)>,
    /// Interned names per code object; holding the `Arc` keeps its address from being reused.
    names: HashMap<*const CodeInfo, Names>,
    /// `--async`: interned `<task NAME>` rows by task name.
    tasks: HashMap<Arc<str>, Arc<str>>,
    frames: Vec<Location>,
}

impl Counter {
    fn add(&mut self, sample: &Resolved, process: &PythonProcess) {
        let command = process.command.as_str();
        if self.names.len() > 100_000 {
            self.names.clear();
        }
        if self.tasks.len() > 100_000 {
            self.tasks.clear();
        }
        self.frames.clear();
        match sample.mixed {
            // `--async`: the Python frames and `<task …>` rows of the rewritten stack.
            Some(mixed) => {
                for m in mixed {
                    match m {
                        Mixed::Python(i) => {
                            if let Some(frame) = sample.frames.get(*i) {
                                let location = self.location(frame);
                                self.frames.push(location);
                            }
                        }
                        Mixed::Task(name) => {
                            let function = self
                                .tasks
                                .entry(name.clone())
                                .or_insert_with(|| format!("<task {name}>").into())
                                .clone();
                            self.frames.push(Location {
                                function,
                                file: "".into(),
                                first_line: 0,
                                line: 0,
                            });
                        }
                        Mixed::Native { .. } | Mixed::Marker(_) => {}
                    }
                }
            }
            None => {
                for frame in sample.frames {
                    let location = self.location(frame);
                    self.frames.push(location);
                }
            }
        }
        if self.named.insert((sample.pid, sample.tid)) {
            let name = self.threads.name(process, sample.tid);
            self.table.name_thread(sample.pid, sample.tid, &name);
        }
        self.table
            .add(sample.pid, sample.tid, command, &self.frames);
    }

    /// A Python frame's row.
    fn location(&mut self, frame: &PyFrame) -> Location {
        {
            match &frame.code {
                Some(code) => {
                    let (_, function, file) =
                        self.names.entry(Arc::as_ptr(code)).or_insert_with(|| {
                            (
                                code.clone(),
                                code.qualname.as_str().into(),
                                code.filename.as_str().into(),
                            )
                        });
                    Location {
                        function: function.clone(),
                        file: file.clone(),
                        first_line: code.firstlineno,
                        line: frame.line,
                    }
                }
                None => Location {
                    function: "<unknown code object>".into(),
                    file: "".into(),
                    first_line: 0,
                    line: 0,
                },
            }
        }
    }
}

impl Counter {
    /// The rows of the interval; threads are named again in the next one.
    fn end_interval(&mut self) -> Counted {
        self.named.clear();
        self.table.end_interval()
    }
}

/// `top`'s sink: samples into the table; every `--delay`, a snapshot to the screen or stdout.
struct Viewer {
    counter: Counter,
    output: Output,
    /// System-wide (no `-p`).
    host: bool,
    pids: Vec<u32>,
    rate_hz: u64,
    started: Instant,
    interval_started: Instant,
    last_samples: u64,
    last_events: u64,
    last_drops: u64,
    delay: Duration,
    printed: u64,
}

impl Viewer {
    /// With `-p`: every target has exited.
    fn all_exited(&self) -> bool {
        !self.host && self.pids.iter().all(|&p| !alive(p))
    }

    /// Ends the current interval.
    fn snapshot(&mut self, session: &Session) -> Snapshot {
        let now = Instant::now();
        let kernel = session.kernel_stats();
        let samples = session.stats().samples;
        let events = kernel.events.saturating_sub(self.last_events);
        let python_share = (events > 0)
            .then(|| (samples.saturating_sub(self.last_samples) as f64 / events as f64).min(1.0));
        let snap = Snapshot {
            counted: self.counter.end_interval(),
            interval: now - self.interval_started,
            elapsed: now - self.started,
            rate_hz: self.rate_hz,
            processes: session.watched().count(),
            python_share,
            dropped_interval: kernel.ringbuf_drops.saturating_sub(self.last_drops),
            dropped_total: kernel.ringbuf_drops,
            note: self
                .all_exited()
                .then(|| "every target process exited".to_string()),
        };
        self.interval_started = now;
        self.last_samples = samples;
        self.last_events = kernel.events;
        self.last_drops = kernel.ringbuf_drops;
        snap
    }
}

impl Sink for Viewer {
    type Input = crossterm::event::Event;

    fn sample(&mut self, sample: &Resolved, process: &PythonProcess) {
        self.counter.add(sample, process);
    }

    fn processes(&mut self, _session: &Session, _added: &[u32], gone: &[u32]) {
        for &pid in gone {
            self.counter.table.forget(pid);
            self.counter.threads.forget(pid);
        }
    }

    fn warn(&mut self, problem: &DiscoveryError) {
        match &mut self.output {
            Output::Live(live) => live.warn(problem.to_string()),
            Output::Text { .. } => log::warn!("{problem}"),
        }
    }

    fn period(&self) -> Option<Duration> {
        Some(self.delay)
    }

    fn on_period(&mut self, session: &Session) -> Result<Flow> {
        let snap = self.snapshot(session);
        match &mut self.output {
            Output::Live(live) => live.update(snap)?,
            Output::Text { opts, limit } => {
                let mut out = std::io::stdout().lock();
                let written = out
                    .write_all(text::snapshot(&snap, opts).as_bytes())
                    .and_then(|_| out.flush());
                match written {
                    Ok(()) => {}
                    // The reader went away (`| head`): nothing more to do.
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(Flow::Stop),
                    Err(e) => return Err(e).context("writing to stdout"),
                }
                self.printed += 1;
                if limit.is_some_and(|n| self.printed >= n) {
                    return Ok(Flow::Stop);
                }
                if let Some(note) = &snap.note {
                    eprintln!("pyebpf: {note}");
                    return Ok(Flow::Stop);
                }
            }
        }
        Ok(Flow::Continue)
    }

    fn input(&mut self) -> Option<tokio::sync::mpsc::UnboundedReceiver<Self::Input>> {
        match &mut self.output {
            Output::Live(live) => Some(live.take_keys()),
            Output::Text { .. } => None,
        }
    }

    fn on_input(&mut self, _session: &Session, event: Self::Input) -> Result<Flow> {
        if let Output::Live(live) = &mut self.output {
            if live.handle(event)? == render::Action::Quit {
                return Ok(Flow::Stop);
            }
        }
        Ok(Flow::Continue)
    }
}

async fn top(args: TopArgs, interactive: bool) -> Result<i32> {
    let scope = if args.targets.pids.is_empty() {
        Scope::Host
    } else {
        Scope::Pids(args.targets.pids.clone())
    };
    let options = Options {
        scope,
        rate_hz: args.targets.rate,
        debug: args.debug.bits(),
        gil: false,
        idle: false,
        duration: None,
        // The table keeps showing what the targets did; the text mode ends on its own.
        end_with_targets: false,
        subsample: 1,
        drain_interval: driver::DRAIN_INTERVAL,
        first_look: Duration::ZERO,
        native: None,
        async_tasks: args.async_tasks,
        task_labels: false,
    };
    let mut session = driver::start(&options)?;
    let granularity = if args.lines {
        Granularity::Line
    } else {
        Granularity::Function
    };
    let opts = ViewOptions::new(granularity, args.sort.into());
    let delay = Duration::from_secs_f64(args.delay);
    // The terminal goes into raw mode after the programs loaded (their errors print plainly);
    // the driver catches SIGTERM and SIGHUP, so dropping `Live` always restores it.
    let output = if interactive {
        Output::Live(Box::new(render::Live::start(
            opts,
            delay,
            args.targets.rate,
        )?))
    } else {
        let limit = if args.once { Some(1) } else { args.iterations };
        Output::Text { opts, limit }
    };
    let now = Instant::now();
    let kernel = session.kernel_stats();
    let mut viewer = Viewer {
        counter: Counter::default(),
        output,
        host: args.targets.pids.is_empty(),
        pids: args.targets.pids.clone(),
        rate_hz: args.targets.rate,
        started: now,
        interval_started: now,
        last_samples: session.stats().samples,
        last_events: kernel.events,
        last_drops: kernel.ringbuf_drops,
        delay,
        printed: 0,
    };
    driver::run(&options, &mut session, &mut viewer).await?;
    Ok(0)
}

/// Where snapshots go.
enum Output {
    Live(Box<render::Live>),
    Text {
        opts: ViewOptions,
        /// Snapshots to print before exiting (`--once`, `-n`); `None` is until interrupted.
        limit: Option<u64>,
    },
}
