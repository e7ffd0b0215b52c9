//! Thread names as Python knows them: `threading.Thread.name`, read from the target's
//! `threading._active` (thread ident → `Thread`) without running code in it.
//!
//! Before 3.14 CPython gives its threads no OS names, so `/proc` calls every thread of a 3.11
//! program `python3.11`; the names people gave their threads live only in `threading`. The
//! way there: the interpreter's `sys.modules` → the `threading` module → its `_active` dict,
//! whose keys are thread idents (`PyThreadState.thread_id`) and whose values are the `Thread`
//! objects, each with its name in the instance attribute `_name`. Dicts and attributes are
//! decoded by the layout (`dicts`); an int key's hash is the int itself, so idents need no
//! reads of their own.
//!
//! Bounded: [`MAX_MODULES`] entries of `sys.modules`, [`MAX_GLOBALS`] of the module's globals,
//! [`MAX_ACTIVE`] threads, names cut at [`MAX_NAME_CHARS`]. Where the module was found is
//! remembered per interpreter ([`ProcessNames`]); [`ThreadNames`] caches each thread's name
//! by (pid, tid) and the thread's start time, so a reused tid is named again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use super::code::read_str_prefix;
use super::dicts::{dict_entries, find_str, AttrReader, DictError};
use super::layout::PyLayout;
use super::threads::{thread_states, ThreadsError};
use crate::discovery::PythonProcess;
use crate::memory::{ProcessMemory, ReadError};

/// Entries of `sys.modules` looked through for `threading`.
pub(crate) const MAX_MODULES: usize = 16 << 10;
/// Entries of the `threading` module's globals looked through for `_active`.
const MAX_GLOBALS: usize = 4096;
/// Threads read from `_active`.
pub(crate) const MAX_ACTIVE: usize = 4096;
/// Characters of a name kept.
pub(crate) const MAX_NAME_CHARS: u64 = 128;
/// Threads whose names a [`ThreadNames`] keeps; past this it starts over.
pub(crate) const MAX_CACHED: usize = 1 << 16;
/// How soon a process whose names were just read is read again for a thread not found.
const REREAD_AFTER: Duration = Duration::from_secs(1);
/// `sys.hash_info.modulus` (2**61 - 1): a non-negative int below it hashes to itself.
const HASH_MODULUS: u64 = (1 << 61) - 1;

#[derive(Debug, thiserror::Error)]
pub(crate) enum NamesError {
    #[error("this layout does not locate sys.modules")]
    Unsupported,
    #[error("the program has not imported threading")]
    NoThreading,
    #[error("threading has no _active dict")]
    NoActive,
    #[error(transparent)]
    Dict(#[from] DictError),
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Threads(#[from] ThreadsError),
}

/// Where one process's `threading._active` is, and what its `Thread` types look like.
#[derive(Default)]
pub(crate) struct ProcessNames {
    /// interpreter → (the `threading` module's globals, the `"_active"` key in them).
    globals: HashMap<u64, (u64, u64)>,
    attrs: AttrReader,
}

impl ProcessNames {
    /// Thread ident → `Thread.name`, for every thread in `threading._active` of interpreter
    /// `interp`.
    pub(crate) fn read(
        &mut self,
        mem: &ProcessMemory,
        layout: &PyLayout,
        interp: u64,
    ) -> Result<HashMap<u64, String>, NamesError> {
        let active = self.active(mem, layout, interp)?;
        let mut out = HashMap::new();
        for entry in dict_entries(mem, layout, active, MAX_ACTIVE)? {
            let Some(ident) = entry.hash.filter(|&h| h < HASH_MODULUS) else {
                continue;
            };
            let Ok(Some(name)) = self.attrs.get(mem, layout, entry.value, "_name") else {
                continue;
            };
            if let Ok((mut text, len)) = read_str_prefix(mem, layout, name, MAX_NAME_CHARS) {
                if len > MAX_NAME_CHARS {
                    text.push('…');
                }
                out.insert(ident, text);
            }
        }
        Ok(out)
    }

    /// The `threading._active` dict of interpreter `interp`.
    fn active(
        &mut self,
        mem: &ProcessMemory,
        layout: &PyLayout,
        interp: u64,
    ) -> Result<u64, NamesError> {
        if let Some(&(globals, key)) = self.globals.get(&interp) {
            // Found before: `_active` is rebound only after a fork, so look its key up again.
            if let Ok(entries) = dict_entries(mem, layout, globals, MAX_GLOBALS) {
                if let Some(e) = entries.iter().find(|e| e.key == key) {
                    return Ok(e.value);
                }
            }
            self.globals.remove(&interp);
        }
        let a = &layout.attrs;
        if a.interp_modules == 0 {
            return Err(NamesError::Unsupported);
        }
        let modules = mem.read_u64(interp.wrapping_add(a.interp_modules as u64))?;
        let entries = dict_entries(mem, layout, modules, MAX_MODULES)?;
        let threading =
            find_str(mem, layout, &entries, "threading")?.ok_or(NamesError::NoThreading)?;
        let globals = mem.read_u64(threading.value.wrapping_add(a.module_dict as u64))?;
        let entries = dict_entries(mem, layout, globals, MAX_GLOBALS)?;
        let active = find_str(mem, layout, &entries, "_active")?.ok_or(NamesError::NoActive)?;
        if self.globals.len() >= MAX_CACHED {
            self.globals.clear();
        }
        self.globals.insert(interp, (globals, active.key));
        Ok(active.value)
    }
}

/// The host tid → Python name of every thread of `proc` that `threading` names.
pub(crate) fn process_thread_names(
    proc: &PythonProcess,
    names: &mut ProcessNames,
) -> Result<HashMap<u32, String>, NamesError> {
    let mem = ProcessMemory::new(proc.pid);
    let layout = &proc.layout;
    let tstates = thread_states(&mem, layout, proc.runtime, &mut 0)?;
    let host_tids: HashMap<u32, u32> = match proc.ns_pid {
        Some(_) => crate::procfs::host_tids(proc.pid).into_iter().collect(),
        None => HashMap::new(),
    };
    let mut by_interp: HashMap<u64, HashMap<u64, String>> = HashMap::new();
    let mut out = HashMap::new();
    let mut last_error = None;
    for (tstate, fields) in tstates {
        let idents = match by_interp.get(&fields.interp) {
            Some(idents) => idents,
            None => {
                let read = names.read(&mem, layout, fields.interp).unwrap_or_else(|e| {
                    last_error = Some(e);
                    HashMap::new()
                });
                by_interp.entry(fields.interp).or_insert(read)
            }
        };
        let Ok(ident) = mem.read_u64(tstate.wrapping_add(layout.thread.thread_id as u64)) else {
            continue;
        };
        let Some(name) = idents.get(&ident) else {
            continue;
        };
        let ns_tid = fields.native_id as u32;
        let tid = host_tids.get(&ns_tid).copied().unwrap_or(ns_tid);
        out.insert(tid, name.clone());
    }
    match (out.is_empty(), last_error) {
        (true, Some(e)) => Err(e),
        _ => Ok(out),
    }
}

/// What naming threads did, for `--stats-json`.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub(crate) struct NameStats {
    /// Threads named from `threading`.
    pub python: u64,
    /// Threads named by the OS (`threading` does not know them, or could not be read).
    pub os: u64,
    /// Reads of a process's names (each reads its thread list and `_active`).
    pub reads: u64,
    pub errors: u64,
    /// Times the cache was full and started over.
    pub evictions: u64,
}

/// Thread names for samples: `threading`'s name of a thread where it has one, its OS name
/// (`/proc/PID/task/TID/comm`) otherwise, cached per (pid, tid) and thread start time.
#[derive(Default)]
pub(crate) struct ThreadNames {
    names: FxHashMap<(u32, u32), (Option<u64>, Arc<str>)>,
    /// Per process: where its names are, and when they were last read.
    processes: HashMap<u32, (ProcessNames, Instant)>,
    pub stats: NameStats,
}

impl ThreadNames {
    /// The name of thread `tid` (host id) of `proc`.
    pub(crate) fn name(&mut self, proc: &PythonProcess, tid: u32) -> Arc<str> {
        let start = crate::procfs::thread_start(proc.pid, tid);
        if let Some((at, name)) = self.names.get(&(proc.pid, tid)) {
            if *at == start {
                return name.clone();
            }
        }
        let recent = self
            .processes
            .get(&proc.pid)
            .is_some_and(|(_, at)| at.elapsed() < REREAD_AFTER);
        if !recent {
            self.refresh(proc);
            if let Some((at, name)) = self.names.get(&(proc.pid, tid)) {
                if *at == start {
                    return name.clone();
                }
            }
        }
        self.stats.os += 1;
        let name: Arc<str> = os_name(proc.pid, tid).into();
        self.insert((proc.pid, tid), (start, name.clone()));
        name
    }

    /// Reads every name of `proc` again.
    fn refresh(&mut self, proc: &PythonProcess) {
        self.stats.reads += 1;
        if self.processes.len() >= MAX_CACHED && !self.processes.contains_key(&proc.pid) {
            self.processes.clear();
            self.stats.evictions += 1;
        }
        let (names, at) = self
            .processes
            .entry(proc.pid)
            .or_insert_with(|| (ProcessNames::default(), Instant::now()));
        *at = Instant::now();
        match process_thread_names(proc, names) {
            Ok(found) => {
                for (tid, name) in found {
                    self.stats.python += 1;
                    let start = crate::procfs::thread_start(proc.pid, tid);
                    self.insert((proc.pid, tid), (start, name.into()));
                }
            }
            Err(e) => {
                log::debug!("pid {}: thread names: {e}", proc.pid);
                self.stats.errors += 1;
            }
        }
    }

    fn insert(&mut self, key: (u32, u32), value: (Option<u64>, Arc<str>)) {
        if self.names.len() >= MAX_CACHED {
            self.names.clear();
            self.stats.evictions += 1;
        }
        self.names.insert(key, value);
    }

    /// Keeps what is known of the processes `keep` says yes to (the watched ones).
    pub(crate) fn keep(&mut self, keep: impl Fn(u32) -> bool) {
        self.processes.retain(|&pid, _| keep(pid));
        self.names.retain(|k, _| keep(k.0));
    }

    /// Drops what is known of an exited process.
    pub(crate) fn forget(&mut self, pid: u32) {
        self.processes.remove(&pid);
        self.names.retain(|k, _| k.0 != pid);
    }
}

/// The thread's OS name (`/proc/PID/task/TID/comm`), empty when it cannot be read (it exited).
pub(crate) fn os_name(pid: u32, tid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .map(|n| n.trim_end_matches('\n').to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::test_support::{hostile_process, layouts, Arena};

    #[test]
    fn thread_names_survive_hostile_memory() {
        let mut rng = fastrand::Rng::with_seed(29);
        let mut arena = Arena::new();
        let mut names = ProcessNames::default();
        for layout in layouts() {
            for _ in 0..200 {
                arena.scramble(&mut rng);
                let proc = hostile_process(arena.word(&mut rng), layout);
                let mem = ProcessMemory::new(proc.pid);
                let _ = names.read(&mem, &layout, arena.word(&mut rng));
                let _ = process_thread_names(&proc, &mut names);
            }
        }
    }

    /// A name is read again only for a thread that started after it was cached (a reused
    /// tid); the OS name stands in where `threading` has none.
    #[test]
    fn names_are_cached_per_thread_start() {
        let me = std::process::id();
        let proc = hostile_process(0, layouts()[0]);
        let mut names = ThreadNames::default();
        let first = names.name(&proc, me);
        assert_eq!(&*first, os_name(me, me));
        assert_eq!((names.stats.reads, names.stats.os), (1, 1));
        assert_eq!(names.name(&proc, me), first);
        assert_eq!(names.stats.os, 1, "a second lookup is a cache hit");
        names.names.insert((me, me), (Some(0), "stale".into()));
        assert_eq!(
            &*names.name(&proc, me),
            os_name(me, me),
            "a reused tid is named again"
        );
    }
}
