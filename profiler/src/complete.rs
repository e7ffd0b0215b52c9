//! Completing stacks deeper than the kernel records.
//!
//! The kernel records the top `MAX_FRAMES` frames and, below them, folds every frame's
//! (address, code, instruction) into `deep_hash`. Userspace finishes the stack from bulk copies
//! of the thread's stack chunks (a handful of reads for thousands of frames; frames living
//! outside chunks, such as generators', are read one by one) and accepts the result only if it
//! folds to the same digest: a chain rebuilt at the same addresses by different calls since
//! the sample (CPython gh-151613) fails the check, and the sample stays truncated.
//!
//! Validated tails are cached per thread by (continuation frame, digest, depth). The digest
//! is taken at sample time, so a hit proves the tail is unchanged without reading anything.

use std::collections::HashMap;

use rustc_hash::FxHashMap;
use std::sync::Arc;

use profiler_common::{
    fold_frame, RawFrame, SampleHeader, FRAME_HEADER_BYTES, MAX_DEEP_FRAMES,
    SAMPLE_DEEP_INCOMPLETE, SAMPLE_READ_ERROR,
};

use crate::memory::{Fields, ProcessMemory, ReadError};
use crate::python::code::read_tag;
use crate::python::layout::PyLayout;

/// Stack chunks copied per completion (CPython's chunks are ≥ 16 KiB: ≥ 1 MiB of frames).
const MAX_CHUNKS: usize = 64;
/// Bytes copied per completion.
const MAX_CHUNK_BYTES: u64 = 16 << 20;
/// First read of a chunk: CPython's usual chunk size, so one read covers most chunks.
const CHUNK_FIRST_READ: usize = 16 << 10;
/// Frames outside chunks (generators, coroutines) read one by one per completion.
const MAX_LOOSE_FRAMES: usize = 1024;
/// Cached tails, all threads together; past this the cache starts over.
const MAX_TAILS: usize = 4096;

/// Why a stack could not be copied, walked or completed. `Read(Gone)` (the target exited)
/// stays apart from garbage in its memory.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StackError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("short {0}")]
    Short(&'static str),
    #[error("implausible stack chunk of {size} bytes at {addr:#x}")]
    ImplausibleChunk { size: u64, addr: u64 },
    #[error("too many frames outside stack chunks")]
    TooManyLooseFrames,
    #[error("the stack is deeper than at sample time")]
    Deeper,
    #[error("the stack changed since the sample ({now} frames vs {then} at sample time)")]
    Changed { now: u32, then: u32 },
    #[error("code object at {addr:#x}: {why}")]
    Tag { addr: u64, why: String },
    /// Re-reading the thread state, to see whether the stack moved while it was copied.
    #[error(transparent)]
    Thread(#[from] crate::python::threads::ThreadsError),
}

/// Where each sample's stack came from.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct CompletionStats {
    /// Samples the kernel recorded whole.
    pub kernel: u64,
    /// Deep samples whose tail came from the cache (no reads).
    pub cache: u64,
    /// Deep samples completed from fresh chunk copies.
    pub chunks: u64,
    /// Deep samples that could not be completed and validated.
    pub truncated: u64,
    /// ...of which the digest did not match (the stack changed before it was copied).
    pub changed: u64,
    /// Remote reads made for completion.
    pub reads: u64,
    pub cache_evictions: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct TailKey {
    pid: u32,
    tid: u32,
    next_frame: u64,
    deep_hash: u64,
    deep_frames: u32,
}

#[derive(Default)]
pub struct Completer {
    tails: FxHashMap<TailKey, Arc<[RawFrame]>>,
    pub stats: CompletionStats,
}

struct Chunk {
    addr: u64,
    bytes: Vec<u8>,
}

impl Completer {
    /// Counts a sample the kernel recorded whole.
    pub(crate) fn kernel_complete(&mut self) {
        self.stats.kernel += 1;
    }

    /// The Python frames below the kernel's recorded ones, leaf first, or `None` when they
    /// cannot be proven to be this sample's.
    pub fn complete(
        &mut self,
        pid: u32,
        tid: u32,
        layout: &PyLayout,
        header: &SampleHeader,
    ) -> Option<Arc<[RawFrame]>> {
        // The kernel folds at most MAX_DEEP_FRAMES frames into `deep_hash`; a header claiming
        // more is corrupt, and walking that many frames round a cyclic chain in a chunk copy
        // would take minutes.
        if header.flags & (SAMPLE_DEEP_INCOMPLETE | SAMPLE_READ_ERROR) != 0
            || header.next_frame == 0
            || header.deep_frames > MAX_DEEP_FRAMES
        {
            self.stats.truncated += 1;
            return None;
        }
        let key = TailKey {
            pid,
            tid,
            next_frame: header.next_frame,
            deep_hash: header.deep_hash,
            deep_frames: header.deep_frames,
        };
        if let Some(tail) = self.tails.get(&key) {
            self.stats.cache += 1;
            return Some(tail.clone());
        }
        let mem = ProcessMemory::new(pid);
        match self.walk(&mem, layout, header) {
            Ok(tail) => {
                self.stats.chunks += 1;
                if self.tails.len() >= MAX_TAILS {
                    self.tails.clear();
                    self.stats.cache_evictions += 1;
                }
                let tail: Arc<[RawFrame]> = tail.into();
                self.tails.insert(key, tail.clone());
                Some(tail)
            }
            Err(why) => {
                log::debug!("pid {pid} tid {tid}: stack not completed: {why}");
                self.stats.truncated += 1;
                None
            }
        }
    }

    /// Drops the cached tails of an exited process.
    pub(crate) fn forget_process(&mut self, pid: u32) {
        self.tails.retain(|k, _| k.pid != pid);
    }

    #[cfg(test)]
    pub(crate) fn cached_tails(&self) -> usize {
        self.tails.len()
    }

    fn walk(
        &mut self,
        mem: &ProcessMemory,
        layout: &PyLayout,
        header: &SampleHeader,
    ) -> Result<Vec<RawFrame>, StackError> {
        let reads = &mut self.stats.reads;
        let stack = ChunkCopy::read(mem, layout, header.datastack_chunk, reads)?;
        let mut walked = stack.walk(mem, layout, header.next_frame, header.deep_frames, reads)?;
        if !walked.complete {
            return Err(StackError::Deeper);
        }
        if walked.count != header.deep_frames || walked.hash != header.deep_hash {
            self.stats.changed += 1;
            return Err(StackError::Changed {
                now: walked.count,
                then: header.deep_frames,
            });
        }
        tag_frames(mem, layout, &mut walked.frames, reads)?;
        Ok(walked.frames)
    }
}

/// Copies of one thread's stack chunks (`_PyStackChunk`s, newest first), so a walk over
/// thousands of frames costs a handful of reads.
pub(crate) struct ChunkCopy {
    chunks: Vec<Chunk>,
}

/// A frame chain walked by [`ChunkCopy::walk`].
pub(crate) struct WalkedStack {
    /// Python frames, leaf first, with `tag` 0 (see [`tag_frames`]).
    pub frames: Vec<RawFrame>,
    /// Frames visited, shims included.
    pub count: u32,
    /// [`fold_frame`] over every frame visited, as the kernel computes `deep_hash`.
    pub hash: u64,
    /// The walk reached the bottom of the stack (else it stopped at `max_frames`).
    pub complete: bool,
}

fn read(
    mem: &ProcessMemory,
    addr: u64,
    len: usize,
    reads: &mut u64,
) -> Result<Vec<u8>, StackError> {
    *reads += 1;
    Ok(mem.read_vec(addr, len)?)
}

impl ChunkCopy {
    /// Copies the chunk list starting at `first` (a thread state's `datastack_chunk`).
    pub(crate) fn read(
        mem: &ProcessMemory,
        layout: &PyLayout,
        first: u64,
        reads: &mut u64,
    ) -> Result<ChunkCopy, StackError> {
        let mut chunks = Vec::new();
        let mut total = 0u64;
        let mut addr = first;
        while addr != 0 && chunks.len() < MAX_CHUNKS {
            *reads += 1;
            let mut bytes = mem.read_upto(addr, CHUNK_FIRST_READ)?;
            let size = bytes
                .u64_at(layout.kernel.chunk_size as usize)
                .ok_or(StackError::Short("chunk header"))?;
            total = total.saturating_add(size);
            if size < layout.kernel.chunk_data as u64 || total > MAX_CHUNK_BYTES {
                return Err(StackError::ImplausibleChunk { size, addr });
            }
            if size as usize > bytes.len() {
                let rest = read(
                    mem,
                    addr.wrapping_add(bytes.len() as u64),
                    size as usize - bytes.len(),
                    reads,
                )?;
                bytes.extend_from_slice(&rest);
            }
            bytes.truncate(size as usize);
            let previous = bytes
                .u64_at(layout.kernel.chunk_previous as usize)
                .ok_or(StackError::Short("chunk header"))?;
            chunks.push(Chunk { addr, bytes });
            addr = previous;
        }
        Ok(ChunkCopy { chunks })
    }

    /// Walks `previous` links from `frame` to the bottom of the stack, taking frame headers
    /// from the chunk copies (frames outside them, such as generators', are read one by one).
    /// Stops after `max_frames` frames (`complete` false).
    pub(crate) fn walk(
        &self,
        mem: &ProcessMemory,
        layout: &PyLayout,
        mut frame: u64,
        max_frames: u32,
        reads: &mut u64,
    ) -> Result<WalkedStack, StackError> {
        let k = &layout.kernel;
        let data_start = layout.kernel.chunk_data as u64;
        let mut frames = Vec::new();
        let mut hash = 0u64;
        let mut count = 0u32;
        let mut loose = 0usize;
        while frame != 0 {
            if count >= max_frames {
                break;
            }
            let copied = self.chunks.iter().find_map(|c| {
                let start = frame.checked_sub(c.addr)?;
                let end = start.checked_add(FRAME_HEADER_BYTES as u64)?;
                (start >= data_start && end <= c.bytes.len() as u64)
                    .then(|| &c.bytes[start as usize..end as usize])
            });
            let owned;
            let bytes = match copied {
                Some(bytes) => bytes,
                None => {
                    loose += 1;
                    if loose > MAX_LOOSE_FRAMES {
                        return Err(StackError::TooManyLooseFrames);
                    }
                    owned = read(mem, frame, FRAME_HEADER_BYTES, reads)?;
                    &owned[..]
                }
            };
            let field = |off: u16| {
                bytes
                    .u64_at(off as usize)
                    .ok_or(StackError::Short("frame header"))
            };
            let previous = field(k.frame_previous)?;
            let code = field(k.frame_executable)? & k.executable_mask;
            let instr = field(k.frame_instr_ptr)?;
            let owner = bytes.get(k.frame_owner as usize).copied().unwrap_or(0) as u32;
            hash = fold_frame(hash, frame, code, instr);
            count += 1;
            let shim = k.is_shim(owner as u64);
            if !shim && code != 0 {
                frames.push(RawFrame {
                    frame,
                    code,
                    instr,
                    tag: 0,
                });
            }
            frame = previous;
        }
        Ok(WalkedStack {
            frames,
            count,
            hash,
            complete: frame == 0,
        })
    }
}

/// Tags each distinct code object of `frames` once, as the kernel does for the frames it
/// records.
pub(crate) fn tag_frames(
    mem: &ProcessMemory,
    layout: &PyLayout,
    frames: &mut [RawFrame],
    reads: &mut u64,
) -> Result<(), StackError> {
    let mut tags: HashMap<u64, u64> = HashMap::new();
    for f in frames {
        if let Some(&tag) = tags.get(&f.code) {
            f.tag = tag;
            continue;
        }
        *reads += 1 + (layout.kernel.tag_deref_ptr != 0) as u64;
        f.tag = read_tag(mem, layout, f.code).map_err(|e| StackError::Tag {
            addr: f.code,
            why: format!("{e:#}"),
        })?;
        tags.insert(f.code, f.tag);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::layout::PyVersion;
    use crate::python::tables::builtin;

    /// A three-frame stack in one stack chunk, laid out as 3.12 does, in this process's own
    /// memory (read back with `process_vm_readv` like a target's).
    struct Stack {
        chunk: Vec<u8>,
        _code: Vec<u8>,
        frames: [u64; 3],
        code: u64,
    }

    fn stack(layout: &PyLayout) -> Stack {
        let k = &layout.kernel;
        let code = vec![0x5au8; 512];
        let code_addr = code.as_ptr() as u64;
        let size = k.chunk_data as usize + 3 * FRAME_HEADER_BYTES;
        let mut chunk = vec![0u8; size];
        let base = chunk.as_ptr() as u64;
        let put = |buf: &mut Vec<u8>, at: usize, v: u64| {
            buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
        };
        put(&mut chunk, k.chunk_previous as usize, 0);
        put(&mut chunk, k.chunk_size as usize, size as u64);
        let frame_at = |i: usize| k.chunk_data as usize + i * FRAME_HEADER_BYTES;
        let frames = [0, 1, 2].map(|i| base + frame_at(i) as u64);
        for i in 0..3 {
            let previous = if i < 2 { frames[i + 1] } else { 0 };
            put(
                &mut chunk,
                frame_at(i) + k.frame_previous as usize,
                previous,
            );
            put(
                &mut chunk,
                frame_at(i) + k.frame_executable as usize,
                code_addr,
            );
            let instr = code_addr + 200 + 2 * i as u64;
            put(&mut chunk, frame_at(i) + k.frame_instr_ptr as usize, instr);
        }
        Stack {
            chunk,
            _code: code,
            frames,
            code: code_addr,
        }
    }

    fn header(s: &Stack, deep_hash: u64) -> SampleHeader {
        let mut h: SampleHeader = bytemuck::Zeroable::zeroed();
        h.datastack_chunk = s.chunk.as_ptr() as u64;
        h.next_frame = s.frames[0];
        h.deep_frames = 3;
        h.deep_hash = deep_hash;
        h
    }

    fn digest(s: &Stack) -> u64 {
        s.frames.iter().enumerate().fold(0, |hash, (i, &f)| {
            fold_frame(hash, f, s.code, s.code + 200 + 2 * i as u64)
        })
    }

    #[test]
    fn a_stack_whose_digest_matches_is_completed() {
        let layout = builtin(PyVersion::from_hex(0x030c_01f0)).unwrap();
        let s = stack(&layout);
        let mut completer = Completer::default();
        let pid = std::process::id();
        let tail = completer
            .complete(pid, pid, &layout, &header(&s, digest(&s)))
            .expect("completed");
        let frames: Vec<u64> = tail.iter().map(|f| f.frame).collect();
        assert_eq!(frames, s.frames);
        assert_eq!((completer.stats.chunks, completer.stats.changed), (1, 0));
        assert_eq!(completer.cached_tails(), 1);
    }

    #[test]
    fn a_stack_whose_digest_does_not_match_is_rejected_and_counted_as_changed() {
        let layout = builtin(PyVersion::from_hex(0x030c_01f0)).unwrap();
        let s = stack(&layout);
        let mut completer = Completer::default();
        let pid = std::process::id();
        let wrong = digest(&s) ^ 1;
        assert!(completer
            .complete(pid, pid, &layout, &header(&s, wrong))
            .is_none());
        let st = completer.stats;
        assert_eq!((st.changed, st.truncated, st.chunks), (1, 1, 0));
        assert_eq!(
            completer.cached_tails(),
            0,
            "nothing cached for a rejected stack"
        );
    }

    #[test]
    fn a_header_claiming_more_frames_than_the_kernel_folds_is_refused_without_a_walk() {
        // A chain whose last frame points back at the first: only `deep_frames` ends the walk,
        // so u32::MAX of it (a bound found auditing for the `complete` fuzz target) is refused.
        let layout = builtin(PyVersion::from_hex(0x030c_01f0)).unwrap();
        let mut s = stack(&layout);
        let k = &layout.kernel;
        let last = k.chunk_data as usize + 2 * FRAME_HEADER_BYTES + k.frame_previous as usize;
        s.chunk[last..last + 8].copy_from_slice(&s.frames[0].to_le_bytes());
        let mut completer = Completer::default();
        let pid = std::process::id();
        let mut h = header(&s, 0);
        h.deep_frames = u32::MAX;
        let started = std::time::Instant::now();
        assert!(completer.complete(pid, pid, &layout, &h).is_none());
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        assert_eq!(
            (completer.stats.truncated, completer.stats.reads),
            (1, 0),
            "refused before reading"
        );
    }
}

#[cfg(test)]
mod hostile {
    use super::*;
    use crate::memory::test_support::{layouts, Arena};
    use profiler_common::SAMPLE_TRUNCATED;

    #[test]
    fn stack_completion_survives_hostile_memory() {
        let mut rng = fastrand::Rng::with_seed(11);
        let pid = std::process::id();
        let mut arena = Arena::new();
        let mut completer = Completer::default();
        for layout in layouts() {
            for _ in 0..300 {
                arena.scramble(&mut rng);
                for _ in 0..10 {
                    let header = SampleHeader {
                        datastack_chunk: arena.word(&mut rng),
                        next_frame: arena.word(&mut rng),
                        deep_hash: rng.u64(..),
                        // Mostly what the kernel can fold; sometimes a corrupt count.
                        deep_frames: if rng.u8(..) < 224 {
                            rng.u32(..=MAX_DEEP_FRAMES)
                        } else {
                            rng.u32(..)
                        },
                        pid,
                        tid: pid,
                        flags: SAMPLE_TRUNCATED,
                        ..Default::default()
                    };
                    let _ = completer.complete(pid, pid, &layout, &header);
                }
            }
        }
        assert!(completer.stats.reads > 0, "completion never read memory");
    }
}
