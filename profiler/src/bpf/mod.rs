//! Loading and attaching the BPF programs, and the userspace side of their maps.
//!
//! Nothing here needs tracefs or debugfs: the sampler is a perf-event program and the
//! lifecycle hooks are BTF tracepoints (`tp_btf`), attached by BTF id. The kernel-struct
//! offsets the hooks read come from the running kernel's BTF (`kernel_btf`), and a program
//! the verifier refuses becomes one line plus a file holding the verifier's full log
//! (`load_error`).

mod kernel_btf;
mod load_error;

use std::collections::HashMap;

use anyhow::{Context, Result};
use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
use aya::programs::{BtfTracePoint, PerfEvent};
use aya::{Btf, Ebpf, EbpfLoader};
use profiler_common::{stat, ProcInfo, PyOffsets, TaskLayout, MAX_LAYOUTS};

pub(crate) use load_error::LoadError;

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler-ebpf"));
/// The same programs with aya-log diagnostics compiled in, for `--debug-bpf`.
static OBJECT_WITH_LOG: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler-ebpf-log"));

/// Counters the kernel keeps per CPU, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct KernelStats {
    pub events: u64,
    pub not_python: u64,
    pub no_tstate: u64,
    pub no_frame: u64,
    pub truncated: u64,
    pub read_errors: u64,
    pub ringbuf_drops: u64,
    pub thread_walk_limit: u64,
    pub tstate_cache_hits: u64,
    pub emitted: u64,
    pub bad_layout: u64,
    pub proc_event_drops: u64,
    pub exit_procs_removed: u64,
    pub exit_threads_removed: u64,
    pub chunk_copy_limit: u64,
    pub chunk_copies: u64,
    pub new_code: u64,
    pub subsampled: u64,
    /// Samples with a frame-pointer walk of the user stack (`--native`).
    pub native_frame_pointers: u64,
    /// Samples with a copy of the user stack (`--native`).
    pub native_stack_copies: u64,
    /// Samples whose native part could not be had.
    pub native_errors: u64,
    /// Frame-pointer samples that carried a stack copy instead (the chain broke at once).
    pub native_fp_fallbacks: u64,
}

/// Entries in the kernel's per-process and per-thread maps, for leak checks and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct MapSizes {
    /// `PROCS`: registered interpreter processes.
    pub procs: usize,
    /// `THREADS`: cached thread states.
    pub threads: usize,
}

/// Which BPF-side diagnostics to log (`--debug-bpf`), as the kernel's `debug::LOG_*` bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DebugBpf(pub u32);

impl DebugBpf {
    pub const OFF: DebugBpf = DebugBpf(0);
    /// Unexpected frame owners.
    pub const OWNERS: u32 = 1 << 0;
    /// Failed reads of target memory, with their addresses.
    pub const READS: u32 = 1 << 1;
    /// Limits hit (frames, thread walks, chunk copies, ring buffer).
    pub const LIMITS: u32 = 1 << 2;
    /// Layouts that don't validate.
    pub const LAYOUT: u32 = 1 << 3;
    pub const ALL: DebugBpf = DebugBpf(Self::OWNERS | Self::READS | Self::LIMITS | Self::LAYOUT);
}

/// Bytes of user stack copied per sample in stack-copy mode unless `--native-stack` says.
pub(crate) const DEFAULT_STACK_COPY: u32 = 16 << 10;

/// The loaded sampler: perf events on every online CPU feeding one ring buffer.
pub(crate) struct Sampler {
    ebpf: Ebpf,
    /// aya-log's reader, with `--debug-bpf`.
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    procs: BpfHashMap<MapData, u32, ProcInfo>,
    layouts: Array<MapData, PyOffsets>,
    stats: PerCpuArray<MapData, u64>,
    /// Distinct layouts loaded, by content: many processes of one build share an entry.
    layout_ids: HashMap<PyOffsets, u32>,
    pub events: Option<RingBuf<MapData>>,
    threads: BpfHashMap<MapData, u32, u64>,
    /// Exec/exit notifications (`ProcEvent`s) from the lifecycle tracepoints.
    pub proc_events: Option<RingBuf<MapData>>,
}

impl Sampler {
    /// Loads the programs and starts sampling every CPU at `rate_hz`.
    pub(crate) fn start(rate_hz: u64) -> Result<Sampler> {
        Self::start_with(rate_hz, DebugBpf::OFF, 1, DEFAULT_STACK_COPY, true)
    }

    /// [`Sampler::start`], with BPF-side diagnostics logged through aya-log (`debug`), and
    /// with perf events `subsample` times faster of which one in `subsample`, at random, is
    /// kept (see the kernel's `SUBSAMPLE`): samples at random intervals averaging
    /// 1/`rate_hz`. Processes registered in stack-copy mode have `stack_copy` bytes of their
    /// user stack copied with each sample. Without `lifecycle` the exec/exit hooks are not
    /// attached (and the kernel's BTF is parsed once, not twice): for runs too short to see a
    /// process come or go (`dump`'s window), which then start in about half the time.
    pub(crate) fn start_with(
        rate_hz: u64,
        debug: DebugBpf,
        subsample: u32,
        stack_copy: u32,
        lifecycle: bool,
    ) -> Result<Sampler> {
        let subsample = subsample.max(1);
        let stack_copy = stack_copy.clamp(1024, profiler_common::MAX_STACK_COPY as u32) & !7;
        // Sample buffers are indexed by CPU number: one per possible CPU.
        let cpu_slots = aya::util::nr_cpus()
            .map_err(|(path, e)| anyhow::anyhow!("reading {path}: {e}"))?
            as u32;
        // Read once, parsed twice: by aya (for the BTF tracepoints) and by `kernel_btf`.
        let vmlinux = std::fs::read(kernel_btf::VMLINUX).map_err(|e| {
            anyhow::anyhow!(
                "reading the kernel's BTF ({}): {e}; pyebpf needs a kernel built with \
                 CONFIG_DEBUG_INFO_BTF=y (Linux 6.1 or newer)",
                kernel_btf::VMLINUX
            )
        })?;
        let btf = Btf::parse(&vmlinux, aya::Endianness::default())
            .map_err(|e| anyhow::anyhow!("parsing {}: {e}", kernel_btf::VMLINUX))?;
        let offsets = match lifecycle {
            true => kernel_btf::ExitOffsets::from_bytes(&vmlinux)?,
            // 0: "unknown" to the exit hook, which is not attached anyway.
            false => kernel_btf::ExitOffsets {
                task_signal: 0,
                signal_live: 0,
            },
        };
        let mut loader = EbpfLoader::new();
        loader
            .btf(Some(&btf))
            .override_global("TASK_SIGNAL_OFFSET", &offsets.task_signal, true)
            .override_global("SIGNAL_LIVE_OFFSET", &offsets.signal_live, true)
            .override_global("SUBSAMPLE", &subsample, true)
            .override_global("STACK_COPY_BYTES", &stack_copy, true)
            .map_max_entries("SAMPLE", cpu_slots);
        let object = if debug == DebugBpf::OFF {
            OBJECT
        } else {
            loader.override_global("DEBUG", &debug.0, true);
            OBJECT_WITH_LOG
        };
        anyhow::ensure!(
            !object.is_empty(),
            "this pyebpf was built with AYA_BUILD_SKIP=1 and has no BPF programs: rebuild without it"
        );
        let mut ebpf = loader.load(object).context("loading the BPF object")?;
        let logger = if debug != DebugBpf::OFF {
            Some(
                aya_log::EbpfLogger::init(&mut ebpf)
                    .context("reading the BPF programs' log (--debug-bpf)")?,
            )
        } else {
            None
        };
        let program: &mut PerfEvent = ebpf
            .program_mut("sample")
            .context("BPF program `sample` missing")?
            .try_into()?;
        program
            .load()
            .map_err(|e| LoadError::from_program("sample", e))?;
        let cpus =
            aya::util::online_cpus().map_err(|(path, e)| anyhow::anyhow!("reading {path}: {e}"))?;
        for cpu in cpus {
            program
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Frequency(rate_hz.saturating_mul(subsample as u64)),
                    false,
                )
                .with_context(|| format!("attaching the sampler to CPU {cpu}"))?;
        }
        if lifecycle {
            attach_lifecycle(&mut ebpf, &btf)?;
        }
        let procs = BpfHashMap::try_from(ebpf.take_map("PROCS").context("map PROCS")?)?;
        let threads = BpfHashMap::try_from(ebpf.take_map("THREADS").context("map THREADS")?)?;
        let proc_events =
            RingBuf::try_from(ebpf.take_map("PROC_EVENTS").context("map PROC_EVENTS")?)?;
        let layouts = Array::try_from(ebpf.take_map("LAYOUTS").context("map LAYOUTS")?)?;
        let stats = PerCpuArray::try_from(ebpf.take_map("STATS").context("map STATS")?)?;
        let events = RingBuf::try_from(ebpf.take_map("EVENTS").context("map EVENTS")?)?;
        Ok(Sampler {
            ebpf,
            logger,
            procs,
            layouts,
            stats,
            layout_ids: HashMap::new(),
            events: Some(events),
            threads,
            proc_events: Some(proc_events),
        })
    }

    /// Starts sampling process `pid`, whose `_PyRuntime` is at `runtime`. A `young` process's
    /// first samples wake userspace at once (see `ProcInfo::eager_samples`).
    pub(crate) fn register(
        &mut self,
        pid: u32,
        runtime: u64,
        offsets: &PyOffsets,
        young: bool,
        native: u32,
        tasks: Option<(u32, TaskLayout)>,
    ) -> Result<()> {
        let layout = self.layout_id(offsets)?;
        let (pidns_dev, pidns_ino) = foreign_pid_namespace(pid).unwrap_or((0, 0));
        let info = ProcInfo {
            runtime,
            layout,
            eager_samples: if young {
                profiler_common::EAGER_SAMPLES
            } else {
                0
            },
            pidns_dev,
            pidns_ino,
            native,
            running_task_offset: tasks.map_or(0, |(offset, _)| offset),
            tasks: tasks.map(|(_, layout)| layout).unwrap_or_default(),
        };
        self.procs
            .insert(pid, info, 0)
            .with_context(|| format!("registering pid {pid}"))?;
        Ok(())
    }

    /// Hands what the BPF programs logged (`--debug-bpf`) to the `log` crate.
    pub(crate) fn flush_logs(&mut self) {
        if let Some(logger) = self.logger.as_mut() {
            logger.flush();
        }
    }

    /// Sets `pid`'s `ProcInfo::running_task_offset` and task layout (`--async`: they were
    /// found after the process was registered). False when the process is not registered.
    pub(crate) fn set_tasks(&mut self, pid: u32, offset: u32, layout: TaskLayout) -> bool {
        let Ok(mut info) = self.procs.get(&pid, 0) else {
            return false;
        };
        info.running_task_offset = offset;
        info.tasks = layout;
        self.procs.insert(pid, info, 0).is_ok()
    }

    pub(crate) fn unregister(&mut self, pid: u32) {
        let _ = self.procs.remove(&pid);
    }

    /// Pids in `PROCS` and tids in `THREADS` right now (one map walk each).
    pub(crate) fn map_sizes(&self) -> MapSizes {
        MapSizes {
            procs: self.procs.keys().count(),
            threads: self.threads.keys().count(),
        }
    }

    /// The pids registered in `PROCS` and the tids cached in `THREADS`.
    pub(crate) fn map_keys(&self) -> (Vec<u32>, Vec<u32>) {
        (
            self.procs.keys().filter_map(|k| k.ok()).collect(),
            self.threads.keys().filter_map(|k| k.ok()).collect(),
        )
    }

    fn layout_id(&mut self, offsets: &PyOffsets) -> Result<u32> {
        if let Some(&id) = self.layout_ids.get(offsets) {
            return Ok(id);
        }
        let id = self.layout_ids.len() as u32;
        anyhow::ensure!(
            id < MAX_LAYOUTS,
            "more than {MAX_LAYOUTS} distinct CPython layouts"
        );
        self.layouts
            .set(id, offsets, 0)
            .context("loading a CPython layout")?;
        self.layout_ids.insert(*offsets, id);
        Ok(id)
    }

    /// What the kernel reports about the loaded sampler program.
    fn program_info(&self) -> Option<aya::programs::ProgramInfo> {
        let program = self.ebpf.program("sample")?;
        <&PerfEvent>::try_from(program).ok()?.info().ok()
    }

    /// Time the kernel spent in the sampler program and how often it ran; zero unless
    /// `kernel.bpf_stats_enabled` is set.
    pub(crate) fn program_runtime(&self) -> (u64, u64) {
        self.program_info()
            .map(|i| (i.run_time().as_nanos() as u64, i.run_count()))
            .unwrap_or((0, 0))
    }

    /// Bytes of the sampler program as the kernel runs it: after the verifier, and JITed.
    pub(crate) fn program_size(&self) -> (u32, u32) {
        self.program_info()
            .map(|i| (i.size_translated().unwrap_or(0), i.size_jitted()))
            .unwrap_or((0, 0))
    }

    /// Exec/exit notifications the kernel could not queue: one map read.
    pub(crate) fn proc_event_drops(&self) -> u64 {
        self.stat(stat::PROC_EVENT_DROPS)
    }

    fn stat(&self, index: u32) -> u64 {
        self.stats
            .get(&index, 0)
            .map(|values| values.iter().sum())
            .unwrap_or(0)
    }

    pub(crate) fn stats(&self) -> KernelStats {
        let sum = |index: u32| self.stat(index);
        KernelStats {
            events: sum(stat::EVENTS),
            not_python: sum(stat::NOT_PYTHON),
            no_tstate: sum(stat::NO_TSTATE),
            no_frame: sum(stat::NO_FRAME),
            truncated: sum(stat::TRUNCATED),
            read_errors: sum(stat::READ_ERRORS),
            ringbuf_drops: sum(stat::RINGBUF_DROPS),
            thread_walk_limit: sum(stat::THREAD_WALK_LIMIT),
            tstate_cache_hits: sum(stat::TSTATE_CACHE_HITS),
            emitted: sum(stat::EMITTED),
            bad_layout: sum(stat::BAD_LAYOUT),
            proc_event_drops: sum(stat::PROC_EVENT_DROPS),
            exit_procs_removed: sum(stat::EXIT_PROCS_REMOVED),
            exit_threads_removed: sum(stat::EXIT_THREADS_REMOVED),
            chunk_copy_limit: sum(stat::CHUNK_COPY_LIMIT),
            chunk_copies: sum(stat::CHUNK_COPIES),
            new_code: sum(stat::NEW_CODE),
            subsampled: sum(stat::SUBSAMPLED),
            native_frame_pointers: sum(stat::NATIVE_FRAME_POINTERS),
            native_stack_copies: sum(stat::NATIVE_STACK_COPIES),
            native_errors: sum(stat::NATIVE_ERRORS),
            native_fp_fallbacks: sum(stat::NATIVE_FP_FALLBACKS),
        }
    }
}

/// Attaches the exec/exit hooks (`profiler-ebpf/src/lifecycle.rs`) as BTF tracepoints: by
/// BTF id, with no tracefs or debugfs involved.
fn attach_lifecycle(ebpf: &mut Ebpf, btf: &Btf) -> Result<()> {
    for (program, event) in [
        ("process_exec", "sched_process_exec"),
        ("process_exit", "sched_process_exit"),
    ] {
        let tp: &mut BtfTracePoint = ebpf
            .program_mut(program)
            .with_context(|| format!("BPF program `{program}` missing"))?
            .try_into()?;
        tp.load(event, btf)
            .map_err(|e| LoadError::from_program(program, e))?;
        tp.attach().map_err(|e| {
            anyhow::anyhow!(
                "attaching the BPF program `{program}` to the BTF tracepoint {event} on Linux \
                 {}: {e}",
                load_error::kernel_release()
            )
        })?;
    }
    Ok(())
}

/// (device, inode) of `pid`'s pid namespace, in the kernel's encoding, when it differs from
/// ours; `None` when it is the same (or cannot be read).
fn foreign_pid_namespace(pid: u32) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let theirs = std::fs::metadata(format!("/proc/{pid}/ns/pid")).ok()?;
    let ours = std::fs::metadata("/proc/self/ns/pid").ok()?;
    if (theirs.dev(), theirs.ino()) == (ours.dev(), ours.ino()) {
        return None;
    }
    let dev = theirs.dev();
    // The kernel's dev_t is major << 20 | minor, not the userspace encoding stat returns.
    let kernel_dev = ((libc::major(dev) as u64) << 20) | libc::minor(dev) as u64;
    Some((kernel_dev, theirs.ino()))
}
