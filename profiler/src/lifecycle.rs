//! Processes coming and going. The kernel's lifecycle tracepoints
//! (`profiler-ebpf/src/lifecycle.rs`) announce every `execve` and the exit of every registered
//! interpreter; this module turns those announcements into discovery attempts and cleanups.
//!
//! An exec'd process is not recognizable at once: the dynamic loader maps `libpython` only
//! after the exec, and a launcher such as `chroot` or `unshare` execs again. So a new process is
//! inspected right away and then retried on a short, bounded backoff ([`EXEC_RETRY_MS`]); after
//! the last try it is dropped (the periodic `/proc` scan still catches a late `dlopen`). The
//! queue itself is capped ([`MAX_PENDING`]), so a fork bomb costs bounded memory.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use profiler_common::{ProcEvent, PROC_EVENT_EXEC, PROC_EVENT_EXIT};

use crate::discovery::DiscoveryError;
use crate::procfs;

/// What exec handling needs from the session: the watch list and the way onto it.
pub(crate) trait Registrar {
    fn is_watched(&self, pid: u32) -> bool;
    /// Inspects `pid`, whose `/proc/PID/maps` reads `maps`, and starts sampling it.
    fn register(&mut self, pid: u32, maps: String) -> Result<(), DiscoveryError>;
    /// Stops sampling `pid` (its image is gone); its caches go after its queued samples.
    fn unregister(&mut self, pid: u32);
    /// True the first time `pid` is reported as unprofilable.
    fn first_warning(&mut self, pid: u32) -> bool;
    /// `pid` exec'd: whatever the `/proc` scan concluded about its old image is void.
    fn exec_seen(&mut self, pid: u32);
}

/// When an exec'd process is inspected, in milliseconds after its exec event arrived. The
/// last tries are for loaded or emulated machines, where the loader can take seconds to map
/// `libpython`.
pub(crate) const EXEC_RETRY_MS: [u64; 10] = [0, 3, 10, 30, 80, 200, 450, 900, 1600, 3000];
/// Exec'd processes waiting for inspection at once; beyond it new ones wait for the scan.
pub(crate) const MAX_PENDING: usize = 4096;

/// One decoded lifecycle notification.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ProcChange {
    Exec(u32),
    Exit(u32),
}

/// Counters of lifecycle handling, for `--stats-json` and benchmarks.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub(crate) struct LifecycleStats {
    pub exec_events: u64,
    pub exit_events: u64,
    /// Interpreters found through an exec event (rather than the `/proc` scan).
    pub added_on_exec: u64,
    /// Processes that exited before they could be inspected or sampled.
    pub vanished: u64,
    /// Exec'd processes that were still not CPython after the last retry.
    pub not_python: u64,
    /// Interpreters whose runtime could not be located or parsed (logged once, at debug level).
    pub discovery_errors: u64,
    /// Exec events ignored because [`MAX_PENDING`] processes were already queued.
    pub pending_dropped: u64,
    pub malformed_events: u64,
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    since: Instant,
    /// Index into [`EXEC_RETRY_MS`] of the next attempt.
    attempt: usize,
}

impl Pending {
    fn due(&self) -> Instant {
        self.since + Duration::from_millis(EXEC_RETRY_MS[self.attempt])
    }
}

/// Outcome of one inspection attempt, as reported back by the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Attempt {
    Added,
    /// Not (yet) recognizable: retry later, or give up after the last try.
    NotYet,
    /// Recognized but failed for good (unsupported, or an error on the last try).
    Failed,
    Gone,
}

#[derive(Default)]
pub(crate) struct Lifecycle {
    pending: HashMap<u32, Pending>,
    pub stats: LifecycleStats,
    /// How long a system-wide run waits before the first look at a new program (see
    /// [`Lifecycle::delay_first_look`]).
    first_look: Duration,
}

impl Lifecycle {
    /// Looks at new programs only `delay` after their exec: one that exits sooner is never
    /// inspected (its exit cancels it), at the price of its first `delay` of samples. For the
    /// agent: inspecting a process costs ~0.5 ms of CPU, and a host that starts dozens of
    /// short-lived interpreters a second would spend more on them than they weigh at 19 Hz.
    pub(crate) fn delay_first_look(&mut self, delay: Duration) {
        self.first_look = delay;
    }

    /// Handles one `PROC_EVENTS` record. With `system_wide`, every exec'd process is queued
    /// for inspection; otherwise only a watched process that exec'd again is re-inspected.
    /// The caller drains the sample ring buffer first, so an exiting process's last samples
    /// are still attributed.
    pub(crate) fn on_event(
        &mut self,
        bytes: &[u8],
        system_wide: bool,
        registrar: &mut dyn Registrar,
    ) {
        match self.decode(bytes) {
            Some(ProcChange::Exec(pid)) => {
                registrar.exec_seen(pid);
                let watched = registrar.is_watched(pid);
                if watched {
                    // A new image: the old runtime address and code objects are meaningless.
                    registrar.unregister(pid);
                }
                if watched || system_wide {
                    // A watched process that exec'd again is looked at at once: its samples
                    // are wanted.
                    let delay = if watched {
                        Duration::ZERO
                    } else {
                        self.first_look
                    };
                    self.expect(pid, Instant::now() + delay);
                }
            }
            Some(ProcChange::Exit(pid)) => {
                self.cancel(pid);
                if registrar.is_watched(pid) {
                    registrar.unregister(pid);
                }
            }
            None => {}
        }
    }

    /// Inspects the exec'd processes whose attempt is due. Returns the pids added.
    /// Unsupported interpreters are reported once each through `warn`; processes that vanish
    /// or cannot be parsed are logged at debug level and counted, never fatal.
    pub(crate) fn poll(
        &mut self,
        registrar: &mut dyn Registrar,
        warn: &mut dyn FnMut(&DiscoveryError),
    ) -> Vec<u32> {
        let mut added = Vec::new();
        for pid in self.due(Instant::now()) {
            let outcome = self.attempt(pid, registrar, warn);
            if outcome == Attempt::Added {
                added.push(pid);
            }
            self.settle(pid, outcome);
        }
        added
    }

    fn attempt(
        &mut self,
        pid: u32,
        registrar: &mut dyn Registrar,
        warn: &mut dyn FnMut(&DiscoveryError),
    ) -> Attempt {
        if registrar.is_watched(pid) {
            return Attempt::Failed;
        }
        let maps = match procfs::python_maps(pid) {
            Err(_) => {
                log::debug!("pid {pid} exited before it could be inspected");
                return Attempt::Gone;
            }
            Ok(None) => return Attempt::NotYet,
            Ok(Some(maps)) => maps,
        };
        let last = self.last_attempt(pid);
        match registrar.register(pid, maps) {
            Ok(()) => Attempt::Added,
            Err(e) if e.is_gone() => {
                log::debug!("pid {pid} exited before it could be inspected");
                Attempt::Gone
            }
            Err(DiscoveryError::NotPython { .. }) => Attempt::NotYet,
            Err(e @ DiscoveryError::Unsupported { .. }) => {
                if registrar.first_warning(pid) {
                    warn(&e);
                }
                Attempt::Failed
            }
            // The loader may still be mapping libpython: retry, and give up on the last try.
            Err(e) if !last && procfs::alive(pid) => {
                log::trace!("pid {pid}: {e:#}; retrying");
                Attempt::NotYet
            }
            Err(e) => {
                if !procfs::alive(pid) {
                    log::debug!("pid {pid} exited while being inspected");
                    return Attempt::Gone;
                }
                log::debug!("{e:#}");
                self.stats.discovery_errors += 1;
                Attempt::Failed
            }
        }
    }

    /// Decodes a `PROC_EVENTS` record.
    pub(crate) fn decode(&mut self, bytes: &[u8]) -> Option<ProcChange> {
        let Some(head) = bytes.get(..size_of::<ProcEvent>()) else {
            self.stats.malformed_events += 1;
            return None;
        };
        let event: ProcEvent = bytemuck::pod_read_unaligned(head);
        match event.kind {
            PROC_EVENT_EXEC => {
                self.stats.exec_events += 1;
                Some(ProcChange::Exec(event.pid))
            }
            PROC_EVENT_EXIT => {
                self.stats.exit_events += 1;
                Some(ProcChange::Exit(event.pid))
            }
            _ => {
                self.stats.malformed_events += 1;
                None
            }
        }
    }

    /// Queues `pid` for inspection now (again, if it was queued: it exec'd once more).
    pub(crate) fn expect(&mut self, pid: u32, now: Instant) {
        if self.pending.len() >= MAX_PENDING && !self.pending.contains_key(&pid) {
            self.stats.pending_dropped += 1;
            return;
        }
        self.pending.insert(
            pid,
            Pending {
                since: now,
                attempt: 0,
            },
        );
    }

    pub(crate) fn cancel(&mut self, pid: u32) {
        self.pending.remove(&pid);
    }

    /// Queued pids whose next attempt is due.
    pub(crate) fn due(&self, now: Instant) -> Vec<u32> {
        self.pending
            .iter()
            .filter(|(_, p)| p.due() <= now)
            .map(|(&pid, _)| pid)
            .collect()
    }

    /// True when `pid`'s current attempt is its last.
    pub(crate) fn last_attempt(&self, pid: u32) -> bool {
        self.pending
            .get(&pid)
            .is_none_or(|p| p.attempt + 1 >= EXEC_RETRY_MS.len())
    }

    /// Records the outcome of an attempt on `pid`.
    pub(crate) fn settle(&mut self, pid: u32, outcome: Attempt) {
        match outcome {
            Attempt::Added => {
                self.stats.added_on_exec += 1;
                self.pending.remove(&pid);
            }
            Attempt::Gone => {
                self.stats.vanished += 1;
                self.pending.remove(&pid);
            }
            Attempt::Failed => {
                self.pending.remove(&pid);
            }
            Attempt::NotYet => {
                let last = self.last_attempt(pid);
                if last {
                    self.stats.not_python += 1;
                    self.pending.remove(&pid);
                } else if let Some(p) = self.pending.get_mut(&pid) {
                    p.attempt += 1;
                }
            }
        }
    }

    /// When the next queued attempt is due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.pending.values().map(Pending::due).min()
    }

    /// True while `pid`'s exec retries are under way.
    pub(crate) fn is_pending(&self, pid: u32) -> bool {
        self.pending.contains_key(&pid)
    }

    pub(crate) fn pending(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_are_bounded() {
        let mut l = Lifecycle::default();
        let t0 = Instant::now();
        l.expect(7, t0);
        let mut tries = 0;
        while l.pending() > 0 {
            assert!(l.is_pending(7) && !l.is_pending(8));
            let at = l.next_due().unwrap();
            assert_eq!(l.due(at), vec![7]);
            l.settle(7, Attempt::NotYet);
            tries += 1;
        }
        assert_eq!(tries, EXEC_RETRY_MS.len());
        assert!(!l.is_pending(7), "settled: the /proc scan may take it now");
        assert_eq!(l.stats.not_python, 1);
    }

    #[test]
    fn queue_is_capped() {
        let mut l = Lifecycle::default();
        let now = Instant::now();
        for pid in 0..(MAX_PENDING as u32 + 10) {
            l.expect(pid, now);
        }
        assert_eq!(l.pending(), MAX_PENDING);
        assert_eq!(l.stats.pending_dropped, 10);
    }

    #[test]
    fn decodes_events() {
        let mut l = Lifecycle::default();
        let ev = ProcEvent {
            time_ns: 1,
            kind: PROC_EVENT_EXIT,
            pid: 42,
        };
        assert_eq!(
            l.decode(bytemuck::bytes_of(&ev)),
            Some(ProcChange::Exit(42))
        );
        assert_eq!(l.decode(&[0u8; 3]), None);
        assert_eq!(l.stats.malformed_events, 1);
    }
}
