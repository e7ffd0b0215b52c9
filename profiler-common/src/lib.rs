//! Types shared by the BPF programs (`profiler-ebpf`) and userspace (`profiler`).
//!
//! Everything here is `#[repr(C)]` with explicit padding so both sides agree on
//! the bytes, and so userspace can view them with `bytemuck`. No logic lives here.
#![no_std]

/// Interpreter frames the kernel records per sample; deeper stacks are completed in userspace.
pub const MAX_FRAMES: usize = 128;
/// Frames below the recorded ones that the kernel folds into `SampleHeader::deep_hash`, so
/// userspace can prove a completion matches the stack at sample time. Deeper than this, a
/// stack is reported truncated.
pub const MAX_DEEP_FRAMES: u32 = 8192;
/// `ProcInfo::eager_samples` of a newly registered young process. Few: a sample whose leaf
/// code is new to the sampler wakes userspace anyway (`SAMPLE_NEW_CODE`), and these only
/// cover a young process's first stacks, whose outer frames may be new too.
pub const EAGER_SAMPLES: u32 = 4;
/// Distinct CPython layouts loaded at once (one per interpreter build, not per process).
pub const MAX_LAYOUTS: u32 = 64;
/// Python processes registered at once.
pub const MAX_PROCS: u32 = 16384;
/// Cached thread-id → thread-state entries (LRU).
pub const MAX_THREADS: u32 = 65536;
/// Code objects the sampler remembers having reported (`SAMPLE_NEW_CODE`), over all processes.
pub const MAX_SEEN_CODE: u32 = 65536;
/// Thread states visited per interpreter when a thread's state is not cached.
pub const MAX_THREAD_WALK: u32 = 256;
/// Interpreters (main + subinterpreters) visited when looking for a thread state.
pub const MAX_INTERPRETERS: u32 = 4;
/// Bytes of `_PyInterpreterFrame` copied per frame: one read covers every field the walk needs.
pub const FRAME_HEADER_BYTES: usize = 96;
/// Bytes of a code object folded into its tag (see [`RawFrame::tag`]).
pub const CODE_TAG_BYTES: usize = 56;

/// `PyOffsets::flags`: the thread's current frame sits behind `tstate->cframe` (3.11, 3.12).
pub const LAYOUT_CFRAME: u32 = 1 << 0;
/// `PyOffsets::flags`: the GIL state (`struct _gil_runtime_state`) is at `gil_offset` in
/// `_PyRuntime` (3.11).
pub const LAYOUT_GIL_RUNTIME: u32 = 1 << 1;
/// `PyOffsets::flags`: the GIL state is at `gil_offset` in the thread's interpreter state
/// (`tstate->interp`, 3.12+).
pub const LAYOUT_GIL_INTERP: u32 = 1 << 2;
/// `PyOffsets::flags`: the word at `gil_offset` is a pointer to the GIL state rather than the
/// state itself (`interp->ceval.gil`, which a subinterpreter may share with the main one).
pub const LAYOUT_GIL_INDIRECT: u32 = 1 << 3;
/// Both GIL bases: neither set means the build exposes no GIL (or `--gil` is off).
pub const LAYOUT_GIL_MASK: u32 = LAYOUT_GIL_RUNTIME | LAYOUT_GIL_INTERP;

/// Offsets and constants of one CPython build, as the kernel walk needs them.
///
/// Every difference between CPython versions that the kernel cares about is a value here;
/// the BPF program has no notion of a Python version.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct PyOffsets {
    /// AND-ed with `f_executable` to clear `_PyStackRef` tag bits (all ones before 3.14).
    pub executable_mask: u64,
    /// `_PyRuntimeState.interpreters.head`
    pub runtime_interpreters_head: u16,
    /// `PyInterpreterState.next`
    pub interp_next: u16,
    /// `PyInterpreterState.threads.head`
    pub interp_threads_head: u16,
    /// `PyThreadState.next`
    pub tstate_next: u16,
    /// `PyThreadState.native_thread_id`
    pub tstate_native_thread_id: u16,
    /// `PyThreadState.current_frame`, or `PyThreadState.cframe` with [`LAYOUT_CFRAME`].
    pub tstate_current_frame: u16,
    /// `_PyCFrame.current_frame` (only with [`LAYOUT_CFRAME`]).
    pub cframe_current_frame: u16,
    /// `PyThreadState.datastack_chunk`, recorded so userspace can copy whole chunks.
    pub tstate_datastack_chunk: u16,
    /// `_PyInterpreterFrame.previous`
    pub frame_previous: u16,
    /// `_PyInterpreterFrame.f_code` / `f_executable`
    pub frame_executable: u16,
    /// `_PyInterpreterFrame.prev_instr` (≤ 3.12) / `instr_ptr` (≥ 3.13)
    pub frame_instr_ptr: u16,
    /// `_PyInterpreterFrame.owner` (one byte)
    pub frame_owner: u16,
    /// Start of the code-object span folded into the frame's tag.
    pub code_tag_offset: u16,
    /// When nonzero: a pointer field of the code object (inside the tag span) whose target's
    /// word at `tag_deref_field` is folded into the tag too; for builds whose code objects
    /// carry no creation counter (3.11), the qualname's cached hash tells a new function at a
    /// freed one's address apart even when every pointer was reused.
    pub tag_deref_ptr: u16,
    /// `LAYOUT_*` bits.
    pub flags: u32,
    /// Bit `n` set: frames whose owner is `n` are C-stack/interpreter shims, not Python code.
    pub skip_owner_mask: u32,
    /// See `tag_deref_ptr`.
    pub tag_deref_field: u16,
    /// `PyThreadState.interp` (the GIL's base with [`LAYOUT_GIL_INTERP`]).
    pub tstate_interp: u16,
    /// Where the GIL state (or, with [`LAYOUT_GIL_INDIRECT`], a pointer to it) sits in its base
    /// (`LAYOUT_GIL_RUNTIME` / `LAYOUT_GIL_INTERP`).
    pub gil_offset: u16,
    /// `_gil_runtime_state.locked` (a C int).
    pub gil_locked: u16,
    /// `_gil_runtime_state.last_holder` (a `PyThreadState *`).
    pub gil_last_holder: u16,
    /// `_PyStackChunk.previous`
    pub chunk_previous: u16,
    /// `_PyStackChunk.data`: where a chunk's frames start.
    pub chunk_data: u16,
    /// `_PyStackChunk.size`: bytes of the chunk, header included.
    pub chunk_size: u16,
    /// When nonzero: `_PyInterpreterFrame.is_entry` (a bool in the owner's word, 3.11), set on
    /// the first frame each `_PyEval_EvalFrameDefault` call runs.
    pub frame_is_entry: u16,
    pub _pad1: u16,
    /// Bit `n` set: frames whose owner is `n` are the entry frames each
    /// `_PyEval_EvalFrameDefault` call pushes (3.12+). With `frame_is_entry`, they tell the
    /// native merge where one eval loop's Python frames end.
    pub entry_owner_mask: u32,
    pub _pad2: u32,
}

impl PyOffsets {
    /// A frame whose owner is a C-stack/interpreter shim, not Python code (see
    /// `skip_owner_mask`): the kernel walk and userspace completion skip the same frames.
    #[inline(always)]
    pub fn is_shim(&self, owner: u64) -> bool {
        owner < 32 && self.skip_owner_mask & (1 << owner) != 0
    }

    /// A frame whose owner marks an eval loop's entry frame (see `entry_owner_mask`).
    #[inline(always)]
    pub fn is_entry_owner(&self, owner: u64) -> bool {
        owner < 32 && self.entry_owner_mask & (1 << owner) != 0
    }
}

/// `PROCS` value: one registered interpreter process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct ProcInfo {
    /// Address of `_PyRuntime` in the process.
    pub runtime: u64,
    /// Index into `LAYOUTS`.
    pub layout: u32,
    /// Samples left that wake userspace at once (counted down by the kernel): a young
    /// process's first samples are symbolized while its code still exists, even if it lives
    /// only milliseconds; later ones are batched.
    pub eager_samples: u32,
    /// Device and inode of the process's pid namespace when it is not the profiler's (else
    /// 0): CPython records thread ids as seen inside that namespace.
    pub pidns_dev: u64,
    pub pidns_ino: u64,
    /// `NATIVE_*`: how the user stack is captured with each sample (0: not at all).
    pub native: u32,
    /// `--async`: offset of `asyncio_running_task` in the thread state (from the `_asyncio`
    /// module's `_Py_AsyncioModuleDebugOffsets`, CPython 3.14+), read into
    /// [`SampleHeader::running_task`] with each sample; 0: off.
    pub running_task_offset: u32,
    /// `--async`: where the kernel finds the fields of the running task and of the tasks
    /// awaiting it (see [`RawTask`]).
    pub tasks: TaskLayout,
}

/// `--async`: the fields the kernel reads to capture a sample's task chain ([`RawTask`]s and
/// the awaiting tasks' coroutine frames), from the `_asyncio` module's
/// `_Py_AsyncioModuleDebugOffsets` and the interpreter's `_Py_DebugOffsets` (CPython 3.14+).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct TaskLayout {
    /// `TaskObj.task_awaited_by`, `.task_coro`, `.task_name` (pointers) and
    /// `.task_is_task`, `.task_awaited_by_is_set` (chars): at most [`TASK_SPAN_BYTES`] apart.
    pub awaited_by: u16,
    pub coro: u16,
    pub name: u16,
    pub is_task: u16,
    pub awaited_by_is_set: u16,
    /// `PyObject.ob_type`.
    pub ob_type: u16,
    /// `PyGenObject.gi_iframe` (the coroutine's embedded frame) and `.gi_frame_state` (an
    /// `int8_t`): with the frame fields, at most [`CORO_SPAN_BYTES`] from `ob_type`.
    pub gi_iframe: u16,
    pub gi_frame_state: u16,
    /// `_PyInterpreterFrame.stackpointer`.
    pub stackpointer: u16,
    /// `FRAME_SUSPENDED_YIELD_FROM` (an `int8_t`, as its byte): the coroutine waits on the
    /// object `yield_from_slot` stack slots below `stackpointer`.
    pub suspended_yield_from: u8,
    pub yield_from_slot: u8,
    pub _pad: u32,
}

/// Tasks of one sample's chain the kernel captures: the running task, then the task awaiting
/// it, and so on. Past them (or at a task awaited by several, `TASK_AWAITED_BY_SET`),
/// userspace follows the chain in the target's memory.
pub const MAX_SAMPLE_TASKS: usize = 16;
/// Coroutine frames of the awaiting tasks the kernel captures per sample, over all of them.
pub const MAX_TASK_FRAMES: usize = 64;
/// Bytes of a task's name object captured with it ([`RawTask::name_head`]).
pub const TASK_NAME_BYTES: usize = 64;
/// Largest span of `TaskObj` fields one read covers.
pub const TASK_SPAN_BYTES: usize = 64;
/// Largest span of a coroutine (from `ob_type` to the end of its frame's fields) one read
/// covers.
pub const CORO_SPAN_BYTES: usize = 256;
/// Room for the task part of a sample (a power of two, for the verifier).
pub const TASK_BYTES: usize = 4096;
const _: () = assert!(
    MAX_SAMPLE_TASKS * core::mem::size_of::<RawTask>() <= TASK_BYTES / 2
        && MAX_TASK_FRAMES * core::mem::size_of::<RawFrame>() <= TASK_BYTES / 2
);

/// [`RawTask::flags`]: `awaited_by` is a `set` of tasks, not one task: the kernel stopped.
pub const TASK_AWAITED_BY_SET: u32 = 1 << 0;
/// [`RawTask::flags`]: the name object could not be read; `name_head` is zero.
pub const TASK_NAME_UNREAD: u32 = 1 << 1;
/// [`RawTask::flags`]: a coroutine of the task could not be read; its frames are a prefix.
pub const TASK_CORO_UNREAD: u32 = 1 << 2;
/// [`RawTask::flags`]: the frame room ([`MAX_TASK_FRAMES`]) ran out in this task's chain.
pub const TASK_CORO_CUT: u32 = 1 << 3;

/// [`SampleHeader::task_flags`]: the chain goes on past the tasks captured (room ran out, or
/// the last one is awaited by a set): userspace continues from the last one's `awaited_by`.
pub const TASKS_CONTINUE: u32 = 1 << 0;
/// [`SampleHeader::task_flags`]: a task's fields could not be read (the chain ends there).
pub const TASKS_READ_ERROR: u32 = 1 << 1;
/// [`SampleHeader::task_flags`]: an awaiter pointer led to an object whose task flag is not
/// set (garbage: the chain ends there).
pub const TASKS_NOT_A_TASK: u32 = 1 << 2;

/// One task of a sample's chain as the kernel saw it at sample time. Userspace names the task
/// and places its frames from these bytes alone, so a task that finished (and whose memory
/// went to another object) before userspace looked is still shown as it was.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct RawTask {
    /// The `TaskObj`.
    pub task: u64,
    /// `task_coro`: for the running task, its frame is in the sample's stack.
    pub coro: u64,
    /// `task_awaited_by`: the awaiting task (the next `RawTask`), or a set of them
    /// ([`TASK_AWAITED_BY_SET`]); 0 for a root task.
    pub awaited_by: u64,
    /// `task_name`: an `int` n (asyncio's default name, `Task-n`) or a `str`.
    pub name: u64,
    /// The first [`TASK_NAME_BYTES`] of the name object: its type, and an int's value or a
    /// short str's characters.
    pub name_head: [u64; TASK_NAME_BYTES / 8],
    /// This task's coroutine frames among the sample's task frames: `nframes` from
    /// `first_frame`, the task's own coroutine first, then the coroutines it awaits, inward.
    /// None for the running task (its frames are the sample's).
    pub first_frame: u16,
    pub nframes: u16,
    /// `TASK_*`.
    pub flags: u32,
}

/// [`ProcInfo::native`]: no native stack.
pub const NATIVE_NONE: u32 = 0;
/// [`ProcInfo::native`]: a frame-pointer walk of the user stack, or a stack copy where the
/// chain is broken (see `stat::NATIVE_FP_FALLBACKS`): up to `MAX_NATIVE_FRAMES`
/// (ip, sp) pairs follow the frames, leaf first, `sp` being the stack pointer in that frame
/// (the callee's frame pointer + 16). A final (0, 0) pair says the walk reached a null frame
/// pointer, the end of the chain.
pub const NATIVE_FRAME_POINTERS: u32 = 1;
/// [`ProcInfo::native`]: a copy of the top of the user stack follows the frames (up to
/// `MAX_STACK_COPY` bytes, from the user `sp` in `SampleHeader::regs`); userspace unwinds it
/// with the binaries' CFI.
pub const NATIVE_STACK_COPY: u32 = 2;
/// Instruction pointers the frame-pointer walk records.
pub const MAX_NATIVE_FRAMES: usize = 128;
/// Largest stack copy (the `--native-stack` bound).
pub const MAX_STACK_COPY: usize = 32 << 10;
/// The native part's room in a raw sample: the larger of the two kinds.
pub const NATIVE_BYTES: usize = MAX_STACK_COPY;

/// `SampleHeader::flags`: the walk stopped at `MAX_FRAMES`; `next_frame` continues it.
pub const SAMPLE_TRUNCATED: u16 = 1 << 0;
/// `SampleHeader::flags`: a frame read failed; the frames recorded are a prefix of the stack.
pub const SAMPLE_READ_ERROR: u16 = 1 << 1;
/// `SampleHeader::flags`: the thread state came from the tid cache (validated).
pub const SAMPLE_TSTATE_CACHED: u16 = 1 << 2;
/// `SampleHeader::flags`: the stack is deeper than `MAX_FRAMES + MAX_DEEP_FRAMES`, or a deep
/// frame could not be read: `deep_hash` does not cover the whole stack.
pub const SAMPLE_DEEP_INCOMPLETE: u16 = 1 << 3;
/// `SampleHeader::flags`: the sampled thread held the GIL (`locked && last_holder == tstate`).
/// Only computed when the layout locates the GIL (`LAYOUT_GIL_MASK`).
pub const SAMPLE_HOLDS_GIL: u16 = 1 << 4;
/// `SampleHeader::flags`: a frame's code object (or its tag) was new to the sampler; the sample
/// woke userspace at once, so the object is read while it still exists.
pub const SAMPLE_NEW_CODE: u16 = 1 << 5;

/// One interpreter frame as seen in the kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct RawFrame {
    /// Address of the `_PyInterpreterFrame`.
    pub frame: u64,
    /// Address of its code object (tag bits cleared).
    pub code: u64,
    /// The frame's instruction pointer (`prev_instr` / `instr_ptr`).
    pub instr: u64,
    /// Fold of `CODE_TAG_BYTES` of the code object from `code_tag_offset`: userspace caches
    /// symbols by (code, tag), so a new code object at a freed one's address is told apart.
    pub tag: u64,
}

/// Fixed part of a raw sample in the ring buffer; `nframes` [`RawFrame`]s follow it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct SampleHeader {
    pub time_ns: u64,
    /// The thread's `PyThreadState`.
    pub tstate: u64,
    /// `tstate->datastack_chunk` at sample time.
    pub datastack_chunk: u64,
    /// With `SAMPLE_TRUNCATED`: the first frame the kernel did not record.
    pub next_frame: u64,
    /// With `SAMPLE_TRUNCATED`: [`fold_frame`] over every frame from `next_frame` down.
    pub deep_hash: u64,
    /// With `SAMPLE_TRUNCATED`: how many frames `deep_hash` covers (shims included).
    pub deep_frames: u32,
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    pub flags: u16,
    pub nframes: u16,
    /// `NATIVE_*` of the native part after the frames (`NATIVE_NONE`: there is none).
    pub native: u16,
    /// Bytes of the native part.
    pub native_len: u16,
    /// Bit `i` (of word `i / 64`): recorded frame `i` is an eval loop's entry frame (see
    /// `PyOffsets::entry_owner_mask`, `frame_is_entry`).
    pub entry_bits: [u64; 2],
    /// The thread's user registers at the interrupt: ip, sp, bp (with a native part).
    pub regs: [u64; 3],
    /// `--async`: the thread's running asyncio task (`tstate->asyncio_running_task`, a
    /// `TaskObj *`) at sample time; 0 when none runs, when the read failed or when the process
    /// has no [`ProcInfo::running_task_offset`].
    pub running_task: u64,
    /// `--async`: the task part after the native part: `ntasks` [`RawTask`]s (the running
    /// task first, then its awaiters), then `ntask_frames` [`RawFrame`]s.
    pub ntasks: u16,
    pub ntask_frames: u16,
    /// `TASKS_*`.
    pub task_flags: u32,
}

/// The complete raw sample as assembled in the per-CPU sample buffer; only the used prefix is
/// sent: the header, `nframes` frames, `native_len` bytes of native stack, then the task part
/// (see [`SampleHeader::ntasks`]). `tasks` is the room the task part may take past a full
/// native part.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Sample {
    pub header: SampleHeader,
    pub frames: [RawFrame; MAX_FRAMES],
    pub native: [u8; NATIVE_BYTES],
    pub tasks: [u8; TASK_BYTES],
}

/// [`ProcEvent::kind`]: a task called `execve`; `pid` is its process, which userspace inspects.
pub const PROC_EVENT_EXEC: u32 = 1;
/// [`ProcEvent::kind`]: a registered interpreter process exited; the kernel already dropped its
/// `PROCS` entry and userspace forgets it.
pub const PROC_EVENT_EXIT: u32 = 2;

/// `PROC_EVENTS` entry: a process-lifecycle notification from the `sched_process_exec` /
/// `sched_process_exit` tracepoints.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct ProcEvent {
    pub time_ns: u64,
    /// `PROC_EVENT_*`
    pub kind: u32,
    /// Process id (tgid) in the host pid namespace.
    pub pid: u32,
}

/// Fold a code-object span (and the `tag_deref_ptr` word, 0 when unused) into a tag.
/// Kernel and userspace must agree bit for bit.
#[inline(always)]
pub fn fold_tag(words: &[u64; CODE_TAG_BYTES / 8], deref: u64) -> u64 {
    let mut tag = deref;
    let mut i = 0;
    while i < CODE_TAG_BYTES / 8 {
        tag = tag.rotate_left(17) ^ words[i];
        i += 1;
    }
    tag
}

/// Adds one frame to a deep-stack digest. Kernel and userspace must agree bit for bit.
#[inline(always)]
pub fn fold_frame(hash: u64, frame: u64, code: u64, instr: u64) -> u64 {
    (hash.rotate_left(23) ^ frame ^ code.rotate_left(17) ^ instr.rotate_left(41))
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Indexes of the per-CPU `STATS` array.
pub mod stat {
    /// perf events handled (every task).
    pub const EVENTS: u32 = 0;
    /// The task's process is not a registered interpreter.
    pub const NOT_PYTHON: u32 = 1;
    /// Registered process, but no thread state for this thread (not a Python thread yet).
    pub const NO_TSTATE: u32 = 2;
    /// The thread has a thread state but no current frame (idle, or in C before any Python).
    pub const NO_FRAME: u32 = 3;
    /// The walk stopped at `MAX_FRAMES`.
    pub const TRUNCATED: u32 = 4;
    /// A `bpf_probe_read_user` failed.
    pub const READ_ERRORS: u32 = 5;
    /// The ring buffer was full.
    pub const RINGBUF_DROPS: u32 = 6;
    /// A thread-list walk hit `MAX_THREAD_WALK` / `MAX_INTERPRETERS`.
    pub const THREAD_WALK_LIMIT: u32 = 7;
    /// Thread states found through the tid cache.
    pub const TSTATE_CACHE_HITS: u32 = 8;
    /// Samples written to the ring buffer.
    pub const EMITTED: u32 = 9;
    /// Entries the `PROCS` lookup pointed at a layout that is not loaded.
    pub const BAD_LAYOUT: u32 = 10;
    /// `PROC_EVENTS` was full: an exec or exit notification was lost (the periodic `/proc`
    /// scan and reap catch up).
    pub const PROC_EVENT_DROPS: u32 = 11;
    /// `PROCS` entries removed by the kernel when their process exited.
    pub const EXIT_PROCS_REMOVED: u32 = 12;
    /// `THREADS` entries removed by the kernel when their thread exited.
    pub const EXIT_THREADS_REMOVED: u32 = 13;
    /// A walk made `MAX_CHUNK_COPIES` chunk copies; its remaining frames were read one by one.
    pub const CHUNK_COPY_LIMIT: u32 = 14;
    /// Chunk copies made (bulk copies of a stack chunk's frames).
    pub const CHUNK_COPIES: u32 = 15;
    /// Samples with a code object new to the sampler, which woke userspace at once.
    pub const NEW_CODE: u32 = 16;
    /// perf events left out by random subsampling (`SUBSAMPLE` > 1), before anything else.
    pub const SUBSAMPLED: u32 = 17;
    /// Samples that carried a frame-pointer walk of the user stack.
    pub const NATIVE_FRAME_POINTERS: u32 = 18;
    /// Samples that carried a copy of the user stack.
    pub const NATIVE_STACK_COPIES: u32 = 19;
    /// Samples whose native part could not be had (no user registers, unreadable stack).
    pub const NATIVE_ERRORS: u32 = 20;
    /// Frame-pointer samples whose chain broke at once (code without frame pointers): they
    /// carry a stack copy instead.
    pub const NATIVE_FP_FALLBACKS: u32 = 21;
    pub const COUNT: u32 = 22;
}

#[cfg(feature = "user")]
mod user {
    unsafe impl aya::Pod for super::PyOffsets {}
    unsafe impl aya::Pod for super::ProcInfo {}
}
