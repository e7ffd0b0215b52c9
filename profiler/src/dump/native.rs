//! `dump --native`: native frames, for the threads that run.
//!
//! A thread's native stack starts at its registers, and a running thread's registers can only
//! be read by stopping it (ptrace) or by catching it on a CPU. pyebpf does the second: before
//! the Python snapshot, the sampler runs with `--native` for a short window, and each thread
//! caught on a CPU gets its last merged stack (Python and native frames, as `record --native`
//! shows them). A thread that stayed off-CPU the whole window has no native stack: reading one
//! would mean pausing it, which pyebpf never does.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::discovery::PythonProcess;
use crate::driver::{self, Options, Scope, Sink};
use crate::native::NativeOptions;
use crate::session::Resolved;

/// Sampling rate of the window: a thread busy for the whole window is caught ~rate × window
/// times.
const WINDOW_RATE_HZ: u64 = 997;

/// What `--native` found for one thread.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum NativeDump {
    /// Its last stack sampled on a CPU, Python and native frames merged, most recent first.
    Sampled {
        /// How long before the Python snapshot it was sampled.
        ms_before: u64,
        frames: Vec<MixedFrame>,
    },
    /// Why there is none.
    Unavailable(String),
}

#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct MixedFrame {
    /// `python`, `native` or `marker` (where native frames are missing).
    pub kind: &'static str,
    pub function: String,
    /// Python: the file; native: the module (`libz.so.1`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
}

/// The last stack sampled of each (pid, host tid), and when.
pub(crate) type Sampled = HashMap<(u32, u32), (Instant, Vec<MixedFrame>)>;

/// The sink of the window.
#[derive(Default)]
struct LastStacks {
    stacks: Sampled,
}

impl Sink for LastStacks {
    type Input = std::convert::Infallible;

    fn sample(&mut self, sample: &Resolved, _process: &PythonProcess) {
        let python = |i: usize| {
            let f = sample.frames.get(i)?;
            Some(match &f.code {
                Some(c) => MixedFrame {
                    kind: "python",
                    function: c.qualname.clone(),
                    file: Some(c.filename.clone()),
                    line: Some(f.line),
                },
                None => MixedFrame {
                    kind: "python",
                    function: format!("<code at {:#x}>", f.code_addr),
                    file: None,
                    line: None,
                },
            })
        };
        let frames = match sample.mixed {
            Some(mixed) => mixed
                .iter()
                .filter_map(|m| match m {
                    crate::resolve::Mixed::Python(i) => python(*i),
                    crate::resolve::Mixed::Native {
                        function, module, ..
                    } => Some(MixedFrame {
                        kind: "native",
                        function: function.to_string(),
                        file: Some(module.to_string()),
                        line: None,
                    }),
                    crate::resolve::Mixed::Task(name) => Some(MixedFrame {
                        kind: "task",
                        function: format!("<task {name}>"),
                        file: None,
                        line: None,
                    }),
                    crate::resolve::Mixed::Marker(text) => Some(MixedFrame {
                        kind: "marker",
                        function: text.to_string(),
                        file: None,
                        line: None,
                    }),
                })
                .collect(),
            None => (0..sample.frames.len())
                .filter_map(python)
                .chain(std::iter::once(MixedFrame {
                    kind: "marker",
                    function: crate::native::merge::NATIVE_UNMERGED.to_string(),
                    file: None,
                    line: None,
                }))
                .collect(),
        };
        self.stacks
            .insert((sample.pid, sample.tid), (Instant::now(), frames));
    }
}

/// Samples `pids` with native stacks for `window`; the last stack of each thread seen on a CPU.
pub(crate) fn sample_window(
    pids: &[u32],
    window: Duration,
    native: NativeOptions,
) -> Result<Sampled> {
    let options = Options {
        scope: Scope::Pids(pids.to_vec()),
        rate_hz: WINDOW_RATE_HZ,
        debug: Default::default(),
        gil: false,
        idle: false,
        duration: Some(window),
        end_with_targets: true,
        subsample: 1,
        drain_interval: window.min(driver::DRAIN_INTERVAL),
        first_look: Duration::ZERO,
        native: Some(native),
        async_tasks: false,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut sink = LastStacks::default();
    runtime.block_on(async {
        let mut session = driver::start(&options)?;
        driver::run(&options, &mut session, &mut sink).await?;
        anyhow::Ok(())
    })?;
    Ok(sink.stacks)
}

/// What to show for a thread: its sampled stack, or why there is none.
pub(crate) fn for_thread(
    stacks: &Sampled,
    pid: u32,
    tid: u32,
    snapshot_at: Instant,
    window: Duration,
) -> NativeDump {
    match stacks.get(&(pid, tid)) {
        Some((at, frames)) => NativeDump::Sampled {
            ms_before: snapshot_at.saturating_duration_since(*at).as_millis() as u64,
            frames: frames.clone(),
        },
        None => NativeDump::Unavailable(format!(
            "not on a CPU during the {} ms sampling window; an idle thread's native stack \
             cannot be read without pausing it",
            window.as_millis()
        )),
    }
}
