//! One home for labels: the operator's `--label`s, the labels of each sample and those of a
//! series.
//!
//! - [`sample_labels`]: what every sample of a process carries in a pprof profile, besides its
//!   numeric `pid` and `tid` and its `thread_name`: `process`, `service_name`, and where they
//!   are known `container_id`, `namespace`, `pod`, `container` and `pod_uid` (the names Grafana
//!   Alloy's Kubernetes relabelling gives, so that a profile from pyebpf and one scraped by
//!   Alloy are grouped alike).
//! - [`series_labels`]: the labels of the series a service's window is pushed to: `__name__`,
//!   `service_name`, `hostname`, the operator's, and each per-process label on which every
//!   process of the window agrees (a pool of gunicorn workers is one series, not one per pid).
//!
//! Operator labels override the agent's own on a series, `service_name` included.

use std::collections::BTreeMap;

use super::{cap, ProcessLabels};

/// Pyroscope's default `validation.max-label-name-length`.
pub(crate) const MAX_LABEL_NAME: usize = 1024;
/// Pyroscope's default `validation.max-label-value-length`.
pub(crate) const MAX_LABEL_VALUE: usize = 2048;
/// Pyroscope's default `validation.max-label-names-per-series`; a series with more is refused.
pub(crate) const MAX_LABELS_PER_SERIES: usize = 30;
/// The series name Pyroscope files CPU profiles of processes under.
pub(crate) const PROFILE_NAME: &str = "process_cpu";
/// Labels the agent may set itself on a series: `__name__`, `service_name`, `hostname`, `pid`,
/// `comm`, `python_version`, `container_id`, `namespace`, `pod`, `container`, `pod_uid`.
const BUILTIN_LABELS: usize = 11;
/// `--label`s an operator may add without the series going over [`MAX_LABELS_PER_SERIES`].
pub(crate) const MAX_OPERATOR_LABELS: usize = MAX_LABELS_PER_SERIES - BUILTIN_LABELS;

/// The labels every sample of a process carries besides `pid`, `tid` and `thread_name`, which
/// the aggregation adds per thread. `command` is the process's short command line.
pub(crate) fn sample_labels(command: &str, process: &ProcessLabels) -> Vec<(&'static str, String)> {
    let mut labels = vec![
        ("process", command.to_string()),
        ("service_name", process.service_name.clone()),
    ];
    for (name, value) in PLACE.into_iter().zip(place(process)) {
        if let Some(value) = value {
            labels.push((name, value.to_string()));
        }
    }
    labels
}

/// The labels that say where a process runs: its container and, in Kubernetes, its pod.
pub(crate) const PLACE: [&str; 5] = ["container_id", "namespace", "pod", "container", "pod_uid"];

/// The values of [`PLACE`] for `process`, in that order.
fn place(process: &ProcessLabels) -> [Option<&str>; 5] {
    let k8s = &process.kubernetes;
    [
        process.container_id.as_deref(),
        k8s.namespace.as_deref(),
        k8s.pod.as_deref(),
        k8s.container.as_deref(),
        k8s.pod_uid.as_deref(),
    ]
}

/// The labels of the series `service`'s profile of a window is pushed to: `__name__` and
/// `service_name` first, then the rest by name. `hostname` and the operator's labels always;
/// `pid`, `comm`, `python_version` and the place labels (see [`sample_labels`]) when all of
/// `processes` agree on them. An operator's label wins over the agent's.
pub fn series_labels<'a>(
    service: &str,
    hostname: &str,
    operator: &OperatorLabels,
    processes: impl Iterator<Item = &'a ProcessLabels> + Clone,
) -> Vec<(String, String)> {
    let mut labels = BTreeMap::new();
    let mut set = |name: &str, value: Option<String>| {
        // An empty value means "not set" to Prometheus-style backends; leave it out.
        if let Some(value) = value.filter(|v| !v.is_empty()) {
            labels.insert(name.to_string(), value);
        }
    };
    set("hostname", Some(hostname.to_string()));
    set(
        "pid",
        common(processes.clone(), |p| Some(p.pid.to_string())),
    );
    set("comm", common(processes.clone(), |p| Some(p.comm.clone())));
    set(
        "python_version",
        common(processes.clone(), |p| Some(p.python_version.clone())),
    );
    for (i, name) in PLACE.into_iter().enumerate() {
        set(
            name,
            common(processes.clone(), |p| place(p)[i].map(str::to_string)),
        );
    }
    for (name, value) in operator.iter() {
        set(name, Some(value.to_string()));
    }
    labels.remove("service_name");
    let mut series = vec![
        ("__name__".to_string(), PROFILE_NAME.to_string()),
        ("service_name".to_string(), service.to_string()),
    ];
    series.extend(labels);
    series
}

/// The value every process agrees on; `None` if they differ or one has none.
fn common<'a>(
    mut processes: impl Iterator<Item = &'a ProcessLabels>,
    value: impl Fn(&ProcessLabels) -> Option<String>,
) -> Option<String> {
    let first = value(processes.next()?)?;
    processes
        .all(|p| value(p).as_ref() == Some(&first))
        .then_some(first)
}

/// A `--label` the operator gave that cannot be a Pyroscope/Prometheus label. Bad usage: the
/// CLI reports it on one line and exits 2.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("--label {arg:?}: expected NAME=VALUE, e.g. --label env=prod")]
    NoEquals { arg: String },
    #[error("--label {arg:?}: label name {name:?} must match [a-zA-Z_][a-zA-Z0-9_]*")]
    BadName { arg: String, name: String },
    #[error("--label {arg:?}: names starting with `__` are reserved for the backend")]
    Reserved { arg: String },
    #[error("--label {arg:?}: empty value; leave the flag out to not set {name}")]
    EmptyValue { arg: String, name: String },
    #[error("--label {name}=…: {what} is longer than {max} bytes, which Pyroscope refuses")]
    TooLong {
        name: String,
        what: &'static str,
        max: usize,
    },
    #[error("--label {name} is given twice (={first:?} and ={second:?}): keep one")]
    Duplicate {
        name: String,
        first: String,
        second: String,
    },
    #[error("{count} --label flags: at most {max} fit in a series beside the agent's own {BUILTIN_LABELS} labels (Pyroscope refuses more than {MAX_LABELS_PER_SERIES})")]
    TooMany { count: usize, max: usize },
}

impl From<LabelError> for crate::UsageError {
    fn from(err: LabelError) -> Self {
        crate::UsageError(err.to_string())
    }
}

/// Parses one `--label NAME=VALUE`; usable as a clap `value_parser`, whose errors exit 2.
pub fn parse_label(arg: &str) -> Result<(String, String), LabelError> {
    let Some((name, value)) = arg.split_once('=') else {
        return Err(LabelError::NoEquals { arg: arg.into() });
    };
    if name.starts_with("__") {
        return Err(LabelError::Reserved { arg: arg.into() });
    }
    if !is_label_name(name) {
        return Err(LabelError::BadName {
            arg: arg.into(),
            name: name.into(),
        });
    }
    if value.is_empty() {
        return Err(LabelError::EmptyValue {
            arg: arg.into(),
            name: name.into(),
        });
    }
    for (what, len, max) in [
        ("the name", name.len(), MAX_LABEL_NAME),
        ("the value", value.len(), MAX_LABEL_VALUE),
    ] {
        if len > max {
            return Err(LabelError::TooLong {
                name: cap(name, 64),
                what,
                max,
            });
        }
    }
    Ok((name.into(), value.into()))
}

fn is_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The operator's `--label`s, checked: valid names, no name twice, few enough to fit a series.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OperatorLabels(BTreeMap<String, String>);

impl OperatorLabels {
    /// From parsed pairs (see [`parse_label`]).
    pub fn new(pairs: impl IntoIterator<Item = (String, String)>) -> Result<Self, LabelError> {
        let mut labels = BTreeMap::new();
        for (name, value) in pairs {
            if let Some(first) = labels.get(&name) {
                return Err(LabelError::Duplicate {
                    name,
                    first: String::clone(first),
                    second: value,
                });
            }
            labels.insert(name, value);
        }
        if labels.len() > MAX_OPERATOR_LABELS {
            return Err(LabelError::TooMany {
                count: labels.len(),
                max: MAX_OPERATOR_LABELS,
            });
        }
        Ok(OperatorLabels(labels))
    }

    /// From raw `NAME=VALUE` arguments.
    pub fn parse<S: AsRef<str>>(args: &[S]) -> Result<Self, LabelError> {
        let pairs = args
            .iter()
            .map(|a| parse_label(a.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        OperatorLabels::new(pairs)
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// By name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{Kubernetes, ServiceSource};

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn operator_labels() {
        assert_eq!(parse_label("env=prod"), Ok(("env".into(), "prod".into())));
        assert_eq!(parse_label("_x=a=b"), Ok(("_x".into(), "a=b".into())));
        assert!(matches!(
            parse_label("env"),
            Err(LabelError::NoEquals { .. })
        ));
        assert!(matches!(parse_label("=x"), Err(LabelError::BadName { .. })));
        assert!(matches!(
            parse_label("1env=x"),
            Err(LabelError::BadName { .. })
        ));
        assert!(matches!(
            parse_label("my-env=x"),
            Err(LabelError::BadName { .. })
        ));
        assert!(matches!(
            parse_label("k8s.ns=x"),
            Err(LabelError::BadName { .. })
        ));
        assert!(matches!(
            parse_label("__name__=x"),
            Err(LabelError::Reserved { .. })
        ));
        assert!(matches!(
            parse_label("env="),
            Err(LabelError::EmptyValue { .. })
        ));
        let long = format!("env={}", "x".repeat(MAX_LABEL_VALUE + 1));
        assert!(matches!(
            parse_label(&long),
            Err(LabelError::TooLong { .. })
        ));
        assert!(matches!(
            OperatorLabels::parse(&["env=a", "env=b"]),
            Err(LabelError::Duplicate { .. })
        ));
        let many: Vec<String> = (0..=MAX_OPERATOR_LABELS)
            .map(|i| format!("l{i}=v"))
            .collect();
        assert!(matches!(
            OperatorLabels::parse(&many),
            Err(LabelError::TooMany { .. })
        ));
        let err = parse_label("bad-name=x").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"--label "bad-name=x": label name "bad-name" must match [a-zA-Z_][a-zA-Z0-9_]*"#
        );
        let usage: crate::UsageError = err.into();
        assert!(usage.0.contains("bad-name"));
    }

    fn process(pid: u32, comm: &str, container: Option<&str>) -> ProcessLabels {
        ProcessLabels {
            pid,
            comm: comm.into(),
            service_name: "shop".into(),
            service_source: ServiceSource::Program,
            container_id: container.map(Into::into),
            container_runtime: None,
            kubernetes: Kubernetes::default(),
            python_version: "3.12".into(),
        }
    }

    fn in_pod(pid: u32) -> ProcessLabels {
        let mut p = process(pid, "python3", Some(ID));
        p.kubernetes = Kubernetes {
            namespace: Some("shop".into()),
            pod: Some(format!("web-{pid}")),
            pod_uid: Some(format!("uid-{pid}")),
            container: Some("api".into()),
        };
        p
    }

    fn get<'a>(series: &'a [(String, String)], name: &str) -> Option<&'a str> {
        series
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn a_series_names_what_its_processes_share() {
        let operator = OperatorLabels::parse(&["env=prod", "zone=a"]).unwrap();
        let one = [process(42, "gunicorn", Some(ID))];
        let series = series_labels("shop", "host1", &operator, one.iter());
        let pairs: Vec<(&str, &str)> = series
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            pairs,
            vec![
                ("__name__", "process_cpu"),
                ("service_name", "shop"),
                ("comm", "gunicorn"),
                ("container_id", ID),
                ("env", "prod"),
                ("hostname", "host1"),
                ("pid", "42"),
                ("python_version", "3.12"),
                ("zone", "a"),
            ]
        );

        // A pool: no pid, and no container when one worker runs outside it.
        let pool = [
            process(7, "gunicorn", Some(ID)),
            process(8, "gunicorn", None),
        ];
        let series = series_labels("shop", "host1", &operator, pool.iter());
        assert_eq!(get(&series, "pid"), None);
        assert_eq!(get(&series, "container_id"), None);
        assert_eq!(get(&series, "comm"), Some("gunicorn"));
    }

    #[test]
    fn pods_of_one_deployment_share_namespace_and_container_not_pod() {
        let operator = OperatorLabels::default();
        let replicas = [in_pod(1), in_pod(2)];
        let series = series_labels("shop/api", "node-1", &operator, replicas.iter());
        assert_eq!(get(&series, "namespace"), Some("shop"));
        assert_eq!(get(&series, "container"), Some("api"));
        assert_eq!(get(&series, "pod"), None);
        assert_eq!(get(&series, "pod_uid"), None);
        let one = [in_pod(3)];
        let series = series_labels("shop/api", "node-1", &operator, one.iter());
        assert_eq!(get(&series, "pod"), Some("web-3"));
        assert_eq!(get(&series, "pod_uid"), Some("uid-3"));
        assert!(series.len() <= MAX_LABELS_PER_SERIES);
    }

    #[test]
    fn operator_labels_override_and_service_name_stays_second() {
        let operator = OperatorLabels::parse(&["hostname=node-7", "env=prod"]).unwrap();
        let series = series_labels("billing", "", &operator, [process(1, "p", None)].iter());
        let names: Vec<&str> = series.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "__name__",
                "service_name",
                "comm",
                "env",
                "hostname",
                "pid",
                "python_version"
            ]
        );
        assert_eq!(get(&series, "hostname"), Some("node-7"));
        assert_eq!(get(&series, "service_name"), Some("billing"));
    }

    #[test]
    fn sample_labels_carry_the_place_only_where_known() {
        let host = process(1, "python3", None);
        assert_eq!(
            sample_labels("python3 app.py", &host),
            vec![
                ("process", "python3 app.py".to_string()),
                ("service_name", "shop".to_string()),
            ]
        );
        let names: Vec<&str> = sample_labels("python3 app.py", &in_pod(2))
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            names,
            [
                "process",
                "service_name",
                "container_id",
                "namespace",
                "pod",
                "container",
                "pod_uid"
            ]
        );
    }
}
