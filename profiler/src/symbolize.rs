//! (pid, code address, tag) → function, file and line table, cached.
//!
//! The key includes the tag the kernel folded from the code object at sample time, so a code
//! object freed and replaced by another at the same address gets a new entry instead of the
//! old name. Steady-state sampling of a stable program does no remote reads at all.

use rustc_hash::FxHashMap;
use std::sync::Arc;

use crate::memory::{ProcessMemory, ReadError};
use crate::python::code::{read_code, CodeInfo};
use crate::python::layout::PyLayout;

/// Code objects kept; past this the cache starts over (and `evictions` counts it).
pub(crate) const MAX_CODE_ENTRIES: usize = 1 << 18;

#[derive(Default, Debug, Clone, Copy, serde::Serialize)]
pub(crate) struct SymbolStats {
    pub lookups: u64,
    pub misses: u64,
    pub errors: u64,
    pub evictions: u64,
    /// Free-threaded 3.14+: reads of a code object's per-thread bytecode copies made because a
    /// frame's instruction pointer lay in none of those known (a thread's first run of it).
    pub tlbc_reads: u64,
    /// Frames whose instruction pointer lay in no copy even after that read (shown at the
    /// function's first line).
    pub tlbc_unmatched: u64,
}

#[derive(Default)]
pub(crate) struct Symbolizer {
    cache: FxHashMap<(u32, u64, u64), Option<Arc<CodeInfo>>>,
    pub stats: SymbolStats,
}

impl Symbolizer {
    /// The code object `code` of process `pid` as it was when the kernel saw tag `tag`;
    /// `None` when it cannot be read or no longer matches.
    pub(crate) fn code(
        &mut self,
        pid: u32,
        layout: &PyLayout,
        code: u64,
        tag: u64,
    ) -> Option<Arc<CodeInfo>> {
        self.stats.lookups += 1;
        if let Some(hit) = self.cache.get(&(pid, code, tag)) {
            return hit.clone();
        }
        self.stats.misses += 1;
        let info = match read_code(&ProcessMemory::new(pid), layout, code, tag) {
            Ok(info) => Some(Arc::new(info)),
            Err(err) => {
                self.stats.errors += 1;
                log::debug!("pid {pid}: code object {code:#x}: {err:#}");
                let gone = err
                    .downcast_ref::<ReadError>()
                    .is_some_and(|e| matches!(e, ReadError::Gone { .. }));
                if gone {
                    return None;
                }
                None
            }
        };
        if self.cache.len() >= MAX_CODE_ENTRIES {
            self.cache.clear();
            self.stats.evictions += 1;
        }
        self.cache.insert((pid, code, tag), info.clone());
        info
    }

    /// The line `instr` of a frame running `info` (the code object at `code`) is at. With
    /// per-thread bytecode (free-threaded 3.14+) a copy made since `info` was read is looked
    /// up first.
    pub(crate) fn line(
        &mut self,
        pid: u32,
        layout: &PyLayout,
        code: u64,
        info: &CodeInfo,
        instr: u64,
    ) -> u32 {
        if layout.code.tlbc != 0 && info.bytecode_start(layout, code, instr).is_none() {
            self.stats.tlbc_reads += 1;
            let refreshed = info.refresh_tlbc(&ProcessMemory::new(pid), layout, code);
            if let Err(err) = &refreshed {
                log::debug!("pid {pid}: co_tlbc of {code:#x}: {err:#}");
            }
            if info.bytecode_start(layout, code, instr).is_none() {
                self.stats.tlbc_unmatched += 1;
            }
        }
        info.line_at_instr(layout, code, instr)
    }

    /// Drops everything cached for an exited process.
    pub(crate) fn forget_process(&mut self, pid: u32) {
        self.cache.retain(|&(p, _, _), _| p != pid);
    }

    pub(crate) fn len(&self) -> usize {
        self.cache.len()
    }
}
