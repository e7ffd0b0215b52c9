//! Ring-buffer records → typed values. Pure: no maps, no processes, unit-tested below.
//!
//! A sample record is a [`SampleHeader`] followed by `nframes` [`FrameRecord`]s, as the kernel
//! writes them (`profiler-ebpf/src/sampler.rs`). The bytes come from our own BPF program, but
//! a truncated or corrupt record must still cost a counter, never a panic.

use profiler_common::{FrameRecord, SampleHeader};

/// One sample as the kernel recorded it.
pub struct SampleRecord<'a> {
    pub header: SampleHeader,
    frames: &'a [u8],
}

impl SampleRecord<'_> {
    /// The recorded frames, leaf first (shim frames have `code == 0`).
    pub fn frames(&self) -> impl Iterator<Item = FrameRecord> + '_ {
        self.frames
            .chunks_exact(size_of::<FrameRecord>())
            .map(bytemuck::pod_read_unaligned::<FrameRecord>)
    }
}

/// Decodes a sample record; `None` when it is shorter than its header says.
pub fn sample(bytes: &[u8]) -> Option<SampleRecord<'_>> {
    let header_len = size_of::<SampleHeader>();
    let header: SampleHeader = bytemuck::pod_read_unaligned(bytes.get(..header_len)?);
    let frames_len = (header.nframes as usize).checked_mul(size_of::<FrameRecord>())?;
    let frames = bytes.get(header_len..header_len.checked_add(frames_len)?)?;
    Some(SampleRecord { header, frames })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(nframes: u16, frames: &[FrameRecord]) -> Vec<u8> {
        let header = SampleHeader {
            pid: 7,
            tid: 8,
            nframes,
            ..Default::default()
        };
        let mut bytes = bytemuck::bytes_of(&header).to_vec();
        for f in frames {
            bytes.extend_from_slice(bytemuck::bytes_of(f));
        }
        bytes
    }

    fn frame(code: u64) -> FrameRecord {
        FrameRecord {
            frame: 0x1000 + code,
            code,
            instr: 2,
            tag: 3,
        }
    }

    #[test]
    fn decodes_header_and_frames_leaf_first() {
        let bytes = record(2, &[frame(10), frame(20)]);
        let rec = sample(&bytes).unwrap();
        assert_eq!((rec.header.pid, rec.header.tid), (7, 8));
        let codes: Vec<u64> = rec.frames().map(|f| f.code).collect();
        assert_eq!(codes, [10, 20]);
    }

    #[test]
    fn short_records_are_rejected_not_read_past() {
        let bytes = record(3, &[frame(10), frame(20)]);
        assert!(sample(&bytes).is_none());
        assert!(sample(&bytes[..10]).is_none());
        assert!(sample(&[]).is_none());
    }

    /// The ring buffer rounds records up; bytes past the frames are ignored.
    #[test]
    fn trailing_bytes_are_ignored() {
        let mut bytes = record(1, &[frame(10)]);
        bytes.extend_from_slice(&[0xff; 8]);
        assert_eq!(sample(&bytes).unwrap().frames().count(), 1);
    }
}
