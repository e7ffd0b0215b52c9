//! The crate's private parsers and readers of foreign data, reachable by the fuzz targets in
//! `fuzz/`: `/proc` lines, the environment, OCI bundles, the thread-list reader (`python::threads`) and
//! the asyncio task readers (`python::asyncio`), with the caps the targets assert.
//!
//! One module of thin wrappers rather than making each parser `pub`: the parsers keep their
//! narrow visibility (so the compiler still flags them when unused), and the surface the fuzz
//! crate depends on is listed in one place. The readers take a pid (the fuzz targets' own)
//! and give their results as the plain structs below. Hidden from the docs: not an API.

use std::sync::Arc;

use profiler_common::{RawFrame, MAX_DEEP_FRAMES};

use crate::complete::ChunkCopy;
use crate::discovery::{Mapping, PythonProcess};
use crate::identity::{Environ, ProcessLabels};
use crate::memory::ProcessMemory;
use crate::python::asyncio::{self, AsyncLayout};
use crate::python::layout::PyLayout;
use crate::python::threads::{self, ThreadFields};

/// Awaiters read from one task's awaiter set ([`read_task`]).
pub const MAX_AWAITERS: usize = asyncio::MAX_AWAITERS;
/// Coroutines followed down one task's `await` chain ([`coro_chain`]).
pub const MAX_CORO_DEPTH: usize = asyncio::MAX_CORO_DEPTH;
/// Tasks one listing gives ([`all_tasks`]).
pub const MAX_TASKS: usize = asyncio::MAX_TASKS;

/// One line of `/proc/PID/maps`: a file-backed mapping, `None` for anything else.
pub fn parse_maps_line(line: &str) -> Option<Mapping> {
    crate::discovery::parse_maps_line(line)
}

/// The service name a `/proc/PID/environ` text gives, as process labels derive it.
pub fn environ_service_name(bytes: &[u8], truncated: bool) -> Option<String> {
    Environ::parse(bytes, truncated)
        .service_name()
        .map(|(name, _)| name)
}

/// What an OCI bundle's `config.json` says about a pod, as the agent reads it; `None` when it
/// is refused as malformed. The values are cut to [`MAX_IDENTITY_VALUE`] bytes.
pub fn bundle_kubernetes(config: &[u8]) -> Option<crate::identity::Kubernetes> {
    crate::identity::kubernetes::from_bundle(config).ok()
}

/// Longest label value derived from another process's data.
pub const MAX_IDENTITY_VALUE: usize = crate::identity::MAX_DERIVED_VALUE;

/// (frames, digest) of the frame chain from `next_frame` down through the stack chunks at
/// `chunk`, as the kernel folds it into `deep_hash`; `None` when the chain cannot be walked to
/// its bottom within [`MAX_DEEP_FRAMES`]. Lets a fuzz input carry a matching digest, so that
/// completion gets past the check that a random header would fail.
pub fn stack_digest(
    pid: u32,
    layout: &PyLayout,
    chunk: u64,
    next_frame: u64,
) -> Option<(u32, u64)> {
    let mem = ProcessMemory::new(pid);
    let mut reads = 0;
    let stack = ChunkCopy::read(&mem, layout, chunk, &mut reads).ok()?;
    let walked = stack
        .walk(&mem, layout, next_frame, MAX_DEEP_FRAMES, &mut reads)
        .ok()?;
    walked.complete.then_some((walked.count, walked.hash))
}

/// One thread state as `python::threads` reads it (its `ThreadFields`, with its address).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thread {
    pub tstate: u64,
    pub interp: u64,
    pub next: u64,
    pub native_id: u64,
    pub frame: u64,
    pub datastack_chunk: u64,
}

impl Thread {
    fn new(tstate: u64, f: ThreadFields) -> Thread {
        Thread {
            tstate,
            interp: f.interp,
            next: f.next,
            native_id: f.native_id,
            frame: f.frame,
            datastack_chunk: f.datastack_chunk,
        }
    }
}

/// Every thread state of every interpreter of the runtime at `runtime` (`thread_states`, as
/// `--idle` and `dump` walk them); `None` when the walk fails. `reads` counts remote reads.
pub fn thread_states(
    pid: u32,
    layout: &PyLayout,
    runtime: u64,
    reads: &mut u64,
) -> Option<Vec<Thread>> {
    let mem = ProcessMemory::new(pid);
    let states = threads::thread_states(&mem, layout, runtime, reads).ok()?;
    Some(states.into_iter().map(|(t, f)| Thread::new(t, f)).collect())
}

/// The fields of the one thread state at `tstate` (`thread_fields`, the re-read `--idle` and
/// `dump` make); `None` when it cannot be read.
pub fn thread_fields(pid: u32, layout: &PyLayout, tstate: u64, reads: &mut u64) -> Option<Thread> {
    let mem = ProcessMemory::new(pid);
    let fields = threads::thread_fields(&mem, layout, tstate, reads).ok()?;
    Some(Thread::new(tstate, fields))
}

/// One asyncio task as `read_task` reads it (its `TaskInfo`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    pub addr: u64,
    pub name: String,
    pub awaited_by: Vec<u64>,
    pub coro: u64,
    /// Leaf first: the task's own coroutine frame last.
    pub coro_frames: Vec<RawFrame>,
    pub coro_truncated: bool,
}

/// The task at `task` (`read_task`: name, awaiters, coroutine chain); `None` when it is not
/// a task or cannot be read.
pub fn read_task(pid: u32, layout: &PyLayout, a: &AsyncLayout, task: u64) -> Option<Task> {
    let mem = ProcessMemory::new(pid);
    let t = asyncio::read_task(&mem, layout, a, task).ok()?;
    Some(Task {
        addr: t.addr,
        name: t.name,
        awaited_by: t.awaited_by,
        coro: t.coro,
        coro_frames: t.coro_frames,
        coro_truncated: t.coro_truncated,
    })
}

/// The `await` chain from the coroutine at `coro` (`coro_chain`: frames leaf first, and
/// whether it was cut short); `None` when it cannot be read.
pub fn coro_chain(
    pid: u32,
    layout: &PyLayout,
    a: &AsyncLayout,
    coro: u64,
) -> Option<(Vec<RawFrame>, bool)> {
    let mem = ProcessMemory::new(pid);
    asyncio::coro_chain(&mem, layout, a, coro).ok()
}

/// Every task in the thread and interpreter task lists of the runtime at `runtime`
/// (`all_tasks`, for process `pid` with that runtime); `None` when a list cannot be read.
pub fn all_tasks(pid: u32, layout: &PyLayout, a: &AsyncLayout, runtime: u64) -> Option<Vec<u64>> {
    let mem = ProcessMemory::new(pid);
    let process = PythonProcess {
        pid,
        command: "fuzz".into(),
        binary: "fuzz".into(),
        runtime,
        layout: *layout,
        ns_pid: None,
        identity: Arc::new(ProcessLabels::from_command(pid, "3.x", "fuzz")),
        frame_pointers: None,
    };
    asyncio::all_tasks(&mem, &process, a).ok()
}
