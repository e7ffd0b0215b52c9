//! `--async`: the sample's asyncio task chain, captured in the interrupt.
//!
//! Tasks live for milliseconds in busy asyncio programs (a `TaskGroup` or `gather` tree makes
//! thousands a second), and their memory goes to the next object at once. Read later from
//! userspace, a task's address shows another task or no task at all, so the chain is
//! captured here, while the sampled thread (the only one that changes its tasks) is stopped:
//! the running task (`tstate->asyncio_running_task`), then each task awaiting it
//! (`task_awaited_by`, while it is one task rather than a set), up to `MAX_SAMPLE_TASKS`
//! tasks. For each: its coroutine, its awaiter and the first bytes of its name object
//! (`RawTask`), and, for the awaiting tasks, the coroutine frames they are suspended in,
//! followed from the task's coroutine through each `await`ed coroutine (`gi_frame_state`
//! says it waits in `yield from`; the awaited object sits `yield_from_slot` stack slots below
//! `stackpointer`; it is followed while it has the task coroutine's type), at most
//! `MAX_TASK_FRAMES` frames in all. The running task's frames are the sample's own.
//!
//! Cost: per task, one read of its fields and one of its name; per awaiting coroutine, one
//! read of it and its frame, one of the awaited object's slot and one of its type, plus one
//! of its code object unless a recent frame ran the same code (recursion).
//!
//! The part goes after the sample's native part: `ntasks` `RawTask`s, then `ntask_frames`
//! `RawFrame`s (`SampleHeader`). Bounds: `MAX_SAMPLE_TASKS`, `MAX_TASK_FRAMES`, and the loop
//! runs at most one step per task and per frame.

use core::{ffi::c_void, ptr::null_mut};

use aya_ebpf::{
    helpers::generated::{bpf_loop, bpf_probe_read_kernel, bpf_probe_read_user as read_user_raw},
    macros::map,
    maps::PerCpuArray,
};
use profiler_common::{
    fold_tag, stat, ProcInfo, PyOffsets, RawFrame, RawTask, Sample, SampleHeader, TaskLayout,
    CODE_TAG_BYTES, CORO_SPAN_BYTES, MAX_FRAMES, MAX_SAMPLE_TASKS, MAX_TASK_FRAMES, NATIVE_BYTES,
    TASKS_CONTINUE, TASKS_NOT_A_TASK, TASKS_READ_ERROR, TASK_AWAITED_BY_SET, TASK_BYTES,
    TASK_CORO_CUT, TASK_CORO_UNREAD, TASK_NAME_BYTES, TASK_NAME_UNREAD, TASK_SPAN_BYTES,
};

use crate::bounds;
use crate::debug::{log_if, LOG_LAYOUT, LOG_READS};
use crate::sampler::{bump, read_u64};

/// Code objects whose tag the walk remembers (recursive coroutines repeat their code).
const TAG_CACHE: usize = 4;
const SPAN_WORDS: usize = CORO_SPAN_BYTES / 8;

/// State of the task walk, carried across `bpf_loop` iterations. In a map (as the frame
/// walk's): 6.1's verifier would otherwise check the callback only with the initial values.
#[repr(C)]
struct TaskWalk {
    /// The task to capture next (0: the chain ended).
    task: u64,
    /// The coroutine to follow next in the last task captured (0: go on to `task`).
    coro: u64,
    /// Type of that task's coroutine: awaited objects of this type are followed.
    coro_type: u64,
    /// (code, tag) of recent frames.
    tags: [[u64; 2]; TAG_CACHE],
    executable_mask: u64,
    /// Start and length of the one read of a task's fields, and of a coroutine's.
    task_lo: u64,
    task_len: u64,
    coro_lo: u64,
    coro_len: u64,
    l: TaskLayout,
    frame_executable: u16,
    frame_instr_ptr: u16,
    code_tag_offset: u16,
    tag_deref_ptr: u16,
    tag_deref_field: u16,
    _pad: u16,
    ntasks: u32,
    nframes: u32,
    flags: u32,
    next_tag: u32,
}

/// Per-CPU working memory of the task walk: its state, and the part being built.
#[repr(C)]
struct TaskScratch {
    walk: TaskWalk,
    /// The last read of a task's or a coroutine's fields.
    span: [u64; SPAN_WORDS],
    /// A code object's tag span (and the `tag_deref_ptr` target's word).
    code: [u64; CODE_TAG_BYTES / 8],
    tasks: [RawTask; MAX_SAMPLE_TASKS],
    frames: [RawFrame; MAX_TASK_FRAMES],
}

#[map]
static TASK_SCRATCH: PerCpuArray<TaskScratch> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn scratch() -> Option<&'static mut TaskScratch> {
    TASK_SCRATCH.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

/// Captures the task chain of the thread whose state is `tstate` into `sample`'s task part
/// (after its `nframes` frames and its native part) and header. Nothing when `proc` is not
/// `--async` or no task runs.
#[inline(always)]
pub(crate) fn capture(sample: &mut Sample, tstate: u64, proc: &ProcInfo, layout: &PyOffsets) {
    let offset = proc.running_task_offset;
    if offset == 0 {
        return;
    }
    let Some(running) = read_u64(tstate.wrapping_add(offset as u64)) else {
        return;
    };
    sample.header.running_task = running;
    if running == 0 {
        return;
    }
    let Some(s) = scratch() else {
        return;
    };
    let l = proc.tasks;
    let task_lo = min5(l.awaited_by, l.coro, l.name, l.is_task, l.awaited_by_is_set) as u64 & !7;
    let task_hi = max5(
        l.awaited_by + 8,
        l.coro + 8,
        l.name + 8,
        l.is_task + 1,
        l.awaited_by_is_set + 1,
    ) as u64;
    let frame_hi = max3(
        layout.frame_executable,
        layout.frame_instr_ptr,
        l.stackpointer,
    ) as u64;
    let coro_lo = l.ob_type.min(l.gi_frame_state) as u64 & !7;
    let coro_hi = (l.gi_iframe as u64 + frame_hi + 8).max(l.gi_frame_state as u64 + 1);
    if task_hi <= task_lo
        || task_hi - task_lo > TASK_SPAN_BYTES as u64
        || coro_hi - coro_lo > CORO_SPAN_BYTES as u64
    {
        bump(stat::BAD_LAYOUT);
        log_if!(
            LOG_LAYOUT,
            "pid {}: task fields span more than one read",
            crate::debug::current_pid()
        );
        return;
    }
    s.walk = TaskWalk {
        task: running,
        coro: 0,
        coro_type: 0,
        tags: [[0; 2]; TAG_CACHE],
        executable_mask: layout.executable_mask,
        task_lo,
        task_len: task_hi - task_lo,
        coro_lo,
        coro_len: coro_hi - coro_lo,
        l,
        frame_executable: layout.frame_executable,
        frame_instr_ptr: layout.frame_instr_ptr,
        code_tag_offset: layout.code_tag_offset,
        tag_deref_ptr: layout.tag_deref_ptr,
        tag_deref_field: layout.tag_deref_field,
        _pad: 0,
        ntasks: 0,
        nframes: 0,
        flags: 0,
        next_tag: 0,
    };
    let steps = (MAX_SAMPLE_TASKS + MAX_TASK_FRAMES + 1) as u32;
    unsafe { bpf_loop(steps, task_step as *mut c_void, null_mut(), 0) };
    let w = &s.walk;
    let mut flags = w.flags;
    if w.task != 0 && w.coro == 0 && flags & (TASKS_READ_ERROR | TASKS_NOT_A_TASK) == 0 {
        // Room ran out with an awaiter left.
        flags |= TASKS_CONTINUE;
    }
    let ntasks = (w.ntasks as usize).min(MAX_SAMPLE_TASKS);
    let nframes = (w.nframes as usize).min(MAX_TASK_FRAMES);
    // The part starts after the frames and the native part that are sent.
    let frames_len = sample.header.nframes as u64 * size_of::<RawFrame>() as u64;
    let frames_len = bounds::size::<{ (MAX_FRAMES * size_of::<RawFrame>()) as u64 }>(frames_len);
    let native_len = match sample.header.native_len {
        0 => 0,
        n => bounds::size::<{ NATIVE_BYTES as u64 }>(n as u64),
    };
    let mut at = size_of::<SampleHeader>() as u64 + frames_len + native_len;
    let base = sample as *mut Sample as *mut u8;
    let mut copy = |src: *const c_void, len: u64| -> bool {
        let len = bounds::size::<{ (TASK_BYTES / 2) as u64 }>(len);
        let dst = unsafe { base.add(at as usize) } as *mut c_void;
        if unsafe { bpf_probe_read_kernel(dst, len as u32, src) } != 0 {
            return false;
        }
        at += len;
        true
    };
    let mut kept_tasks = 0;
    let mut kept_frames = 0;
    if ntasks > 0
        && copy(
            s.tasks.as_ptr() as *const c_void,
            (ntasks * size_of::<RawTask>()) as u64,
        )
    {
        kept_tasks = ntasks;
        if nframes > 0
            && copy(
                s.frames.as_ptr() as *const c_void,
                (nframes * size_of::<RawFrame>()) as u64,
            )
        {
            kept_frames = nframes;
        }
    }
    sample.header.ntasks = kept_tasks as u16;
    sample.header.ntask_frames = kept_frames as u16;
    sample.header.task_flags = flags;
}

#[inline(always)]
fn min5(a: u16, b: u16, c: u16, d: u16, e: u16) -> u16 {
    a.min(b).min(c).min(d).min(e)
}

#[inline(always)]
fn max5(a: u16, b: u16, c: u16, d: u16, e: u16) -> u16 {
    a.max(b).max(c).max(d).max(e)
}

#[inline(always)]
fn max3(a: u16, b: u16, c: u16) -> u16 {
    a.max(b).max(c)
}

/// The word at byte offset `off` of the last span read from `lo`.
#[inline(always)]
fn word(span: &[u64; SPAN_WORDS], lo: u64, off: u16) -> u64 {
    span[((off as u64).wrapping_sub(lo) / 8) as usize & (SPAN_WORDS - 1)]
}

/// The byte at byte offset `off` of the last span read from `lo`.
#[inline(always)]
fn byte(span: &[u64; SPAN_WORDS], lo: u64, off: u16) -> u8 {
    let bytes: &[u8; CORO_SPAN_BYTES] = unsafe { &*(span as *const _ as *const _) };
    bytes[((off as u64).wrapping_sub(lo)) as usize & (CORO_SPAN_BYTES - 1)]
}

/// Reads `len` (≤ `CORO_SPAN_BYTES`) bytes at `addr` into the span buffer.
#[inline(always)]
fn read_span(span: &mut [u64; SPAN_WORDS], addr: u64, len: u64) -> bool {
    let len = bounds::size::<{ CORO_SPAN_BYTES as u64 }>(len);
    let failed = unsafe {
        read_user_raw(
            span.as_mut_ptr() as *mut c_void,
            len as u32,
            addr as *const c_void,
        )
    } != 0;
    if failed {
        bump(stat::READ_ERRORS);
        log_if!(
            LOG_READS,
            "pid {}: task or coroutine read of {} bytes at {:x} failed",
            crate::debug::current_pid(),
            len,
            addr
        );
    }
    !failed
}

/// One step: capture the next task, or one coroutine frame of the last task. Returns 1 to
/// stop the loop.
#[inline(never)]
extern "C" fn task_step(_index: u64, _ctx: *mut c_void) -> i64 {
    let Some(s) = scratch() else {
        return 1;
    };
    let TaskScratch {
        walk: w,
        span,
        code: code_buf,
        tasks,
        frames,
    } = s;
    if w.coro == 0 {
        // The next task.
        if w.task == 0 {
            return 1;
        }
        if w.ntasks as usize >= MAX_SAMPLE_TASKS {
            return 1;
        }
        let addr = w.task;
        if !read_span(span, addr.wrapping_add(w.task_lo), w.task_len) {
            w.flags |= TASKS_READ_ERROR;
            return 1;
        }
        let l = w.l;
        if byte(span, w.task_lo, l.is_task) != 1 {
            w.flags |= TASKS_NOT_A_TASK;
            return 1;
        }
        let coro = word(span, w.task_lo, l.coro);
        let awaited_by = word(span, w.task_lo, l.awaited_by);
        let is_set = byte(span, w.task_lo, l.awaited_by_is_set) != 0;
        let name = word(span, w.task_lo, l.name);
        let first = w.ntasks == 0;
        let t = &mut tasks[w.ntasks as usize & (MAX_SAMPLE_TASKS - 1)];
        t.task = addr;
        t.coro = coro;
        t.awaited_by = awaited_by;
        t.name = name;
        t.first_frame = w.nframes as u16;
        t.nframes = 0;
        t.flags = 0;
        // The name's first bytes; a short object near the end of a mapping may not have
        // them all, so then its first half.
        let head = t.name_head.as_mut_ptr() as *mut c_void;
        let mut read = false;
        for len in [TASK_NAME_BYTES, TASK_NAME_BYTES / 2] {
            if !read && name != 0 {
                read = unsafe { read_user_raw(head, len as u32, name as *const c_void) } == 0;
            }
        }
        if !read {
            t.name_head = [0; TASK_NAME_BYTES / 8];
            t.flags |= TASK_NAME_UNREAD;
        }
        w.ntasks += 1;
        // The running task's coroutine frames are in the sample's stack.
        w.coro = if first { 0 } else { coro };
        w.coro_type = 0;
        w.task = awaited_by;
        if is_set && awaited_by != 0 {
            t.flags |= TASK_AWAITED_BY_SET;
            w.flags |= TASKS_CONTINUE;
            w.task = 0;
        }
        return 0;
    }
    // One coroutine of the last task captured.
    let t = &mut tasks[(w.ntasks as usize).wrapping_sub(1) & (MAX_SAMPLE_TASKS - 1)];
    if w.nframes as usize >= MAX_TASK_FRAMES {
        t.flags |= TASK_CORO_CUT;
        w.coro = 0;
        w.task = 0;
        return 1;
    }
    let gen = w.coro;
    if !read_span(span, gen.wrapping_add(w.coro_lo), w.coro_len) {
        t.flags |= TASK_CORO_UNREAD;
        w.coro = 0;
        return 0;
    }
    let l = w.l;
    let ty = word(span, w.coro_lo, l.ob_type);
    if w.coro_type == 0 {
        w.coro_type = ty;
    }
    let frame_word = |field: u16| word(span, w.coro_lo, l.gi_iframe.wrapping_add(field));
    let code = frame_word(w.frame_executable) & w.executable_mask;
    let instr = frame_word(w.frame_instr_ptr);
    let sp = frame_word(l.stackpointer);
    let state = byte(span, w.coro_lo, l.gi_frame_state);
    if code == 0 {
        t.flags |= TASK_CORO_UNREAD;
        w.coro = 0;
        return 0;
    }
    let Some(tag) = tag_of(w, code_buf, code) else {
        t.flags |= TASK_CORO_UNREAD;
        w.coro = 0;
        return 0;
    };
    let f = &mut frames[w.nframes as usize & (MAX_TASK_FRAMES - 1)];
    f.frame = gen.wrapping_add(l.gi_iframe as u64);
    f.code = code;
    f.instr = instr;
    f.tag = tag;
    w.nframes += 1;
    t.nframes += 1;
    w.coro = 0;
    if state != l.suspended_yield_from {
        return 0;
    }
    // The awaited object: followed when it is a coroutine too.
    let slot = sp.wrapping_sub(8 * l.yield_from_slot as u64);
    let Some(awaited) = read_u64(slot).map(|a| a & w.executable_mask) else {
        t.flags |= TASK_CORO_UNREAD;
        return 0;
    };
    if awaited == 0 {
        return 0;
    }
    if read_u64(awaited.wrapping_add(l.ob_type as u64)) == Some(w.coro_type) {
        w.coro = awaited;
    }
    0
}

/// The tag of the code object at `code` (see `RawFrame::tag`), from the walk's cache or read.
#[inline(always)]
fn tag_of(w: &mut TaskWalk, buf: &mut [u64; CODE_TAG_BYTES / 8], code: u64) -> Option<u64> {
    for entry in w.tags.iter() {
        if entry[0] == code {
            return Some(entry[1]);
        }
    }
    let src = code.wrapping_add(w.code_tag_offset as u64) as *const c_void;
    if unsafe { read_user_raw(buf.as_mut_ptr() as *mut c_void, CODE_TAG_BYTES as u32, src) } != 0 {
        bump(stat::READ_ERRORS);
        return None;
    }
    let mut deref = 0;
    if w.tag_deref_ptr != 0 {
        let slot = (w.tag_deref_ptr.wrapping_sub(w.code_tag_offset) / 8) as usize;
        // Constant indexes: a remainder by 7 is no bound the verifier follows.
        let mut ptr = 0;
        for (i, &w) in buf.iter().enumerate() {
            if i == slot {
                ptr = w;
            }
        }
        deref = read_u64(ptr.wrapping_add(w.tag_deref_field as u64)).unwrap_or(0);
    }
    let tag = fold_tag(buf, deref);
    let i = w.next_tag as usize % TAG_CACHE;
    w.tags[i] = [code, tag];
    w.next_tag = w.next_tag.wrapping_add(1);
    Some(tag)
}
