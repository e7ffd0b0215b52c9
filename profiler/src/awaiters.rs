//! `--async`: a sample's running asyncio task → `<task NAME>` frames and its awaiter chain.
//!
//! The kernel records each sample's running task (`tstate->asyncio_running_task`, one read,
//! see `ProcInfo::running_task_offset`). Here a sample whose running task is set is rewritten,
//! leaf first, as: its Python frames down to and including the task's coroutine frame; a
//! `<task NAME>` frame; the awaiting task's coroutine chain, `<task AWAITER>`, and so on to a
//! root task that nothing awaits. The event loop's frames below the coroutine are dropped: in
//! an async program they say nothing about who asked for the work. A sample whose coroutine
//! frame is not in its stack keeps its stack, and is counted.
//!
//! Awaiter chains change as tasks are created and finish, so what is read is kept only
//! briefly: tasks are cached by (pid, address) for at most [`CACHE_TTL`] (and emptied at every
//! drain's housekeeping), [`MAX_CACHED_TASKS`] entries at most (emptied when full, counted).
//! A chain follows at most [`MAX_CHAIN`] tasks and stops at a task it already visited (a cycle
//! in `awaited_by`, from garbage or a race); both are counted. Among several awaiters
//! (`awaited_by` is a set), the one at the lowest address is followed, so that a chain is the
//! same from one sample to the next.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::{FxHashMap, FxHashSet};

use crate::memory::ProcessMemory;
use crate::python::asyncio::{read_task, AsyncError, AsyncLayout, TaskInfo};
use crate::python::layout::PyLayout;
use crate::resolve::Mixed;

/// How long a task read stays usable.
pub(crate) const CACHE_TTL: Duration = Duration::from_millis(250);
/// Tasks cached over all processes before the cache is emptied.
pub(crate) const MAX_CACHED_TASKS: usize = 4096;
/// Tasks followed from the running one to its root.
pub(crate) const MAX_CHAIN: usize = 64;
/// How often a process whose `_asyncio` module was not found is looked at again.
pub(crate) const RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// Processes remembered as already told about (`--async` unsupported).
const MAX_WARNED: usize = 65536;

/// `--async` counters (`record`'s summary and `--stats-json`).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub(crate) struct AsyncStats {
    /// Kernel samples taken while a task ran, in processes with the async view.
    pub task_samples: u64,
    /// Samples rewritten with `<task …>` frames.
    pub rewritten: u64,
    /// Samples whose running task's coroutine frame was not in the stack (kept as they were).
    pub frame_not_found: u64,
    /// Awaiter chains cut at [`MAX_CHAIN`] tasks or a coroutine chain at its depth bound.
    pub truncated_depth: u64,
    /// Awaiter chains cut at a task already visited.
    pub truncated_cycle: u64,
    /// Task reads that failed (the running task's: the sample is kept as it was; an
    /// awaiter's: the chain ends there with a marker).
    pub read_errors: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Cached tasks dropped because the cache was full.
    pub cache_evictions: u64,
    /// Processes with the task layout, found in a mapped file or in the module on disk.
    pub processes: u64,
    /// Processes whose CPython has no task layout (before 3.14).
    pub processes_unsupported: u64,
    /// Processes whose `_asyncio` module is not found yet (looked at again every second).
    pub processes_pending: u64,
}

/// What the async view knows about one process.
#[derive(Clone, Debug)]
pub(crate) enum ProcessAsync {
    Ready(AsyncLayout),
    /// 3.14+ but the module was not found yet: look again at `next_try`.
    Pending {
        next_try: Instant,
    },
    /// No async view for this process (too old a CPython, or a section that did not parse).
    Off,
}

/// One cached task: what was read, and its name ready for a frame.
struct Cached {
    info: Option<Arc<TaskInfo>>,
    name: Arc<str>,
}

/// A running task's chain to its root, as read.
pub(crate) struct Chain {
    /// Running task first, root (or where the chain was cut) last.
    pub tasks: Vec<(Arc<TaskInfo>, Arc<str>)>,
    /// Why the chain ends before a root task, if it does.
    pub cut: Option<&'static str>,
}

#[derive(Default)]
pub(crate) struct Awaiters {
    procs: FxHashMap<u32, ProcessAsync>,
    cache: FxHashMap<(u32, u64), Cached>,
    filled: Option<Instant>,
    warned: FxHashSet<u32>,
    pub stats: AsyncStats,
}

impl Awaiters {
    /// Records what is known about `pid`'s async view.
    pub(crate) fn set(&mut self, pid: u32, state: ProcessAsync) {
        match &state {
            ProcessAsync::Ready(_) => self.stats.processes += 1,
            ProcessAsync::Off => {}
            ProcessAsync::Pending { .. } => {}
        }
        self.procs.insert(pid, state);
        self.count_pending();
    }

    fn count_pending(&mut self) {
        self.stats.processes_pending = self
            .procs
            .values()
            .filter(|s| matches!(s, ProcessAsync::Pending { .. }))
            .count() as u64;
    }

    /// True the first time it is asked for `pid` (to say something once per process).
    pub(crate) fn first_warning(&mut self, pid: u32) -> bool {
        if self.warned.len() >= MAX_WARNED {
            self.warned.clear();
        }
        self.warned.insert(pid)
    }

    pub(crate) fn layout(&self, pid: u32) -> Option<&AsyncLayout> {
        match self.procs.get(&pid) {
            Some(ProcessAsync::Ready(a)) => Some(a),
            _ => None,
        }
    }

    /// Processes whose module is to be looked for again now.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<u32> {
        let mut due = Vec::new();
        for (&pid, state) in self.procs.iter_mut() {
            if let ProcessAsync::Pending { next_try } = state {
                if *next_try <= now {
                    *next_try = now + RETRY_INTERVAL;
                    due.push(pid);
                }
            }
        }
        due
    }

    pub(crate) fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
        self.cache.retain(|&(p, _), _| p != pid);
        self.count_pending();
    }

    /// Drops every cached task (at each drain's housekeeping: chains change).
    pub(crate) fn expire(&mut self) {
        self.cache.clear();
        self.filled = None;
    }

    /// The task at `addr`, from the cache or read now.
    fn task(
        &mut self,
        pid: u32,
        layout: &PyLayout,
        a: &AsyncLayout,
        addr: u64,
    ) -> Option<(Arc<TaskInfo>, Arc<str>)> {
        if self.filled.is_some_and(|at| at.elapsed() > CACHE_TTL) {
            self.expire();
        }
        if let Some(c) = self.cache.get(&(pid, addr)) {
            self.stats.cache_hits += 1;
            return c.info.clone().map(|i| (i, c.name.clone()));
        }
        self.stats.cache_misses += 1;
        let read = read_task(&ProcessMemory::new(pid), layout, a, addr);
        let info = match read {
            Ok(info) => Some(Arc::new(info)),
            Err(e) => {
                self.stats.read_errors += 1;
                if !e.is_gone() {
                    log::debug!("pid {pid}: task {addr:#x}: {e}");
                }
                None
            }
        };
        if self.cache.len() >= MAX_CACHED_TASKS {
            self.stats.cache_evictions += self.cache.len() as u64;
            self.cache.clear();
        }
        let name: Arc<str> = info.as_ref().map_or("?".into(), |i| i.name.as_str().into());
        self.filled.get_or_insert_with(Instant::now);
        self.cache.insert(
            (pid, addr),
            Cached {
                info: info.clone(),
                name: name.clone(),
            },
        );
        info.map(|i| (i, name))
    }

    /// The chain from `running` to its root task; `None` when the running task itself could
    /// not be read.
    pub(crate) fn chain(
        &mut self,
        pid: u32,
        layout: &PyLayout,
        a: &AsyncLayout,
        running: u64,
    ) -> Option<Chain> {
        let first = self.task(pid, layout, a, running)?;
        let mut chain = Chain {
            tasks: vec![first],
            cut: None,
        };
        let mut seen: FxHashSet<u64> = FxHashSet::default();
        seen.insert(running);
        loop {
            let last = &chain.tasks[chain.tasks.len() - 1].0;
            let Some(&next) = last.awaited_by.iter().min() else {
                break;
            };
            if chain.tasks.len() >= MAX_CHAIN {
                self.stats.truncated_depth += 1;
                chain.cut = Some("<async chain truncated>");
                break;
            }
            if !seen.insert(next) {
                self.stats.truncated_cycle += 1;
                chain.cut = Some("<async chain cycle>");
                break;
            }
            match self.task(pid, layout, a, next) {
                Some(t) => chain.tasks.push(t),
                None => {
                    chain.cut = Some("<awaiter unreadable>");
                    break;
                }
            }
        }
        if chain.tasks.iter().any(|(t, _)| t.coro_truncated) {
            self.stats.truncated_depth += 1;
        }
        Some(chain)
    }
}

/// The rewritten stack, leaf first: `base` (the sample's own stack) up to and including the
/// Python frame `k` (the running task's coroutine frame), then `<task NAME>` of each task in
/// `tasks`, each awaiter's frames (`Mixed::Python` of the ranges, leaf first) before its
/// name; `cut` ends a chain that stops before its root. `None` when `base` has no
/// `Mixed::Python(k)`.
pub(crate) fn splice(
    base: &[Mixed],
    k: usize,
    tasks: &[(Arc<str>, Range<usize>)],
    cut: Option<&'static str>,
    out: &mut Vec<Mixed>,
) -> Option<()> {
    let at = base
        .iter()
        .position(|m| matches!(m, Mixed::Python(i) if *i == k))?;
    out.clear();
    out.extend_from_slice(&base[..=at]);
    for (i, (name, frames)) in tasks.iter().enumerate() {
        if i > 0 {
            out.extend(frames.clone().map(Mixed::Python));
        }
        out.push(Mixed::Task(name.clone()));
    }
    if let Some(marker) = cut {
        out.push(Mixed::Marker(marker));
    }
    Some(())
}

/// Whether a failed layout lookup means "look again later" (the module is not there yet).
pub(crate) fn retry_later(e: &AsyncError) -> bool {
    matches!(e, AsyncError::NotFound { .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(m: &[Mixed]) -> Vec<String> {
        m.iter()
            .map(|m| match m {
                Mixed::Python(i) => format!("py{i}"),
                Mixed::Task(n) => format!("<task {n}>"),
                Mixed::Marker(t) => t.to_string(),
                Mixed::Native { function, .. } => function.to_string(),
            })
            .collect()
    }

    #[test]
    fn splice_cuts_below_the_coroutine_and_adds_the_chain() {
        // Frames 0..=2 are the running task's (2 is its coroutine), 3..5 the event loop; the
        // awaiters' frames were appended at 3..5 and 5..6 after the cut.
        let base: Vec<Mixed> = (0..6).map(Mixed::Python).collect();
        let tasks = vec![
            (Arc::from("alpha"), 0..0),
            (Arc::from("parent"), 3..5),
            (Arc::from("main"), 5..6),
        ];
        let mut out = Vec::new();
        splice(&base, 2, &tasks, None, &mut out).unwrap();
        assert_eq!(
            names(&out),
            [
                "py0",
                "py1",
                "py2",
                "<task alpha>",
                "py3",
                "py4",
                "<task parent>",
                "py5",
                "<task main>"
            ]
        );
        splice(&base, 0, &tasks[..1], Some("<async chain cycle>"), &mut out).unwrap();
        assert_eq!(names(&out), ["py0", "<task alpha>", "<async chain cycle>"]);
        assert!(splice(&base, 9, &tasks, None, &mut out).is_none());
    }

    #[test]
    fn native_frames_leafward_of_the_coroutine_are_kept() {
        let base = vec![
            Mixed::Native {
                function: "memcpy".into(),
                module: "libc.so.6".into(),
                build_id: None,
            },
            Mixed::Python(0),
            Mixed::Native {
                function: "_PyEval_EvalFrameDefault".into(),
                module: "python".into(),
                build_id: None,
            },
            Mixed::Python(1),
        ];
        let mut out = Vec::new();
        splice(&base, 0, &[(Arc::from("t"), 0..0)], None, &mut out).unwrap();
        assert_eq!(names(&out), ["memcpy", "py0", "<task t>"]);
    }

    /// A cycle in `awaited_by` (a task awaited by its own awaiter) ends the chain: built from
    /// the cache, no memory is read.
    #[test]
    fn cycles_and_depth_are_bounded() {
        let layout =
            crate::python::tables::builtin(crate::python::layout::PyVersion::from_hex(0x030c_04f0))
                .unwrap();
        let mut layout = layout;
        layout.coroutines = Some(Default::default());
        let a = AsyncLayout::new(Default::default(), &layout).unwrap();
        let mut aw = Awaiters::default();
        let pid = 1;
        let put = |aw: &mut Awaiters, addr: u64, by: Vec<u64>| {
            let info = TaskInfo {
                addr,
                name: format!("t{addr}"),
                awaited_by: by,
                ..Default::default()
            };
            aw.cache.insert(
                (pid, addr),
                Cached {
                    name: info.name.as_str().into(),
                    info: Some(Arc::new(info)),
                },
            );
        };
        put(&mut aw, 1, vec![3, 2]);
        put(&mut aw, 2, vec![1]);
        aw.filled = Some(Instant::now());
        let chain = aw.chain(pid, &layout, &a, 1).unwrap();
        let got: Vec<u64> = chain.tasks.iter().map(|(t, _)| t.addr).collect();
        assert_eq!(
            got,
            [1, 2],
            "lowest awaiter first, then the cycle back to 1"
        );
        assert_eq!(chain.cut, Some("<async chain cycle>"));
        assert_eq!(aw.stats.truncated_cycle, 1);
        // A chain longer than MAX_CHAIN.
        for addr in 100..(100 + 2 * MAX_CHAIN as u64) {
            put(&mut aw, addr, vec![addr + 1]);
        }
        let chain = aw.chain(pid, &layout, &a, 100).unwrap();
        assert_eq!(chain.tasks.len(), MAX_CHAIN);
        assert_eq!(aw.stats.truncated_depth, 1);
    }
}
