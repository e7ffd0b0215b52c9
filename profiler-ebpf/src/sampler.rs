use core::{ffi::c_void, ptr::null_mut};

use crate::bounds;
use crate::chunk_copy::{self, frame_words};
use crate::debug::{log_if, LOG_LAYOUT, LOG_LIMITS, LOG_OWNERS, LOG_READS};
use aya_ebpf::{
    bindings::bpf_pidns_info,
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_prandom_u32, bpf_get_smp_processor_id, bpf_ktime_get_ns,
        bpf_probe_read_user,
        generated::{
            bpf_get_current_task_btf, bpf_get_ns_current_pid_tgid, bpf_loop, bpf_probe_read_kernel,
            bpf_probe_read_user as read_user_raw, bpf_task_pt_regs,
        },
    },
    macros::{map, perf_event},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
    programs::PerfEventContext,
    Global,
};
use profiler_common::{
    fold_frame, fold_tag, stat, ProcInfo, PyOffsets, RawFrame, RawTask, Sample, SampleHeader,
    CODE_TAG_BYTES, LAYOUT_CFRAME, LAYOUT_GIL_INDIRECT, LAYOUT_GIL_INTERP, LAYOUT_GIL_MASK,
    MAX_DEEP_FRAMES, MAX_FRAMES, MAX_INTERPRETERS, MAX_LAYOUTS, MAX_NATIVE_FRAMES, MAX_PROCS,
    MAX_SEEN_CODE, MAX_THREADS, MAX_THREAD_WALK, NATIVE_BYTES, NATIVE_FRAME_POINTERS,
    NATIVE_STACK_COPY, SAMPLE_DEEP_INCOMPLETE, SAMPLE_HOLDS_GIL, SAMPLE_NEW_CODE,
    SAMPLE_READ_ERROR, SAMPLE_TRUNCATED, SAMPLE_TSTATE_CACHED, TASK_BYTES,
};

/// Keep one perf event in `SUBSAMPLE`, chosen at random (1, the default: keep all). The perf
/// events then run `SUBSAMPLE` times faster than the sampling rate asked for, and the kept
/// samples are a Bernoulli draw from them: the time between samples is random (geometric),
/// so work that repeats at a fixed period cannot line up with the sampling clock (aliasing),
/// and counts per process become Poisson-like. Set by userspace at load time.
#[unsafe(no_mangle)]
static SUBSAMPLE: Global<u32> = Global::new(1);
/// Bytes of user stack copied for processes in `NATIVE_STACK_COPY` mode (`--native-stack`),
/// at most `NATIVE_BYTES`. Set by userspace at load time.
#[unsafe(no_mangle)]
static STACK_COPY_BYTES: Global<u32> = Global::new(16 << 10);
/// How far above the user stack pointer entry frames are looked for: a thread's C stack is at
/// most this big (glibc's default).
const C_STACK_SPAN: u64 = 8 << 20;
/// A frame-pointer walk shorter than this did not follow a real chain (see `native_stack`).
const MIN_FP_FRAMES: u64 = 4;
/// Copies shorter than this are not worth sending (a few frames at most).
const MIN_STACK_COPY: u64 = 512;
/// `struct pt_regs` (x86-64): where the user registers the unwinders start from are.
const PT_REGS_BP: u64 = 4 * 8;
const PT_REGS_IP: u64 = 16 * 8;
const PT_REGS_SP: u64 = 19 * 8;

/// 8 MiB: at 1 kHz on 64 CPUs with full-depth samples that is still ~30 ms of slack.
const RINGBUF_BYTES: u32 = 8 << 20;
/// Queued bytes past which a sample wakes the reader (see `emit`).
const RINGBUF_WAKEUP_BYTES: u64 = 1 << 20;
const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;
/// The thread-state fields a sample needs are read in one go: up to 512 bytes apart.
const TSTATE_WORDS: usize = 64;
/// Owner codes 0..=2 (owned by a thread, a generator, a frame object) hold Python code in
/// every supported CPython; shim owners are the layout's `skip_owner_mask`. Anything else
/// is a layout that doesn't match its interpreter (`--debug-bpf` says so).
const PYTHON_OWNERS_MAX: u64 = 2;

#[map]
pub(crate) static PROCS: HashMap<u32, ProcInfo> = HashMap::with_max_entries(MAX_PROCS, 0);
#[map]
pub(crate) static LAYOUTS: Array<PyOffsets> = Array::with_max_entries(MAX_LAYOUTS, 0);
/// tid → PyThreadState address; revalidated on every use.
#[map]
pub(crate) static THREADS: LruHashMap<u32, u64> = LruHashMap::with_max_entries(MAX_THREADS, 0);
/// (pid, code address) → tag of the code objects samples have carried as their leaf. A leaf
/// whose code is missing here, or here with another tag, is new: its sample wakes userspace
/// at once, because a short-lived code object can only be named while it exists. Everything
/// else waits for userspace's drain timer.
#[map]
static SEEN_CODE: LruHashMap<[u64; 2], u64> = LruHashMap::with_max_entries(MAX_SEEN_CODE, 0);
#[map]
pub(crate) static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stat::COUNT, 0);
/// The sample under construction (too large for the 512-byte BPF stack), and the state of
/// the `bpf_loop`s that fill it.
#[map]
static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// Per-CPU working memory of one sample.
///
/// The loops' state lives here, not on the stack: 6.1's verifier checks a `bpf_loop`
/// callback once, with the caller's stack as it is before the first iteration, and deletes
/// as dead every branch those initial values don't take (a frame counter still 0, no thread
/// state yet). A map value is unknown to any verifier, so every branch is checked and kept.
#[repr(C)]
struct Scratch {
    fp: FpWalk,
    search: ThreadSearch,
    walk: Walk,
    deep: DeepWalk,
}

#[inline(always)]
fn scratch() -> Option<&'static mut Scratch> {
    SCRATCH.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}
/// The sample under construction, one per CPU. An array indexed by CPU rather than a per-CPU
/// map: with the native part (up to 32 KiB of stack) a sample is larger than the 32 KiB a
/// per-CPU value may be. A perf-event program runs with preemption off and does not nest on
/// its CPU, so the CPU's slot is its own. Userspace sizes it to the possible CPUs.
#[map]
static SAMPLE: Array<Sample> = Array::with_max_entries(1, 0);

#[inline(always)]
fn sample_buf() -> Option<&'static mut Sample> {
    let cpu = unsafe { bpf_get_smp_processor_id() };
    SAMPLE.get_ptr_mut(cpu).map(|p| unsafe { &mut *p })
}
/// The span of a thread state that holds the fields a sample reads.
#[map]
static TSTATE: PerCpuArray<[u64; TSTATE_WORDS]> = PerCpuArray::with_max_entries(1, 0);
#[map]
pub(crate) static EVENTS: RingBuf = RingBuf::with_byte_size(RINGBUF_BYTES, 0);

#[inline(always)]
pub(crate) fn bump(index: u32) {
    if let Some(counter) = STATS.get_ptr_mut(index) {
        unsafe { *counter += 1 };
    }
}

#[inline(always)]
pub(crate) fn read_u64(addr: u64) -> Option<u64> {
    let value = unsafe { bpf_probe_read_user(addr as *const u64) };
    if value.is_err() {
        bump(stat::READ_ERRORS);
        log_if!(
            LOG_READS,
            "pid {}: user read of 8 bytes at {:x} failed",
            crate::debug::current_pid(),
            addr
        );
    }
    value.ok()
}

#[perf_event]
pub fn sample(_ctx: PerfEventContext) -> u32 {
    bump(stat::EVENTS);
    let keep_one_in = SUBSAMPLE.load();
    if keep_one_in > 1 && unsafe { bpf_get_prandom_u32() } % keep_one_in != 0 {
        bump(stat::SUBSAMPLED);
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    let Some(proc) = (unsafe { PROCS.get(&pid) }) else {
        bump(stat::NOT_PYTHON);
        return 0;
    };
    let Some(layout) = LAYOUTS.get(proc.layout) else {
        bump(stat::BAD_LAYOUT);
        log_if!(
            LOG_LAYOUT,
            "pid {}: layout {} is not loaded",
            pid,
            proc.layout
        );
        return 0;
    };
    let Some((tstate, cached, fields)) = find_tstate(tid, native_tid(tid, proc), proc, layout)
    else {
        bump(stat::NO_TSTATE);
        return 0;
    };
    let Some(frame) = current_frame(&fields, layout) else {
        return 0;
    };
    if frame == 0 {
        bump(stat::NO_FRAME);
        return 0;
    }
    let gil = if holds_gil(tstate, proc, layout) {
        SAMPLE_HOLDS_GIL
    } else {
        0
    };
    // The walk writes frames into SCRATCH itself; the header is filled in afterwards.
    // With `--native`, the user registers first: the walk notes where the entry frames on
    // the C stack are.
    let user = if proc.native != 0 { user_regs() } else { None };
    let user_sp = user.map_or(0, |u| u[1]);
    let (nframes, next_frame, flags) = walk(frame, pid, proc.layout, fields.chunk, user_sp);
    if nframes == 0 {
        bump(stat::NO_FRAME);
        return 0;
    }
    if flags & SAMPLE_TRUNCATED != 0 {
        bump(stat::TRUNCATED);
        log_if!(
            LOG_LIMITS,
            "pid {} tid {}: stack deeper than the {} frames recorded",
            pid,
            tid,
            MAX_FRAMES
        );
    }
    let (mut deep_hash, mut deep_frames) = (0, 0);
    let datastack_chunk = fields.chunk;
    let mut flags = flags;
    if flags & !SAMPLE_NEW_CODE == SAMPLE_TRUNCATED {
        let Some(deep) = deep_walk(next_frame, proc.layout) else {
            return 0;
        };
        deep_hash = deep.hash;
        deep_frames = deep.frames;
        if deep.complete == 0 {
            flags |= SAMPLE_DEEP_INCOMPLETE;
            log_if!(
                LOG_LIMITS,
                "pid {} tid {}: deep digest stopped after {} frames (bound {})",
                pid,
                tid,
                deep.frames,
                MAX_DEEP_FRAMES
            );
        }
    }
    let Some((entry_bits, c_entry)) = scratch().map(|s| (s.walk.entry_bits, s.walk.c_entry)) else {
        return 0;
    };
    let Some(sample) = sample_buf() else {
        return 0;
    };
    sample.header = SampleHeader {
        time_ns: unsafe { bpf_ktime_get_ns() },
        tstate,
        datastack_chunk,
        next_frame,
        deep_hash,
        deep_frames,
        pid,
        tid,
        cpu: unsafe { bpf_get_smp_processor_id() },
        flags: flags | gil | if cached { SAMPLE_TSTATE_CACHED } else { 0 },
        nframes: nframes as u16,
        native: 0,
        native_len: 0,
        entry_bits,
        regs: [0; 3],
        running_task: 0,
        ntasks: 0,
        ntask_frames: 0,
        task_flags: 0,
    };
    if proc.native != 0 {
        match user {
            Some(user) => native_stack(sample, nframes, proc.native, user, c_entry),
            None => bump(stat::NATIVE_ERRORS),
        }
    }
    // `--async`: the running task and the chain of tasks awaiting it (see `tasks`), only for
    // processes that asked for it. Last, so that its branch does not double the states the
    // verifier explores through the walk (6.1 refused the `--debug-bpf` build at 1M
    // instructions with the running task's read before the walk).
    crate::tasks::capture(sample, tstate, proc, layout);
    // A young process's samples go out at once (see `ProcInfo::eager_samples`).
    let mut eager = false;
    if let Some(info) = PROCS.get_ptr_mut(&pid) {
        let info = unsafe { &mut *info };
        if info.eager_samples > 0 {
            info.eager_samples -= 1;
            eager = true;
        }
    }
    if flags & SAMPLE_NEW_CODE != 0 {
        bump(stat::NEW_CODE);
        eager = true;
    }
    emit(sample, nframes, eager);
    0
}

/// The thread's user registers (ip, sp, bp) at its entry to the kernel (`task_pt_regs`): the
/// interrupted ones when it ran in user mode, those of its system call otherwise.
#[inline(always)]
fn user_regs() -> Option<[u64; 3]> {
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as u64;
    if regs == 0 {
        return None;
    }
    let mut user = [0u64; 3];
    for (slot, off) in user.iter_mut().zip([PT_REGS_IP, PT_REGS_SP, PT_REGS_BP]) {
        let mut value = 0u64;
        let src = regs.wrapping_add(off) as *const c_void;
        if unsafe { bpf_probe_read_kernel(&mut value as *mut u64 as *mut c_void, 8, src) } != 0 {
            return None;
        }
        *slot = value;
    }
    Some(user)
}

/// The native part of the sample, after its `nframes` frames: the kernel's frame-pointer walk
/// of the user stack, or a copy of its top. Both come from this interrupt, so they show the
/// same moment as the Python frames.
#[inline(always)]
fn native_stack(sample: &mut Sample, nframes: usize, mode: u32, user: [u64; 3], c_entry: u64) {
    sample.header.regs = user;
    // The native part starts right after the frames that are sent.
    let at = bounds::size::<{ MAX_FRAMES as u64 }>(nframes as u64) as usize;
    let dst = unsafe { (sample.frames.as_mut_ptr().add(at)) as *mut c_void };
    if mode == NATIVE_FRAME_POINTERS {
        // Our own walk rather than `bpf_get_stack`: the merge needs each frame's stack
        // address, which tells which native frame an eval loop's entry frame lives in.
        let Some(scratch) = scratch() else {
            return;
        };
        scratch.fp = FpWalk {
            fp: user[2],
            at: at as u64,
            n: 1,
            done: 0,
            top: user[1],
        };
        // The interrupted frame: its ip and sp as the registers say.
        let base = native_words(sample, at as u64);
        unsafe {
            *base = user[0];
            *base.add(1) = user[1];
        }
        unsafe {
            bpf_loop(
                MAX_NATIVE_FRAMES as u32 - 1,
                fp_step as *mut c_void,
                null_mut(),
                0,
            )
        };
        let walk = &scratch.fp;
        // The walk is good enough when it reached a null frame pointer (the whole chain) or
        // went past the outermost eval loop's entry frame (it covers every eval loop, which
        // is what the merge needs). Code built without frame pointers (Debian's libc, zlib,
        // OpenSSL) uses the register for data, and a sample in it walks nowhere: that sample
        // copies the stack instead, for the CFI unwinder.
        let covers = c_entry != 0 && walk.top > c_entry;
        if walk.n >= MIN_FP_FRAMES && (walk.done == 1 || covers) {
            bump(stat::NATIVE_FRAME_POINTERS);
            sample.header.native = NATIVE_FRAME_POINTERS as u16;
            sample.header.native_len = ((walk.n + walk.done) * 16) as u16;
            return;
        }
        bump(stat::NATIVE_FP_FALLBACKS);
    }
    if mode == NATIVE_FRAME_POINTERS || mode == NATIVE_STACK_COPY {
        // The stack may end less than the bound above `sp` (a thread that has not gone deep,
        // near the top of its mapping): the copy is halved until it fits.
        let mut len = (STACK_COPY_BYTES.load() as u64).min(NATIVE_BYTES as u64);
        let mut copied = 0;
        for _ in 0..7 {
            if len < MIN_STACK_COPY {
                break;
            }
            let n = bounds::size::<{ NATIVE_BYTES as u64 }>(len);
            if unsafe { read_user_raw(dst, n as u32, user[1] as *const c_void) } == 0 {
                copied = n;
                break;
            }
            len /= 2;
        }
        if copied == 0 {
            bump(stat::NATIVE_ERRORS);
            return;
        }
        bump(stat::NATIVE_STACK_COPIES);
        sample.header.native = NATIVE_STACK_COPY as u16;
        sample.header.native_len = copied as u16;
    }
}

/// Whether `tstate` holds its interpreter's GIL: `locked != 0 && last_holder == tstate`, with
/// the GIL state found as the layout says (in `_PyRuntime`, or in / behind `tstate->interp`).
/// False when the layout locates no GIL (the build has none, or `--gil` is off).
#[inline(always)]
fn holds_gil(tstate: u64, proc: &ProcInfo, layout: &PyOffsets) -> bool {
    if layout.flags & LAYOUT_GIL_MASK == 0 {
        return false;
    }
    let base = if layout.flags & LAYOUT_GIL_INTERP != 0 {
        match read_u64(tstate + layout.tstate_interp as u64) {
            Some(interp) if interp != 0 => interp,
            _ => return false,
        }
    } else {
        proc.runtime
    };
    let mut gil = base + layout.gil_offset as u64;
    if layout.flags & LAYOUT_GIL_INDIRECT != 0 {
        match read_u64(gil) {
            Some(ptr) if ptr != 0 => gil = ptr,
            _ => return false,
        }
    }
    let locked = unsafe { bpf_probe_read_user((gil + layout.gil_locked as u64) as *const u32) };
    if !matches!(locked, Ok(l) if l != 0) {
        return false;
    }
    read_u64(gil + layout.gil_last_holder as u64) == Some(tstate)
}

/// The thread id as the process itself sees it (`gettid()` in its own pid namespace), which
/// is what CPython stores in `native_thread_id`; the host tid when it is not namespaced.
#[inline(always)]
fn native_tid(tid: u32, proc: &ProcInfo) -> u32 {
    if proc.pidns_ino == 0 {
        return tid;
    }
    let mut ns = bpf_pidns_info { pid: 0, tgid: 0 };
    let ret = unsafe {
        bpf_get_ns_current_pid_tgid(
            proc.pidns_dev,
            proc.pidns_ino,
            &mut ns,
            size_of::<bpf_pidns_info>() as u32,
        )
    };
    if ret == 0 {
        ns.pid
    } else {
        tid
    }
}

/// State of the frame-pointer walk (`NATIVE_FRAME_POINTERS`), carried across `bpf_loop`
/// iterations.
#[repr(C)]
struct FpWalk {
    /// The frame pointer of the frame whose caller is next.
    fp: u64,
    /// Where the native part starts, in raw frames.
    at: u64,
    /// Pairs written.
    n: u64,
    /// 1 once the chain ended at a null frame pointer (its (0, 0) pair is written).
    done: u64,
    /// The highest stack address the walk reached.
    top: u64,
}

/// u64 words of a sample's native part (a power of two for the verifier's masks).
const NATIVE_WORDS: usize = NATIVE_BYTES / 8;
const _: () = assert!(NATIVE_WORDS.is_power_of_two() && MAX_NATIVE_FRAMES * 2 <= NATIVE_WORDS);

/// The native part of `sample`, which starts after its `at` frames.
#[inline(always)]
fn native_words(sample: &mut Sample, at: u64) -> *mut u64 {
    let at = bounds::size::<{ MAX_FRAMES as u64 }>(at) as usize;
    unsafe { sample.frames.as_mut_ptr().add(at) as *mut u64 }
}

/// One step of the frame-pointer walk: the saved frame pointer and return address at `fp`
/// become the next pair. Returns 1 to stop.
#[inline(never)]
extern "C" fn fp_step(_index: u64, _ctx: *mut c_void) -> i64 {
    let (Some(scratch), Some(sample)) = (scratch(), sample_buf()) else {
        return 1;
    };
    let walk = &mut scratch.fp;
    let base = native_words(sample, walk.at);
    let slot = (walk.n * 2) as usize & (NATIVE_WORDS - 1);
    if walk.fp == 0 {
        // The outermost frame clears its frame pointer: the chain is whole.
        unsafe {
            *base.add(slot) = 0;
            *base.add((slot + 1) & (NATIVE_WORDS - 1)) = 0;
        }
        walk.done = 1;
        return 1;
    }
    let Ok(pair) = (unsafe { bpf_probe_read_user(walk.fp as *const [u64; 2]) }) else {
        return 1;
    };
    let [next, ret] = pair;
    // Callers' frames sit above their callees': anything else is not a frame chain (code
    // without frame pointers used the register for something else).
    if ret == 0 || (next != 0 && (next <= walk.fp || next % 8 != 0)) {
        return 1;
    }
    unsafe {
        *base.add(slot) = ret;
        *base.add((slot + 1) & (NATIVE_WORDS - 1)) = walk.fp + 16;
    }
    walk.n += 1;
    walk.top = walk.fp + 16;
    walk.fp = next;
    0
}

/// State of the thread-list search, carried across `bpf_loop` iterations.
#[repr(C)]
struct ThreadSearch {
    runtime: u64,
    interp: u64,
    tstate: u64,
    found: u64,
    /// A matching thread state without a current frame: used if no better one turns up.
    fallback: u64,
    layout: u32,
    tid: u32,
    /// Interpreters entered so far.
    interps: u32,
    /// The search ran out of input or hit a read error.
    done: u32,
}

/// Finds the thread's `PyThreadState`: from the tid cache when the cached state still names
/// this thread, else by walking the interpreters' thread lists. Works whether or not the
/// thread holds the GIL.
#[inline(always)]
fn find_tstate(
    tid: u32,
    native_tid: u32,
    proc: &ProcInfo,
    layout: &PyOffsets,
) -> Option<(u64, bool, ThreadFields)> {
    if let Some(&cached) = unsafe { THREADS.get(&tid) } {
        match thread_fields(cached, layout) {
            Some(fields) if fields.native_id == native_tid as u64 => {
                bump(stat::TSTATE_CACHE_HITS);
                return Some((cached, true, fields));
            }
            _ => {}
        }
        let _ = THREADS.remove(&tid);
    }
    let search = &mut scratch()?.search;
    *search = ThreadSearch {
        runtime: proc.runtime,
        interp: 0,
        tstate: 0,
        found: 0,
        fallback: 0,
        layout: proc.layout,
        tid: native_tid,
        interps: 0,
        done: 0,
    };
    let steps = MAX_INTERPRETERS * (MAX_THREAD_WALK + 1);
    unsafe { bpf_loop(steps, thread_step as *mut c_void, null_mut(), 0) };
    let found = if search.found != 0 {
        search.found
    } else {
        search.fallback
    };
    if found != 0 {
        let _ = THREADS.insert(&tid, &found, 0);
        return Some((found, false, thread_fields(found, layout)?));
    }
    if search.done == 0 {
        bump(stat::THREAD_WALK_LIMIT);
        log_if!(
            LOG_LIMITS,
            "tid {}: no thread state within {} interpreters x {} threads",
            tid,
            MAX_INTERPRETERS,
            MAX_THREAD_WALK
        );
    }
    None
}

/// One step of the thread search: enter the next interpreter, or test one thread state.
/// Returns 1 to stop the loop.
#[inline(never)]
extern "C" fn thread_step(_index: u64, _ctx: *mut c_void) -> i64 {
    let Some(scratch) = scratch() else {
        return 1;
    };
    let search = &mut scratch.search;
    let Some(layout) = LAYOUTS.get(search.layout) else {
        search.done = 1;
        return 1;
    };
    if search.tstate == 0 {
        // Current interpreter exhausted (or none yet): move to the next one.
        let next = if search.interps == 0 {
            read_u64(search.runtime + layout.runtime_interpreters_head as u64)
        } else {
            read_u64(search.interp + layout.interp_next as u64)
        };
        let Some(interp) = next.filter(|&i| i != 0) else {
            search.done = 1;
            return 1;
        };
        if search.interps >= MAX_INTERPRETERS {
            return 1;
        }
        search.interps += 1;
        search.interp = interp;
        match read_u64(interp + layout.interp_threads_head as u64) {
            Some(head) => search.tstate = head,
            None => {
                search.done = 1;
                return 1;
            }
        }
        return 0;
    }
    if read_u64(search.tstate + layout.tstate_native_thread_id as u64) == Some(search.tid as u64) {
        // Creating a subinterpreter leaves an idle state with the creator's id in the new
        // interpreter's list: prefer the state that is running Python.
        let frame = thread_fields(search.tstate, layout).and_then(|f| current_frame(&f, layout));
        if frame.is_some_and(|f| f != 0) {
            search.found = search.tstate;
            search.done = 1;
            return 1;
        }
        if search.fallback == 0 {
            search.fallback = search.tstate;
        }
    }
    match read_u64(search.tstate + layout.tstate_next as u64) {
        Some(next) => search.tstate = next,
        None => {
            search.done = 1;
            return 1;
        }
    }
    0
}

/// The thread-state fields a sample needs.
struct ThreadFields {
    native_id: u64,
    /// `current_frame`, or the `_PyCFrame` pointer with `LAYOUT_CFRAME`.
    current: u64,
    /// `datastack_chunk`: where the chunk copies start.
    chunk: u64,
}

/// One read of the thread state from its lowest to its highest needed field (the offsets
/// are 8-aligned pointer and `unsigned long` fields, at most `TSTATE_WORDS` words apart).
#[inline(always)]
fn thread_fields(tstate: u64, layout: &PyOffsets) -> Option<ThreadFields> {
    let offsets = [
        layout.tstate_native_thread_id,
        layout.tstate_current_frame,
        layout.tstate_datastack_chunk,
    ];
    let lo = offsets[0].min(offsets[1]).min(offsets[2]) as u64 & !7;
    let hi = offsets[0].max(offsets[1]).max(offsets[2]) as u64 + 8;
    let len = hi - lo;
    if len > (TSTATE_WORDS * 8) as u64 {
        bump(stat::BAD_LAYOUT);
        log_if!(
            LOG_LAYOUT,
            "pid {}: thread-state fields span {} bytes, more than one read of {}",
            crate::debug::current_pid(),
            len,
            TSTATE_WORDS * 8
        );
        return None;
    }
    let buf = TSTATE.get_ptr_mut(0)?;
    let src = tstate.wrapping_add(lo);
    let len = bounds::size::<{ (TSTATE_WORDS * 8) as u64 }>(len);
    if unsafe { read_user_raw(buf as *mut c_void, len as u32, src as *const c_void) } != 0 {
        bump(stat::READ_ERRORS);
        log_if!(
            LOG_READS,
            "pid {}: thread state read at {:x} failed",
            crate::debug::current_pid(),
            src
        );
        return None;
    }
    let buf = unsafe { &*buf };
    let at = |off: u16| buf[((off as u64 - lo) / 8) as usize & (TSTATE_WORDS - 1)];
    Some(ThreadFields {
        native_id: at(layout.tstate_native_thread_id),
        current: at(layout.tstate_current_frame),
        chunk: at(layout.tstate_datastack_chunk),
    })
}

#[inline(always)]
fn current_frame(fields: &ThreadFields, layout: &PyOffsets) -> Option<u64> {
    if layout.flags & LAYOUT_CFRAME == 0 || fields.current == 0 {
        return Some(fields.current);
    }
    read_u64(fields.current + layout.cframe_current_frame as u64)
}

/// State of the frame walk, carried across `bpf_loop` iterations.
#[repr(C)]
struct Walk {
    frame: u64,
    /// Code object and tag of the last frame tagged, reused by a recursive frame below it.
    last_code: u64,
    last_tag: u64,
    /// See `SampleHeader::entry_bits`.
    entry_bits: [u64; 2],
    /// The user stack pointer (0 without `--native`), and the highest address of an entry
    /// frame found within `C_STACK_SPAN` above it: the outermost eval loop's entry frame on
    /// the C stack (3.12+), 0 if none. A thread's base frame (3.14+) is in its thread state,
    /// elsewhere.
    user_sp: u64,
    c_entry: u64,
    /// Raw frames written (shims included).
    nframes: u32,
    pid: u32,
    layout: u32,
    flags: u32,
    done: u32,
}

/// Walks `previous` links from `frame`, one raw frame per frame into `SCRATCH`.
/// Returns (records written, where the walk stopped if incomplete, SAMPLE_* flags).
///
/// Shim frames (C-stack entry frames, interpreter-owned frames) are recorded with `code == 0`
/// and dropped by userspace: writing raw frame `i` at iteration `i` keeps the loop state free of
/// counters, so the verifier checks the body once instead of once per frame.
#[inline(always)]
fn walk(frame: u64, pid: u32, layout: u32, chunk: u64, user_sp: u64) -> (usize, u64, u16) {
    chunk_copy::reset(chunk);
    let Some(scratch) = scratch() else {
        return (0, 0, SAMPLE_READ_ERROR);
    };
    scratch.walk = Walk {
        frame,
        last_code: 0,
        last_tag: 0,
        entry_bits: [0; 2],
        user_sp,
        c_entry: 0,
        nframes: 0,
        pid,
        layout,
        flags: 0,
        done: 0,
    };
    unsafe { bpf_loop(MAX_FRAMES as u32, walk_step as *mut c_void, null_mut(), 0) };
    let walk = &scratch.walk;
    let mut flags = walk.flags as u16;
    if walk.done == 0 && walk.frame != 0 {
        flags |= SAMPLE_TRUNCATED;
    }
    let next = if flags & (SAMPLE_TRUNCATED | SAMPLE_READ_ERROR) != 0 {
        walk.frame
    } else {
        0
    };
    (walk.nframes as usize, next, flags)
}

/// One frame of the walk. Returns 1 to stop the loop.
#[inline(never)]
extern "C" fn walk_step(index: u64, _ctx: *mut c_void) -> i64 {
    let Some(scratch) = scratch() else {
        return 1;
    };
    let Scratch { walk, .. } = scratch;
    let Some(sample) = sample_buf() else {
        return 1;
    };
    if walk.frame == 0 {
        walk.done = 1;
        return 1;
    }
    let Some(layout) = LAYOUTS.get(walk.layout) else {
        walk.flags |= SAMPLE_READ_ERROR as u32;
        return 1;
    };
    let Some(words) = frame_words(walk.frame, layout) else {
        walk.flags |= SAMPLE_READ_ERROR as u32;
        return 1;
    };
    let previous = words.previous;
    let mut code = words.executable & layout.executable_mask;
    let owner_shift = (layout.frame_owner % 8) * 8;
    let owner = (words.owner >> owner_shift) & 0xff;
    let entry_owner = layout.is_entry_owner(owner);
    let is_entry = layout.frame_is_entry != 0
        && (words.owner >> ((layout.frame_is_entry % 8) * 8)) & 0xff != 0;
    if entry_owner || is_entry {
        walk.entry_bits[(index as usize / 64) & 1] |= 1 << (index % 64);
    }
    if entry_owner
        && walk.frame > walk.c_entry
        && walk.frame.wrapping_sub(walk.user_sp) < C_STACK_SPAN
    {
        walk.c_entry = walk.frame;
    }
    if layout.is_shim(owner) {
        code = 0;
    } else if owner > PYTHON_OWNERS_MAX {
        log_if!(
            LOG_OWNERS,
            "pid {}: frame {:x} has owner {}, which the layout does not know",
            walk.pid,
            walk.frame,
            owner
        );
    }
    let mut tag = 0;
    if code != 0 && code == walk.last_code {
        // Recursion: the same code object as the frame above, read a moment ago.
        tag = walk.last_tag;
    } else if code != 0 {
        let src = (code + layout.code_tag_offset as u64) as *const [u64; CODE_TAG_BYTES / 8];
        // Read straight into the value: a zero-initialised buffer would cost a byte-wise memset.
        let Ok(span) = (unsafe { bpf_probe_read_user(src) }) else {
            bump(stat::READ_ERRORS);
            log_if!(
                LOG_READS,
                "pid {}: code object read at {:x} failed",
                walk.pid,
                src as u64
            );
            walk.flags |= SAMPLE_READ_ERROR as u32;
            return 1;
        };
        let mut deref = 0;
        if layout.tag_deref_ptr != 0 {
            let slot = (layout.tag_deref_ptr.wrapping_sub(layout.code_tag_offset) / 8) as usize;
            // Constant indexes only: the verifier rejects variable-offset stack reads.
            let mut ptr = 0;
            for (i, &w) in span.iter().enumerate() {
                if i == slot {
                    ptr = w;
                }
            }
            let target = ptr + layout.tag_deref_field as u64;
            deref = unsafe { bpf_probe_read_user(target as *const u64) }.unwrap_or(0);
        }
        tag = fold_tag(&span, deref);
        walk.last_code = code;
        walk.last_tag = tag;
        // The leaf only: a code object runs as the leaf before anything else, and one map
        // lookup per sample is cheap where one per frame is not.
        let key = [walk.pid as u64, code];
        if index == 0 && unsafe { SEEN_CODE.get(&key) } != Some(&tag) {
            let _ = SEEN_CODE.insert(&key, &tag, 0);
            walk.flags |= SAMPLE_NEW_CODE as u32;
        }
    }
    let slot = &mut sample.frames[index as usize & (MAX_FRAMES - 1)];
    slot.frame = walk.frame;
    slot.code = code;
    slot.instr = words.instr;
    slot.tag = tag;
    walk.nframes = index as u32 + 1;
    walk.frame = previous;
    0
}

/// State of the deep walk, carried across `bpf_loop` iterations.
#[repr(C)]
struct DeepWalk {
    frame: u64,
    hash: u64,
    layout: u32,
    frames: u32,
    /// The walk reached the bottom of the stack.
    complete: u32,
    _pad: u32,
}

/// Folds every frame below the recorded ones into a digest without recording them: one read
/// per frame, so userspace can complete the stack from bulk copies and prove the completion
/// is the stack of this sample, not one built later at the same addresses.
#[inline(always)]
fn deep_walk(frame: u64, layout: u32) -> Option<&'static DeepWalk> {
    let scratch = scratch()?;
    scratch.deep = DeepWalk {
        frame,
        hash: 0,
        layout,
        frames: 0,
        complete: 0,
        _pad: 0,
    };
    unsafe { bpf_loop(MAX_DEEP_FRAMES, deep_step as *mut c_void, null_mut(), 0) };
    Some(&scratch.deep)
}

#[inline(never)]
extern "C" fn deep_step(_index: u64, _ctx: *mut c_void) -> i64 {
    let Some(scratch) = scratch() else {
        return 1;
    };
    let deep = &mut scratch.deep;
    if deep.frame == 0 {
        deep.complete = 1;
        return 1;
    }
    let Some(layout) = LAYOUTS.get(deep.layout) else {
        return 1;
    };
    let Some(words) = frame_words(deep.frame, layout) else {
        return 1;
    };
    let code = words.executable & layout.executable_mask;
    deep.hash = fold_frame(deep.hash, deep.frame, code, words.instr);
    deep.frames += 1;
    deep.frame = words.previous;
    0
}

#[inline(always)]
fn emit(sample: &Sample, nframes: usize, eager: bool) {
    const _: () = assert!(
        size_of::<SampleHeader>() + MAX_FRAMES * size_of::<RawFrame>() + NATIVE_BYTES + TASK_BYTES
            == size_of::<Sample>()
    );
    // 1..=MAX_FRAMES raw frames and 0..NATIVE_BYTES of native stack: the verifier must see that
    // the length fits `Sample`.
    let nframes = bounds::size::<{ MAX_FRAMES as u64 }>(nframes as u64) as usize;
    let native = match sample.header.native_len {
        0 => 0,
        n => bounds::size::<{ NATIVE_BYTES as u64 }>(n as u64) as usize,
    };
    // `--async`: the task part after the native part (see `tasks`).
    let tasks = sample.header.ntasks as usize * size_of::<RawTask>()
        + sample.header.ntask_frames as usize * size_of::<RawFrame>();
    let tasks = match tasks {
        0 => 0,
        n => bounds::size::<{ TASK_BYTES as u64 }>(n as u64) as usize,
    };
    let len = size_of::<SampleHeader>() + nframes * size_of::<RawFrame>() + native + tasks;
    let bytes =
        unsafe { core::slice::from_raw_parts(sample as *const Sample as *const u64, len / 8) };
    // Waking the reader costs an interrupt (a VM exit on virtual machines) here and a
    // context switch there, so userspace drains on its own timer and is woken only when the
    // buffer fills up, or for a young process's samples, which must be symbolized before
    // the process (and its code objects) may be gone.
    let wakeup = if eager || EVENTS.query(BPF_RB_AVAIL_DATA) > RINGBUF_WAKEUP_BYTES {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    match EVENTS.output::<[u64]>(bytes, wakeup) {
        Ok(()) => bump(stat::EMITTED),
        Err(_) => {
            bump(stat::RINGBUF_DROPS);
            log_if!(
                LOG_LIMITS,
                "sample ring buffer full: a sample of pid {} dropped",
                sample.header.pid
            );
        }
    }
}
