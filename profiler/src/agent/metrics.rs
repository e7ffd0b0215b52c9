//! `/metrics`: the agent's counters in the Prometheus/OpenMetrics text format, encoded by
//! `prometheus-client`.
//!
//! The counters live where they are counted (the session, the kernel's stats map, the windows,
//! the pusher); a scrape takes a [`Snapshot`] of them and moves the registry's counters up to
//! it, so a counter here never goes down and never drifts from its source.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::agent::export::ExporterStats;
use crate::awaiters::AsyncStats;

/// The OpenMetrics content type `prometheus-client` encodes.
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type Labels = Vec<(&'static str, &'static str)>;

/// The agent's counters at one moment.
#[derive(Clone, Debug, Default)]
pub(crate) struct Snapshot {
    pub samples: u64,
    pub truncated: u64,
    /// (reason, samples lost).
    pub dropped: Vec<(&'static str, u64)>,
    /// (kind, count).
    pub errors: Vec<(&'static str, u64)>,
    pub processes: u64,
    pub processes_profiled: u64,
    pub services: u64,
    pub windows: u64,
    pub cpu_user_seconds: f64,
    pub cpu_system_seconds: f64,
    /// `None` where the kernel keeps no BPF run-time statistics.
    pub cpu_bpf_seconds: Option<f64>,
    pub resident_bytes: u64,
    /// Each exporter's counters, labelled with its name.
    pub exports: Vec<ExporterStats>,
    pub pull_served: u64,
    pub pull_refused: u64,
    /// `--async` counters (none without `--async`).
    pub async_tasks: Option<AsyncStats>,
    pub identity: crate::identity::IdentityStats,
}

pub(crate) struct Metrics {
    registry: Registry,
    samples: Counter,
    truncated: Counter,
    dropped: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    processes: Gauge,
    processes_profiled: Counter,
    services: Gauge,
    windows: Counter,
    cpu: Family<Labels, Counter<f64, AtomicU64>>,
    resident: Gauge,
    exports: Family<Labels, Counter>,
    export_drops: Family<Labels, Counter>,
    export_retries: Family<Labels, Counter>,
    export_partial: Family<Labels, Counter>,
    export_queue: Family<Labels, Gauge>,
    export_queue_bytes: Family<Labels, Gauge>,
    dictionary: Family<Labels, Gauge>,
    dictionary_over_limit: Family<Labels, Counter>,
    queue: Gauge,
    queue_bytes: Gauge,
    pulls: Family<Labels, Counter>,
    async_samples: Family<Labels, Counter>,
    async_chains: Family<Labels, Counter>,
    async_reads: Family<Labels, Counter>,
    async_processes: Family<Labels, Counter>,
    async_pending: Family<Labels, Gauge>,
    identity_missing: Family<Labels, Counter>,
    identity_containers: Counter,
    identity_cache_resets: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("pyebpf");
        let m = Metrics {
            samples: Counter::default(),
            truncated: Counter::default(),
            dropped: Family::default(),
            errors: Family::default(),
            processes: Gauge::default(),
            processes_profiled: Counter::default(),
            services: Gauge::default(),
            windows: Counter::default(),
            cpu: Family::default(),
            resident: Gauge::default(),
            exports: Family::default(),
            export_drops: Family::default(),
            export_retries: Family::default(),
            export_partial: Family::default(),
            export_queue: Family::default(),
            export_queue_bytes: Family::default(),
            dictionary: Family::default(),
            dictionary_over_limit: Family::default(),
            queue: Gauge::default(),
            queue_bytes: Gauge::default(),
            pulls: Family::default(),
            async_samples: Family::default(),
            async_chains: Family::default(),
            async_reads: Family::default(),
            async_processes: Family::default(),
            async_pending: Family::default(),
            identity_missing: Family::default(),
            identity_containers: Counter::default(),
            identity_cache_resets: Counter::default(),
            registry: Registry::default(),
        };
        registry.register("samples", "Python stacks sampled", m.samples.clone());
        registry.register(
            "truncated_stacks",
            "Samples whose stack could not be read whole",
            m.truncated.clone(),
        );
        registry.register(
            "dropped_samples",
            "Samples lost, by reason: ring_buffer (userspace too slow), services_limit, stack_limit (merged into <stacks over limit>)",
            m.dropped.clone(),
        );
        registry.register(
            "errors",
            "Errors, by kind: read (target memory the kernel could not read), unknown_frame, malformed_sample, proc_events_lost",
            m.errors.clone(),
        );
        registry.register(
            "processes",
            "Python processes being profiled now",
            m.processes.clone(),
        );
        registry.register(
            "processes_profiled",
            "Python processes profiled since the agent started",
            m.processes_profiled.clone(),
        );
        registry.register(
            "services",
            "Services with samples in the current window",
            m.services.clone(),
        );
        registry.register(
            "windows",
            "Profiles cut (one per service per interval)",
            m.windows.clone(),
        );
        registry.register(
            "cpu_seconds",
            "The agent's own CPU time, by mode: user, system, bpf (the sampler in the kernel; absent where the kernel keeps no BPF statistics)",
            m.cpu.clone(),
        );
        registry.register(
            "resident_memory_bytes",
            "The agent's resident memory",
            m.resident.clone(),
        );
        registry.register(
            "exports",
            "Requests sent, by backend and result: ok, rejected (a status not worth retrying), retries_exhausted",
            m.exports.clone(),
        );
        registry.register(
            "export_dropped",
            "Requests dropped before they were sent, by backend and reason: queue_full, too_large",
            m.export_drops.clone(),
        );
        registry.register(
            "export_retries",
            "Attempts that failed and were retried, by backend and cause: connect, timeout, server (5xx), throttled (429)",
            m.export_retries.clone(),
        );
        registry.register(
            "export_partial_success",
            "Requests the backend accepted only in part (OTLP partial_success), by backend",
            m.export_partial.clone(),
        );
        registry.register(
            "export_queue_depth",
            "Requests waiting to be sent, by backend",
            m.export_queue.clone(),
        );
        registry.register(
            "export_queue_bytes",
            "Bytes of requests waiting to be sent, by backend",
            m.export_queue_bytes.clone(),
        );
        registry.register(
            "export_dictionary_entries",
            "Entries of the last window's dictionary tables (strings, functions, locations, mappings, stacks, attributes), by backend (OTLP)",
            m.dictionary.clone(),
        );
        registry.register(
            "export_dictionary_over_limit_samples",
            "Samples whose stack was folded into one frame because the window's dictionary was full, by backend",
            m.dictionary_over_limit.clone(),
        );
        registry.register(
            "push_queue_depth",
            "Requests waiting to be sent, all backends together (see export_queue_depth)",
            m.queue.clone(),
        );
        registry.register(
            "push_queue_bytes",
            "Bytes of requests waiting to be sent, all backends together",
            m.queue_bytes.clone(),
        );
        registry.register(
            "pull_profiles",
            "/debug/pprof/profile requests, by result: served, refused",
            m.pulls.clone(),
        );
        registry.register(
            "async_samples",
            "--async: samples taken while an asyncio task ran, by outcome: rewritten (with <task> frames), frame_not_found (the task's coroutine was not in the stack), task_unreadable (the running task could not be read at sample time)",
            m.async_samples.clone(),
        );
        registry.register(
            "async_chains",
            "--async: awaiter chains, by event: cut_depth, cut_cycle, cut_awaiter_unreadable, coroutine_unreadable (an awaiting task's coroutines read in part), continued_in_memory (longer than the kernel captures), name_unreadable",
            m.async_chains.clone(),
        );
        registry.register(
            "async_memory_reads",
            "--async: reads of the target's memory, by kind: task, task_failed (chains past the kernel's capture), name (names longer than the bytes captured); cache_evictions counts cache entries dropped when full",
            m.async_reads.clone(),
        );
        registry.register(
            "async_processes",
            "--async: processes looked at, by task layout: found, unsupported (CPython before 3.14)",
            m.async_processes.clone(),
        );
        registry.register(
            "async_processes_pending",
            "--async: processes whose asyncio module is not found yet",
            m.async_pending.clone(),
        );
        registry.register(
            "identity_sources_missing",
            "Identity sources that gave nothing, so their labels were left out, by source and reason: cgroup unreadable (per process); bundle not_found, unreadable, too_large, malformed and service_account unreadable (per container)",
            m.identity_missing.clone(),
        );
        registry.register(
            "identity_containers",
            "Containers whose identity (runtime, pod) was looked up, each once",
            m.identity_containers.clone(),
        );
        registry.register(
            "identity_cache_resets",
            "Times the container identity cache was full and started over",
            m.identity_cache_resets.clone(),
        );
        Metrics { registry, ..m }
    }
}

/// Moves a counter up to `total` (its source only grows; a smaller total is ignored).
fn raise(counter: &Counter, total: u64) {
    let now = counter.get();
    if total > now {
        counter.inc_by(total - now);
    }
}

fn raise_f64(counter: &Counter<f64, AtomicU64>, total: f64) {
    let now = counter.get();
    if total > now {
        counter.inc_by(total - now);
    }
}

fn gauge(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl Metrics {
    /// The text of a scrape showing `snapshot`.
    pub(crate) fn render(&self, snapshot: &Snapshot) -> String {
        raise(&self.samples, snapshot.samples);
        raise(&self.truncated, snapshot.truncated);
        for &(reason, n) in &snapshot.dropped {
            raise(&self.dropped.get_or_create(&vec![("reason", reason)]), n);
        }
        for &(kind, n) in &snapshot.errors {
            raise(&self.errors.get_or_create(&vec![("kind", kind)]), n);
        }
        self.processes.set(gauge(snapshot.processes));
        raise(&self.processes_profiled, snapshot.processes_profiled);
        self.services.set(gauge(snapshot.services));
        raise(&self.windows, snapshot.windows);
        raise_f64(
            &self.cpu.get_or_create(&vec![("mode", "user")]),
            snapshot.cpu_user_seconds,
        );
        raise_f64(
            &self.cpu.get_or_create(&vec![("mode", "system")]),
            snapshot.cpu_system_seconds,
        );
        if let Some(bpf) = snapshot.cpu_bpf_seconds {
            raise_f64(&self.cpu.get_or_create(&vec![("mode", "bpf")]), bpf);
        }
        self.resident.set(gauge(snapshot.resident_bytes));
        let (mut queued, mut queued_bytes) = (0, 0);
        for export in &snapshot.exports {
            let backend = export.name;
            let push = &export.queue;
            let export_label = |result| vec![("backend", backend), ("result", result)];
            raise(&self.exports.get_or_create(&export_label("ok")), push.ok);
            for (reason, n) in push.failed() {
                raise(&self.exports.get_or_create(&export_label(reason)), n);
            }
            for (reason, n) in push.dropped() {
                raise(
                    &self
                        .export_drops
                        .get_or_create(&vec![("backend", backend), ("reason", reason)]),
                    n,
                );
            }
            let e = &push.attempt_errors;
            for (cause, n) in [
                ("connect", e.connect),
                ("timeout", e.timeout),
                ("server", e.server),
                ("throttled", e.throttled),
            ] {
                raise(
                    &self
                        .export_retries
                        .get_or_create(&vec![("backend", backend), ("cause", cause)]),
                    n,
                );
            }
            let label = vec![("backend", backend)];
            raise(&self.export_partial.get_or_create(&label), push.partial);
            self.export_queue
                .get_or_create(&label)
                .set(gauge(push.queued as u64));
            self.export_queue_bytes
                .get_or_create(&label)
                .set(gauge(push.queued_bytes as u64));
            if let Some(d) = export.dictionary {
                self.dictionary.get_or_create(&label).set(gauge(d.entries));
                raise(
                    &self.dictionary_over_limit.get_or_create(&label),
                    d.over_limit_samples,
                );
            }
            queued += push.queued as u64;
            queued_bytes += push.queued_bytes as u64;
        }
        if !snapshot.exports.is_empty() {
            self.queue.set(gauge(queued));
            self.queue_bytes.set(gauge(queued_bytes));
        }
        raise(
            &self.pulls.get_or_create(&vec![("result", "served")]),
            snapshot.pull_served,
        );
        raise(
            &self.pulls.get_or_create(&vec![("result", "refused")]),
            snapshot.pull_refused,
        );
        if let Some(a) = &snapshot.async_tasks {
            let count = |family: &Family<Labels, Counter>, key, value, n| {
                raise(&family.get_or_create(&vec![(key, value)]), n)
            };
            for (outcome, n) in [
                ("rewritten", a.rewritten),
                ("frame_not_found", a.frame_not_found),
                ("task_unreadable", a.task_unreadable),
            ] {
                count(&self.async_samples, "outcome", outcome, n);
            }
            for (event, n) in [
                ("cut_depth", a.truncated_depth),
                ("cut_cycle", a.truncated_cycle),
                ("cut_awaiter_unreadable", a.awaiter_unreadable),
                ("coroutine_unreadable", a.coroutine_unreadable),
                ("continued_in_memory", a.continued),
                ("name_unreadable", a.names_unreadable),
            ] {
                count(&self.async_chains, "event", event, n);
            }
            for (kind, n) in [
                ("task", a.cache_misses),
                ("task_failed", a.read_errors),
                ("name", a.names_read),
                ("cache_evictions", a.cache_evictions),
            ] {
                count(&self.async_reads, "kind", kind, n);
            }
            count(&self.async_processes, "layout", "found", a.processes);
            count(
                &self.async_processes,
                "layout",
                "unsupported",
                a.processes_unsupported,
            );
            self.async_pending
                .get_or_create(&vec![])
                .set(gauge(a.processes_pending));
        }
        for (source, reason, n) in snapshot.identity.missing() {
            raise(
                &self
                    .identity_missing
                    .get_or_create(&vec![("source", source), ("reason", reason)]),
                n,
            );
        }
        raise(&self.identity_containers, snapshot.identity.containers);
        raise(&self.identity_cache_resets, snapshot.identity.cache_resets);
        let mut text = String::new();
        // Encoding into a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

/// The agent's own CPU time so far: (user, system) seconds, all threads.
pub(crate) fn own_cpu() -> (f64, f64) {
    match nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF) {
        Ok(usage) => {
            let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
            (secs(usage.user_time()), secs(usage.system_time()))
        }
        Err(_) => (0.0, 0.0),
    }
}

/// The agent's resident memory, from `/proc/self/statm`.
pub(crate) fn own_rss() -> u64 {
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .unwrap_or(4096) as u64;
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * page)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, line_start: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(line_start)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {line_start} in\n{text}"))
    }

    #[test]
    fn async_counters_only_with_async() {
        let m = Metrics::default();
        let text = m.render(&Snapshot::default());
        assert!(!text.contains("pyebpf_async_samples_total{"), "{text}");
        let s = Snapshot {
            async_tasks: Some(AsyncStats {
                task_samples: 100,
                rewritten: 97,
                frame_not_found: 2,
                task_unreadable: 1,
                continued: 4,
                processes: 1,
                ..Default::default()
            }),
            ..Default::default()
        };
        let text = m.render(&s);
        let outcome = |o: &str| format!("pyebpf_async_samples_total{{outcome=\"{o}\"}} ");
        assert_eq!(value(&text, &outcome("rewritten")), 97.0);
        assert_eq!(value(&text, &outcome("task_unreadable")), 1.0);
        assert_eq!(
            value(
                &text,
                "pyebpf_async_chains_total{event=\"continued_in_memory\"} "
            ),
            4.0
        );
        assert_eq!(
            value(&text, "pyebpf_async_processes_total{layout=\"found\"} "),
            1.0
        );
    }

    #[test]
    fn counters_follow_their_sources_and_never_go_down() {
        let m = Metrics::default();
        let mut s = Snapshot {
            samples: 10,
            dropped: vec![("ring_buffer", 2)],
            cpu_user_seconds: 0.5,
            cpu_bpf_seconds: Some(0.25),
            processes: 3,
            ..Default::default()
        };
        let text = m.render(&s);
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert_eq!(value(&text, "pyebpf_samples_total "), 10.0);
        assert_eq!(
            value(
                &text,
                "pyebpf_dropped_samples_total{reason=\"ring_buffer\"} "
            ),
            2.0
        );
        assert_eq!(
            value(&text, "pyebpf_cpu_seconds_total{mode=\"user\"} "),
            0.5
        );
        assert_eq!(
            value(&text, "pyebpf_cpu_seconds_total{mode=\"bpf\"} "),
            0.25
        );
        assert_eq!(value(&text, "pyebpf_processes "), 3.0);
        s.samples = 25;
        s.processes = 1;
        assert_eq!(value(&m.render(&s), "pyebpf_samples_total "), 25.0);
        s.samples = 5;
        let text = m.render(&s);
        assert_eq!(value(&text, "pyebpf_samples_total "), 25.0);
        assert_eq!(value(&text, "pyebpf_processes "), 1.0);
        assert!(!text.contains("backend=\"pyroscope\""));
        s.identity.bundle_not_found = 2;
        s.identity.containers = 3;
        let text = m.render(&s);
        assert_eq!(
            value(
                &text,
                "pyebpf_identity_sources_missing_total{source=\"bundle\",reason=\"not_found\"} "
            ),
            2.0
        );
        assert_eq!(value(&text, "pyebpf_identity_containers_total "), 3.0);
    }
}
