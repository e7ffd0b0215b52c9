//! Recorded frames → symbolized stacks: the userspace half of every sample.
//!
//! A kernel sample's frames are completed when the kernel stopped at its frame limit
//! ([`Completer`], validated against the digest the kernel took), then each code object is
//! named through the [`Symbolizer`]'s cache and each instruction pointer becomes a line. Idle
//! stacks (`--idle`) take the same path from their own tagged frames.

use std::sync::Arc;

use profiler_common::{FrameRecord, SAMPLE_HOLDS_GIL, SAMPLE_READ_ERROR, SAMPLE_TRUNCATED};

use crate::complete::{Completer, CompletionStats};
use crate::decode::SampleRecord;
use crate::discovery::PythonProcess;
use crate::idle::IdleStack;
use crate::python::code::CodeInfo;
use crate::python::layout::PyLayout;
use crate::symbolize::{SymbolStats, Symbolizer};

/// One Python frame of a sample, symbolized.
#[derive(Clone, Debug)]
pub struct PyFrame {
    /// `None` when the code object could not be read or changed since the sample.
    pub code: Option<Arc<CodeInfo>>,
    pub line: u32,
    pub code_addr: u64,
    pub tag: u64,
}

/// A decoded, symbolized sample. `frames` are leaf first.
#[derive(Debug)]
pub struct Resolved<'a> {
    pub pid: u32,
    pub tid: u32,
    /// The CPU the kernel sampled it on; `None` for idle stacks.
    pub cpu: Option<u32>,
    /// Kernel time of the sample (`bpf_ktime_get_ns`); `None` for idle stacks.
    pub time_ns: Option<u64>,
    pub frames: &'a [PyFrame],
    /// The stack is deeper than what could be recovered; `frames` are its top part.
    pub truncated: bool,
    /// A read failed mid-walk; `frames` are its top part.
    pub partial: bool,
    /// The thread held the GIL (kernel samples of layouts that locate it, with `--gil`).
    pub holds_gil: bool,
    /// An off-CPU stack from the thread list (`--idle`), not a kernel sample.
    pub idle: bool,
    /// Samples this stands for: 1 for kernel samples, the sampling periods an idle stack
    /// covers.
    pub weight: u64,
}

/// Totals over a session, for summaries and headers.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct SessionStats {
    pub samples: u64,
    pub truncated: u64,
    pub partial: u64,
    /// Frames whose code object could not be symbolized.
    pub unknown_frames: u64,
    /// Samples of processes no longer (or not yet) known to userspace.
    pub orphan_samples: u64,
    pub malformed_records: u64,
    /// Records holding only shim frames (no Python code running yet).
    pub shim_only: u64,
    /// Kernel samples flagged as holding the GIL (counted with `--gil`).
    pub holds_gil: u64,
}

#[derive(Default)]
pub struct Resolver {
    symbols: Symbolizer,
    completer: Completer,
    /// The frames of the sample being resolved (reused: no allocation per sample).
    frames: Vec<PyFrame>,
    pub stats: SessionStats,
}

impl Resolver {
    /// A kernel sample of `process`; `None` when it holds no Python frame (only shims).
    pub fn kernel<'a>(
        &'a mut self,
        record: &SampleRecord,
        process: &PythonProcess,
    ) -> Option<Resolved<'a>> {
        let header = &record.header;
        let mut truncated = header.flags & SAMPLE_TRUNCATED != 0;
        let tail = if truncated {
            self.completer
                .complete(header.pid, header.tid, &process.layout, header)
        } else {
            self.completer.kernel_complete();
            None
        };
        truncated &= tail.is_none();
        let tail_frames = tail.iter().flat_map(|t| t.iter().copied());
        self.symbolize(
            header.pid,
            &process.layout,
            record.frames().chain(tail_frames),
        );
        if self.frames.is_empty() {
            self.stats.shim_only += 1;
            return None;
        }
        let resolved = Resolved {
            pid: header.pid,
            tid: header.tid,
            cpu: Some(header.cpu),
            time_ns: Some(header.time_ns),
            frames: &self.frames,
            truncated,
            partial: header.flags & SAMPLE_READ_ERROR != 0,
            holds_gil: header.flags & SAMPLE_HOLDS_GIL != 0,
            idle: false,
            weight: 1,
        };
        self.stats.samples += 1;
        self.stats.holds_gil += resolved.holds_gil as u64;
        self.stats.truncated += resolved.truncated as u64;
        self.stats.partial += resolved.partial as u64;
        Some(resolved)
    }

    /// An idle thread's stack; `None` when it holds no Python frame.
    pub fn idle<'a>(
        &'a mut self,
        stack: &IdleStack,
        process: &PythonProcess,
    ) -> Option<Resolved<'a>> {
        self.symbolize(process.pid, &process.layout, stack.frames.iter().copied());
        if self.frames.is_empty() {
            return None;
        }
        Some(Resolved {
            pid: process.pid,
            tid: stack.tid,
            cpu: None,
            time_ns: None,
            frames: &self.frames,
            truncated: stack.truncated,
            partial: false,
            holds_gil: false,
            idle: true,
            weight: stack.weight,
        })
    }

    /// Drops what is cached for `pid` (after its last samples were resolved).
    pub fn forget_process(&mut self, pid: u32) {
        self.symbols.forget_process(pid);
        self.completer.forget_process(pid);
    }

    pub fn completion_stats(&self) -> CompletionStats {
        self.completer.stats
    }

    pub fn symbol_stats(&self) -> SymbolStats {
        self.symbols.stats
    }

    /// Symbolized code objects held.
    pub fn symbols(&self) -> usize {
        self.symbols.len()
    }

    /// Symbolizes `records` (leaf first, shims dropped) into `self.frames`.
    fn symbolize(
        &mut self,
        pid: u32,
        layout: &PyLayout,
        records: impl Iterator<Item = FrameRecord>,
    ) {
        self.frames.clear();
        // Deep stacks are mostly recursion: a frame running the code object of the frame
        // before it takes that frame's symbol without another cache lookup.
        let mut last: Option<(u64, u64, Option<Arc<CodeInfo>>)> = None;
        for rec in records {
            if rec.code == 0 {
                // A shim frame (C-stack entry, interpreter-owned): not Python code.
                continue;
            }
            let code = match &last {
                Some((code, tag, info)) if *code == rec.code && *tag == rec.tag => info.clone(),
                _ => {
                    let info = self.symbols.code(pid, layout, rec.code, rec.tag);
                    last = Some((rec.code, rec.tag, info.clone()));
                    info
                }
            };
            let line = code
                .as_ref()
                .map(|c| c.line_at_instr(layout, rec.code, rec.instr))
                .unwrap_or(0);
            if code.is_none() {
                self.stats.unknown_frames += 1;
            }
            self.frames.push(PyFrame {
                code,
                line,
                code_addr: rec.code,
                tag: rec.tag,
            });
        }
    }
}
