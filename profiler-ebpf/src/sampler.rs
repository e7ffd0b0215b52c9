use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_user,
        bpf_probe_read_user_buf,
    },
    macros::{map, perf_event},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
    programs::PerfEventContext,
};
use profiler_common::{
    fold_tag, stat, FrameRecord, ProcInfo, PyOffsets, Sample, SampleHeader, CODE_TAG_BYTES,
    FRAME_HEADER_BYTES, LAYOUT_CFRAME, MAX_FRAMES, MAX_INTERPRETERS, MAX_LAYOUTS, MAX_PROCS,
    MAX_THREADS, MAX_THREAD_WALK, SAMPLE_READ_ERROR, SAMPLE_TRUNCATED, SAMPLE_TSTATE_CACHED,
};

/// 8 MiB: at 1 kHz on 64 CPUs with full-depth records that is still ~30 ms of slack.
const RINGBUF_BYTES: u32 = 8 << 20;
/// Shim frames (C-stack entry frames, interpreter-owned frames) are at most one per
/// Python→C→Python transition; this bounds the loop when they are interleaved.
const MAX_WALK: usize = MAX_FRAMES + 64;
const HEADER_WORDS: usize = FRAME_HEADER_BYTES / 8;

#[map]
static PROCS: HashMap<u32, ProcInfo> = HashMap::with_max_entries(MAX_PROCS, 0);
#[map]
static LAYOUTS: Array<PyOffsets> = Array::with_max_entries(MAX_LAYOUTS, 0);
/// tid → PyThreadState address; revalidated on every use.
#[map]
static THREADS: LruHashMap<u32, u64> = LruHashMap::with_max_entries(MAX_THREADS, 0);
#[map]
static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stat::COUNT, 0);
/// The record under construction (too large for the 512-byte BPF stack).
#[map]
static SCRATCH: PerCpuArray<Sample> = PerCpuArray::with_max_entries(1, 0);
/// One frame header, read with a single probe and then picked apart by layout offsets.
#[map]
static FRAME_HEADER: PerCpuArray<[u64; HEADER_WORDS]> = PerCpuArray::with_max_entries(1, 0);
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(RINGBUF_BYTES, 0);

#[inline(always)]
fn bump(index: u32) {
    if let Some(counter) = STATS.get_ptr_mut(index) {
        unsafe { *counter += 1 };
    }
}

#[inline(always)]
fn read_u64(addr: u64) -> Option<u64> {
    let value = unsafe { bpf_probe_read_user(addr as *const u64) };
    if value.is_err() {
        bump(stat::READ_ERRORS);
    }
    value.ok()
}

#[perf_event]
pub fn sample(_ctx: PerfEventContext) -> u32 {
    bump(stat::EVENTS);
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    let Some(proc) = (unsafe { PROCS.get(&pid) }) else {
        bump(stat::NOT_PYTHON);
        return 0;
    };
    let Some(layout) = LAYOUTS.get(proc.layout) else {
        bump(stat::BAD_LAYOUT);
        return 0;
    };
    let Some((tstate, cached)) = find_tstate(tid, proc, layout) else {
        bump(stat::NO_TSTATE);
        return 0;
    };
    let Some(frame) = current_frame(tstate, layout) else {
        return 0;
    };
    if frame == 0 {
        bump(stat::NO_FRAME);
        return 0;
    }
    let Some(sample) = SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    let sample = unsafe { &mut *sample };
    let header = &mut sample.header;
    header.time_ns = unsafe { bpf_ktime_get_ns() };
    header.tstate = tstate;
    header.datastack_chunk = read_u64(tstate + layout.tstate_datastack_chunk as u64).unwrap_or(0);
    header.pid = pid;
    header.tid = tid;
    header.cpu = unsafe { bpf_get_smp_processor_id() };
    header.flags = if cached { SAMPLE_TSTATE_CACHED } else { 0 };
    let (nframes, next_frame, flags) = walk(frame, layout, &mut sample.frames);
    if nframes == 0 {
        bump(stat::NO_FRAME);
        return 0;
    }
    let header = &mut sample.header;
    header.nframes = nframes as u16;
    header.next_frame = next_frame;
    header.flags |= flags;
    if flags & SAMPLE_TRUNCATED != 0 {
        bump(stat::TRUNCATED);
    }
    emit(sample, nframes);
    0
}

/// Finds the thread's `PyThreadState`: from the tid cache when the cached state still names
/// this thread, else by walking the interpreters' thread lists. Works whether or not the
/// thread holds the GIL.
#[inline(always)]
fn find_tstate(tid: u32, proc: &ProcInfo, layout: &PyOffsets) -> Option<(u64, bool)> {
    let native_id = layout.tstate_native_thread_id as u64;
    if let Some(&cached) = unsafe { THREADS.get(&tid) } {
        if read_u64(cached + native_id) == Some(tid as u64) {
            bump(stat::TSTATE_CACHE_HITS);
            return Some((cached, true));
        }
        let _ = THREADS.remove(&tid);
    }
    let mut interp = read_u64(proc.runtime + layout.runtime_interpreters_head as u64)?;
    for _ in 0..MAX_INTERPRETERS {
        if interp == 0 {
            return None;
        }
        let mut tstate = read_u64(interp + layout.interp_threads_head as u64)?;
        for _ in 0..MAX_THREAD_WALK {
            if tstate == 0 {
                break;
            }
            if read_u64(tstate + native_id)? == tid as u64 {
                let _ = THREADS.insert(&tid, &tstate, 0);
                return Some((tstate, false));
            }
            tstate = read_u64(tstate + layout.tstate_next as u64)?;
        }
        if tstate != 0 {
            bump(stat::THREAD_WALK_LIMIT);
        }
        interp = read_u64(interp + layout.interp_next as u64)?;
    }
    if interp != 0 {
        bump(stat::THREAD_WALK_LIMIT);
    }
    None
}

#[inline(always)]
fn current_frame(tstate: u64, layout: &PyOffsets) -> Option<u64> {
    let first = read_u64(tstate + layout.tstate_current_frame as u64)?;
    if layout.flags & LAYOUT_CFRAME == 0 {
        return Some(first);
    }
    if first == 0 {
        return Some(0);
    }
    read_u64(first + layout.cframe_current_frame as u64)
}

#[inline(always)]
fn word(header: &[u64; HEADER_WORDS], offset: u16) -> u64 {
    header[(offset as usize / 8) % HEADER_WORDS]
}

/// Walks `previous` links from `frame`, recording Python frames and skipping shims.
/// Returns (frames recorded, where the walk stopped if truncated, SAMPLE_* flags).
#[inline(always)]
fn walk(mut frame: u64, layout: &PyOffsets, out: &mut [FrameRecord; MAX_FRAMES]) -> (usize, u64, u16) {
    let Some(header) = FRAME_HEADER.get_ptr_mut(0) else {
        return (0, 0, SAMPLE_READ_ERROR);
    };
    let header = unsafe { &mut *header };
    let mut n = 0usize;
    for _ in 0..MAX_WALK {
        if frame == 0 {
            return (n, 0, 0);
        }
        if n >= MAX_FRAMES {
            return (n, frame, SAMPLE_TRUNCATED);
        }
        let bytes: &mut [u8; FRAME_HEADER_BYTES] = unsafe { &mut *(header as *mut _ as *mut _) };
        if unsafe { bpf_probe_read_user_buf(frame as *const u8, bytes) }.is_err() {
            bump(stat::READ_ERRORS);
            return (n, frame, SAMPLE_READ_ERROR);
        }
        let previous = word(header, layout.frame_previous);
        let code = word(header, layout.frame_executable) & layout.executable_mask;
        let owner_shift = (layout.frame_owner % 8) * 8;
        let owner = (word(header, layout.frame_owner) >> owner_shift) & 0xff;
        let shim = owner < 32 && layout.skip_owner_mask & (1 << owner) != 0;
        if shim || code == 0 {
            frame = previous;
            continue;
        }
        let instr = word(header, layout.frame_instr_ptr);
        let mut window = [0u64; CODE_TAG_BYTES / 8];
        let window_bytes: &mut [u8; CODE_TAG_BYTES] = unsafe { &mut *(&mut window as *mut _ as *mut _) };
        let src = (code + layout.code_tag_offset as u64) as *const u8;
        if unsafe { bpf_probe_read_user_buf(src, window_bytes) }.is_err() {
            bump(stat::READ_ERRORS);
            return (n, frame, SAMPLE_READ_ERROR);
        }
        let slot = &mut out[n % MAX_FRAMES];
        slot.frame = frame;
        slot.code = code;
        slot.instr = instr;
        slot.tag = fold_tag(&window);
        n += 1;
        frame = previous;
    }
    (n, frame, if frame == 0 { 0 } else { SAMPLE_TRUNCATED })
}

#[inline(always)]
fn emit(sample: &Sample, nframes: usize) {
    let len = size_of::<SampleHeader>() + nframes * size_of::<FrameRecord>();
    if len > size_of::<Sample>() {
        return;
    }
    let bytes = unsafe { core::slice::from_raw_parts(sample as *const Sample as *const u64, len / 8) };
    match EVENTS.output::<[u64]>(bytes, 0) {
        Ok(()) => bump(stat::EMITTED),
        Err(_) => bump(stat::RINGBUF_DROPS),
    }
}
