//! Loading and attaching the BPF programs, and the userspace side of their maps.

use std::collections::HashMap;

use anyhow::{Context, Result};
use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
use aya::programs::PerfEvent;
use aya::Ebpf;
use profiler_common::{stat, ProcInfo, PyOffsets, MAX_LAYOUTS};

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler-ebpf"));

/// Counters the kernel keeps per CPU, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct KernelStats {
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
}

/// The loaded sampler: perf events on every online CPU feeding one ring buffer.
pub struct Sampler {
    ebpf: Ebpf,
    procs: BpfHashMap<MapData, u32, ProcInfo>,
    layouts: Array<MapData, PyOffsets>,
    stats: PerCpuArray<MapData, u64>,
    /// Distinct layouts loaded, by content: many processes of one build share an entry.
    layout_ids: HashMap<PyOffsets, u32>,
    pub events: Option<RingBuf<MapData>>,
}

impl Sampler {
    /// Loads the programs and starts sampling every CPU at `rate_hz`.
    pub fn start(rate_hz: u64) -> Result<Sampler> {
        let mut ebpf = Ebpf::load(OBJECT).context("loading the BPF programs")?;
        let program: &mut PerfEvent = ebpf
            .program_mut("sample")
            .context("BPF program `sample` missing")?
            .try_into()?;
        program
            .load()
            .context("the kernel refused the BPF sampler program")?;
        let cpus =
            aya::util::online_cpus().map_err(|(path, e)| anyhow::anyhow!("reading {path}: {e}"))?;
        for cpu in cpus {
            program
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Frequency(rate_hz),
                    false,
                )
                .with_context(|| format!("attaching the sampler to CPU {cpu}"))?;
        }
        let procs = BpfHashMap::try_from(ebpf.take_map("PROCS").context("map PROCS")?)?;
        let layouts = Array::try_from(ebpf.take_map("LAYOUTS").context("map LAYOUTS")?)?;
        let stats = PerCpuArray::try_from(ebpf.take_map("STATS").context("map STATS")?)?;
        let events = RingBuf::try_from(ebpf.take_map("EVENTS").context("map EVENTS")?)?;
        Ok(Sampler {
            ebpf,
            procs,
            layouts,
            stats,
            layout_ids: HashMap::new(),
            events: Some(events),
        })
    }

    /// Starts sampling process `pid`, whose `_PyRuntime` is at `runtime`.
    pub fn register(&mut self, pid: u32, runtime: u64, offsets: &PyOffsets) -> Result<()> {
        let layout = self.layout_id(offsets)?;
        let info = ProcInfo {
            runtime,
            layout,
            _pad0: 0,
        };
        self.procs
            .insert(pid, info, 0)
            .with_context(|| format!("registering pid {pid}"))?;
        Ok(())
    }

    pub fn unregister(&mut self, pid: u32) {
        let _ = self.procs.remove(&pid);
    }

    /// Processes currently registered in the kernel.
    pub fn registered(&self) -> usize {
        self.procs.keys().count()
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

    pub fn layouts_loaded(&self) -> usize {
        self.layout_ids.len()
    }

    /// Time the kernel spent in the sampler program and how often it ran; zero unless
    /// `kernel.bpf_stats_enabled` is set.
    pub fn program_runtime(&self) -> (u64, u64) {
        let info = self
            .ebpf
            .program("sample")
            .and_then(|p| <&PerfEvent>::try_from(p).ok())
            .and_then(|p| p.info().ok());
        info.map(|i| (i.run_time().as_nanos() as u64, i.run_count()))
            .unwrap_or((0, 0))
    }

    pub fn stats(&self) -> KernelStats {
        let sum = |index: u32| -> u64 {
            self.stats
                .get(&index, 0)
                .map(|values| values.iter().sum())
                .unwrap_or(0)
        };
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
        }
    }
}
