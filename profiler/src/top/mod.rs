//! `pyebpf top`: a live table of the Python functions using the most CPU, across every
//! interpreter on the host (or the `-p` ones).
//!
//! The driver here runs one sampling [`Session`] on a current-thread tokio runtime, like
//! `record`: ring-buffer records are symbolized and counted into a [`table::Table`] as they
//! arrive; every 200 ms exited processes are dropped (and, system-wide, the host is rescanned
//! for new interpreters once a second); every `--delay` the table's interval ends and becomes a
//! [`Snapshot`], which is drawn by [`render`] (a terminal) or printed by [`text`] (a pipe, or
//! `--once` / `-n N`).

pub mod render;
pub mod table;
pub mod text;

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::io::unix::AsyncFd;

use crate::cli::TopArgs;
use crate::python::code::CodeInfo;
use crate::session::{alive, Resolved, Session};
use table::{Counted, Granularity, Location, Row, Table, ViewOptions};

/// Exited processes are dropped and new work is picked up this often.
const HOUSEKEEPING_INTERVAL: Duration = Duration::from_millis(200);
/// System-wide, the host is searched for new interpreters this often.
const RESCAN_INTERVAL: Duration = Duration::from_secs(1);

/// Everything one refresh shows.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
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
    pub dropped_window: u64,
    pub dropped_total: u64,
    /// Something to tell the user, such as "every target exited".
    pub note: Option<String>,
}

impl Snapshot {
    /// The one-line totals shown above the table.
    pub fn summary(&self) -> String {
        let secs = self.interval.as_secs_f64();
        let rate = if secs > 0.0 {
            self.counted.window_samples as f64 / secs
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
            self.dropped_window,
            self.dropped_total,
            self.elapsed.as_secs_f64(),
        )
    }
}

/// Width of the Process column's text (`pid command`).
const PROCESS_WIDTH: usize = text::WIDTHS[4];

/// A row's cells in display order: %Own, %Total, OwnTime, TotalTime, Process, Function.
pub fn cells(row: &Row, snap: &Snapshot) -> [String; 6] {
    let window = snap.counted.window_samples;
    let mut process = format!("{} {}", row.key.pid, row.command);
    if process.chars().count() > PROCESS_WIDTH {
        process = process.chars().take(PROCESS_WIDTH - 1).collect::<String>() + "…";
    }
    [
        format!("{:.1}%", table::percent(row.own_window, window)),
        format!("{:.1}%", table::percent(row.total_window, window)),
        table::format_time(row.own, snap.rate_hz),
        table::format_time(row.total, snap.rate_hz),
        process,
        row.key.label(),
    ]
}

pub fn run(args: TopArgs) -> Result<i32> {
    crate::check::preflight(&args.pids)?;
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
    /// Interned names per code object; holding the `Arc` keeps its address from being reused.
    names: HashMap<*const CodeInfo, Names>,
    frames: Vec<Location>,
}

impl Counter {
    fn add(&mut self, sample: &Resolved, command: &str) {
        if self.names.len() > 100_000 {
            self.names.clear();
        }
        self.frames.clear();
        for frame in sample.frames {
            let location = match &frame.code {
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
            };
            self.frames.push(location);
        }
        self.table
            .add(sample.pid, sample.tid, command, &self.frames);
    }
}

/// The sampling side: a session and the table its samples go to.
struct Collector {
    session: Session,
    counter: Counter,
    /// System-wide (no `-p`).
    host: bool,
    pids: Vec<u32>,
    rate_hz: u64,
    started: Instant,
    window_started: Instant,
    last_scan: Instant,
    last_samples: u64,
    last_events: u64,
    last_drops: u64,
    /// Discovery warnings not yet shown.
    warnings: Vec<String>,
}

impl Collector {
    fn start(args: &TopArgs) -> Result<Collector> {
        let mut session = Session::start(args.rate, args.debug.bits())?;
        let host = args.pids.is_empty();
        let mut warnings = Vec::new();
        if host {
            session.scan(&mut |e| warnings.push(e.to_string()));
        } else {
            for &pid in &args.pids {
                session.add(pid)?;
            }
        }
        let now = Instant::now();
        let kernel = session.kernel_stats();
        Ok(Collector {
            last_samples: session.stats.samples,
            last_events: kernel.events,
            last_drops: kernel.ringbuf_drops,
            session,
            counter: Counter::default(),
            host,
            pids: args.pids.clone(),
            rate_hz: args.rate,
            started: now,
            window_started: now,
            last_scan: now,
            warnings,
        })
    }

    fn drain(&mut self, ring: &mut aya::maps::RingBuf<aya::maps::MapData>) {
        while let Some(item) = ring.next() {
            self.session
                .process_record(&item, &mut |s, cmd| self.counter.add(s, cmd));
        }
    }

    /// Drops exited processes; system-wide, picks up new interpreters.
    fn housekeeping(&mut self) {
        for pid in self.session.reap() {
            self.counter.table.forget(pid);
        }
        if self.host && self.last_scan.elapsed() >= RESCAN_INTERVAL {
            let warnings = &mut self.warnings;
            self.session.scan(&mut |e| warnings.push(e.to_string()));
            self.last_scan = Instant::now();
        }
    }

    /// With `-p`: every target has exited.
    fn all_exited(&self) -> bool {
        !self.host && self.pids.iter().all(|&p| !alive(p))
    }

    /// Ends the current interval.
    fn snapshot(&mut self) -> Snapshot {
        let now = Instant::now();
        let kernel = self.session.kernel_stats();
        let samples = self.session.stats.samples;
        let events = kernel.events.saturating_sub(self.last_events);
        let python_share = (events > 0)
            .then(|| (samples.saturating_sub(self.last_samples) as f64 / events as f64).min(1.0));
        let snap = Snapshot {
            counted: self.counter.table.end_window(),
            interval: now - self.window_started,
            elapsed: now - self.started,
            rate_hz: self.rate_hz,
            processes: self.session.watched().count(),
            python_share,
            dropped_window: kernel.ringbuf_drops.saturating_sub(self.last_drops),
            dropped_total: kernel.ringbuf_drops,
            note: self
                .all_exited()
                .then(|| "every target process exited".to_string()),
        };
        self.window_started = now;
        self.last_samples = samples;
        self.last_events = kernel.events;
        self.last_drops = kernel.ringbuf_drops;
        snap
    }
}

async fn top(args: TopArgs, interactive: bool) -> Result<i32> {
    // SIGTERM and SIGHUP end `top` like `q`: caught before the terminal is put in raw mode, so
    // that the loop's exit (dropping `Live`) always restores it.
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigterm = signal(SignalKind::terminate()).context("handling SIGTERM")?;
    let mut sighup = signal(SignalKind::hangup()).context("handling SIGHUP")?;
    let mut collector = Collector::start(&args)?;
    let events = collector
        .session
        .take_events()
        .context("ring buffer already taken")?;
    // SAFETY: the ring buffer owns its map fd, which stays open and unchanged while it lives.
    let mut events = unsafe { AsyncFd::register(events) }
        .map_err(std::io::Error::from)
        .context("polling the ring buffer")?;
    let granularity = if args.lines {
        Granularity::Line
    } else {
        Granularity::Function
    };
    let opts = ViewOptions::new(granularity, args.sort.into());
    let delay = Duration::from_secs_f64(args.delay);
    let mut output = if interactive {
        Output::Live(Box::new(render::Live::start(opts, delay, args.rate)?))
    } else {
        for w in collector.warnings.drain(..) {
            log::warn!("{w}");
        }
        let limit = if args.once { Some(1) } else { args.iterations };
        Output::Text { opts, limit }
    };

    let mut refresh = tokio::time::interval_at(tokio::time::Instant::now() + delay, delay);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut housekeeping = tokio::time::interval(HOUSEKEEPING_INTERVAL);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut printed = 0u64;
    loop {
        let key = async {
            match &mut output {
                Output::Live(live) => live.next_event().await,
                Output::Text { .. } => std::future::pending().await,
            }
        };
        tokio::select! {
            guard = events.readable_mut() => {
                let mut guard = guard.context("waiting for samples")?;
                guard.clear_ready();
                collector.drain(guard.get_inner_mut());
            }
            _ = housekeeping.tick() => {
                // The kernel wakes us only when its buffer fills: drain on this tick too, and
                // before exited processes are forgotten.
                collector.drain(events.get_mut());
                collector.housekeeping();
                if let Output::Live(live) = &mut output {
                    for w in collector.warnings.drain(..) {
                        live.warn(w);
                    }
                }
            }
            _ = refresh.tick() => {
                collector.drain(events.get_mut());
                let snap = collector.snapshot();
                match &mut output {
                    Output::Live(live) => live.update(snap)?,
                    Output::Text { opts, limit } => {
                        let mut out = std::io::stdout().lock();
                        let written = out
                            .write_all(text::snapshot(&snap, opts).as_bytes())
                            .and_then(|_| out.flush());
                        match written {
                            Ok(()) => {}
                            // The reader went away (`| head`): nothing more to do.
                            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => break,
                            Err(e) => return Err(e).context("writing to stdout"),
                        }
                        printed += 1;
                        if limit.is_some_and(|n| printed >= n) {
                            break;
                        }
                        if let Some(note) = &snap.note {
                            eprintln!("pyebpf: {note}");
                            break;
                        }
                    }
                }
            }
            event = key => {
                if let Output::Live(live) = &mut output {
                    if live.handle(event)? == render::Action::Quit {
                        break;
                    }
                }
            }
            _ = &mut ctrl_c => break,
            _ = sigterm.recv() => break,
            _ = sighup.recv() => break,
        }
    }
    drop(output);
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
