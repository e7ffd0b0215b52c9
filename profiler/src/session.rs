//! One sampling session: the loaded BPF sampler, the interpreters it watches, and the
//! userspace half of every sample (decode → symbolize). `record` and `top` drive it.

use std::collections::HashMap;

use rustc_hash::FxHashMap;
use std::sync::Arc;

use anyhow::Result;
use profiler_common::{
    FrameRecord, SampleHeader, LAYOUT_GIL_MASK, SAMPLE_HOLDS_GIL, SAMPLE_READ_ERROR,
    SAMPLE_TRUNCATED,
};

use crate::bpf::{KernelStats, MapSizes, Sampler};
use crate::complete::{Completer, CompletionStats};
use crate::discovery::{self, DiscoveryError, PythonProcess};
use crate::elf::ElfCache;
use crate::idle::{IdleSampler, IdleStats};
use crate::lifecycle::{Attempt, Lifecycle, LifecycleStats, ProcChange};
use crate::python::code::CodeInfo;
use crate::symbolize::Symbolizer;

/// Processes younger than this get eager samples when registered.
const YOUNG_PROCESS: std::time::Duration = std::time::Duration::from_secs(2);
/// How often watched processes are checked against `/proc` (see `Session::reap`).
const SWEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// One Python frame of a sample, symbolized.
#[derive(Clone, Debug)]
pub struct PyFrame {
    /// `None` when the code object could not be read or changed since the sample.
    pub code: Option<Arc<CodeInfo>>,
    pub line: u32,
    pub code_addr: u64,
    pub tag: u64,
}

/// A decoded, symbolized sample. `frames` are leaf first.
#[derive(Debug)]
pub struct Resolved<'a> {
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    pub time_ns: u64,
    pub frames: &'a [PyFrame],
    /// The stack is deeper than what could be recovered; `frames` are its top part.
    pub truncated: bool,
    /// A read failed mid-walk; `frames` are its top part.
    pub partial: bool,
    /// The thread held the GIL (kernel samples of layouts that locate it, with `want_gil`).
    pub holds_gil: bool,
    /// An off-CPU stack from the thread list (`--idle`), not a kernel sample.
    pub idle: bool,
    /// Samples this stands for: 1 for kernel samples, the sampling periods an idle stack
    /// covers.
    pub weight: u64,
}

/// Totals over a session, for summaries and headers.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct SessionStats {
    pub samples: u64,
    pub truncated: u64,
    pub partial: u64,
    /// Frames whose code object could not be symbolized.
    pub unknown_frames: u64,
    /// Samples of processes no longer (or not yet) known to userspace.
    pub orphan_samples: u64,
    pub malformed_records: u64,
    /// Records holding only shim frames (no Python code running yet).
    pub shim_only: u64,
    /// Kernel samples flagged as holding the GIL (counted when `want_gil` is on).
    pub holds_gil: u64,
}

pub struct Session {
    sampler: Sampler,
    elves: ElfCache,
    procs: FxHashMap<u32, PythonProcess>,
    /// Processes that exited; their caches are dropped on the next reap, after the ring
    /// buffer had a chance to deliver their last samples.
    exited: Vec<u32>,
    /// Every process ever profiled in this session (pid → command), for labels after exit.
    pub seen: HashMap<u32, String>,
    symbols: Symbolizer,
    completer: Completer,
    frames: Vec<PyFrame>,
    pub stats: SessionStats,
    /// Exec'd processes awaiting inspection, and lifecycle counters.
    lifecycle: Lifecycle,
    /// Have the kernel test GIL ownership (`--gil`); off, layouts reach the kernel without
    /// their GIL location and the sampler does no GIL reads.
    gil: bool,
    /// Off-CPU sampling from the thread lists (`--idle`).
    idle: Option<IdleSampler>,
    /// When `/proc` was last checked for watched processes that are gone.
    last_sweep: std::time::Instant,
}

/// Sizes of the session's per-process state, for leak checks and benchmarks.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct CacheSizes {
    /// Processes watched.
    pub procs: usize,
    /// Exec'd processes waiting to be inspected.
    pub pending_execs: usize,
    /// Exited processes whose caches are dropped on the next reap.
    pub exited: usize,
    /// Symbolized code objects.
    pub symbols: usize,
}

impl Session {
    pub fn start(rate_hz: u64, debug: crate::bpf::DebugBpf) -> Result<Session> {
        Ok(Session {
            sampler: Sampler::start_with(rate_hz, debug)?,
            elves: ElfCache::default(),
            procs: FxHashMap::default(),
            exited: Vec::new(),
            seen: HashMap::new(),
            symbols: Symbolizer::default(),
            completer: Completer::default(),
            frames: Vec::with_capacity(profiler_common::MAX_FRAMES),
            stats: SessionStats::default(),
            lifecycle: Lifecycle::default(),
            gil: false,
            idle: None,
            last_sweep: std::time::Instant::now(),
        })
    }

    /// Have the kernel flag samples whose thread holds the GIL (`Resolved::holds_gil`), for
    /// processes added from now on.
    pub fn want_gil(&mut self) {
        self.gil = true;
    }

    /// Whether samples of this process can be told GIL holders (`want_gil` and a layout that
    /// locates the GIL).
    pub fn gil_known(proc: &PythonProcess) -> bool {
        proc.layout.kernel.flags & LAYOUT_GIL_MASK != 0
    }

    /// Also sample off-CPU threads from the interpreters' thread lists (see `crate::idle`);
    /// the caller runs `idle_pass` every `idle_period`.
    pub fn enable_idle(&mut self, rate_hz: u64) {
        self.idle = Some(IdleSampler::new(rate_hz));
    }

    /// Time between idle passes, when `--idle` is on.
    pub fn idle_period(&self) -> Option<std::time::Duration> {
        self.idle.as_ref().map(|i| i.period())
    }

    pub fn idle_stats(&self) -> Option<IdleStats> {
        self.idle.as_ref().map(|i| i.stats)
    }

    /// One idle pass over every watched process: drain the sample ring buffer first, so the
    /// threads the kernel saw on a CPU are known.
    pub fn idle_pass(&mut self, sink: &mut dyn FnMut(&Resolved, &PythonProcess)) {
        let Some(mut idle) = self.idle.take() else {
            return;
        };
        let periods = idle.begin(std::time::Instant::now());
        let mut budget = crate::idle::MAX_WALKS_PER_PASS;
        let pids: Vec<u32> = self.procs.keys().copied().collect();
        for pid in pids {
            let Some(proc) = self.procs.get(&pid) else {
                continue;
            };
            let stacks = idle.sample_process(proc, periods, &mut budget);
            for stack in stacks {
                let Some(proc) = self.procs.get(&pid) else {
                    break;
                };
                symbolize_into(
                    &mut self.frames,
                    &mut self.symbols,
                    &mut self.stats,
                    pid,
                    &proc.layout,
                    stack.frames.iter().copied(),
                );
                if self.frames.is_empty() {
                    continue;
                }
                let resolved = Resolved {
                    pid,
                    tid: stack.tid,
                    cpu: u32::MAX,
                    time_ns: 0,
                    frames: &self.frames,
                    truncated: stack.truncated,
                    partial: false,
                    holds_gil: false,
                    idle: true,
                    weight: stack.weight,
                };
                sink(&resolved, proc);
            }
        }
        idle.end();
        self.idle = Some(idle);
    }

    /// Inspects `pid` and starts sampling it.
    pub fn add(&mut self, pid: u32) -> Result<&PythonProcess, DiscoveryError> {
        let proc = discovery::inspect(pid, &self.elves)?;
        let mut kernel = proc.layout.kernel;
        if !self.gil {
            kernel.flags &= !LAYOUT_GIL_MASK;
        }
        // A process that has run for a while has loaded its code: its samples can wait for
        // the drain timer (code new to the sampler still wakes userspace at once).
        let young = process_age(pid).is_none_or(|age| age < YOUNG_PROCESS);
        self.sampler
            .register(pid, proc.runtime, &kernel, young)
            .map_err(|cause| DiscoveryError::Other {
                pid,
                binary: proc.binary.clone(),
                cause,
            })?;
        log::info!(
            "profiling pid {pid} ({}): CPython {} from {}",
            proc.command,
            proc.layout.version,
            proc.binary
        );
        self.seen.insert(pid, proc.command.clone());
        self.exited.retain(|&p| p != pid);
        Ok(self.procs.entry(pid).or_insert(proc))
    }

    /// Adds every interpreter on the host not already watched. Returns the pids added;
    /// unsupported interpreters are reported once each through `warn`.
    pub fn scan(&mut self, warn: &mut dyn FnMut(&DiscoveryError)) -> Vec<u32> {
        let mut added = Vec::new();
        for pid in discovery::all_pids() {
            if self.procs.contains_key(&pid) || !discovery::looks_like_python(pid) {
                continue;
            }
            match self.add(pid) {
                Ok(_) => added.push(pid),
                Err(e) if e.is_benign() => {}
                Err(e) => {
                    // Remember it so it is reported once, not on every scan.
                    self.seen.entry(pid).or_insert_with(|| {
                        warn(&e);
                        String::new()
                    });
                }
            }
        }
        added
    }

    /// Stops watching processes that exited. Returns the pids that left. (Called on every
    /// housekeeping tick, it also hands on what the BPF programs logged, with `--debug-bpf`.)
    pub fn reap(&mut self) -> Vec<u32> {
        self.flush_bpf_logs();
        for pid in self.exited.drain(..) {
            self.symbols.forget_process(pid);
            self.completer.forget_process(pid);
            if let Some(idle) = self.idle.as_mut() {
                idle.forget_process(pid);
            }
        }
        // Exit events normally remove processes at once; the sweep only catches exits whose
        // event was lost (counted as lifecycle drops), so once a second is enough.
        if self.last_sweep.elapsed() < SWEEP_INTERVAL {
            return Vec::new();
        }
        self.last_sweep = std::time::Instant::now();
        let gone: Vec<u32> = self
            .procs
            .keys()
            .copied()
            .filter(|&pid| !alive(pid))
            .collect();
        for &pid in &gone {
            self.procs.remove(&pid);
            self.sampler.unregister(pid);
            self.exited.push(pid);
        }
        gone
    }

    /// Hands what the BPF programs logged (`--debug-bpf`) to the `log` crate.
    pub fn flush_bpf_logs(&mut self) {
        self.sampler.flush_logs();
    }

    pub fn watched(&self) -> impl Iterator<Item = &PythonProcess> {
        self.procs.values()
    }

    pub fn is_watched(&self, pid: u32) -> bool {
        self.procs.contains_key(&pid)
    }

    pub fn kernel_stats(&self) -> KernelStats {
        self.sampler.stats()
    }

    /// (nanoseconds, runs) of the BPF sampler program, when the kernel keeps BPF stats.
    pub fn program_runtime(&self) -> (u64, u64) {
        self.sampler.program_runtime()
    }

    /// (translated, JITed) bytes of the BPF sampler program.
    pub fn program_size(&self) -> (u32, u32) {
        self.sampler.program_size()
    }

    /// Where stacks came from: kernel, completion cache, chunk copies, or left truncated.
    pub fn completion_stats(&self) -> CompletionStats {
        self.completer.stats
    }

    pub fn symbol_stats(&self) -> crate::symbolize::SymbolStats {
        self.symbols.stats
    }

    /// The ring buffer, for the event loop to wait on; give it back with `return_events`.
    pub fn take_events(&mut self) -> Option<aya::maps::RingBuf<aya::maps::MapData>> {
        self.sampler.events.take()
    }

    /// Decodes and symbolizes one ring-buffer record, handing it to `sink`.
    pub fn process_record(
        &mut self,
        bytes: &[u8],
        sink: &mut dyn FnMut(&Resolved, &PythonProcess),
    ) {
        let header_len = size_of::<SampleHeader>();
        let Some(head) = bytes.get(..header_len) else {
            self.stats.malformed_records += 1;
            return;
        };
        let header: SampleHeader = bytemuck::pod_read_unaligned(head);
        let frame_len = size_of::<FrameRecord>();
        let body = &bytes[header_len..];
        if body.len() < header.nframes as usize * frame_len {
            self.stats.malformed_records += 1;
            return;
        }
        let Some(proc) = self.procs.get(&header.pid) else {
            self.stats.orphan_samples += 1;
            return;
        };
        self.frames.clear();
        let kernel_frames = body
            .chunks_exact(frame_len)
            .take(header.nframes as usize)
            .map(bytemuck::pod_read_unaligned::<FrameRecord>);
        let mut truncated = header.flags & SAMPLE_TRUNCATED != 0;
        let tail = if truncated {
            self.completer
                .complete(header.pid, header.tid, &proc.layout, &header)
        } else {
            self.completer.kernel_complete();
            None
        };
        truncated &= tail.is_none();
        let tail_frames = tail.iter().flat_map(|t| t.iter().copied());
        symbolize_into(
            &mut self.frames,
            &mut self.symbols,
            &mut self.stats,
            header.pid,
            &proc.layout,
            kernel_frames.chain(tail_frames),
        );
        if let Some(idle) = self.idle.as_mut() {
            idle.on_cpu(header.pid, header.tstate);
        }
        if self.frames.is_empty() {
            self.stats.shim_only += 1;
            return;
        }
        let resolved = Resolved {
            pid: header.pid,
            tid: header.tid,
            cpu: header.cpu,
            time_ns: header.time_ns,
            frames: &self.frames,
            truncated,
            partial: header.flags & SAMPLE_READ_ERROR != 0,
            holds_gil: header.flags & SAMPLE_HOLDS_GIL != 0,
            idle: false,
            weight: 1,
        };
        self.stats.samples += 1;
        self.stats.holds_gil += resolved.holds_gil as u64;
        self.stats.truncated += resolved.truncated as u64;
        self.stats.partial += resolved.partial as u64;
        sink(&resolved, proc);
    }
}

/// Symbolizes `records` (leaf first, shims dropped) into `frames`.
fn symbolize_into(
    frames: &mut Vec<PyFrame>,
    symbols: &mut Symbolizer,
    stats: &mut SessionStats,
    pid: u32,
    layout: &crate::python::layout::PyLayout,
    records: impl Iterator<Item = FrameRecord>,
) {
    frames.clear();
    // Deep stacks are mostly recursion: a frame running the code object of the frame before
    // it takes that frame's symbol without another cache lookup.
    let mut last: Option<(u64, u64, Option<Arc<CodeInfo>>)> = None;
    for rec in records {
        if rec.code == 0 {
            // A shim frame (C-stack entry, interpreter-owned): not Python code.
            continue;
        }
        let code = match &last {
            Some((code, tag, info)) if *code == rec.code && *tag == rec.tag => info.clone(),
            _ => {
                let info = symbols.code(pid, layout, rec.code, rec.tag);
                last = Some((rec.code, rec.tag, info.clone()));
                info
            }
        };
        let line = code
            .as_ref()
            .map(|c| c.line_at_instr(layout, rec.code, rec.instr))
            .unwrap_or(0);
        if code.is_none() {
            stats.unknown_frames += 1;
        }
        frames.push(PyFrame {
            code,
            line,
            code_addr: rec.code,
            tag: rec.tag,
        });
    }
}

/// Process lifecycle: exec/exit notifications from the kernel (see `crate::lifecycle`).
impl Session {
    /// The exec/exit notification ring buffer, for the event loop to wait on.
    pub fn take_proc_events(&mut self) -> Option<aya::maps::RingBuf<aya::maps::MapData>> {
        self.sampler.proc_events.take()
    }

    /// Handles one `PROC_EVENTS` record. With `system_wide`, every exec'd process is queued
    /// for inspection; otherwise only a watched process that exec'd again is re-inspected.
    /// Drain the sample ring buffer before calling this, so an exiting process's last samples
    /// are still attributed.
    pub fn handle_proc_event(&mut self, bytes: &[u8], system_wide: bool) {
        match self.lifecycle.decode(bytes) {
            Some(ProcChange::Exec(pid)) => {
                let watched = self.procs.contains_key(&pid);
                if watched {
                    // A new image: the old runtime address and code objects are meaningless.
                    self.forget(pid);
                }
                if watched || system_wide {
                    self.lifecycle.expect(pid, std::time::Instant::now());
                }
            }
            Some(ProcChange::Exit(pid)) => {
                self.lifecycle.cancel(pid);
                if self.procs.contains_key(&pid) {
                    self.forget(pid);
                }
            }
            None => {}
        }
    }

    /// Inspects the exec'd processes whose attempt is due. Returns the pids added.
    /// Unsupported interpreters are reported once each through `warn`; processes that vanish
    /// or cannot be parsed are logged at debug level and counted, never fatal.
    pub fn poll_execs(&mut self, warn: &mut dyn FnMut(&DiscoveryError)) -> Vec<u32> {
        let mut added = Vec::new();
        for pid in self.lifecycle.due(std::time::Instant::now()) {
            let outcome = self.try_exec(pid, warn);
            if outcome == Attempt::Added {
                added.push(pid);
            }
            self.lifecycle.settle(pid, outcome);
        }
        added
    }

    fn try_exec(&mut self, pid: u32, warn: &mut dyn FnMut(&DiscoveryError)) -> Attempt {
        if self.procs.contains_key(&pid) {
            return Attempt::Failed;
        }
        let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
            log::debug!("pid {pid} exited before it could be inspected");
            return Attempt::Gone;
        };
        if !maps
            .lines()
            .any(|l| l.rsplit('/').next().is_some_and(|b| b.contains("python")))
        {
            return Attempt::NotYet;
        }
        let last = self.lifecycle.last_attempt(pid);
        match self.add(pid).map(|_| ()) {
            Ok(()) => Attempt::Added,
            Err(e) if e.is_gone() => {
                log::debug!("pid {pid} exited before it could be inspected");
                Attempt::Gone
            }
            Err(DiscoveryError::NotPython { .. }) => Attempt::NotYet,
            Err(e @ DiscoveryError::Unsupported { .. }) => {
                self.seen.entry(pid).or_insert_with(|| {
                    warn(&e);
                    String::new()
                });
                Attempt::Failed
            }
            // The loader may still be mapping libpython: retry, and give up on the last try.
            Err(e) if !last && alive(pid) => {
                log::trace!("pid {pid}: {e:#}; retrying");
                Attempt::NotYet
            }
            Err(e) => {
                if !alive(pid) {
                    log::debug!("pid {pid} exited while being inspected");
                    return Attempt::Gone;
                }
                log::debug!("{e:#}");
                self.lifecycle.stats.discovery_errors += 1;
                Attempt::Failed
            }
        }
    }

    /// When `poll_execs` has work next.
    pub fn next_exec_due(&self) -> Option<std::time::Instant> {
        self.lifecycle.next_due()
    }

    pub fn lifecycle_stats(&self) -> LifecycleStats {
        self.lifecycle.stats
    }

    /// Stops watching `pid` now; its caches go on the next reap, after its queued samples.
    fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
        self.sampler.unregister(pid);
        if !self.exited.contains(&pid) {
            self.exited.push(pid);
        }
    }

    /// Entries in the kernel's `PROCS` and `THREADS` maps.
    pub fn map_sizes(&self) -> MapSizes {
        self.sampler.map_sizes()
    }

    /// Pids in `PROCS` and tids in `THREADS`.
    pub fn map_keys(&self) -> (Vec<u32>, Vec<u32>) {
        self.sampler.map_keys()
    }

    pub fn cache_sizes(&self) -> CacheSizes {
        CacheSizes {
            procs: self.procs.len(),
            pending_execs: self.lifecycle.pending(),
            exited: self.exited.len(),
            symbols: self.symbols.len(),
        }
    }
}

/// A process that still runs (exists and is not a zombie).
/// How long `pid` has been running (from its start time in `/proc/PID/stat`).
fn process_age(pid: u32) -> Option<std::time::Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name; `starttime` is field 22 of the whole line.
    let (_, rest) = stat.rsplit_once(')')?;
    let start_ticks: f64 = rest.split_whitespace().nth(19)?.parse().ok()?;
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks <= 0 {
        return None;
    }
    let age = uptime - start_ticks / ticks as f64;
    Some(std::time::Duration::from_secs_f64(age.max(0.0)))
}

pub fn alive(pid: u32) -> bool {
    use std::io::Read;
    // One read into a fixed buffer: the state follows the pid and the command name (at most
    // 16 bytes), so 256 bytes always reach it.
    let mut buf = [0u8; 256];
    let Ok(n) = std::fs::File::open(format!("/proc/{pid}/stat")).and_then(|mut f| f.read(&mut buf))
    else {
        return false;
    };
    let stat = &buf[..n];
    stat.iter()
        .rposition(|&b| b == b')')
        .and_then(|at| stat[at + 1..].iter().find(|b| !b.is_ascii_whitespace()))
        .is_some_and(|&state| state != b'Z' && state != b'X')
}
