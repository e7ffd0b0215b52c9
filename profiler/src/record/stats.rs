//! `--stats-json`: every counter of a finished recording, for scripts and benchmarks.

use std::time::Duration;

use anyhow::{Context, Result};

use crate::session::Session;

/// Counters of a finished recording, as written by `--stats-json`.
#[derive(serde::Serialize)]
struct StatsReport {
    duration_s: f64,
    processes: usize,
    session: crate::session::SessionStats,
    kernel: crate::bpf::KernelStats,
    symbols: crate::symbolize::SymbolStats,
    /// Where stacks came from (kernel, completion cache, chunk copies, left truncated).
    completion: crate::complete::CompletionStats,
    /// `process_vm_readv` calls made by pyebpf.
    remote_reads: u64,
    /// BPF sampler program: total run time and runs (needs `kernel.bpf_stats_enabled=1`).
    bpf_run_time_ns: u64,
    bpf_run_count: u64,
    /// BPF sampler program as loaded: bytes after the verifier, and of machine code.
    bpf_xlated_bytes: u32,
    bpf_jited_bytes: u32,
    /// pyebpf's own CPU time.
    user_cpu_s: f64,
    system_cpu_s: f64,
    /// Exec/exit handling.
    lifecycle: crate::lifecycle::LifecycleStats,
    /// Off-CPU passes (`--idle` only).
    idle: Option<crate::idle::IdleStats>,
    /// Unwinding and native symbolization (`--native` only).
    native: Option<crate::native::NativeStats>,
    /// asyncio task chains (`--async` only).
    #[serde(rename = "async")]
    async_tasks: Option<crate::awaiters::AsyncStats>,
    /// Kernel map and userspace cache sizes over the recording.
    maps: serde_json::Value,
}

/// Sizes of the kernel maps and userspace caches: after the initial discovery, the largest
/// seen (checked once a second), and at the end, with the pids/tids left in the maps.
#[derive(serde::Serialize)]
pub(super) struct MapReport {
    start: crate::bpf::MapSizes,
    peak: crate::bpf::MapSizes,
    end: crate::bpf::MapSizes,
    caches_start: crate::session::CacheSizes,
    caches_peak: crate::session::CacheSizes,
    caches_end: crate::session::CacheSizes,
    end_pids: Vec<u32>,
    end_tids: Vec<u32>,
}

impl MapReport {
    pub(super) fn start(session: &Session) -> MapReport {
        let maps = session.map_sizes();
        let caches = session.cache_sizes();
        MapReport {
            start: maps,
            peak: maps,
            end: maps,
            caches_start: caches,
            caches_peak: caches,
            caches_end: caches,
            end_pids: Vec::new(),
            end_tids: Vec::new(),
        }
    }

    pub(super) fn observe(&mut self, session: &Session) {
        let m = session.map_sizes();
        self.peak.procs = self.peak.procs.max(m.procs);
        self.peak.threads = self.peak.threads.max(m.threads);
        let c = session.cache_sizes();
        let p = &mut self.caches_peak;
        p.procs = p.procs.max(c.procs);
        p.pending_execs = p.pending_execs.max(c.pending_execs);
        p.exited = p.exited.max(c.exited);
        p.symbols = p.symbols.max(c.symbols);
    }

    pub(super) fn finish(&mut self, session: &Session) {
        self.observe(session);
        self.end = session.map_sizes();
        self.caches_end = session.cache_sizes();
        (self.end_pids, self.end_tids) = session.map_keys();
        self.end_pids.sort_unstable();
        self.end_tids.sort_unstable();
    }
}

/// The `--stats-json` document of a finished recording.
pub(super) fn stats_json(session: &Session, elapsed: Duration, maps: &MapReport) -> Result<String> {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let (bpf_run_time_ns, bpf_run_count) = session.program_runtime();
    let (bpf_xlated_bytes, bpf_jited_bytes) = session.program_size();
    let report = StatsReport {
        duration_s: elapsed.as_secs_f64(),
        processes: session.profiled() as usize,
        session: session.stats(),
        kernel: session.kernel_stats(),
        symbols: session.symbol_stats(),
        completion: session.completion_stats(),
        remote_reads: crate::memory::REMOTE_READS.load(std::sync::atomic::Ordering::Relaxed),
        bpf_run_time_ns,
        bpf_run_count,
        bpf_xlated_bytes,
        bpf_jited_bytes,
        user_cpu_s: secs(usage.ru_utime),
        system_cpu_s: secs(usage.ru_stime),
        lifecycle: session.lifecycle_stats(),
        idle: session.idle_stats(),
        native: session.native_stats(),
        async_tasks: session.async_stats(),
        maps: serde_json::to_value(maps)?,
    };
    serde_json::to_string_pretty(&report).context("encoding the stats")
}
