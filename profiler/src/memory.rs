//! Reading another process's memory with `process_vm_readv`: the target is never stopped,
//! ptraced or written to. Callers batch what they need into as few reads as possible.

use std::io::IoSliceMut;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::sys::uio::{process_vm_readv, RemoteIoVec};
use nix::unistd::Pid;

/// Remote reads issued by this process (all `ProcessMemory`s), for the "reads per sample" figure.
pub static REMOTE_READS: AtomicU64 = AtomicU64::new(0);

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
    pub fn read_vec(&self, addr: u64, len: usize) -> Result<Vec<u8>, ReadError> {
        let mut buf = vec![0u8; len];
        self.read(addr, &mut buf)?;
        Ok(buf)
    }

    /// Reads up to `len` bytes at `addr`, stopping early at an unmapped page: for reads whose
    /// exact size is unknown (a string near the end of a mapping).
    pub fn read_upto(&self, addr: u64, len: usize) -> Result<Vec<u8>, ReadError> {
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

    pub fn read_u64(&self, addr: u64) -> Result<u64, ReadError> {
        let mut buf = [0u8; 8];
        self.read(addr, &mut buf)?;
        Ok(u64::from_le_bytes(buf))
    }
}

/// Little-endian field accessors over a buffer copied from a target; out-of-range offsets read
/// as `None` rather than panicking, because the buffer's contents are untrusted.
pub trait Fields {
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
