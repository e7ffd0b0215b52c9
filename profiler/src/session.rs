//! One sampling session: the loaded BPF programs and the userspace state that goes with them.
//! The [`crate::driver`] runs it; each of its jobs lives in its own module:
//!
//! - [`crate::registry`]: the interpreters watched (and userspace's side of `PROCS`);
//! - [`crate::decode`]: raw ring-buffer samples → typed values;
//! - [`crate::resolve`]: recorded frames → symbolized stacks (completion, symbols, lines);
//! - [`crate::lifecycle`]: exec/exit notifications → inspections and cleanups;
//! - [`crate::idle`]: off-CPU stacks from the thread lists (`--idle`);
//! - [`crate::procfs`]: what `/proc` says about a process.
//!
//! What stays here is the glue: registering a process is discovery, then the kernel map, then
//! the registry; forgetting one clears every cache after its last samples.

use std::time::{Duration, Instant};

use anyhow::Result;
use profiler_common::{TaskLayout, LAYOUT_GIL_MASK};

use crate::awaiters::{self, AsyncStats, ProcessAsync};
use crate::bpf::{DebugBpf, KernelStats, MapSizes, Sampler, DEFAULT_STACK_COPY};
use crate::complete::CompletionStats;
use crate::discovery::{self, DiscoveryError, PythonProcess};
use crate::idle::{IdleSampler, IdleStats};
use crate::lifecycle::{Lifecycle, LifecycleStats, Registrar};
use crate::native::NativeOptions;
use crate::procfs;
use crate::python::asyncio::{self, AsyncError};
use crate::registry::Registry;
use crate::resolve::Resolver;

pub(crate) use crate::resolve::{PyFrame, Resolved, SessionStats};

/// Processes younger than this get eager samples when registered.
const YOUNG_PROCESS: Duration = Duration::from_secs(2);
/// How often watched processes are checked against `/proc` (see [`Session::reap`]).
const SWEEP_INTERVAL: Duration = Duration::from_secs(10);

pub(crate) struct Session {
    sampler: Sampler,
    /// `--native`: how processes' user stacks are captured.
    native: Option<NativeOptions>,
    caches: discovery::Caches,
    registry: Registry,
    resolver: Resolver,
    /// Exec'd processes awaiting inspection, and lifecycle counters.
    lifecycle: Lifecycle,
    /// Have the kernel test GIL ownership (`--gil`); off, layouts reach the kernel without
    /// their GIL location and the sampler does no GIL reads.
    gil: bool,
    /// Off-CPU sampling from the thread lists (`--idle`).
    idle: Option<IdleSampler>,
    /// `<task …>` frames for asyncio programs (`--async`).
    async_tasks: bool,
    /// When `/proc` was last checked for watched processes that are gone, and the kernel's
    /// count of lost exec/exit events then.
    last_sweep: Instant,
    sweep_drops: u64,
    /// Processes the scan found without Python mapped, and when: their maps are read again
    /// only after [`NOT_PYTHON_RECHECK`] or an exec. Holds live pids only.
    not_python: rustc_hash::FxHashMap<u32, Instant>,
}

/// How long a process without Python stays unread by the scan. Exec events announce new
/// programs at once; what this delays is an interpreter embedded with `dlopen` long after
/// its process started. Reading every process's maps every second was most of a quiet
/// host's scan cost.
pub(crate) const NOT_PYTHON_RECHECK: Duration = Duration::from_secs(10);

/// Sizes of the session's per-process state, for leak checks and benchmarks.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub(crate) struct CacheSizes {
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
    /// Loads the BPF programs (see [`Sampler::start_with`] for `subsample`).
    pub(crate) fn start(
        rate_hz: u64,
        debug: DebugBpf,
        subsample: u32,
        native: Option<NativeOptions>,
    ) -> Result<Session> {
        Self::start_with(rate_hz, debug, subsample, native, true)
    }

    /// [`Session::start`] for a run that lasts milliseconds (`dump`'s window): no exec/exit
    /// hooks (see [`Sampler::start_with`]).
    pub(crate) fn start_brief(rate_hz: u64, native: Option<NativeOptions>) -> Result<Session> {
        Self::start_with(rate_hz, DebugBpf::OFF, 1, native, false)
    }

    fn start_with(
        rate_hz: u64,
        debug: DebugBpf,
        subsample: u32,
        native: Option<NativeOptions>,
        lifecycle: bool,
    ) -> Result<Session> {
        let stack_copy = native.map_or(DEFAULT_STACK_COPY, |n| n.stack_bytes);
        let mut resolver = Resolver::default();
        if native.is_some() {
            resolver.enable_native();
        }
        Ok(Session {
            sampler: Sampler::start_with(rate_hz, debug, subsample, stack_copy, lifecycle)?,
            native,
            caches: discovery::Caches::default(),
            registry: Registry::default(),
            resolver,
            lifecycle: Lifecycle::default(),
            gil: false,
            idle: None,
            async_tasks: false,
            last_sweep: Instant::now(),
            not_python: Default::default(),
            sweep_drops: 0,
        })
    }

    /// Have the kernel flag samples whose thread holds the GIL (`Resolved::holds_gil`), for
    /// processes added from now on.
    pub(crate) fn want_gil(&mut self) {
        self.gil = true;
    }

    /// Whether samples of this process can be told GIL holders (`want_gil` and a layout that
    /// locates the GIL).
    pub(crate) fn gil_known(proc: &PythonProcess) -> bool {
        proc.layout.kernel.flags & LAYOUT_GIL_MASK != 0
    }

    /// Have the kernel record each sample's running asyncio task and rewrite those samples
    /// with `<task …>` frames and awaiter chains (`--async`), for processes added from now on.
    /// With `task_labels`, samples carry their running task's raw name (`Resolved::task_name`).
    pub(crate) fn enable_async(&mut self, task_labels: bool) {
        self.async_tasks = true;
        self.resolver.enable_async(task_labels);
    }

    /// Have the kernel record each sample's running asyncio task, reported as
    /// `Resolved::running_task` with the stack left as it is (`dump --async`).
    pub(crate) fn capture_running_tasks(&mut self) {
        self.async_tasks = true;
        self.resolver.enable_task_capture();
    }

    /// `--async` counters.
    pub(crate) fn async_stats(&self) -> Option<AsyncStats> {
        self.resolver.async_stats()
    }

    /// `--async`: finds `proc`'s task layout and records it; the offset of the running task in
    /// its thread states and the task layout for the kernel (none, yet or at all). Says once
    /// per process why there is none when that is final.
    fn async_offset(&mut self, proc: &PythonProcess) -> Option<(u32, TaskLayout)> {
        if !self.async_tasks {
            return None;
        }
        let aw = self.resolver.awaiters()?;
        let pid = proc.pid;
        match asyncio::locate(proc) {
            Ok((layout, found)) => {
                log::info!("pid {pid}: asyncio task layout from {found:?}");
                aw.set(pid, ProcessAsync::Ready(layout));
                Some((layout.offsets.thread_running_task as u32, layout.kernel))
            }
            Err(e) if awaiters::retry_later(&e) => {
                log::info!("pid {pid}: {e}; looking again every second");
                aw.set(
                    pid,
                    ProcessAsync::Pending {
                        next_try: Instant::now() + awaiters::RETRY_INTERVAL,
                    },
                );
                None
            }
            Err(e) => {
                if matches!(e, AsyncError::Unsupported { .. }) {
                    aw.stats.processes_unsupported += 1;
                }
                if aw.first_warning(pid) {
                    let why = match &e {
                        AsyncError::Unsupported { .. } => "--async needs CPython 3.14+ (earlier \
                                                          versions publish no asyncio task \
                                                          layout)"
                            .to_string(),
                        other => format!("no --async view: {other}"),
                    };
                    eprintln!(
                        "pyebpf: pid {pid} ({}, CPython {}): {why}; its samples are taken \
                         without task frames",
                        proc.command, proc.layout.version
                    );
                }
                aw.set(pid, ProcessAsync::Off);
                None
            }
        }
    }

    /// `--async`: looks again for the task layout of processes whose `_asyncio` module was
    /// not found when they were registered, and empties the task cache (chains change).
    fn async_housekeeping(&mut self) {
        let Some(aw) = self.resolver.awaiters() else {
            return;
        };
        aw.expire();
        let due = aw.due(Instant::now());
        for pid in due {
            let Some(proc) = self.registry.get(pid) else {
                continue;
            };
            let Ok((layout, found)) = asyncio::locate(proc) else {
                continue;
            };
            let offset = layout.offsets.thread_running_task as u32;
            if self.sampler.set_tasks(pid, offset, layout.kernel) {
                log::info!("pid {pid}: asyncio task layout from {found:?} (found late)");
                if let Some(aw) = self.resolver.awaiters() {
                    aw.set(pid, ProcessAsync::Ready(layout));
                }
            }
        }
    }

    /// Also sample off-CPU threads from the interpreters' thread lists (see `crate::idle`);
    /// the driver runs `idle_pass` every `idle_period`.
    pub(crate) fn enable_idle(&mut self, rate_hz: u64) {
        self.idle = Some(IdleSampler::new(rate_hz));
    }

    /// Time between idle passes, when `--idle` is on.
    pub(crate) fn idle_period(&self) -> Option<Duration> {
        self.idle.as_ref().map(|i| i.period())
    }

    pub(crate) fn idle_stats(&self) -> Option<IdleStats> {
        self.idle.as_ref().map(|i| i.stats)
    }

    /// One idle pass over every watched process (see [`IdleSampler::pass`]).
    pub(crate) fn idle_pass(&mut self, sink: &mut dyn FnMut(&Resolved, &PythonProcess)) {
        if let Some(idle) = self.idle.as_mut() {
            idle.pass(&self.registry, &mut self.resolver, sink);
        }
    }

    /// Inspects `pid` and starts sampling it.
    pub(crate) fn add(&mut self, pid: u32) -> Result<&PythonProcess, DiscoveryError> {
        self.add_inspected(pid, None)
    }

    /// [`Session::add`], given `/proc/PID/maps` when the caller already read it.
    fn add_inspected(
        &mut self,
        pid: u32,
        maps: Option<String>,
    ) -> Result<&PythonProcess, DiscoveryError> {
        let proc = discovery::inspect_maps(pid, &self.caches, maps)?;
        let mut kernel = proc.layout.kernel;
        if !self.gil {
            kernel.flags &= !LAYOUT_GIL_MASK;
        }
        // A process that has run for a while has loaded its code: its samples can wait for
        // the drain timer (code new to the sampler still wakes userspace at once).
        let young = procfs::age(pid).is_none_or(|age| age < YOUNG_PROCESS);
        let tasks = self.async_offset(&proc);
        self.sampler
            .register(
                pid,
                proc.runtime,
                &kernel,
                young,
                NativeOptions::mode(self.native, proc.frame_pointers),
                tasks,
            )
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
        Ok(self.registry.insert(proc))
    }

    /// Adds every interpreter on the host not already watched. Returns the pids added;
    /// unsupported interpreters are reported once each through `warn`.
    pub(crate) fn scan(&mut self, warn: &mut dyn FnMut(&DiscoveryError)) -> Vec<u32> {
        let mut added = Vec::new();
        let now = Instant::now();
        let pids = discovery::all_pids();
        // Forget the pids that are gone: the cache never outgrows /proc.
        let live: rustc_hash::FxHashSet<u32> = pids.iter().copied().collect();
        self.not_python.retain(|pid, _| live.contains(pid));
        for pid in pids {
            // An exec'd process is the lifecycle's until its retries settle: the scan taking
            // it between two retries would save at most one retry gap, and hide that the exec
            // path found it.
            if self.registry.contains(pid) || self.lifecycle.is_pending(pid) {
                continue;
            }
            if let Some(&at) = self.not_python.get(&pid) {
                if now.duration_since(at) < NOT_PYTHON_RECHECK {
                    continue;
                }
            }
            let Some(maps) = discovery::python_maps(pid) else {
                self.not_python.insert(pid, now);
                continue;
            };
            self.not_python.remove(&pid);
            match self.add_inspected(pid, Some(maps)) {
                Ok(_) => added.push(pid),
                Err(e) if e.is_benign() => {}
                Err(e) => {
                    if self.registry.first_warning(pid) {
                        warn(&e);
                    }
                }
            }
        }
        added
    }

    /// Drops the caches of processes that stopped being watched (their queued samples were
    /// delivered by now) and, every ten seconds (at once after a lost event), stops watching processes that exited without
    /// an exit event (one was lost). Also hands on what the BPF programs logged.
    pub(crate) fn reap(&mut self) {
        self.flush_bpf_logs();
        self.async_housekeeping();
        for pid in self.registry.take_exited() {
            self.resolver.forget_process(pid);
            if let Some(idle) = self.idle.as_mut() {
                idle.forget_process(pid);
            }
        }
        // Exits arrive as events; the sweep is for the ones whose event was lost, so it runs
        // at once when the kernel counts a lost event, and otherwise rarely.
        let drops = self.sampler.proc_event_drops();
        if drops == self.sweep_drops && self.last_sweep.elapsed() < SWEEP_INTERVAL {
            return;
        }
        self.sweep_drops = drops;
        self.last_sweep = Instant::now();
        for pid in self.registry.pids() {
            if !procfs::alive(pid) {
                self.forget(pid);
            }
        }
    }

    /// Hands what the BPF programs logged (`--debug-bpf`) to the `log` crate.
    pub(crate) fn flush_bpf_logs(&mut self) {
        self.sampler.flush_logs();
    }

    pub(crate) fn watched(&self) -> impl Iterator<Item = &PythonProcess> {
        self.registry.watched()
    }

    /// See [`Lifecycle::delay_first_look`].
    pub(crate) fn delay_first_look(&mut self, delay: Duration) {
        self.lifecycle.delay_first_look(delay);
    }

    /// Changes whenever the watched set changes (see [`Session::watched`]).
    pub(crate) fn watched_generation(&self) -> u64 {
        self.registry.generation()
    }

    /// Processes profiled in this session, exited ones included.
    pub(crate) fn profiled(&self) -> u64 {
        self.registry.profiled()
    }

    pub(crate) fn stats(&self) -> SessionStats {
        self.resolver.stats
    }

    /// Identity sources that were missing or unreadable, and containers looked up.
    pub(crate) fn identity_stats(&self) -> crate::identity::IdentityStats {
        self.caches.identities.stats()
    }

    pub(crate) fn kernel_stats(&self) -> KernelStats {
        self.sampler.stats()
    }

    /// (nanoseconds, runs) of the BPF sampler program, when the kernel keeps BPF stats.
    pub(crate) fn program_runtime(&self) -> (u64, u64) {
        self.sampler.program_runtime()
    }

    /// (translated, JITed) bytes of the BPF sampler program.
    pub(crate) fn program_size(&self) -> (u32, u32) {
        self.sampler.program_size()
    }

    /// Where stacks came from: kernel, completion cache, chunk copies, or left truncated.
    pub(crate) fn completion_stats(&self) -> CompletionStats {
        self.resolver.completion_stats()
    }

    pub(crate) fn symbol_stats(&self) -> crate::symbolize::SymbolStats {
        self.resolver.symbol_stats()
    }

    /// Unwinding and native symbolization counters (`--native`).
    pub(crate) fn native_stats(&self) -> Option<crate::native::NativeStats> {
        self.resolver.native_stats()
    }

    /// The sample ring buffer, for the driver to wait on.
    pub(crate) fn take_events(&mut self) -> Option<aya::maps::RingBuf<aya::maps::MapData>> {
        self.sampler.events.take()
    }

    /// Decodes and resolves one raw sample, handing it to `sink`.
    pub(crate) fn process_record(
        &mut self,
        bytes: &[u8],
        sink: &mut dyn FnMut(&Resolved, &PythonProcess),
    ) {
        let Some(record) = crate::decode::sample(bytes) else {
            self.resolver.stats.malformed_samples += 1;
            return;
        };
        let header = &record.header;
        let Some(proc) = self.registry.get(header.pid) else {
            self.resolver.stats.orphan_samples += 1;
            return;
        };
        if let Some(idle) = self.idle.as_mut() {
            idle.on_cpu(header.pid, header.tstate);
        }
        if let Some(resolved) = self.resolver.kernel(&record, proc) {
            sink(&resolved, proc);
        }
    }

    /// The exec/exit notification ring buffer, for the driver to wait on.
    pub(crate) fn take_proc_events(&mut self) -> Option<aya::maps::RingBuf<aya::maps::MapData>> {
        self.sampler.proc_events.take()
    }

    /// Handles one exec/exit notification (see [`Lifecycle::on_event`]).
    pub(crate) fn handle_proc_event(&mut self, bytes: &[u8], system_wide: bool) {
        let mut lifecycle = std::mem::take(&mut self.lifecycle);
        lifecycle.on_event(bytes, system_wide, self);
        self.lifecycle = lifecycle;
    }

    /// Inspects the exec'd processes whose attempt is due (see [`Lifecycle::poll`]).
    pub(crate) fn poll_execs(&mut self, warn: &mut dyn FnMut(&DiscoveryError)) -> Vec<u32> {
        let mut lifecycle = std::mem::take(&mut self.lifecycle);
        let added = lifecycle.poll(self, warn);
        self.lifecycle = lifecycle;
        added
    }

    /// When `poll_execs` has work next.
    pub(crate) fn next_exec_due(&self) -> Option<Instant> {
        self.lifecycle.next_due()
    }

    pub(crate) fn lifecycle_stats(&self) -> LifecycleStats {
        self.lifecycle.stats
    }

    /// Stops watching `pid` now; its caches go on the next reap, after its queued samples.
    fn forget(&mut self, pid: u32) {
        if self.registry.remove(pid) {
            self.sampler.unregister(pid);
        }
    }

    /// Entries in the kernel's `PROCS` and `THREADS` maps.
    pub(crate) fn map_sizes(&self) -> MapSizes {
        self.sampler.map_sizes()
    }

    /// Pids in `PROCS` and tids in `THREADS`.
    pub(crate) fn map_keys(&self) -> (Vec<u32>, Vec<u32>) {
        self.sampler.map_keys()
    }

    pub(crate) fn cache_sizes(&self) -> CacheSizes {
        CacheSizes {
            procs: self.registry.len(),
            pending_execs: self.lifecycle.pending(),
            exited: self.registry.exited(),
            symbols: self.resolver.symbols(),
        }
    }
}

impl Registrar for Session {
    fn is_watched(&self, pid: u32) -> bool {
        self.registry.contains(pid)
    }

    fn register(&mut self, pid: u32, maps: String) -> Result<(), DiscoveryError> {
        self.add_inspected(pid, Some(maps)).map(|_| ())
    }

    fn unregister(&mut self, pid: u32) {
        self.forget(pid);
    }

    fn first_warning(&mut self, pid: u32) -> bool {
        self.registry.first_warning(pid)
    }

    fn exec_seen(&mut self, pid: u32) {
        self.not_python.remove(&pid);
    }
}
