//! `--async`: a sample's asyncio task chain → `<task NAME>` frames.
//!
//! The kernel captures each sample's chain while the sampled thread is stopped (see
//! `profiler-ebpf/src/tasks.rs`): the running task, then each task awaiting it, with its
//! coroutine, the first bytes of its name object and, for the awaiting tasks, the coroutine
//! frames they are suspended in. Here such a sample is rewritten, leaf first, as: its Python
//! frames down to and including the running task's coroutine frame; a `<task NAME>` frame;
//! the awaiting task's coroutine frames, `<task AWAITER>`, and so on to a root task that
//! nothing awaits. The event loop's frames below the coroutine are dropped: in an async
//! program they say nothing about who asked for the work. A sample whose running task's
//! coroutine frame is not in its stack keeps its stack, and is counted.
//!
//! Why in the kernel: a busy program creates and finishes thousands of tasks a second, and a
//! task's memory goes to the next object at once. Read from userspace at the next drain, the
//! running task's address held another task or no task at all (measured on a task tree at
//! ~30 k tasks/s: 58 % of task samples unreadable, 20 % more pointing at a task whose
//! coroutine was not in the stack).
//!
//! Names. A task asyncio named by default (`Task-<n>`: its name is still the int n, or the str
//! `Task-n` once `get_name()` ran) is shown by its coroutine, `<task AsyncTree.recurse>`, since
//! task numbers would make every sample of a busy program a stack of its own; a name the
//! program gave is shown as given. The raw name stays available ([`TaskName::raw`]: `dump
//! --async`, the opt-in `task_name` label). Names are decoded from the captured bytes; only a
//! `str` longer than them is read from the target, and it is used (and cached by address) only
//! while the object there still starts with the captured bytes, so a name freed and replaced
//! since is never taken for the one sampled.
//!
//! Past the tasks the kernel captures (`MAX_SAMPLE_TASKS`, or a task awaited by several, whose
//! awaiters are a set), the chain is followed in the target's memory: those tasks are cached
//! by (pid, address) for at most [`CACHE_TTL`] (and emptied at every drain's housekeeping),
//! [`MAX_CACHED_TASKS`] entries at most (emptied when full, counted). A chain has at most
//! [`MAX_CHAIN`] tasks and stops at a task it already visited (a cycle, from garbage or a
//! race); both are counted. Among several awaiters (`awaited_by` is a set), the one at the
//! lowest address is followed, so that a chain is the same from one sample to the next.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use profiler_common::{
    RawFrame, RawTask, TASKS_CONTINUE, TASKS_NOT_A_TASK, TASKS_READ_ERROR, TASK_AWAITED_BY_SET,
    TASK_CORO_CUT, TASK_CORO_UNREAD, TASK_NAME_BYTES, TASK_NAME_UNREAD,
};
use rustc_hash::{FxHashMap, FxHashSet};

use crate::decode::RawSample;
use crate::memory::{Fields, ProcessMemory};
use crate::python::asyncio::{
    read_set, read_task, small_int_in, type_name_of, AsyncError, AsyncLayout, TaskInfo,
};
use crate::python::code::{decode_chars, read_str_prefix, str_shape};
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
/// Type objects remembered as the type of a task name (`int`, `str`, other), over all
/// processes.
const MAX_NAME_TYPES: usize = 4096;
/// Names longer than their captured bytes remembered, over all processes.
const MAX_LONG_NAMES: usize = 4096;
/// Characters of a task name kept.
const MAX_NAME_CHARS: u64 = 256;

/// `--async` counters (`record`'s summary, `--stats-json`, the agent's `/metrics`).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub(crate) struct AsyncStats {
    /// Kernel samples taken while a task ran, in processes with the async view.
    pub task_samples: u64,
    /// Samples rewritten with `<task …>` frames.
    pub rewritten: u64,
    /// Samples whose running task's coroutine frame was not in the stack (kept as they were).
    pub frame_not_found: u64,
    /// Samples whose running task could not be read at sample time (kept as they were).
    pub task_unreadable: u64,
    /// Awaiter chains cut at [`MAX_CHAIN`] tasks or at the kernel's frame room.
    pub truncated_depth: u64,
    /// Awaiter chains cut at a task already visited.
    pub truncated_cycle: u64,
    /// Awaiter chains cut at a task that could not be read (marked `<awaiter unreadable>`).
    pub awaiter_unreadable: u64,
    /// Awaiting tasks whose coroutine chain the kernel could not read whole (their frames
    /// are the outer part).
    pub coroutine_unreadable: u64,
    /// Chains that went on past what the kernel captured, followed in the target's memory.
    pub continued: u64,
    /// Task reads from the target's memory (chains past the kernel's capture) that failed.
    pub read_errors: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Cached tasks, name types and long names dropped because their cache was full.
    pub cache_evictions: u64,
    /// Task names longer than the bytes captured, read from the target.
    pub names_read: u64,
    /// Task names that could not be had (shown by the task's coroutine, like a default name).
    pub names_unreadable: u64,
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

/// A task's name as sampled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum TaskName {
    /// asyncio's default name, `Task-n` (`None`: n unknown): shown as the task's coroutine.
    Default(Option<u64>),
    /// A name the program gave.
    Named(Arc<str>),
    /// The name could not be had: shown as the task's coroutine, like a default name.
    Unknown,
}

impl TaskName {
    /// The name as asyncio has it (`task.get_name()`).
    pub(crate) fn raw(&self) -> Arc<str> {
        match self {
            TaskName::Default(Some(n)) => format!("Task-{n}").into(),
            TaskName::Default(None) => "Task-?".into(),
            TaskName::Named(name) => name.clone(),
            TaskName::Unknown => "?".into(),
        }
    }

    /// What the task's `<task …>` frame shows: the name the program gave, else `coroutine`
    /// (the qualname of the task's coroutine, when it could be named), else `Task-?` for a
    /// default name: never `Task-<n>`, which would make each of a program's thousands of
    /// tasks a frame of its own.
    pub(crate) fn shown(&self, coroutine: Option<&str>) -> Arc<str> {
        match (self, coroutine) {
            (TaskName::Named(name), _) => name.clone(),
            (_, Some(qualname)) => qualname.into(),
            (TaskName::Default(_), None) => "Task-?".into(),
            (TaskName::Unknown, None) => self.raw(),
        }
    }

    /// The name of a `str`: a default one when it reads `Task-<digits>`.
    pub(crate) fn parse(name: &str) -> TaskName {
        match name.strip_prefix("Task-") {
            Some(digits) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
                TaskName::Default(digits.parse().ok())
            }
            _ => TaskName::Named(name.into()),
        }
    }
}

/// One task of a sample's chain.
#[derive(Clone, Debug)]
pub(crate) struct ChainTask {
    /// `task_coro`.
    pub coro: u64,
    pub name: TaskName,
    /// Its coroutine frames, leaf first (the task's own coroutine last); none for the running
    /// task, whose frames are the sample's.
    pub frames: Vec<RawFrame>,
}

/// A running task's chain to its root, as sampled.
pub(crate) struct Chain {
    /// Running task first, root (or where the chain was cut) last.
    pub tasks: Vec<ChainTask>,
    /// Why the chain ends before a root task, if it does.
    pub cut: Option<&'static str>,
}

/// What kind of object a task name is, by its type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NameType {
    Int,
    Str,
    Other,
}

#[derive(Default)]
pub(crate) struct Awaiters {
    procs: FxHashMap<u32, ProcessAsync>,
    cache: FxHashMap<(u32, u64), Option<Arc<TaskInfo>>>,
    filled: Option<Instant>,
    warned: FxHashSet<u32>,
    /// (pid, type object) → what a name of that type is.
    name_types: FxHashMap<(u32, u64), NameType>,
    /// (pid, str address) → its captured first bytes and the whole name.
    long_names: FxHashMap<(u32, u64), ([u64; TASK_NAME_BYTES / 8], Arc<str>)>,
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
        self.name_types.retain(|&(p, _), _| p != pid);
        self.long_names.retain(|&(p, _), _| p != pid);
        self.count_pending();
    }

    /// Drops every task read from memory (at each drain's housekeeping: chains change).
    pub(crate) fn expire(&mut self) {
        self.cache.clear();
        self.filled = None;
    }

    /// The chain the kernel captured with `raw`, continued in memory where the capture
    /// stopped short of a root; `None` (counted) when the running task was not captured.
    pub(crate) fn chain(
        &mut self,
        pid: u32,
        layout: &PyLayout,
        a: &AsyncLayout,
        raw: &RawSample,
    ) -> Option<Chain> {
        let header = &raw.header;
        let captured: Vec<RawTask> = raw.tasks().collect();
        if captured.first().map(|t| t.task) != Some(header.running_task) {
            self.stats.task_unreadable += 1;
            return None;
        }
        let frames: Vec<RawFrame> = raw.task_frames().collect();
        let mut chain = Chain {
            tasks: Vec::with_capacity(captured.len()),
            cut: None,
        };
        let mut seen: FxHashSet<u64> = FxHashSet::default();
        for (i, t) in captured.iter().enumerate() {
            if !seen.insert(t.task) {
                self.stats.truncated_cycle += 1;
                chain.cut = Some("<async chain cycle>");
                return Some(chain);
            }
            let mut task_frames = Vec::new();
            if i > 0 {
                let start = t.first_frame as usize;
                let end = start.saturating_add(t.nframes as usize);
                // Captured outermost first; leaf first here.
                task_frames.extend(frames.get(start..end).unwrap_or(&[]).iter().rev());
                if t.flags & TASK_CORO_UNREAD != 0 || task_frames.len() != t.nframes as usize {
                    self.stats.coroutine_unreadable += 1;
                }
            }
            chain.tasks.push(ChainTask {
                coro: t.coro,
                name: self.captured_name(pid, layout, a, t),
                frames: task_frames,
            });
            if t.flags & TASK_CORO_CUT != 0 {
                self.stats.truncated_depth += 1;
                chain.cut = Some("<async chain truncated>");
                return Some(chain);
            }
        }
        if header.task_flags & (TASKS_READ_ERROR | TASKS_NOT_A_TASK) != 0 {
            self.stats.awaiter_unreadable += 1;
            chain.cut = Some("<awaiter unreadable>");
            return Some(chain);
        }
        if header.task_flags & TASKS_CONTINUE != 0 {
            self.stats.continued += 1;
            let last = captured[captured.len() - 1];
            let next = if last.flags & TASK_AWAITED_BY_SET != 0 {
                let mem = ProcessMemory::new(pid);
                match read_set(&mem, &a.coroutines, last.awaited_by) {
                    Ok(set) => set.into_iter().min(),
                    Err(_) => {
                        self.stats.read_errors += 1;
                        self.stats.awaiter_unreadable += 1;
                        chain.cut = Some("<awaiter unreadable>");
                        return Some(chain);
                    }
                }
            } else {
                Some(last.awaited_by)
            };
            if let Some(next) = next.filter(|&n| n != 0) {
                self.follow(pid, layout, a, &mut chain, next, &mut seen);
            }
        }
        Some(chain)
    }

    /// Continues `chain` from the task at `next` in the target's memory, up to a root task,
    /// [`MAX_CHAIN`] tasks or a task already in `seen`.
    fn follow(
        &mut self,
        pid: u32,
        layout: &PyLayout,
        a: &AsyncLayout,
        chain: &mut Chain,
        mut next: u64,
        seen: &mut FxHashSet<u64>,
    ) {
        loop {
            if chain.tasks.len() >= MAX_CHAIN {
                self.stats.truncated_depth += 1;
                chain.cut = Some("<async chain truncated>");
                return;
            }
            if !seen.insert(next) {
                self.stats.truncated_cycle += 1;
                chain.cut = Some("<async chain cycle>");
                return;
            }
            let Some(task) = self.task(pid, layout, a, next) else {
                self.stats.awaiter_unreadable += 1;
                chain.cut = Some("<awaiter unreadable>");
                return;
            };
            if task.coro_truncated {
                self.stats.truncated_depth += 1;
            }
            chain.tasks.push(ChainTask {
                coro: task.coro,
                name: TaskName::parse(&task.name),
                frames: task.coro_frames.clone(),
            });
            match task.awaited_by.iter().min() {
                Some(&n) => next = n,
                None => return,
            }
        }
    }

    /// The task at `addr`, from the cache or read now.
    fn task(
        &mut self,
        pid: u32,
        layout: &PyLayout,
        a: &AsyncLayout,
        addr: u64,
    ) -> Option<Arc<TaskInfo>> {
        if self.filled.is_some_and(|at| at.elapsed() > CACHE_TTL) {
            self.expire();
        }
        if let Some(cached) = self.cache.get(&(pid, addr)) {
            self.stats.cache_hits += 1;
            return cached.clone();
        }
        self.stats.cache_misses += 1;
        let info = match read_task(&ProcessMemory::new(pid), layout, a, addr) {
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
        self.filled.get_or_insert_with(Instant::now);
        self.cache.insert((pid, addr), info.clone());
        info
    }

    /// A captured task's name, from the bytes of its name object taken at sample time.
    fn captured_name(
        &mut self,
        pid: u32,
        layout: &PyLayout,
        a: &AsyncLayout,
        t: &RawTask,
    ) -> TaskName {
        if t.flags & TASK_NAME_UNREAD != 0 || t.name == 0 {
            self.stats.names_unreadable += 1;
            return TaskName::Unknown;
        }
        let head: &[u8] = bytemuck::cast_slice(&t.name_head);
        let ty = head.u64_at(layout.ob_type as usize).unwrap_or(0);
        let name = match self.name_type(pid, layout, ty) {
            NameType::Int => TaskName::Default(small_int_in(head, &a.coroutines)),
            NameType::Str => match self.str_name(pid, layout, t) {
                Some(text) => TaskName::parse(&text),
                None => TaskName::Unknown,
            },
            NameType::Other => TaskName::Unknown,
        };
        if name == TaskName::Unknown {
            self.stats.names_unreadable += 1;
        }
        name
    }

    /// Whether names of type `ty` are ints or strs (type objects of names are static: cached).
    fn name_type(&mut self, pid: u32, layout: &PyLayout, ty: u64) -> NameType {
        if let Some(&kind) = self.name_types.get(&(pid, ty)) {
            return kind;
        }
        let Ok(name) = type_name_of(&ProcessMemory::new(pid), layout, ty) else {
            return NameType::Other;
        };
        let kind = match name.as_str() {
            "int" => NameType::Int,
            "str" => NameType::Str,
            _ => NameType::Other,
        };
        if self.name_types.len() >= MAX_NAME_TYPES {
            self.stats.cache_evictions += self.name_types.len() as u64;
            self.name_types.clear();
        }
        self.name_types.insert((pid, ty), kind);
        kind
    }

    /// The text of a `str` name: from the captured bytes when it fits in them, else read
    /// (and cached) while the object at its address still starts as captured.
    fn str_name(&mut self, pid: u32, layout: &PyLayout, t: &RawTask) -> Option<Arc<str>> {
        let head: &[u8] = bytemuck::cast_slice(&t.name_head);
        let shape = str_shape(head, layout).ok()?;
        let chars = shape.length.min(MAX_NAME_CHARS) as usize;
        let end = shape.data.checked_add(chars.checked_mul(shape.width)?)?;
        if let Some(data) = head.get(shape.data..end) {
            return Some(decode_chars(data, shape.width).into());
        }
        let same = |old: &[u64; TASK_NAME_BYTES / 8]| same_str(old, &t.name_head, layout);
        if let Some((old, text)) = self.long_names.get(&(pid, t.name)) {
            if same(old) {
                return Some(text.clone());
            }
        }
        let mem = ProcessMemory::new(pid);
        let now = mem.read_vec(t.name, TASK_NAME_BYTES).ok().map(|b| {
            let mut words = [0u64; TASK_NAME_BYTES / 8];
            bytemuck::cast_slice_mut::<u64, u8>(&mut words).copy_from_slice(&b);
            words
        });
        let text = match now.filter(same) {
            Some(_) => read_str_prefix(&mem, layout, t.name, MAX_NAME_CHARS)
                .ok()
                .map(|(text, _)| Arc::<str>::from(text)),
            None => None,
        }?;
        self.stats.names_read += 1;
        if self.long_names.len() >= MAX_LONG_NAMES {
            self.stats.cache_evictions += self.long_names.len() as u64;
            self.long_names.clear();
        }
        self.long_names
            .insert((pid, t.name), (t.name_head, text.clone()));
        Some(text)
    }
}

/// Whether two captures of a `str`'s first bytes show the same string: same type, length and
/// leading characters (its reference count, cached hash and interning state may change).
fn same_str(
    a: &[u64; TASK_NAME_BYTES / 8],
    b: &[u64; TASK_NAME_BYTES / 8],
    layout: &PyLayout,
) -> bool {
    let (a, b): (&[u8], &[u8]) = (bytemuck::cast_slice(a), bytemuck::cast_slice(b));
    let word = |bytes: &[u8], off: u16| bytes.u64_at(off as usize);
    let (Ok(sa), Ok(sb)) = (str_shape(a, layout), str_shape(b, layout)) else {
        return false;
    };
    sa == sb
        && word(a, layout.ob_type) == word(b, layout.ob_type)
        && a.get(sa.data..) == b.get(sb.data..)
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
    use crate::python::layout::{CoroutineLayout, PyVersion};
    use profiler_common::SampleHeader;

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

    #[test]
    fn default_names_are_told_from_given_ones() {
        assert_eq!(TaskName::parse("Task-12"), TaskName::Default(Some(12)));
        assert_eq!(
            TaskName::parse("Task-99999999999999999999999"),
            TaskName::Default(None)
        );
        for given in ["Task-", "Task-1a", "ingest", "task-3", " Task-3"] {
            assert_eq!(TaskName::parse(given), TaskName::Named(given.into()));
        }
        let default = TaskName::Default(Some(7));
        assert_eq!(&*default.raw(), "Task-7");
        assert_eq!(
            &*default.shown(Some("AsyncTree.recurse")),
            "AsyncTree.recurse"
        );
        assert_eq!(&*default.shown(None), "Task-?");
        let named = TaskName::Named("ingest".into());
        assert_eq!(&*named.shown(Some("ingest_loop")), "ingest");
        assert_eq!(&*TaskName::Unknown.shown(Some("f")), "f");
        assert_eq!(&*TaskName::Unknown.raw(), "?");
    }

    /// A 3.12 table's object layout with the coroutine fields of the async view; the task
    /// offsets do not matter to captured chains.
    fn layouts() -> (PyLayout, AsyncLayout) {
        let mut layout = crate::python::tables::builtin(PyVersion::from_hex(0x030c_04f0)).unwrap();
        layout.coroutines = Some(CoroutineLayout {
            long_tag: 16,
            long_digit: 24,
            ..Default::default()
        });
        let a = AsyncLayout::new(Default::default(), &layout).unwrap();
        (layout, a)
    }

    /// Objects in this process's memory, read through `ProcessMemory` as a target's would be.
    struct Objects {
        layout: PyLayout,
        int_type: Vec<u64>,
        str_type: Vec<u64>,
        _type_names: Vec<Vec<u8>>,
    }

    impl Objects {
        fn new(layout: &PyLayout) -> Objects {
            let int_name = b"int\0".to_vec();
            let str_name = b"str\0".to_vec();
            let mut int_type = vec![0u64; 64];
            let mut str_type = vec![0u64; 64];
            int_type[layout.tp_name as usize / 8] = int_name.as_ptr() as u64;
            str_type[layout.tp_name as usize / 8] = str_name.as_ptr() as u64;
            Objects {
                layout: *layout,
                int_type,
                str_type,
                _type_names: vec![int_name, str_name],
            }
        }

        /// An int object (asyncio's default name n).
        fn int(&self, n: u64) -> Vec<u64> {
            let mut obj = vec![0u64; 8];
            obj[self.layout.ob_type as usize / 8] = self.int_type.as_ptr() as u64;
            obj[2] = 1 << 3;
            obj[3] = n;
            obj
        }

        /// A compact ASCII str object.
        fn str(&self, text: &str) -> Vec<u64> {
            let u = &self.layout.unicode;
            let len = u.ascii_data as usize + text.len() + 1;
            let mut obj = vec![0u64; len.div_ceil(8).max(8)];
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut obj);
            bytes[self.layout.ob_type as usize..][..8]
                .copy_from_slice(&(self.str_type.as_ptr() as u64).to_le_bytes());
            bytes[u.length as usize..][..8].copy_from_slice(&(text.len() as u64).to_le_bytes());
            let state: u32 = 1 << u.kind_shift | 1 << u.compact_bit | 1 << u.ascii_bit;
            bytes[u.state as usize..][..4].copy_from_slice(&state.to_le_bytes());
            bytes[u.ascii_data as usize..][..text.len()].copy_from_slice(text.as_bytes());
            obj
        }
    }

    /// A task as the kernel captures it, its name object being `name`.
    fn task(addr: u64, awaited_by: u64, name: &[u64]) -> RawTask {
        let mut head = [0u64; TASK_NAME_BYTES / 8];
        head.copy_from_slice(&name[..TASK_NAME_BYTES / 8]);
        RawTask {
            task: addr,
            coro: addr + 1,
            awaited_by,
            name: name.as_ptr() as u64,
            name_head: head,
            ..Default::default()
        }
    }

    fn frame(code: u64) -> RawFrame {
        RawFrame {
            frame: code + 0x10,
            code,
            instr: code + 2,
            tag: 1,
        }
    }

    /// The bytes of a sample of pid `pid` whose task part holds `tasks` and `frames`.
    fn sample(
        pid: u32,
        running: u64,
        flags: u32,
        tasks: &[RawTask],
        frames: &[RawFrame],
    ) -> Vec<u8> {
        let header = SampleHeader {
            pid,
            nframes: 1,
            running_task: running,
            ntasks: tasks.len() as u16,
            ntask_frames: frames.len() as u16,
            task_flags: flags,
            ..Default::default()
        };
        let mut bytes = bytemuck::bytes_of(&header).to_vec();
        bytes.extend_from_slice(bytemuck::bytes_of(&frame(1)));
        for t in tasks {
            bytes.extend_from_slice(bytemuck::bytes_of(t));
        }
        for f in frames {
            bytes.extend_from_slice(bytemuck::bytes_of(f));
        }
        bytes
    }

    fn chain_of(aw: &mut Awaiters, bytes: &[u8]) -> Option<Chain> {
        let (layout, a) = layouts();
        let raw = crate::decode::sample(bytes).expect("a whole sample");
        aw.chain(raw.header.pid, &layout, &a, &raw)
    }

    #[test]
    fn a_captured_chain_is_named_from_its_bytes() {
        let (layout, _) = layouts();
        let objects = Objects::new(&layout);
        let pid = std::process::id();
        let (seven, ingest, three) = (objects.int(7), objects.str("ingest"), objects.str("Task-3"));
        let mut awaiter = task(0x200, 0x300, &ingest);
        awaiter.first_frame = 0;
        awaiter.nframes = 2;
        let tasks = [task(0x100, 0x200, &seven), awaiter, task(0x300, 0, &three)];
        // The awaiter's frames as the kernel captures them: its own coroutine first.
        let frames = [frame(0xa0), frame(0xb0)];
        let mut aw = Awaiters::default();
        let chain = chain_of(&mut aw, &sample(pid, 0x100, 0, &tasks, &frames)).unwrap();
        assert_eq!(chain.cut, None);
        let got: Vec<(TaskName, Vec<u64>)> = chain
            .tasks
            .iter()
            .map(|t| (t.name.clone(), t.frames.iter().map(|f| f.code).collect()))
            .collect();
        assert_eq!(
            got,
            [
                (TaskName::Default(Some(7)), vec![]),
                (TaskName::Named("ingest".into()), vec![0xb0, 0xa0]),
                (TaskName::Default(Some(3)), vec![]),
            ],
            "names from the captured bytes; frames leaf first"
        );
        assert_eq!(chain.tasks[0].coro, 0x101);
        assert_eq!((aw.stats.names_read, aw.stats.names_unreadable), (0, 0));
        drop((seven, ingest, three));
    }

    #[test]
    fn a_sample_without_its_running_task_is_unreadable() {
        let mut aw = Awaiters::default();
        assert!(chain_of(&mut aw, &sample(1, 0x100, TASKS_READ_ERROR, &[], &[])).is_none());
        // A capture of another task than the one running is not taken for it.
        let other = task(0x900, 0, &[0u64; 8]);
        assert!(chain_of(&mut aw, &sample(1, 0x100, 0, &[other], &[])).is_none());
        assert_eq!(aw.stats.task_unreadable, 2);
    }

    #[test]
    fn captured_chains_end_at_cycles_bad_awaiters_and_the_frame_room() {
        let name = [0u64; 8];
        let mut aw = Awaiters::default();
        let cyclic = [task(1, 2, &name), task(2, 1, &name), task(1, 2, &name)];
        let chain = chain_of(&mut aw, &sample(1, 1, 0, &cyclic, &[])).unwrap();
        assert_eq!(
            (chain.tasks.len(), chain.cut),
            (2, Some("<async chain cycle>"))
        );
        let two = [task(1, 2, &name), task(2, 3, &name)];
        let chain = chain_of(&mut aw, &sample(1, 1, TASKS_NOT_A_TASK, &two, &[])).unwrap();
        assert_eq!(
            (chain.tasks.len(), chain.cut),
            (2, Some("<awaiter unreadable>"))
        );
        let mut cut = two;
        cut[1].flags = TASK_CORO_CUT;
        let chain = chain_of(&mut aw, &sample(1, 1, 0, &cut, &[])).unwrap();
        assert_eq!(
            (chain.tasks.len(), chain.cut),
            (2, Some("<async chain truncated>"))
        );
        // Unreadable names (the kernel says so, or a type that names nothing) are counted.
        assert_eq!(aw.stats.names_unreadable, 6);
        assert!(chain.tasks.iter().all(|t| t.name == TaskName::Unknown));
        assert_eq!(
            (
                aw.stats.truncated_cycle,
                aw.stats.awaiter_unreadable,
                aw.stats.truncated_depth
            ),
            (1, 1, 1)
        );
    }

    /// Past the capture, the chain goes on from the tasks in memory: here, from the cache, so
    /// nothing is read; bounded by [`MAX_CHAIN`] and by cycles.
    #[test]
    fn a_chain_the_kernel_could_not_finish_goes_on_in_memory() {
        let name = [0u64; 8];
        let mut aw = Awaiters::default();
        let pid = 1;
        let put = |aw: &mut Awaiters, addr: u64, by: Vec<u64>| {
            let info = TaskInfo {
                addr,
                name: format!("Task-{addr}"),
                awaited_by: by,
                coro_frames: vec![frame(addr << 8)],
                ..Default::default()
            };
            aw.cache.insert((pid, addr), Some(Arc::new(info)));
        };
        put(&mut aw, 10, vec![12, 11]);
        put(&mut aw, 11, vec![1]);
        aw.filled = Some(Instant::now());
        let captured = [task(1, 10, &name)];
        let chain = chain_of(&mut aw, &sample(pid, 1, TASKS_CONTINUE, &captured, &[])).unwrap();
        let got: Vec<u64> = chain
            .tasks
            .iter()
            .map(|t| t.frames.first().map_or(0, |f| f.code))
            .collect();
        assert_eq!(
            got,
            [0, 10 << 8, 11 << 8],
            "lowest awaiter first, then the cycle back to 1"
        );
        assert_eq!(chain.tasks[1].name, TaskName::Default(Some(10)));
        assert_eq!(chain.cut, Some("<async chain cycle>"));
        assert_eq!((aw.stats.continued, aw.stats.truncated_cycle), (1, 1));
        for addr in 100..(100 + 2 * MAX_CHAIN as u64) {
            put(&mut aw, addr, vec![addr + 1]);
        }
        let captured = [task(2, 100, &name)];
        let chain = chain_of(&mut aw, &sample(pid, 2, TASKS_CONTINUE, &captured, &[])).unwrap();
        assert_eq!(chain.tasks.len(), MAX_CHAIN);
        assert_eq!(chain.cut, Some("<async chain truncated>"));
    }

    /// Name bytes are the target's memory: any of them, with any flags and frame ranges,
    /// give a chain or none, never a panic.
    #[test]
    fn captured_garbage_never_panics() {
        let (layout, _) = layouts();
        let objects = Objects::new(&layout);
        let mut rng = fastrand::Rng::with_seed(20);
        let mut aw = Awaiters::default();
        let pid = std::process::id();
        let (mut chains, mut named) = (0, 0);
        for _ in 0..3000 {
            let n = rng.usize(1..=profiler_common::MAX_SAMPLE_TASKS);
            let mut tasks = Vec::new();
            for i in 0..n {
                let mut words = [0u64; TASK_NAME_BYTES / 8];
                for w in words.iter_mut() {
                    *w = match rng.u8(..4) {
                        0 => rng.u64(..),
                        1 => rng.u64(..300),
                        _ => 0,
                    };
                }
                // Often a real type, so the str and int decoders see garbage too.
                words[1] = match rng.u8(..3) {
                    0 => objects.int_type.as_ptr() as u64,
                    1 => objects.str_type.as_ptr() as u64,
                    _ => words[1],
                };
                tasks.push(RawTask {
                    task: if i == 0 { 0x100 } else { rng.u64(..8) },
                    coro: rng.u64(..),
                    awaited_by: rng.u64(..),
                    name: if rng.bool() {
                        words.as_ptr() as u64
                    } else {
                        rng.u64(..)
                    },
                    name_head: words,
                    first_frame: rng.u16(..),
                    nframes: rng.u16(..80),
                    flags: rng.u32(..16),
                });
            }
            let frames: Vec<RawFrame> = (0..rng.usize(..8)).map(|i| frame(i as u64)).collect();
            let flags = rng.u32(..8) & !TASKS_CONTINUE;
            if let Some(chain) = chain_of(&mut aw, &sample(pid, 0x100, flags, &tasks, &frames)) {
                chains += 1;
                named += chain
                    .tasks
                    .iter()
                    .filter(|t| matches!(t.name, TaskName::Named(_)))
                    .count();
                assert!(chain.tasks.len() <= n);
            }
        }
        assert!(
            chains > 0 && named > 0,
            "{chains} chains, {named} named tasks"
        );
    }

    /// A name longer than its captured bytes is read while the object still starts as
    /// captured, and never once another string took its place.
    #[test]
    fn long_names_are_read_only_while_they_are_the_object_sampled() {
        let (layout, _) = layouts();
        let objects = Objects::new(&layout);
        let pid = std::process::id();
        let long = "ingest-".repeat(20);
        let mut name = objects.str(&long);
        let t = task(0x100, 0, &name);
        let mut aw = Awaiters::default();
        let got = |aw: &mut Awaiters, t: &RawTask| {
            chain_of(aw, &sample(pid, 0x100, 0, &[*t], &[]))
                .unwrap()
                .tasks[0]
                .name
                .clone()
        };
        assert_eq!(got(&mut aw, &t), TaskName::Named(long.as_str().into()));
        assert_eq!(aw.stats.names_read, 1);
        // Cached: the same capture needs no read.
        assert_eq!(got(&mut aw, &t), TaskName::Named(long.as_str().into()));
        assert_eq!(aw.stats.names_read, 1);
        // Another string at the same address, sampled before it changed again: the capture
        // no longer matches the cached one, nor what memory holds now.
        let other = objects.str(&"other-".repeat(20));
        let mut t2 = task(0x100, 0, &other);
        t2.name = name.as_ptr() as u64;
        assert_eq!(got(&mut aw, &t2), TaskName::Unknown);
        // Once memory holds that string, it is read.
        let n = name.len().min(other.len());
        name[..n].copy_from_slice(&other[..n]);
        assert_eq!(
            got(&mut aw, &t2),
            TaskName::Named("other-".repeat(20).into())
        );
        assert_eq!((aw.stats.names_read, aw.stats.names_unreadable), (2, 1));
        drop(name);
    }
}
