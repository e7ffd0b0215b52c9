//! The crate's private parsers of foreign data, reachable by the fuzz targets in `fuzz/`.
//!
//! One module of thin wrappers rather than making each parser `pub`: the parsers keep their
//! narrow visibility (so the compiler still flags them when unused), and the surface the fuzz
//! crate depends on is listed in one place. Hidden from the docs: not an API.

use profiler_common::MAX_DEEP_FRAMES;

use crate::complete::ChunkCopy;
use crate::discovery::Mapping;
use crate::identity::Environ;
use crate::memory::ProcessMemory;
use crate::python::layout::PyLayout;

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
