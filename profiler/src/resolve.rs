//! Recorded frames → symbolized stacks: the userspace half of every sample.
//!
//! A kernel sample's frames are completed when the kernel stopped at its frame limit
//! ([`Completer`], validated against the digest the kernel took), then each code object is
//! named through the [`Symbolizer`]'s cache and each instruction pointer becomes a line. Idle
//! stacks (`--idle`) take the same path from their own tagged frames.

use std::sync::Arc;

use profiler_common::{RawFrame, SAMPLE_HOLDS_GIL, SAMPLE_READ_ERROR, SAMPLE_TRUNCATED};

use crate::awaiters::{self, AsyncStats, Awaiters};
use crate::complete::{Completer, CompletionStats};
use crate::decode::{NativeCapture, RawSample};
use crate::discovery::PythonProcess;
use crate::idle::IdleStack;
use crate::native::merge::{self, role, Group, NativeIn, Outcome, Piece};
use crate::native::{Native, NativeStack, Regs, StackEnd};
use crate::python::code::CodeInfo;
use crate::python::layout::PyLayout;
use crate::symbolize::{SymbolStats, Symbolizer};

/// One Python frame of a sample, symbolized.
#[derive(Clone, Debug)]
pub(crate) struct PyFrame {
    /// `None` when the code object could not be read or changed since the sample.
    pub code: Option<Arc<CodeInfo>>,
    pub line: u32,
    pub code_addr: u64,
    pub tag: u64,
    /// The frame's instruction pointer when it was taken (`line` is its line).
    pub instr: u64,
}

/// One frame of a sample's merged stack (`--native`), leaf first.
#[derive(Clone, Debug)]
pub(crate) enum Mixed {
    /// `Resolved::frames[i]`.
    Python(usize),
    /// A native function: its name (`[module+0xoffset]` when unknown) and module.
    Native {
        function: Arc<str>,
        module: Arc<str>,
        /// The module's GNU build id (hex), when known.
        build_id: Option<Arc<str>>,
    },
    /// Where native frames are missing (see `native::merge`), or where an awaiter chain
    /// was cut (`--async`, see `awaiters`).
    Marker(&'static str),
    /// `--async`: the asyncio task whose coroutine runs the frames leafward of it; its
    /// awaiter's frames follow rootward.
    Task(Arc<str>),
}

/// A decoded, symbolized sample. `frames` are leaf first.
#[derive(Debug)]
pub(crate) struct Resolved<'a> {
    pub pid: u32,
    pub tid: u32,
    pub frames: &'a [PyFrame],
    /// With `--native`: the Python frames (by index into `frames`, in their order) merged
    /// with the native ones. With `--async`, for a sample taken while an asyncio task ran:
    /// the stack down to the task's coroutine, then `Mixed::Task` frames and the awaiters'
    /// coroutine frames (appended to `frames`) down to the root task.
    pub mixed: Option<&'a [Mixed]>,
    /// The stack is deeper than what could be recovered; `frames` are its top part.
    pub truncated: bool,
    /// A read failed mid-walk; `frames` are its top part.
    pub partial: bool,
    /// The thread held the GIL (kernel samples of layouts that locate it, with `--gil`), or
    /// ran in a free-threaded build, which has none to wait for.
    pub holds_gil: bool,
    /// An off-CPU stack from the thread list (`--idle`), not a kernel sample.
    pub idle: bool,
    /// `--async --task-labels`: the raw name of the task that ran (`Task-<n>` for asyncio's
    /// default names), for the `task_name` label.
    pub task_name: Option<Arc<str>>,
    /// Samples this stands for: 1 for kernel samples, the sampling periods an idle stack
    /// covers.
    pub weight: u64,
    /// The address of each of `frames`' interpreter frames (`dump --locals` reads them).
    pub frame_addrs: &'a [u64],
    /// The asyncio task running when the kernel took the sample (`--async`), or 0.
    pub running_task: u64,
}

/// Totals over a session, for summaries and headers.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub(crate) struct SessionStats {
    pub samples: u64,
    pub truncated: u64,
    pub partial: u64,
    /// Frames whose code object could not be symbolized.
    pub unknown_frames: u64,
    /// Samples of processes no longer (or not yet) known to userspace.
    pub orphan_samples: u64,
    pub malformed_samples: u64,
    /// Samples holding only shim frames (no Python code running yet).
    pub shim_only: u64,
    /// Kernel samples flagged as holding the GIL (counted with `--gil`).
    pub holds_gil: u64,
    /// `--native`: samples whose native frames were merged whole, merged down to where the
    /// native stack ended, could not be merged (Python frames kept whole), or came without a
    /// native part (see the kernel's `native_errors`).
    pub native_merged: u64,
    pub native_partial: u64,
    pub native_failed: u64,
    pub native_missing: u64,
}

#[derive(Default)]
pub(crate) struct Resolver {
    symbols: Symbolizer,
    completer: Completer,
    /// The frames of the sample being resolved (reused: no allocation per sample).
    frames: Vec<PyFrame>,
    /// `--native`: unwinding and symbolization, and the sample's merged stack.
    native: Option<Native>,
    mixed: Vec<Mixed>,
    groups: Vec<Group>,
    pieces: Vec<Piece>,
    roles: Vec<NativeIn>,
    /// Address of each of `frames`' interpreter frames.
    frame_addrs: Vec<u64>,
    /// `--async`: task chains, and the scratch of a rewrite.
    awaiters: Option<Awaiters>,
    /// Rewrite samples that ran a task with their task chains (off: the running task is only
    /// reported, as `dump` wants).
    rewrite_tasks: bool,
    /// `--task-labels`: give samples the raw name of their running task.
    task_labels: bool,
    task_name: Option<Arc<str>>,
    spliced: Vec<Mixed>,
    task_ranges: Vec<(Arc<str>, std::ops::Range<usize>)>,
    pub stats: SessionStats,
}

impl Resolver {
    /// A kernel sample of `process`; `None` when it holds no Python frame (only shims).
    pub(crate) fn kernel<'a>(
        &'a mut self,
        raw: &RawSample,
        process: &PythonProcess,
    ) -> Option<Resolved<'a>> {
        let header = &raw.header;
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
        self.symbolize(header.pid, &process.layout, raw.frames().chain(tail_frames));
        if self.frames.is_empty() {
            self.stats.shim_only += 1;
            return None;
        }
        let mut mixed = match self.native.is_some() {
            true => self.merge_native(raw, process),
            false => false,
        };
        self.task_name = None;
        if header.running_task != 0 && self.rewrite_tasks {
            mixed |= self.rewrite_async(raw, process, mixed);
        }
        let resolved = Resolved {
            pid: header.pid,
            tid: header.tid,
            frames: &self.frames,
            mixed: mixed.then_some(&self.mixed[..]),
            truncated,
            partial: header.flags & SAMPLE_READ_ERROR != 0,
            // A free-threaded build has no GIL: every running thread runs as its holder would.
            holds_gil: header.flags & SAMPLE_HOLDS_GIL != 0 || process.layout.free_threaded,
            idle: false,
            task_name: self.task_name.take(),
            weight: 1,
            frame_addrs: &self.frame_addrs,
            running_task: header.running_task,
        };
        self.stats.samples += 1;
        self.stats.holds_gil += resolved.holds_gil as u64;
        self.stats.truncated += resolved.truncated as u64;
        self.stats.partial += resolved.partial as u64;
        Some(resolved)
    }

    /// An idle thread's stack; `None` when it holds no Python frame.
    pub(crate) fn idle<'a>(
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
            frames: &self.frames,
            mixed: None,
            truncated: stack.truncated,
            partial: false,
            holds_gil: false,
            idle: true,
            task_name: None,
            weight: stack.weight,
            frame_addrs: &self.frame_addrs,
            running_task: 0,
        })
    }

    /// Drops what is cached for `pid` (after its last samples were resolved).
    pub(crate) fn forget_process(&mut self, pid: u32) {
        self.symbols.forget_process(pid);
        self.completer.forget_process(pid);
        if let Some(native) = self.native.as_mut() {
            native.forget(pid);
        }
        if let Some(aw) = self.awaiters.as_mut() {
            aw.forget(pid);
        }
    }

    /// Rewrites kernel samples taken while an asyncio task ran with `<task …>` frames and
    /// their awaiter chains from now on (see `crate::awaiters`); with `task_labels`, gives
    /// them the raw name of their running task too ([`Resolved::task_name`]).
    pub(crate) fn enable_async(&mut self, task_labels: bool) {
        self.awaiters.get_or_insert_with(Awaiters::default);
        self.rewrite_tasks = true;
        self.task_labels = task_labels;
    }

    /// Reports each sample's running task (`Resolved::running_task`) without rewriting the
    /// sample (`dump --async`).
    pub(crate) fn enable_task_capture(&mut self) {
        self.awaiters.get_or_insert_with(Awaiters::default);
    }

    /// The async view's per-process state and counters (`--async`).
    pub(crate) fn awaiters(&mut self) -> Option<&mut Awaiters> {
        self.awaiters.as_mut()
    }

    pub(crate) fn async_stats(&self) -> Option<AsyncStats> {
        self.awaiters.as_ref().map(|a| a.stats)
    }

    /// Fills `self.mixed` with the async stack of a sample taken while a task ran (see
    /// `crate::awaiters`); false, stack untouched, when it cannot be had.
    fn rewrite_async(&mut self, raw: &RawSample, process: &PythonProcess, has_mixed: bool) -> bool {
        let pid = raw.header.pid;
        let Some(aw) = self.awaiters.as_mut() else {
            return false;
        };
        let Some(a) = aw.layout(pid).copied() else {
            return false;
        };
        aw.stats.task_samples += 1;
        let Some(chain) = aw.chain(pid, &process.layout, &a, raw) else {
            return false;
        };
        if self.task_labels {
            self.task_name = Some(chain.tasks[0].name.raw());
        }
        let target = a.coro_frame(chain.tasks[0].coro);
        let found = self.frame_addrs.iter().position(|&f| f == target);
        let in_mixed = |k: usize| {
            !has_mixed
                || self
                    .mixed
                    .iter()
                    .any(|m| matches!(m, Mixed::Python(i) if *i == k))
        };
        let Some(k) = found.filter(|&k| in_mixed(k)) else {
            aw.stats.frame_not_found += 1;
            return false;
        };
        if !has_mixed {
            self.mixed.clear();
            self.mixed.extend((0..self.frames.len()).map(Mixed::Python));
        }
        self.frames.truncate(k + 1);
        self.frame_addrs.truncate(k + 1);
        self.task_ranges.clear();
        for (i, task) in chain.tasks.iter().enumerate() {
            let start = self.frames.len();
            if i > 0 {
                self.symbolize_more(pid, &process.layout, task.frames.iter().copied());
            }
            let end = self.frames.len();
            // The task's coroutine: the running task's is frame `k`, an awaiter's is the
            // outermost of its frames.
            let coroutine = match i {
                0 => self.frames.get(k),
                _ => end
                    .checked_sub(1)
                    .filter(|&e| e >= start)
                    .and_then(|e| self.frames.get(e)),
            };
            let qualname = coroutine
                .and_then(|f| f.code.as_deref())
                .map(|c| c.qualname.as_str());
            self.task_ranges
                .push((task.name.shown(qualname), start..end));
        }
        if awaiters::splice(
            &self.mixed,
            k,
            &self.task_ranges,
            chain.cut,
            &mut self.spliced,
        )
        .is_none()
        {
            return false;
        }
        std::mem::swap(&mut self.mixed, &mut self.spliced);
        if let Some(aw) = self.awaiters.as_mut() {
            aw.stats.rewritten += 1;
        }
        true
    }

    /// Unwinds, symbolizes and merges the native part of kernel samples from now on.
    pub(crate) fn enable_native(&mut self) {
        self.native.get_or_insert_with(Native::new);
    }

    pub(crate) fn native_stats(&self) -> Option<crate::native::NativeStats> {
        self.native.as_ref().map(|n| n.stats())
    }

    /// Fills `self.mixed` from the sample's native part and `self.frames`; false when the
    /// sample has no native part.
    fn merge_native(&mut self, raw: &RawSample, process: &PythonProcess) -> bool {
        let Some(native) = self.native.as_mut() else {
            return false;
        };
        let pid = raw.header.pid;
        let stack: NativeStack = match raw.native() {
            None => {
                self.stats.native_missing += 1;
                return false;
            }
            Some(NativeCapture::Copy { ip, sp, bp, stack }) => {
                native.unwind_copy(pid, Regs { ip, sp, bp }, stack)
            }
            Some(NativeCapture::FramePointers(bytes)) => {
                let pairs: Vec<(u64, u64)> = NativeCapture::pairs(bytes).collect();
                let complete = pairs.last() == Some(&(0, 0));
                native.symbolize_frame_pointers(pid, &pairs, complete)
            }
        };
        // Groups: the Python frames between entry frames (see `native::merge`).
        self.groups.clear();
        let mut kept = 0;
        for (i, rec) in raw.frames().enumerate() {
            kept += (rec.code != 0) as usize;
            if raw.is_entry(i) {
                let entry = (rec.code == 0).then_some(rec.frame);
                self.groups.push(Group { end: kept, entry });
            }
        }
        if self.groups.last().map_or(0, |g| g.end) < self.frames.len() {
            self.groups.push(Group {
                end: self.frames.len(),
                entry: None,
            });
        }
        let interpreter = crate::discovery::basename(&process.binary);
        self.roles.clear();
        self.roles
            .extend(stack.frames.iter().enumerate().map(|(i, f)| {
                let mut frame = NativeIn::new(
                    role(f.function.as_deref(), &f.module, interpreter),
                    f.sp,
                    &*f.module == interpreter,
                );
                frame.named = f.function.is_some();
                frame.index = i;
                frame
            }));
        merge::anchor(&mut self.roles, &self.groups);
        let complete = matches!(stack.end, StackEnd::Complete);
        let outcome = merge::merge(
            &self.roles,
            complete,
            &self.groups,
            self.frames.len(),
            &mut self.pieces,
        );
        match outcome {
            Outcome::Merged => self.stats.native_merged += 1,
            Outcome::Partial => self.stats.native_partial += 1,
            Outcome::Failed => {
                self.stats.native_failed += 1;
                if log::log_enabled!(log::Level::Debug) {
                    let names: Vec<String> = self
                        .roles
                        .iter()
                        .map(|r| {
                            let f = &stack.frames[r.index];
                            let name = f.function.as_deref().unwrap_or("?");
                            format!("{name} ({}, {:?}, sp {:#x})", f.module, r.role, f.sp)
                        })
                        .collect();
                    log::debug!(
                        "pid {pid}: native stack not merged ({:?}, groups {:?}): {}",
                        stack.end,
                        self.groups,
                        names.join(" <- ")
                    );
                }
            }
        }
        self.mixed.clear();
        for piece in &self.pieces {
            self.mixed.push(match *piece {
                Piece::Python(i) => Mixed::Python(i),
                Piece::Marker(m) => Mixed::Marker(m),
                Piece::Native(j) => {
                    let f = &stack.frames[self.roles[j].index];
                    Mixed::Native {
                        function: f
                            .function
                            .clone()
                            .unwrap_or_else(|| format!("[{}+{:#x}]", f.module, f.offset).into()),
                        module: f.module.clone(),
                        build_id: f.build_id.clone(),
                    }
                }
            });
        }
        true
    }

    pub(crate) fn completion_stats(&self) -> CompletionStats {
        self.completer.stats
    }

    pub(crate) fn symbol_stats(&self) -> SymbolStats {
        self.symbols.stats
    }

    /// Symbolized code objects held.
    pub(crate) fn symbols(&self) -> usize {
        self.symbols.len()
    }

    /// Symbolizes `raw` frames (leaf first, shims dropped) into `self.frames`.
    fn symbolize(&mut self, pid: u32, layout: &PyLayout, raw: impl Iterator<Item = RawFrame>) {
        self.frames.clear();
        self.frame_addrs.clear();
        self.symbolize_more(pid, layout, raw);
    }

    /// [`Resolver::symbolize`], appending to `self.frames`.
    fn symbolize_more(&mut self, pid: u32, layout: &PyLayout, raw: impl Iterator<Item = RawFrame>) {
        // Deep stacks are mostly recursion: a frame running the code object of the frame
        // before it takes that frame's symbol without another cache lookup.
        let mut last: Option<(u64, u64, Option<Arc<CodeInfo>>)> = None;
        for rec in raw {
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
                .map(|c| self.symbols.line(pid, layout, rec.code, c, rec.instr))
                .unwrap_or(0);
            if code.is_none() {
                self.stats.unknown_frames += 1;
            }
            self.frames.push(PyFrame {
                code,
                line,
                code_addr: rec.code,
                tag: rec.tag,
                instr: rec.instr,
            });
            self.frame_addrs.push(rec.frame);
        }
    }
}
