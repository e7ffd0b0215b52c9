//! The agent's windows: every `--interval`, one profile per service, and the labels of the
//! series it is pushed to.
//!
//! A service is what [`crate::identity`] named the process (or an operator's `service_name`
//! label). Its series' labels are [`identity::series_labels`]: a pool of gunicorn workers is
//! one series, not one per worker, while its samples keep `pid` and `tid` as pprof labels.
//!
//! Bounds: at most [`MAX_SERVICES`] services per window (samples of others are counted in
//! [`Windows::services_over_limit`] and left out), and at most [`MAX_WINDOW_STACKS`] distinct
//! (labels, stack) keys per service (more go to one `<stacks over limit>` stack, counted).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::aggregate::stacks::Aggregator;
use crate::aggregate::{Profile, Timing};
use crate::discovery::PythonProcess;
use crate::identity::{self, OperatorLabels, ProcessLabels};
use crate::output::pprof;
use crate::session::Resolved;

/// Services with a profile in one window.
pub(crate) const MAX_SERVICES: usize = 256;
/// Distinct (labels, stack) keys of one service's profile in one window. At 19 Hz a 15 s
/// window of a 64-CPU host holds at most ~18 k samples, so the cap only bites on pathological
/// stack churn.
pub(crate) const MAX_WINDOW_STACKS: usize = 8192;
/// Processes a window keeps labels of, per service.
const MAX_PROCESSES: usize = 4096;

/// A profile being filled, and whom it covers.
pub(crate) struct Window {
    aggregator: Aggregator,
    processes: BTreeMap<u32, WindowProcess>,
}

/// What a window knows of a process it has samples of.
#[derive(Clone, Debug)]
pub(crate) struct WindowProcess {
    pub identity: Arc<ProcessLabels>,
    /// The executable's file name (`/proc/PID/exe`), read at the process's first sample in
    /// the window; its `comm` when that cannot be read.
    pub executable: String,
}

impl WindowProcess {
    fn of(process: &PythonProcess) -> WindowProcess {
        let executable = std::fs::read_link(format!("/proc/{}/exe", process.pid))
            .ok()
            .and_then(|p| Some(p.file_name()?.to_string_lossy().into_owned()))
            .unwrap_or_else(|| process.identity.comm.clone());
        WindowProcess {
            identity: Arc::clone(&process.identity),
            executable,
        }
    }
}

impl Window {
    pub(crate) fn new(stack_limit: usize) -> Window {
        Window {
            aggregator: Aggregator::new(Profile::with_stack_limit(stack_limit), false, false)
                .with_labels(true),
            processes: BTreeMap::new(),
        }
    }

    pub(crate) fn add(&mut self, sample: &Resolved, process: &PythonProcess) {
        if self.processes.len() < MAX_PROCESSES {
            self.processes
                .entry(process.pid)
                .or_insert_with(|| WindowProcess::of(process));
        }
        self.aggregator.add(sample, process);
    }

    pub(crate) fn samples(&self) -> u64 {
        self.aggregator.profile.samples
    }

    /// The profile of what was collected since `started`.
    pub(crate) fn finish(self, started: SystemTime, elapsed: Duration, rate_hz: u64) -> Profile {
        let mut profile = self.aggregator.profile;
        profile.timing = Timing {
            start_unix_ns: started
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
            duration_ns: elapsed.as_nanos() as u64,
            period_ns: 1_000_000_000 / rate_hz.max(1),
        };
        profile
    }

    /// The gzipped pprof of what was collected since `started`.
    pub(crate) fn pprof(self, started: SystemTime, elapsed: Duration, rate_hz: u64) -> Vec<u8> {
        let profile = self.finish(started, elapsed, rate_hz);
        let mut bytes = Vec::new();
        // Writing to a Vec fails only on allocation failure, which aborts anyway.
        let _ = pprof::write(&profile, "pyebpf agent", &mut bytes);
        bytes
    }
}

/// One service's profile of a window, for the exporters.
pub(crate) struct Cut {
    pub service: String,
    /// The labels of the service's series (Pyroscope's), `__name__` and `service_name` first.
    pub labels: Vec<(String, String)>,
    /// With its timing; samples labelled with pid, tid, thread name and the process's labels.
    pub profile: Profile,
    /// The processes with samples in it (at most [`MAX_PROCESSES`]), by pid.
    pub processes: BTreeMap<u32, WindowProcess>,
}

/// The current window of every service.
pub(crate) struct Windows {
    by_service: BTreeMap<String, Window>,
    started: SystemTime,
    started_at: Instant,
    hostname: String,
    operator: OperatorLabels,
    /// Samples left out because [`MAX_SERVICES`] services already had a window.
    pub services_over_limit: u64,
    /// Samples that went to `<stacks over limit>`, over all cut windows.
    pub stacks_over_limit: u64,
    /// Windows cut (one per service with samples).
    pub cut: u64,
}

impl Windows {
    pub(crate) fn new(hostname: String, operator: OperatorLabels) -> Windows {
        Windows {
            by_service: BTreeMap::new(),
            started: SystemTime::now(),
            started_at: Instant::now(),
            hostname,
            operator,
            services_over_limit: 0,
            stacks_over_limit: 0,
            cut: 0,
        }
    }

    pub(crate) fn add(&mut self, sample: &Resolved, process: &PythonProcess) {
        let service = service_of(&self.operator, process);
        if let Some(window) = self.by_service.get_mut(service) {
            window.add(sample, process);
            return;
        }
        if self.by_service.len() >= MAX_SERVICES {
            self.services_over_limit += sample.weight;
            return;
        }
        let service = service.to_string();
        let mut window = Window::new(MAX_WINDOW_STACKS);
        window.add(sample, process);
        self.by_service.insert(service, window);
    }

    pub(crate) fn services(&self) -> usize {
        self.by_service.len()
    }

    pub(crate) fn age(&self) -> Duration {
        self.started_at.elapsed()
    }

    /// Ends the window: one profile per service that has samples, and a new window starts.
    pub(crate) fn cut(&mut self, rate_hz: u64) -> Vec<Cut> {
        let elapsed = self.started_at.elapsed();
        let started = self.started;
        self.started = SystemTime::now();
        self.started_at = Instant::now();
        let mut cuts = Vec::new();
        for (service, window) in std::mem::take(&mut self.by_service) {
            if window.samples() == 0 {
                continue;
            }
            let labels = self.series_labels(&service, window.processes.values());
            let processes = window.processes.clone();
            let profile = window.finish(started, elapsed, rate_hz);
            self.stacks_over_limit += profile.over_limit;
            self.cut += 1;
            cuts.push(Cut {
                service,
                labels,
                profile,
                processes,
            });
        }
        cuts
    }

    /// The labels of `service`'s series (see [`identity::series_labels`]).
    fn series_labels<'a>(
        &self,
        service: &str,
        processes: impl Iterator<Item = &'a WindowProcess> + Clone,
    ) -> Vec<(String, String)> {
        identity::series_labels(
            service,
            &self.hostname,
            &self.operator,
            processes.map(|p| p.identity.as_ref()),
        )
    }
}

/// The service a process's samples go to: the operator's `service_name`, else its own.
pub(crate) fn service_of<'a>(operator: &'a OperatorLabels, process: &'a PythonProcess) -> &'a str {
    operator
        .get("service_name")
        .unwrap_or(&process.identity.service_name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::ServiceSource;

    fn labels(pid: u32, comm: &str, container: Option<&str>) -> WindowProcess {
        let identity = Arc::new(ProcessLabels {
            pid,
            comm: comm.into(),
            service_name: "svc".into(),
            service_source: ServiceSource::Program,
            container_id: container.map(Into::into),
            container_runtime: None,
            kubernetes: Default::default(),
            python_version: "3.12".into(),
        });
        WindowProcess {
            identity,
            executable: "python3.12".into(),
        }
    }

    fn windows(operator: &[&str]) -> Windows {
        Windows::new("host1".into(), OperatorLabels::parse(operator).unwrap())
    }

    #[test]
    fn one_process_names_its_pid_a_pool_does_not() {
        let w = windows(&[]);
        let one = [labels(7, "python3", Some("c1"))];
        let series = w.series_labels("svc", one.iter());
        let get = |s: &[(String, String)], k: &str| {
            s.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        };
        assert_eq!(series[0], ("__name__".into(), "process_cpu".into()));
        assert_eq!(series[1], ("service_name".into(), "svc".into()));
        assert_eq!(get(&series, "pid").as_deref(), Some("7"));
        assert_eq!(get(&series, "container_id").as_deref(), Some("c1"));
        assert_eq!(get(&series, "hostname").as_deref(), Some("host1"));
        assert_eq!(get(&series, "python_version").as_deref(), Some("3.12"));

        let pool = [
            labels(7, "gunicorn", Some("c1")),
            labels(8, "gunicorn", None),
        ];
        let series = w.series_labels("svc", pool.iter());
        assert_eq!(get(&series, "pid"), None);
        assert_eq!(get(&series, "container_id"), None);
        assert_eq!(get(&series, "comm").as_deref(), Some("gunicorn"));
    }

    #[test]
    fn operator_labels_win_and_service_name_stays_second() {
        let w = windows(&["env=prod", "hostname=override"]);
        let series = w.series_labels("svc", [labels(1, "p", None)].iter());
        let names: Vec<&str> = series.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(&names[..2], ["__name__", "service_name"]);
        assert!(series.contains(&("env".into(), "prod".into())));
        assert!(series.contains(&("hostname".into(), "override".into())));
        assert_eq!(names.iter().filter(|n| **n == "service_name").count(), 1);
    }
}
