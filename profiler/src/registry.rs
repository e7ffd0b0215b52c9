//! The interpreters a session watches, and those it watched before.
//!
//! Watched processes are registered in the kernel's `PROCS` map too; this is userspace's side
//! of it. A process that stops being watched (exit, exec) is kept in `exited` until the next
//! reap, so its samples still queued in the ring buffer are resolved with its caches intact.
//! Bounded by the host's processes: entries of processes that are gone are dropped at reap;
//! the sets of pids profiled and warned about are capped at [`MAX_REMEMBERED`].

use std::collections::HashSet;

use rustc_hash::FxHashMap;

use crate::discovery::PythonProcess;

/// Pids of past processes remembered (to count distinct processes, to warn once); beyond it
/// they are forgotten in bulk, and a pid seen again counts (or warns) again.
const MAX_REMEMBERED: usize = 65536;

#[derive(Default)]
pub(crate) struct Registry {
    procs: FxHashMap<u32, PythonProcess>,
    /// Stopped being watched since the last reap.
    exited: Vec<u32>,
    /// Pids profiled in this session.
    profiled_pids: HashSet<u32>,
    /// Distinct processes profiled in this session (survives `profiled_pids` being trimmed).
    profiled: u64,
    /// Processes already reported as unprofilable (reported once each).
    warned: HashSet<u32>,
    /// Moves on every insert and removal: a reader compares it to skip diffing the set.
    generation: u64,
}

impl Registry {
    pub(crate) fn insert(&mut self, proc: PythonProcess) -> &PythonProcess {
        let pid = proc.pid;
        if self.profiled_pids.len() >= MAX_REMEMBERED {
            self.profiled_pids.clear();
        }
        if self.profiled_pids.insert(pid) {
            self.profiled += 1;
        }
        self.exited.retain(|&p| p != pid);
        self.generation += 1;
        self.procs.entry(pid).insert_entry(proc).into_mut()
    }

    /// Stops watching `pid`; its caches go at the next [`Registry::take_exited`].
    pub(crate) fn remove(&mut self, pid: u32) -> bool {
        let was = self.procs.remove(&pid).is_some();
        if was {
            self.generation += 1;
        }
        if was && !self.exited.contains(&pid) {
            self.exited.push(pid);
        }
        was
    }

    /// Changes whenever the watched set changes.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    pub(crate) fn get(&self, pid: u32) -> Option<&PythonProcess> {
        self.procs.get(&pid)
    }

    pub(crate) fn contains(&self, pid: u32) -> bool {
        self.procs.contains_key(&pid)
    }

    pub(crate) fn watched(&self) -> impl Iterator<Item = &PythonProcess> {
        self.procs.values()
    }

    pub(crate) fn pids(&self) -> Vec<u32> {
        self.procs.keys().copied().collect()
    }

    /// Processes that stopped being watched since the last call.
    pub(crate) fn take_exited(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.exited)
    }

    pub(crate) fn exited(&self) -> usize {
        self.exited.len()
    }

    /// True the first time `pid` is reported as unprofilable.
    pub(crate) fn first_warning(&mut self, pid: u32) -> bool {
        if self.warned.len() >= MAX_REMEMBERED {
            self.warned.clear();
        }
        self.warned.insert(pid)
    }

    /// Processes profiled in this session, exited ones included.
    pub(crate) fn profiled(&self) -> u64 {
        self.profiled
    }

    pub(crate) fn len(&self) -> usize {
        self.procs.len()
    }
}
