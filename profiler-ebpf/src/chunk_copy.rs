//! Frame headers for the walks, read in bulk where the frames are in a stack chunk.
//!
//! A thread's frames live in its stack chunks, a caller below its callee. One copy of the
//! chunk from its data start up to the end of the first frame's header brings every caller
//! in that chunk with it, so a walk costs one read per chunk instead of one per frame.
//! Frames outside the copy (generators', coroutines', or past `MAX_CHUNK_COPIES`) are read
//! one by one. A copy is as good as per-frame reads: both are snapshots of the target's
//! memory taken during this sample, and a frame is used only when its whole header is inside.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::{bpf_probe_read_user_buf, generated::bpf_probe_read_user},
    macros::map,
    maps::PerCpuArray,
};
use profiler_common::{stat, PyOffsets, FRAME_HEADER_BYTES};

use crate::bounds;
use crate::debug::{log_if, LOG_LIMITS, LOG_READS};
use crate::sampler::{bump, read_u64};

/// 32 KiB, the largest per-CPU map value: two default-size (16 KiB) chunks' worth of frames.
const COPY_WORDS: usize = 4096;
const COPY_BYTES: u64 = (COPY_WORDS * 8) as u64;
/// Copies one sample may make; a 1000-frame stack needs about eight.
const MAX_CHUNK_COPIES: u32 = 64;
/// Farther than this above its chunk's data, a frame is not in the chunk (CPython allocates
/// chunks of 16 KiB, or the size of one frame when that is larger).
const MAX_CHUNK_SPAN: u64 = 16 << 20;
/// Power of two so the verifier can bound the word index with a mask.
const HEADER_WORDS: usize = 16;
const _: () = assert!(FRAME_HEADER_BYTES <= HEADER_WORDS * 8);
const HEADER: u64 = FRAME_HEADER_BYTES as u64;

#[map]
static CHUNK_COPY: PerCpuArray<[u64; COPY_WORDS]> = PerCpuArray::with_max_entries(1, 0);
/// One frame header, for frames outside the copy.
#[map]
static FRAME_HEADER: PerCpuArray<[u64; HEADER_WORDS]> = PerCpuArray::with_max_entries(1, 0);
/// What `CHUNK_COPY` holds. Kept in a map, not in the loops' state: the verifier tracks exact
/// values of loop state on the stack, and a copy counter there would make it re-verify the
/// loop body once per value.
#[map]
static COPY_STATE: PerCpuArray<ChunkCopy> = PerCpuArray::with_max_entries(1, 0);

/// Which stretch of the thread's stack `CHUNK_COPY` holds; shared by the walk and the deep walk.
#[repr(C)]
pub(crate) struct ChunkCopy {
    /// Target address of `CHUNK_COPY[0]`, and how many bytes are valid (0: nothing yet).
    lo: u64,
    len: u64,
    /// The chunk the copy was cut from (0: copies are off for this sample).
    chunk: u64,
    /// The chunk before it (its callers' frames continue there) and that chunk's end, read
    /// when first needed (`below_known`), so frames outside every chunk (coroutines') do not
    /// cost a read of them each.
    below: u64,
    below_end: u64,
    below_known: u32,
    copies: u32,
}

/// Starts a sample's copies in `chunk`, the thread state's `datastack_chunk` (0: none).
#[inline(always)]
pub(crate) fn reset(chunk: u64) {
    if let Some(copy) = COPY_STATE.get_ptr_mut(0) {
        let copy = unsafe { &mut *copy };
        copy.lo = 0;
        copy.len = 0;
        copy.chunk = chunk;
        copy.below = 0;
        copy.below_end = 0;
        copy.below_known = 0;
        copy.copies = 0;
    }
}

/// The four header fields the walks use.
pub(crate) struct FrameWords {
    pub previous: u64,
    pub executable: u64,
    /// The word holding the owner byte.
    pub owner: u64,
    pub instr: u64,
}

impl FrameWords {
    /// Picks the fields out of a frame header, given how to read the word at a byte offset.
    #[inline(always)]
    fn pick(layout: &PyOffsets, at: impl Fn(u16) -> u64) -> FrameWords {
        FrameWords {
            previous: at(layout.frame_previous),
            executable: at(layout.frame_executable),
            owner: at(layout.frame_owner),
            instr: at(layout.frame_instr_ptr),
        }
    }
}

#[inline(always)]
fn covers(copy: &ChunkCopy, frame: u64) -> bool {
    let off = frame.wrapping_sub(copy.lo);
    copy.len >= HEADER && off <= copy.len - HEADER && off % 8 == 0
}

/// The header fields of `frame`, from the copy when it is there (sliding the copy down
/// to the frame's chunk when the frame is below it), else from a read of its own.
#[inline(always)]
pub(crate) fn frame_words(frame: u64, layout: &PyOffsets) -> Option<FrameWords> {
    let copy = unsafe { &mut *COPY_STATE.get_ptr_mut(0)? };
    if !covers(copy, frame) {
        slide(copy, frame, layout);
    }
    if covers(copy, frame) {
        let buf = unsafe { &*CHUNK_COPY.get_ptr(0)? };
        let base = ((frame - copy.lo) / 8) as usize;
        return Some(FrameWords::pick(layout, |off| {
            buf[(base + off as usize / 8) & (COPY_WORDS - 1)]
        }));
    }
    let header = unsafe { &mut *FRAME_HEADER.get_ptr_mut(0)? };
    let bytes: &mut [u8; FRAME_HEADER_BYTES] = unsafe { &mut *(header as *mut _ as *mut _) };
    if unsafe { bpf_probe_read_user_buf(frame as *const u8, bytes) }.is_err() {
        bump(stat::READ_ERRORS);
        log_if!(
            LOG_READS,
            "pid {}: frame header read at {:x} failed",
            crate::debug::current_pid(),
            frame
        );
        return None;
    }
    Some(FrameWords::pick(layout, |off| {
        header[(off as usize / 8) & (HEADER_WORDS - 1)]
    }))
}

/// Copies the stretch of a chunk that ends with `frame`'s header: from the chunk's data start,
/// or `COPY_BYTES` below the header's end if the chunk holds more. `frame` is looked for in
/// the current chunk below the copy, then in the chunk before it (chunks are separate
/// mappings, in no particular address order); a frame in neither (a generator's) gets no
/// copy. A failed copy turns copies off for the rest of the sample.
#[inline(always)]
fn slide(copy: &mut ChunkCopy, frame: u64, layout: &PyOffsets) {
    if copy.chunk == 0 {
        return;
    }
    let data = layout.chunk_data as u64;
    let from_data = frame.wrapping_sub(copy.chunk.wrapping_add(data));
    // Below the copy, the rest of its chunk; before the first copy, anything plausibly
    // in the chunk (a coroutine's frame elsewhere in memory should not be copied around).
    let in_current = if copy.len == 0 {
        from_data < MAX_CHUNK_SPAN
    } else {
        frame >= copy.chunk.wrapping_add(data) && frame < copy.lo
    };
    if !in_current {
        if copy.below_known == 0 {
            copy.below_known = 1;
            let below = read_u64(copy.chunk.wrapping_add(layout.chunk_previous as u64));
            copy.below = below.unwrap_or(0);
            if copy.below != 0 {
                let size = read_u64(copy.below.wrapping_add(layout.chunk_size as u64));
                copy.below_end = copy.below.wrapping_add(size.unwrap_or(0));
            }
        }
        let start = copy.below.wrapping_add(data);
        if copy.below == 0 || frame < start || frame.wrapping_add(HEADER) > copy.below_end {
            return;
        }
        copy.chunk = copy.below;
        copy.below_known = 0;
        copy.len = 0;
    }
    if copy.copies >= MAX_CHUNK_COPIES {
        bump(stat::CHUNK_COPY_LIMIT);
        log_if!(
            LOG_LIMITS,
            "pid {}: {} chunk copies made; the rest frame by frame",
            crate::debug::current_pid(),
            MAX_CHUNK_COPIES
        );
        copy.chunk = 0;
        return;
    }
    let Some(hi) = frame.checked_add(HEADER) else {
        return;
    };
    let floor = copy.chunk.wrapping_add(data);
    if hi < floor {
        return;
    }
    let lo = if hi - floor > COPY_BYTES {
        hi - COPY_BYTES
    } else {
        floor
    };
    let len = hi - lo;
    if len == 0 || len > COPY_BYTES {
        return;
    }
    let Some(buf) = CHUNK_COPY.get_ptr_mut(0) else {
        return;
    };
    copy.copies += 1;
    bump(stat::CHUNK_COPIES);
    let len = bounds::size::<COPY_BYTES>(len);
    let failed =
        unsafe { bpf_probe_read_user(buf as *mut c_void, len as u32, lo as *const c_void) } != 0;
    if failed {
        bump(stat::READ_ERRORS);
        log_if!(
            LOG_READS,
            "pid {}: chunk copy of {} bytes at {:x} failed",
            crate::debug::current_pid(),
            len,
            lo
        );
        copy.len = 0;
        copy.chunk = 0;
        return;
    }
    copy.lo = lo;
    copy.len = len;
}
