//! Reading another process's memory with `process_vm_readv`: the target is never stopped,
//! ptraced or written to. Callers batch what they need into as few reads as possible.

use std::io::IoSliceMut;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::sys::uio::{process_vm_readv, RemoteIoVec};
use nix::unistd::Pid;

/// Regions per `process_vm_readv` call in [`ProcessMemory::read_batch`] (`IOV_MAX`).
const BATCH_REGIONS: usize = 1024;

/// Remote reads issued by this process (all `ProcessMemory`s), for the "reads per sample" figure.
pub(crate) static REMOTE_READS: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("process {pid} is gone")]
    Gone { pid: u32 },
    #[error("reading {len} bytes at {addr:#x} in process {pid}: {source}")]
    Failed {
        pid: u32,
        addr: u64,
        len: usize,
        source: nix::Error,
    },
    #[error("short read of {len} bytes at {addr:#x} in process {pid} ({got} read)")]
    Short {
        pid: u32,
        addr: u64,
        len: usize,
        got: usize,
    },
}

/// A handle on one process's address space.
#[derive(Clone, Copy, Debug)]
pub struct ProcessMemory {
    pub pid: u32,
}

impl ProcessMemory {
    pub fn new(pid: u32) -> Self {
        ProcessMemory { pid }
    }

    /// Fills `buf` from `addr`; fails unless every byte was read.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), ReadError> {
        if buf.is_empty() {
            return Ok(());
        }
        REMOTE_READS.fetch_add(1, Ordering::Relaxed);
        let len = buf.len();
        let remote = [RemoteIoVec {
            base: addr as usize,
            len,
        }];
        let mut local = [IoSliceMut::new(buf)];
        match process_vm_readv(Pid::from_raw(self.pid as i32), &mut local, &remote) {
            Ok(got) if got == len => Ok(()),
            Ok(got) => Err(ReadError::Short {
                pid: self.pid,
                addr,
                len,
                got,
            }),
            Err(nix::Error::ESRCH) => Err(ReadError::Gone { pid: self.pid }),
            Err(source) => Err(ReadError::Failed {
                pid: self.pid,
                addr,
                len,
                source,
            }),
        }
    }

    /// Reads `len` bytes at `addr` into a new buffer.
    pub(crate) fn read_vec(&self, addr: u64, len: usize) -> Result<Vec<u8>, ReadError> {
        let mut buf = vec![0u8; len];
        self.read(addr, &mut buf)?;
        Ok(buf)
    }

    /// Reads up to `len` bytes at `addr`, stopping early at an unmapped page: for reads whose
    /// exact size is unknown (a string near the end of a mapping).
    pub(crate) fn read_upto(&self, addr: u64, len: usize) -> Result<Vec<u8>, ReadError> {
        match self.read_vec(addr, len) {
            Ok(buf) => Ok(buf),
            Err(ReadError::Failed { .. } | ReadError::Short { .. }) => {
                let to_page_end = 0x1000 - (addr & 0xfff);
                let first = (to_page_end as usize).min(len);
                self.read_vec(addr, first)
            }
            Err(e) => Err(e),
        }
    }

    /// Reads many small regions with as few `process_vm_readv` calls as it takes: each
    /// region's bytes, or `None` where it could not be read whole. A call stops at the first
    /// region it cannot read (the kernel never splits one), so the next call starts after it;
    /// each call carries at most [`BATCH_REGIONS`] regions.
    pub(crate) fn read_batch(
        &self,
        regions: &[(u64, usize)],
    ) -> Result<Vec<Option<Vec<u8>>>, ReadError> {
        let mut out: Vec<Option<Vec<u8>>> = Vec::with_capacity(regions.len());
        let mut next = 0;
        while next < regions.len() {
            let end = (next + BATCH_REGIONS).min(regions.len());
            let batch = &regions[next..end];
            let total: usize = batch.iter().map(|&(_, len)| len).sum();
            let mut buf = vec![0u8; total];
            let remote: Vec<RemoteIoVec> = batch
                .iter()
                .map(|&(base, len)| RemoteIoVec {
                    base: base as usize,
                    len,
                })
                .collect();
            REMOTE_READS.fetch_add(1, Ordering::Relaxed);
            let got = {
                let mut local = [IoSliceMut::new(&mut buf)];
                match process_vm_readv(Pid::from_raw(self.pid as i32), &mut local, &remote) {
                    Ok(got) => got,
                    Err(nix::Error::ESRCH) => return Err(ReadError::Gone { pid: self.pid }),
                    // The first region failed: nothing was transferred.
                    Err(_) => 0,
                }
            };
            let mut at = 0;
            let mut done = 0;
            for &(_, len) in batch {
                if at + len > got {
                    break;
                }
                out.push(Some(buf[at..at + len].to_vec()));
                at += len;
                done += 1;
            }
            if done < batch.len() {
                // Region `done` could not be read; the call ended there.
                out.push(None);
                done += 1;
            }
            next += done;
        }
        Ok(out)
    }

    pub(crate) fn read_u64(&self, addr: u64) -> Result<u64, ReadError> {
        let mut buf = [0u8; 8];
        self.read(addr, &mut buf)?;
        Ok(u64::from_le_bytes(buf))
    }
}

/// Little-endian field accessors over a buffer copied from a target; out-of-range offsets read
/// as `None` rather than panicking, because the buffer's contents are untrusted.
pub(crate) trait Fields {
    fn u64_at(&self, offset: usize) -> Option<u64>;
    fn u32_at(&self, offset: usize) -> Option<u32>;
    fn i32_at(&self, offset: usize) -> Option<i32> {
        self.u32_at(offset).map(|v| v as i32)
    }
}

impl Fields for [u8] {
    fn u64_at(&self, offset: usize) -> Option<u64> {
        let bytes = self.get(offset..offset.checked_add(8)?)?;
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    }
    fn u32_at(&self, offset: usize) -> Option<u32> {
        let bytes = self.get(offset..offset.checked_add(4)?)?;
        Some(u32::from_le_bytes(bytes.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regions read in one batch: each whole, and an unreadable one in the middle (the call
    /// stops there) costs only itself; more regions than one call carries take more calls.
    #[test]
    fn batched_reads_skip_what_cannot_be_read() {
        let data: Vec<u64> = (0..2048).collect();
        let base = data.as_ptr() as u64;
        let mem = ProcessMemory::new(std::process::id());
        let regions = [(base, 16), (8, 8), (base + 64, 8), (base + 8 * 2047, 8)];
        let got = mem.read_batch(&regions).unwrap();
        assert_eq!(got.len(), 4);
        assert_eq!(got[0].as_deref().and_then(|b| b.u64_at(8)), Some(1));
        assert_eq!(got[1], None);
        assert_eq!(got[2].as_deref().and_then(|b| b.u64_at(0)), Some(8));
        assert_eq!(got[3].as_deref().and_then(|b| b.u64_at(0)), Some(2047));
        let many: Vec<(u64, usize)> = (0..2048).map(|i| (base + 8 * i, 8)).collect();
        let got = mem.read_batch(&many).unwrap();
        assert!(got
            .iter()
            .enumerate()
            .all(|(i, b)| b.as_deref().and_then(|b| b.u64_at(0)) == Some(i as u64)));
        assert!(ProcessMemory::new(u32::MAX >> 1)
            .read_batch(&regions)
            .is_err());
    }
}

/// Hostile memory for the readers' tests: everything that reads another process must survive
/// any bytes it finds there (a target can free, reuse or scribble over memory between the
/// kernel's sample and userspace's read). The tests beside each reader point it at memory of
/// this very process filled with words chosen to break arithmetic (addresses near `u64::MAX`,
/// huge sizes, self-references, unaligned pointers) and require that nothing panics, under
/// every layout pyebpf knows.
#[cfg(test)]
pub(crate) mod test_support {
    use std::sync::Arc;

    use crate::discovery::PythonProcess;
    use crate::python::layout::{PyLayout, PyVersion};
    use crate::python::{debug_offsets, tables};

    const BUFFERS: usize = 8;
    const WORDS: usize = 512;

    /// Buffers of hostile words, some of which point into the buffers themselves.
    pub(crate) struct Arena {
        buffers: Vec<Box<[u64; WORDS]>>,
    }

    impl Arena {
        pub(crate) fn new() -> Arena {
            Arena {
                buffers: (0..BUFFERS).map(|_| Box::new([0u64; WORDS])).collect(),
            }
        }

        pub(crate) fn base(&self, i: usize) -> u64 {
            self.buffers[i].as_ptr() as u64
        }

        /// An address inside the arena (sometimes unaligned, sometimes near a buffer's end).
        pub(crate) fn inside(&self, rng: &mut fastrand::Rng) -> u64 {
            let base = self.base(rng.usize(0..BUFFERS));
            let bytes = (WORDS * 8) as u64;
            match rng.u8(0..4) {
                0 => base + rng.u64(0..bytes),
                1 => base + bytes - rng.u64(1..64),
                _ => base + 8 * rng.u64(0..WORDS as u64),
            }
        }

        pub(crate) fn word(&self, rng: &mut fastrand::Rng) -> u64 {
            match rng.u8(0..10) {
                0..=2 => self.inside(rng),
                3 => u64::MAX - rng.u64(0..64),
                8 => u64::MAX - rng.u64(0..4096),
                4 => rng.u64(..),
                5 => rng.u64(0..8192),
                6 => 1 << rng.u32(0..64),
                7 => (1u64 << 47) - rng.u64(0..4096),
                _ => 0,
            }
        }

        pub(crate) fn scramble(&mut self, rng: &mut fastrand::Rng) {
            for i in 0..BUFFERS {
                for j in 0..WORDS {
                    let w = self.word(rng);
                    self.buffers[i][j] = w;
                }
            }
        }
    }

    pub(crate) fn layouts() -> Vec<PyLayout> {
        let mut all: Vec<PyLayout> = [0x030b_07f0, 0x030c_01f0]
            .into_iter()
            .filter_map(|hex| tables::builtin(PyVersion::from_hex(hex)))
            .collect();
        all.extend(debug_offsets::fixtures::layouts());
        assert_eq!(all.len(), 7, "every layout shape takes part");
        all
    }

    /// A process description for this very process, its runtime at `runtime` (hostile memory).
    pub(crate) fn hostile_process(runtime: u64, layout: PyLayout) -> PythonProcess {
        PythonProcess {
            pid: std::process::id(),
            command: "hostile".into(),
            binary: "hostile".into(),
            runtime,
            layout,
            ns_pid: None,
            identity: Arc::new(crate::identity::ProcessLabels::from_command(
                std::process::id(),
                "3.x",
                "hostile",
            )),
            frame_pointers: None,
        }
    }
}
