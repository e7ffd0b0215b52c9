//! Completing a deep stack from copies of a target's stack chunks (`Completer::complete`),
//! with a sample header built from the input.
//!
//! Arguments: 0 `datastack_chunk`, 1 `next_frame`, 2 `deep_hash`, 3 `deep_frames` (low 32
//! bits). Flags: the header's `flags`, except bit 15: take `deep_hash` and `deep_frames` from
//! a walk of the image, so that inputs get past the digest check.
#![no_main]

use libfuzzer_sys::fuzz_target;
use profiler::complete::Completer;
use profiler::python::layout::PyLayout;
use profiler_common::{SampleHeader, FRAME_HEADER_BYTES, SAMPLE_TRUNCATED};
use pyebpf_fuzz::{chunk_frame, load, write_seeds, Image, ARENA};

const DIGEST: u16 = 1 << 15;

fn seeds(i: usize, l: &PyLayout) -> Vec<Vec<u8>> {
    let k = &l.kernel;
    let mut out = Vec::new();
    // One chunk of three frames; two chunks with a frame each plus a loose (generator) frame.
    for chunks in [1usize, 2] {
        let mut im = Image::new(i, SAMPLE_TRUNCATED | DIGEST);
        let code = 0xd00;
        im.put(code, &[0x5a; 256]);
        let per_chunk = if chunks == 1 { 3 } else { 1 };
        let size = k.chunk_data as usize + per_chunk * FRAME_HEADER_BYTES;
        let mut frames = Vec::new();
        for c in 0..chunks {
            let at = 0x100 + c * 0x500;
            let previous = if c + 1 < chunks {
                ARENA + at as u64 + 0x500
            } else {
                0
            };
            im.u64(at + k.chunk_previous as usize, previous)
                .u64(at + k.chunk_size as usize, size as u64);
            frames.extend((0..per_chunk).map(|f| chunk_frame(l, at, f)));
        }
        if chunks == 2 {
            frames.insert(1, 0xc00);
        }
        for (n, &f) in frames.iter().enumerate() {
            let previous = frames.get(n + 1).map_or(0, |&p| ARENA + p as u64);
            im.u64(f + k.frame_previous as usize, previous)
                .u64(f + k.frame_executable as usize, ARENA + code as u64)
                .u64(
                    f + k.frame_instr_ptr as usize,
                    ARENA + code as u64 + 200 + 2 * n as u64,
                );
        }
        im.arg(0, ARENA + 0x100)
            .arg(1, ARENA + frames[0] as u64)
            .arg(3, frames.len() as u64);
        out.push(im.finish());
    }
    out
}

fuzz_target!(
    init: write_seeds("complete", seeds),
    |data: &[u8]| {
        let Some(input) = load(data) else {
            return;
        };
        let pid = std::process::id();
        let l = &input.layout;
        let [chunk, next_frame, mut deep_hash, deep_frames] = input.args;
        let mut deep_frames = deep_frames as u32;
        if input.flags & DIGEST != 0 {
            if let Some((frames, hash)) = profiler::fuzzing::stack_digest(pid, l, chunk, next_frame) {
                (deep_frames, deep_hash) = (frames, hash);
            }
        }
        let header = SampleHeader {
            datastack_chunk: chunk,
            next_frame,
            deep_hash,
            deep_frames,
            pid,
            tid: pid,
            flags: input.flags & !DIGEST,
            ..Default::default()
        };
        // A fresh completer per input (its tail cache would make runs depend on each other);
        // the second call takes the cache path.
        let mut completer = Completer::default();
        let first = completer.complete(pid, pid, l, &header);
        let second = completer.complete(pid, pid, l, &header);
        assert_eq!(first.is_some(), second.is_some(), "a cached tail is the tail");
    }
);
