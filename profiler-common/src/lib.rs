//! Types shared by the BPF programs (`profiler-ebpf`) and userspace (`profiler`).
//!
//! Everything here is `#[repr(C)]` with explicit padding so both sides agree on
//! the bytes, and so userspace can view them with `bytemuck`. No logic lives here.
#![no_std]

/// Interpreter frames the kernel walks per sample; deeper stacks are completed in userspace.
pub const MAX_FRAMES: usize = 128;
/// Distinct CPython layouts loaded at once (one per interpreter build, not per process).
pub const MAX_LAYOUTS: u32 = 64;
/// Python processes registered at once.
pub const MAX_PROCS: u32 = 16384;
/// Cached thread-id → thread-state entries (LRU).
pub const MAX_THREADS: u32 = 65536;
/// Thread states visited per interpreter when a thread's state is not cached.
pub const MAX_THREAD_WALK: u32 = 256;
/// Interpreters (main + subinterpreters) visited when looking for a thread state.
pub const MAX_INTERPRETERS: u32 = 4;
/// Bytes of `_PyInterpreterFrame` copied per frame: one read covers every field the walk needs.
pub const FRAME_HEADER_BYTES: usize = 96;
/// Bytes of a code object folded into its tag (see [`FrameRecord::tag`]).
pub const CODE_TAG_BYTES: usize = 32;

/// `PyOffsets::flags`: the thread's current frame sits behind `tstate->cframe` (3.11, 3.12).
pub const LAYOUT_CFRAME: u32 = 1 << 0;

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
    /// Start of the code-object window folded into the frame's tag.
    pub code_tag_offset: u16,
    pub _pad0: u16,
    /// `LAYOUT_*` bits.
    pub flags: u32,
    /// Bit `n` set: frames whose owner is `n` are C-stack/interpreter shims, not Python code.
    pub skip_owner_mask: u32,
    pub _pad1: u32,
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
    pub _pad0: u32,
}

/// `SampleHeader::flags`: the walk stopped at `MAX_FRAMES`; `next_frame` continues it.
pub const SAMPLE_TRUNCATED: u16 = 1 << 0;
/// `SampleHeader::flags`: a frame read failed; the frames recorded are a prefix of the stack.
pub const SAMPLE_READ_ERROR: u16 = 1 << 1;
/// `SampleHeader::flags`: the thread state came from the tid cache (validated).
pub const SAMPLE_TSTATE_CACHED: u16 = 1 << 2;

/// One interpreter frame as seen in the kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct FrameRecord {
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

/// Fixed part of a ring-buffer record; `nframes` [`FrameRecord`]s follow it.
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
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    pub flags: u16,
    pub nframes: u16,
}

/// The complete record as assembled in per-CPU scratch; only the used prefix is sent.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Sample {
    pub header: SampleHeader,
    pub frames: [FrameRecord; MAX_FRAMES],
}

/// Fold a code-object window into a tag. Kernel and userspace must agree bit for bit.
#[inline(always)]
pub fn fold_tag(words: &[u64; CODE_TAG_BYTES / 8]) -> u64 {
    let mut tag = 0u64;
    let mut i = 0;
    while i < CODE_TAG_BYTES / 8 {
        tag = tag.rotate_left(17) ^ words[i];
        i += 1;
    }
    tag
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
    pub const COUNT: u32 = 11;
}

#[cfg(feature = "user")]
mod user {
    unsafe impl aya::Pod for super::PyOffsets {}
    unsafe impl aya::Pod for super::ProcInfo {}
}
