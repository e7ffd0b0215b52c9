//! `--idle`: samples of threads that are off-CPU.
//!
//! The kernel only sees threads while they run. With `--idle`, userspace makes a pass over the
//! thread list of every watched interpreter (`_PyRuntime` → interpreters → thread states, read
//! with `process_vm_readv`, offsets from the layout) a few dozen times a second. A pass stands
//! for the sampling periods (`rate × time`) since the previous one; a thread state with a current
//! frame gets one idle stack weighted by the periods it was *not* sampled on a CPU, so a thread
//! asleep the whole time gets `rate × duration` samples, as it would if it had been running.
//! A thread that is runnable (`R` in `/proc`) when the pass looks was waiting for a CPU, not
//! idle: it gets no idle stack (counted in [`IdleStats::runnable`]).
//!
//! The stack comes from bulk copies of the thread's stack chunks, walked like deep stacks are
//! completed (`complete::ChunkCopy`), and is accepted only if the thread's current frame did
//! not move during the copy. Code objects are tagged as the kernel tags them, so idle frames go
//! through the same symbol cache; the tags of a thread whose chain (frame, code, instruction)
//! is unchanged since its previous pass are reused without reading anything.
//!
//! Work is bounded: at most [`MAX_WALKS_PER_PASS`] stack walks per pass (what is left over is
//! counted in [`IdleStats::skipped`]), and the thread lists as `python::threads` bounds them.
//! Without `--idle` none of this runs.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use profiler_common::{RawFrame, MAX_DEEP_FRAMES, MAX_FRAMES};

use crate::complete::{tag_frames, ChunkCopy, StackError};
use crate::discovery::PythonProcess;
use crate::memory::ProcessMemory;
use crate::python::layout::PyLayout;
use crate::python::threads::{thread_fields, thread_states, ThreadFields};
use crate::registry::Registry;
use crate::resolve::{Resolved, Resolver};

/// Stack walks per pass, all processes together; further idle threads wait for a later pass.
pub(crate) const MAX_WALKS_PER_PASS: usize = 128;
/// Shortest time between passes, whatever the sampling rate.
const MIN_PERIOD: Duration = Duration::from_millis(20);
/// Frames an idle stack may have (deeper ones are reported truncated).
const MAX_IDLE_FRAMES: u32 = MAX_FRAMES as u32 + MAX_DEEP_FRAMES;

/// What the idle passes did, for the summary and `--stats-json`.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub(crate) struct IdleStats {
    pub passes: u64,
    /// Thread states with a current frame found in the thread lists (summed over passes).
    pub threads: u64,
    /// ...of which were on a CPU for the whole pass (the kernel sampled them).
    pub on_cpu: u64,
    /// ...of which were runnable but not caught on a CPU: waiting for one, not idle.
    pub runnable: u64,
    /// Idle stacks produced.
    pub stacks: u64,
    /// Samples those stacks stand for (sampling periods off-CPU).
    pub samples: u64,
    /// Idle threads not walked because the pass hit `MAX_WALKS_PER_PASS`, and their samples.
    pub skipped: u64,
    pub skipped_samples: u64,
    /// Stacks dropped because the thread's current frame moved while they were copied.
    pub changed: u64,
    /// Thread lists or stacks that could not be read.
    pub errors: u64,
    /// Walks whose tags were reused from the thread's previous walk.
    pub tags_reused: u64,
    /// Remote reads made by the idle passes.
    pub reads: u64,
}

/// One idle thread's stack, ready for symbolization.
pub(crate) struct IdleStack {
    /// `native_thread_id` of the thread state (the thread id in the process's pid namespace).
    pub tid: u32,
    /// Sampling periods this stack stands for.
    pub weight: u64,
    /// Leaf first, tagged.
    pub frames: Vec<RawFrame>,
    /// Deeper than `MAX_IDLE_FRAMES`: `frames` are its top part.
    pub truncated: bool,
}

pub(crate) struct IdleSampler {
    rate_hz: u64,
    last: Option<Instant>,
    /// Fraction of a sampling period carried to the next pass.
    carry: f64,
    /// (pid, thread state) → kernel samples since the last pass.
    on_cpu: HashMap<(u32, u64), u64>,
    /// (pid, thread state) → kernel samples beyond the periods of earlier passes: the per-CPU
    /// sampling clocks are not aligned with the passes, so a busy thread's count wobbles
    /// around `periods`; the surplus pays for the next shortfall instead of showing as idle.
    surplus: HashMap<(u32, u64), u64>,
    /// (pid, thread state) → tagged frames of its last walk.
    previous: HashMap<(u32, u64), Vec<RawFrame>>,
    /// (pid, thread id in the process's pid namespace) → host thread id, for processes in
    /// another pid namespace (CPython stores the former; labels and `/proc` need the latter).
    host_tids: HashMap<(u32, u32), u32>,
    /// Thread states seen in the current pass (to drop `previous` entries of gone threads).
    seen: HashSet<(u32, u64)>,
    pub stats: IdleStats,
}

impl IdleSampler {
    pub(crate) fn new(rate_hz: u64) -> IdleSampler {
        IdleSampler {
            rate_hz: rate_hz.max(1),
            last: None,
            carry: 0.0,
            on_cpu: HashMap::new(),
            surplus: HashMap::new(),
            host_tids: HashMap::new(),
            previous: HashMap::new(),
            seen: HashSet::new(),
            stats: IdleStats::default(),
        }
    }

    /// Time between passes: one sampling period, but no shorter than [`MIN_PERIOD`].
    pub(crate) fn period(&self) -> Duration {
        Duration::from_secs_f64(1.0 / self.rate_hz as f64).max(MIN_PERIOD)
    }

    /// One pass over every watched process: each idle thread's stack, resolved, to `sink`.
    /// The caller drains the sample ring buffer first, so the threads the kernel saw on a CPU
    /// are known.
    pub(crate) fn pass(
        &mut self,
        registry: &Registry,
        resolver: &mut Resolver,
        sink: &mut dyn FnMut(&Resolved, &PythonProcess),
    ) {
        let periods = self.begin(Instant::now());
        let mut budget = MAX_WALKS_PER_PASS;
        for proc in registry.watched() {
            for stack in self.sample_process(proc, periods, &mut budget) {
                if let Some(resolved) = resolver.idle(&stack, proc) {
                    sink(&resolved, proc);
                }
            }
        }
        self.end();
    }

    /// Notes a kernel sample of `tstate`: the thread was on a CPU for one period.
    pub(crate) fn on_cpu(&mut self, pid: u32, tstate: u64) {
        *self.on_cpu.entry((pid, tstate)).or_default() += 1;
    }

    /// Starts a pass; returns the whole sampling periods since the previous one (0 on the
    /// first pass, which only sets the baseline).
    pub(crate) fn begin(&mut self, now: Instant) -> u64 {
        self.seen.clear();
        let Some(last) = self.last.replace(now) else {
            self.on_cpu.clear();
            return 0;
        };
        self.stats.passes += 1;
        self.carry += now.saturating_duration_since(last).as_secs_f64() * self.rate_hz as f64;
        let periods = self.carry.floor();
        self.carry -= periods;
        periods as u64
    }

    /// Ends a pass: on-CPU counts start over, walks of threads that are gone are forgotten.
    pub(crate) fn end(&mut self) {
        self.on_cpu.clear();
        let seen = &self.seen;
        self.previous.retain(|k, _| seen.contains(k));
        self.surplus.retain(|k, _| seen.contains(k));
    }

    pub(crate) fn forget_process(&mut self, pid: u32) {
        self.previous.retain(|k, _| k.0 != pid);
        self.surplus.retain(|k, _| k.0 != pid);
        self.host_tids.retain(|k, _| k.0 != pid);
        self.on_cpu.retain(|k, _| k.0 != pid);
    }

    /// The idle stacks of one process for a pass worth `periods` sampling periods; `budget`
    /// is the number of stack walks the pass has left.
    pub(crate) fn sample_process(
        &mut self,
        proc: &PythonProcess,
        periods: u64,
        budget: &mut usize,
    ) -> Vec<IdleStack> {
        let mut out = Vec::new();
        if periods == 0 {
            return out;
        }
        let mem = ProcessMemory::new(proc.pid);
        let layout = &proc.layout;
        let tstates = match thread_states(&mem, layout, proc.runtime, &mut self.stats.reads) {
            Ok(t) => t,
            Err(e) => {
                log::debug!("pid {}: idle pass: thread list: {e}", proc.pid);
                self.stats.errors += 1;
                return out;
            }
        };
        for (tstate, fields) in tstates {
            if fields.frame == 0 {
                continue;
            }
            let key = (proc.pid, tstate);
            self.seen.insert(key);
            self.stats.threads += 1;
            let on_cpu = self.on_cpu.get(&key).copied().unwrap_or(0)
                + self.surplus.remove(&key).unwrap_or(0);
            let weight = periods.saturating_sub(on_cpu);
            let surplus = (on_cpu - periods.min(on_cpu)).min(self.rate_hz);
            if surplus > 0 {
                self.surplus.insert(key, surplus);
            }
            if weight == 0 {
                self.stats.on_cpu += 1;
                continue;
            }
            let tid = fields.native_id as u32;
            let tid = if proc.ns_pid.is_some() {
                self.host_tid(proc.pid, tid)
            } else {
                tid
            };
            // Checked before the `/proc` read below, so a pass over the budget costs no reads.
            if *budget == 0 {
                self.stats.skipped += 1;
                self.stats.skipped_samples += weight;
                continue;
            }
            // A runnable thread the kernel did not catch on a CPU was waiting for one, not
            // idle: on a loaded machine a busy thread would otherwise show as `<idle>`.
            if crate::procfs::stat(tid).is_ok_and(|s| s.state == 'R') {
                self.stats.runnable += 1;
                continue;
            }
            *budget -= 1;
            match self.walk(&mem, layout, tstate, &fields) {
                Ok(Some((frames, truncated))) => {
                    self.stats.stacks += 1;
                    self.stats.samples += weight;
                    out.push(IdleStack {
                        tid,
                        weight,
                        frames,
                        truncated,
                    });
                }
                Ok(None) => self.stats.changed += 1,
                Err(e) => {
                    log::debug!("pid {} tstate {tstate:#x}: idle stack: {e}", proc.pid);
                    self.stats.errors += 1;
                }
            }
        }
        out
    }

    /// The host id of thread `ns_tid` of a process in another pid namespace (from the `NSpid`
    /// lines of `/proc/PID/task/*/status`, cached); `ns_tid` itself when it cannot be found.
    fn host_tid(&mut self, pid: u32, ns_tid: u32) -> u32 {
        if let Some(&tid) = self.host_tids.get(&(pid, ns_tid)) {
            return tid;
        }
        for (inner, host) in crate::procfs::host_tids(pid) {
            self.host_tids.insert((pid, inner), host);
        }
        self.host_tids
            .get(&(pid, ns_tid))
            .copied()
            .unwrap_or(ns_tid)
    }

    /// The thread's stack, or `None` when its current frame moved while it was copied.
    fn walk(
        &mut self,
        mem: &ProcessMemory,
        layout: &PyLayout,
        tstate: u64,
        fields: &ThreadFields,
    ) -> Result<Option<(Vec<RawFrame>, bool)>, StackError> {
        let reads = &mut self.stats.reads;
        let stack = ChunkCopy::read(mem, layout, fields.datastack_chunk, reads)?;
        let walked = stack.walk(mem, layout, fields.frame, MAX_IDLE_FRAMES, reads)?;
        let (mut frames, truncated) = (walked.frames, !walked.complete);
        // The copy is this thread's stack only if it did not move meanwhile.
        let after = thread_fields(mem, layout, tstate, &mut self.stats.reads)?;
        if after.frame != fields.frame || after.datastack_chunk != fields.datastack_chunk {
            return Ok(None);
        }
        let key = (mem.pid, tstate);
        let same_chain = self.previous.get(&key).is_some_and(|prev| {
            prev.len() == frames.len()
                && prev
                    .iter()
                    .zip(&frames)
                    .all(|(a, b)| (a.frame, a.code, a.instr) == (b.frame, b.code, b.instr))
        });
        if same_chain {
            self.stats.tags_reused += 1;
            frames.clone_from(&self.previous[&key]);
        } else {
            tag_frames(mem, layout, &mut frames, &mut self.stats.reads)?;
            self.previous.insert(key, frames.clone());
        }
        Ok(Some((frames, truncated)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::test_support::{hostile_process, layouts, Arena};

    #[test]
    fn idle_thread_walk_survives_hostile_memory() {
        let mut rng = fastrand::Rng::with_seed(13);
        let mut arena = Arena::new();
        let mut idle = IdleSampler::new(100);
        for layout in layouts() {
            for _ in 0..300 {
                arena.scramble(&mut rng);
                let proc = hostile_process(arena.word(&mut rng), layout);
                let mut budget = 64;
                let _ = idle.sample_process(&proc, 1, &mut budget);
            }
        }
        assert!(idle.stats.reads > 0, "the idle walk never read memory");
    }
}
