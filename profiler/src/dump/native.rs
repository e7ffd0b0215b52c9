//! `dump --native`: native frames, for the threads that run.
//!
//! A thread's native stack starts at its registers, and a running thread's registers can only
//! be read by stopping it (ptrace) or by catching it on a CPU. pyebpf does the second: the
//! sampling window every dump runs (`window`) captures native stacks too, and a thread whose
//! stack was taken in the interrupt gets that sample's merged stack (Python and native frames,
//! as `record --native` shows them). A thread that was off CPU has none: reading one would
//! mean pausing it, which pyebpf never does.

use crate::resolve::Mixed;
use crate::session::Resolved;

/// What `--native` found for one thread.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum NativeDump {
    /// The stack sampled on a CPU that the thread's Python frames come from, Python and
    /// native frames merged, most recent first.
    Sampled { frames: Vec<MixedFrame> },
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

/// A sample's merged stack (Python and native frames, as `record --native` shows them), most
/// recent first; without a native part, its Python frames under a marker.
pub(super) fn mixed_frames(sample: &Resolved) -> Vec<MixedFrame> {
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
    match sample.mixed {
        Some(mixed) => mixed
            .iter()
            .filter_map(|m| match m {
                Mixed::Python(i) => python(*i),
                Mixed::Native {
                    function, module, ..
                } => Some(MixedFrame {
                    kind: "native",
                    function: function.to_string(),
                    file: Some(module.to_string()),
                    line: None,
                }),
                Mixed::Task(name) => Some(MixedFrame {
                    kind: "task",
                    function: format!("<task {name}>"),
                    file: None,
                    line: None,
                }),
                Mixed::Marker(text) => Some(MixedFrame {
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
    }
}

/// Why a thread whose stack was not taken in the interrupt has no native frames.
pub(super) const IDLE_NATIVE: &str = "its stack was read from memory while it was off CPU; an \
    idle thread's native stack cannot be read without pausing it";
