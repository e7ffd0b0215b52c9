//! Raw samples from the ring buffer → typed values. Pure: no maps, no processes, unit-tested below.
//!
//! A raw sample is a [`SampleHeader`] followed by `nframes` [`RawFrame`]s, `native_len`
//! bytes of native stack and, with `--async`, `ntasks` [`RawTask`]s and `ntask_frames`
//! [`RawFrame`]s, as the kernel writes them (`profiler-ebpf/src/sampler.rs`, `tasks.rs`). The
//! bytes come from our own BPF program, but a truncated or corrupt sample must still cost a
//! counter, never a panic.

use profiler_common::{RawFrame, RawTask, SampleHeader, NATIVE_FRAME_POINTERS, NATIVE_STACK_COPY};

/// One sample as the kernel recorded it.
pub(crate) struct RawSample<'a> {
    pub header: SampleHeader,
    frames: &'a [u8],
    native: &'a [u8],
    tasks: &'a [u8],
    task_frames: &'a [u8],
}

/// The user stack captured with a sample (`--native`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NativeCapture<'a> {
    /// The kernel's frame-pointer walk: (ip, sp) pairs, leaf first, ending in (0, 0) when
    /// the chain was whole (16 bytes each).
    FramePointers(&'a [u8]),
    /// The top of the user stack, from `sp` up.
    Copy {
        ip: u64,
        sp: u64,
        bp: u64,
        stack: &'a [u8],
    },
}

impl<'a> NativeCapture<'a> {
    /// The frame-pointer walk's (ip, sp) pairs.
    pub(crate) fn pairs(bytes: &'a [u8]) -> impl Iterator<Item = (u64, u64)> + 'a {
        let word = |w: &[u8]| u64::from_ne_bytes(w.try_into().unwrap_or_default());
        bytes
            .chunks_exact(16)
            .map(move |p| (word(&p[..8]), word(&p[8..])))
    }
}

impl RawSample<'_> {
    /// The recorded frames, leaf first (shim frames have `code == 0`).
    pub(crate) fn frames(&self) -> impl Iterator<Item = RawFrame> + '_ {
        self.frames
            .chunks_exact(size_of::<RawFrame>())
            .map(bytemuck::pod_read_unaligned::<RawFrame>)
    }

    /// The native part, when the sample has one.
    pub(crate) fn native(&self) -> Option<NativeCapture<'_>> {
        let [ip, sp, bp] = self.header.regs;
        match self.header.native as u32 {
            _ if self.native.is_empty() => None,
            NATIVE_FRAME_POINTERS => Some(NativeCapture::FramePointers(self.native)),
            NATIVE_STACK_COPY => Some(NativeCapture::Copy {
                ip,
                sp,
                bp,
                stack: self.native,
            }),
            _ => None,
        }
    }

    /// `--async`: the task chain captured with the sample, the running task first.
    pub(crate) fn tasks(&self) -> impl Iterator<Item = RawTask> + '_ {
        self.tasks
            .chunks_exact(size_of::<RawTask>())
            .map(bytemuck::pod_read_unaligned::<RawTask>)
    }

    /// `--async`: the awaiting tasks' coroutine frames (see [`RawTask::first_frame`]).
    pub(crate) fn task_frames(&self) -> impl Iterator<Item = RawFrame> + '_ {
        self.task_frames
            .chunks_exact(size_of::<RawFrame>())
            .map(bytemuck::pod_read_unaligned::<RawFrame>)
    }

    /// Whether recorded frame `index` is an eval loop's entry frame.
    pub(crate) fn is_entry(&self, index: usize) -> bool {
        index < 128 && self.header.entry_bits[index / 64] & (1 << (index % 64)) != 0
    }
}

/// Decodes a raw sample; `None` when it is shorter than its header says.
pub(crate) fn sample(bytes: &[u8]) -> Option<RawSample<'_>> {
    let header_len = size_of::<SampleHeader>();
    let header: SampleHeader = bytemuck::pod_read_unaligned(bytes.get(..header_len)?);
    let frames_len = (header.nframes as usize).checked_mul(size_of::<RawFrame>())?;
    let frames_end = header_len.checked_add(frames_len)?;
    let frames = bytes.get(header_len..frames_end)?;
    let native_end = frames_end.checked_add(header.native_len as usize)?;
    let native = bytes.get(frames_end..native_end)?;
    let tasks_end = native_end.checked_add(header.ntasks as usize * size_of::<RawTask>())?;
    let tasks = bytes.get(native_end..tasks_end)?;
    let task_frames_end =
        tasks_end.checked_add(header.ntask_frames as usize * size_of::<RawFrame>())?;
    let task_frames = bytes.get(tasks_end..task_frames_end)?;
    Some(RawSample {
        header,
        frames,
        native,
        tasks,
        task_frames,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw_sample(nframes: u16, frames: &[RawFrame]) -> Vec<u8> {
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

    fn frame(code: u64) -> RawFrame {
        RawFrame {
            frame: 0x1000 + code,
            code,
            instr: 2,
            tag: 3,
        }
    }

    #[test]
    fn decodes_header_and_frames_leaf_first() {
        let bytes = raw_sample(2, &[frame(10), frame(20)]);
        let rec = sample(&bytes).unwrap();
        assert_eq!((rec.header.pid, rec.header.tid), (7, 8));
        let codes: Vec<u64> = rec.frames().map(|f| f.code).collect();
        assert_eq!(codes, [10, 20]);
    }

    #[test]
    fn short_samples_are_rejected_not_read_past() {
        let bytes = raw_sample(3, &[frame(10), frame(20)]);
        assert!(sample(&bytes).is_none());
        assert!(sample(&bytes[..10]).is_none());
        assert!(sample(&[]).is_none());
    }

    #[test]
    fn native_part_follows_the_frames() {
        let header = SampleHeader {
            nframes: 1,
            native: NATIVE_STACK_COPY as u16,
            native_len: 16,
            regs: [1, 2, 3],
            entry_bits: [0b10, 0],
            ..Default::default()
        };
        let mut bytes = bytemuck::bytes_of(&header).to_vec();
        bytes.extend_from_slice(bytemuck::bytes_of(&frame(10)));
        bytes.extend_from_slice(&[7; 16]);
        let rec = sample(&bytes).unwrap();
        assert!(!rec.is_entry(0) && rec.is_entry(1) && !rec.is_entry(500));
        let Some(NativeCapture::Copy { ip, sp, bp, stack }) = rec.native() else {
            panic!("no stack copy");
        };
        assert_eq!((ip, sp, bp, stack), (1, 2, 3, &[7u8; 16][..]));
        // A native part longer than the sample is a short sample.
        assert!(sample(&bytes[..bytes.len() - 1]).is_none());
    }

    #[test]
    fn task_part_follows_the_native_part() {
        let header = SampleHeader {
            nframes: 1,
            native: NATIVE_STACK_COPY as u16,
            native_len: 8,
            ntasks: 2,
            ntask_frames: 1,
            ..Default::default()
        };
        let mut bytes = bytemuck::bytes_of(&header).to_vec();
        bytes.extend_from_slice(bytemuck::bytes_of(&frame(10)));
        bytes.extend_from_slice(&[7; 8]);
        for task in [0x100u64, 0x200] {
            let t = RawTask {
                task,
                first_frame: 0,
                nframes: (task == 0x200) as u16,
                ..Default::default()
            };
            bytes.extend_from_slice(bytemuck::bytes_of(&t));
        }
        bytes.extend_from_slice(bytemuck::bytes_of(&frame(30)));
        let rec = sample(&bytes).unwrap();
        let tasks: Vec<u64> = rec.tasks().map(|t| t.task).collect();
        assert_eq!(tasks, [0x100, 0x200]);
        assert_eq!(rec.task_frames().map(|f| f.code).collect::<Vec<_>>(), [30]);
        assert!(matches!(rec.native(), Some(NativeCapture::Copy { stack, .. }) if stack == [7; 8]));
        // A task part cut short is a short sample.
        assert!(sample(&bytes[..bytes.len() - 8]).is_none());
    }

    /// The ring buffer rounds samples up; bytes past the frames are ignored.
    #[test]
    fn trailing_bytes_are_ignored() {
        let mut bytes = raw_sample(1, &[frame(10)]);
        bytes.extend_from_slice(&[0xff; 8]);
        assert_eq!(sample(&bytes).unwrap().frames().count(), 1);
    }
}
