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
    /// (the qualname of the task's coroutine, when it could be named), else the raw name.
    pub(crate) fn shown(&self, coroutine: Option<&str>) -> Arc<str> {
        match (self, coroutine) {
            (TaskName::Named(name), _) => name.clone(),
            (_, Some(qualname)) => qualname.into(),
            (_, None) => self.raw(),
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
    pub addr: u64,
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
                addr: t.task,
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
                addr: task.addr,
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
        let now = mem.read_vec(t.name, TASK_NAME_BYTES).ok().and_then(|b| {
            let mut words = [0u64; TASK_NAME_BYTES / 8];
            bytemuck::cast_slice_mut::<u64, u8>(&mut words).copy_from_slice(&b);
            Some(words)
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
