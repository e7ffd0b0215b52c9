//! Who a process is: the labels its samples and profiles carry.
//!
//! A profiling backend groups profiles by `service_name`, so every Python process on the host
//! is named without help from it. The name is the first of:
//!
//! 1. **What the process was told** ([`environ`]): `OTEL_SERVICE_NAME`, `service.name` in
//!    `OTEL_RESOURCE_ATTRIBUTES`, `PYROSCOPE_APPLICATION_NAME`, from its environment as it was
//!    at exec (`/proc/PID/environ`).
//! 2. **Its pod** ([`kubernetes`]): `NAMESPACE/CONTAINER`, as Pyroscope's own eBPF integration
//!    names a container of a pod, when both are known.
//! 3. **The container it runs in** ([`container`]): the short id (12 hex digits, as `docker
//!    ps` shows it) of the container its cgroup path names.
//! 4. **The program** ([`launchers`]): the script, the module, or for a known launcher the
//!    application it serves (`gunicorn app:app` → `app`).
//! 5. `comm`, when the command line is empty.
//!
//! Operator labels (`--label k=v`) override any of these on a series, `service_name` included;
//! [`labels`] builds a sample's labels and a series'.
//!
//! **Where a process runs** comes from the node alone, with no API server: the container id,
//! runtime and pod UID from its cgroup path, then the pod's namespace and name and the
//! container's name from the OCI bundle the runtime wrote for it, then what the process itself
//! says (`HOSTNAME`, the service-account namespace file). A container is looked up once, by the
//! first process found in it, and kept in [`Identities`] for the others (at most
//! [`MAX_CONTAINERS`]; the cache starts over when full, counted). A source that is missing or
//! unreadable leaves its labels out and is counted ([`IdentityStats`], shown in `/metrics`);
//! it never fails the process. Nothing changes for a process outside any container: no bundle
//! is looked for, and its labels are what they always were.
//!
//! Bounds: `environ` and `cmdline` reads stop at [`PROC_READ_CAP`] bytes (both can be megabytes;
//! a truncated last entry is dropped), at most [`MAX_ARGS`] arguments are looked at, and a
//! value taken from another process is cut to [`MAX_DERIVED_VALUE`] bytes. Everything read from
//! other processes is untrusted: no parser here panics on it, and bytes that are not UTF-8 are
//! replaced, never passed on as label values.

pub(crate) mod container;
pub(crate) mod environ;
pub(crate) mod kubernetes;
pub(crate) mod labels;
pub(crate) mod launchers;

use std::collections::HashMap;
use std::io::Read;
use std::sync::{Arc, Mutex};

pub use container::{parse_cgroup, Cgroup, Runtime};
pub use environ::Environ;
pub use kubernetes::Kubernetes;
pub(crate) use labels::sample_labels;
pub use labels::{parse_label, series_labels, LabelError, OperatorLabels};

/// Bytes read from `/proc/PID/environ` and `/proc/PID/cmdline`. Environments in containers
/// are a few KiB; the variables that matter are usually set by the orchestrator and come early.
pub(crate) const PROC_READ_CAP: usize = 64 * 1024;
/// Command-line arguments looked at when naming a program.
pub(crate) const MAX_ARGS: usize = 256;
/// A value derived from another process's data is cut to this many bytes (at a character
/// boundary): a name is for people to read, and the backend keeps it per series.
pub(crate) const MAX_DERIVED_VALUE: usize = 256;
/// Containers whose identity is kept; a node runs at most a few hundred.
pub(crate) const MAX_CONTAINERS: usize = 4096;

/// Where a process's `service_name` came from; worth a log line, since a surprising name is
/// the first thing an operator asks about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceSource {
    OtelServiceName,
    OtelResourceAttributes,
    PyroscopeApplicationName,
    Kubernetes,
    Container,
    Program,
    Comm,
}

/// What is known about one process, before operator labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessLabels {
    pub pid: u32,
    /// `/proc/PID/comm`: at most 15 bytes, set by the kernel from the executable's name or by
    /// the process itself (`prctl`, `setproctitle`).
    pub comm: String,
    pub service_name: String,
    pub service_source: ServiceSource,
    /// Full (64 hex digits, lower case) container id, when the process runs in one.
    pub container_id: Option<String>,
    /// The runtime that runs that container, when its cgroup path says.
    pub container_runtime: Option<Runtime>,
    /// Its pod, when the container is in one (all `None` otherwise).
    pub kubernetes: Kubernetes,
    /// `3.12`, as the caller's layout says; passed through.
    pub python_version: String,
}

impl ProcessLabels {
    /// What a short command line alone says: for a process whose `/proc` entries are gone.
    pub(crate) fn from_command(pid: u32, python_version: &str, command: &str) -> ProcessLabels {
        let comm = cap(
            basename(command.split_whitespace().next().unwrap_or("python")),
            MAX_DERIVED_VALUE,
        );
        ProcessLabels {
            pid,
            service_name: comm.clone(),
            service_source: ServiceSource::Comm,
            comm,
            container_id: None,
            container_runtime: None,
            kubernetes: Kubernetes::default(),
            python_version: python_version.to_string(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("process {pid} is gone")]
    Gone { pid: u32 },
    #[error("cannot read /proc/{pid}/comm: {source}")]
    Unreadable {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
}

/// A container as it was looked up, shared by its processes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Container {
    runtime: Option<Runtime>,
    kubernetes: Kubernetes,
}

/// Sources of identity that were missing or unreadable, and the container cache's size.
/// Counted once per container looked up (the bundle, the namespace file) or per process (the
/// cgroup file).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct IdentityStats {
    /// Containers looked up (each once, by its first process found).
    pub containers: u64,
    /// Times the container cache was full and started over.
    pub cache_resets: u64,
    pub cgroup_unreadable: u64,
    pub bundle_not_found: u64,
    pub bundle_unreadable: u64,
    pub bundle_too_large: u64,
    pub bundle_malformed: u64,
    pub service_account_unreadable: u64,
}

impl IdentityStats {
    /// `(source, reason, count)` of every source that gave nothing: the `/metrics` series.
    pub fn missing(&self) -> [(&'static str, &'static str, u64); 6] {
        [
            ("cgroup", "unreadable", self.cgroup_unreadable),
            ("bundle", "not_found", self.bundle_not_found),
            ("bundle", "unreadable", self.bundle_unreadable),
            ("bundle", "too_large", self.bundle_too_large),
            ("bundle", "malformed", self.bundle_malformed),
            (
                "service_account",
                "unreadable",
                self.service_account_unreadable,
            ),
        ]
    }
}

/// The identities of processes, with what is shared per container looked up once.
#[derive(Debug, Default)]
pub struct Identities {
    containers: Mutex<HashMap<String, Arc<Container>>>,
    stats: Mutex<IdentityStats>,
}

impl Identities {
    /// Resolves `pid`'s labels from `/proc` (and, for a container seen first, its bundle). Only
    /// a process that is gone (or whose `comm` cannot be read at all) is an error; a source
    /// that cannot be read (an `environ` hidden by the kernel's ptrace check, a bundle behind a
    /// runtime that keeps none) is skipped and the next one decides.
    pub fn resolve(&self, pid: u32, python_version: &str) -> Result<ProcessLabels, ResolveError> {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).map_err(|source| {
            if crate::procfs::is_absent(&source) {
                ResolveError::Gone { pid }
            } else {
                ResolveError::Unreadable { pid, source }
            }
        })?;
        let comm = cap(comm.trim_end_matches('\n'), MAX_DERIVED_VALUE);
        let environ =
            read_capped(&format!("/proc/{pid}/environ"), PROC_READ_CAP).unwrap_or_default();
        let cmdline =
            read_capped(&format!("/proc/{pid}/cmdline"), PROC_READ_CAP).unwrap_or_default();
        let env = Environ::parse(&environ.bytes, environ.truncated);
        let cgroup = container::cgroup_of(pid).unwrap_or_else(|| {
            self.count(|s| s.cgroup_unreadable += 1);
            Cgroup::default()
        });
        let (container_runtime, kubernetes) = match &cgroup.container_id {
            Some(id) => {
                let found = self.container(pid, id, &cgroup, &env);
                (found.runtime, found.kubernetes.clone())
            }
            // A pod's process whose path names no container (a driver wrapping ids its own
            // way): the pod, without a cache, since there is no key.
            None if cgroup.pod_uid.is_some() => (None, self.pod_of(pid, &cgroup, &env, None)),
            None => (None, Kubernetes::default()),
        };
        let argv = split_cmdline(&cmdline.bytes, cmdline.truncated);
        let argv: Vec<&str> = argv.iter().map(|a| a.as_ref()).collect();
        let (service_name, service_source) =
            service_name(&env, &kubernetes, cgroup.container_id.as_deref(), &argv)
                .unwrap_or((comm.clone(), ServiceSource::Comm));
        Ok(ProcessLabels {
            pid,
            comm,
            service_name,
            service_source,
            container_id: cgroup.container_id,
            container_runtime,
            kubernetes,
            python_version: python_version.to_string(),
        })
    }

    pub fn stats(&self) -> IdentityStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, f: impl FnOnce(&mut IdentityStats)) {
        f(&mut self.stats.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Container `id`'s identity, looked up by `pid` (one of its processes) when not known yet.
    fn container(&self, pid: u32, id: &str, cgroup: &Cgroup, env: &Environ) -> Arc<Container> {
        let cached = |containers: &HashMap<String, Arc<Container>>| containers.get(id).cloned();
        if let Some(hit) = cached(&self.containers.lock().unwrap_or_else(|e| e.into_inner())) {
            return hit;
        }
        let bundle = match container::read_bundle_config(pid, id) {
            Ok(config) => kubernetes::from_bundle(&config).map_err(|err| {
                self.count(|s| s.bundle_malformed += 1);
                log::info!(
                    "container {}: its OCI bundle is unreadable ({err}); no pod labels from it",
                    short_id(id)
                );
            }),
            Err(err) => {
                self.count(|s| match err {
                    container::BundleError::NotFound => s.bundle_not_found += 1,
                    container::BundleError::Unreadable { .. } => s.bundle_unreadable += 1,
                    container::BundleError::TooLarge { .. } => s.bundle_too_large += 1,
                });
                log::info!(
                    "container {} (process {pid}): {err}; no pod labels from its bundle ({})",
                    short_id(id),
                    err.reason()
                );
                Err(())
            }
        };
        let found = Arc::new(Container {
            runtime: cgroup.runtime,
            kubernetes: self.pod_of(pid, cgroup, env, bundle.ok()),
        });
        let mut containers = self.containers.lock().unwrap_or_else(|e| e.into_inner());
        if containers.len() >= MAX_CONTAINERS {
            containers.clear();
            self.count(|s| s.cache_resets += 1);
        }
        containers.insert(id.to_string(), Arc::clone(&found));
        self.count(|s| s.containers += 1);
        found
    }

    /// The pod of a process: what its bundle said, then the pod UID of its cgroup path, then,
    /// when that shows it is in a pod, what the process says of itself.
    fn pod_of(
        &self,
        pid: u32,
        cgroup: &Cgroup,
        env: &Environ,
        bundle: Option<Kubernetes>,
    ) -> Kubernetes {
        let mut found = bundle.unwrap_or_default();
        found.fill(Kubernetes {
            pod_uid: cgroup.pod_uid.clone(),
            ..Kubernetes::default()
        });
        if found.is_empty() {
            return found;
        }
        let (own, read) = kubernetes::from_process(pid, env.hostname.as_deref());
        if let Err(err) = read {
            self.count(|s| s.service_account_unreadable += 1);
            log::info!("process {pid}: its service-account namespace file: {err}");
        }
        found.fill(own);
        found
    }
}

/// [`Identities::resolve`] without a cache shared with other lookups.
pub fn resolve(pid: u32, python_version: &str) -> Result<ProcessLabels, ResolveError> {
    Identities::default().resolve(pid, python_version)
}

/// The container id in `pid`'s cgroup path, if it has one (see [`parse_cgroup`]).
pub fn container_id(pid: u32) -> Option<String> {
    container::cgroup_of(pid)?.container_id
}

/// This host's name (the agent's UTS namespace: in a container that is the container's, so a
/// DaemonSet sets `--label node=…` from the downward API). Read once.
pub fn hostname() -> std::io::Result<String> {
    let name = nix::unistd::gethostname()?;
    Ok(cap(&name.to_string_lossy(), MAX_DERIVED_VALUE))
}

/// The service name of a process from its environment, pod, container and command line, in
/// that order; `None` when none of them names it.
pub fn service_name(
    env: &Environ,
    kubernetes: &Kubernetes,
    container_id: Option<&str>,
    argv: &[&str],
) -> Option<(String, ServiceSource)> {
    if let Some(found) = env.service_name() {
        return Some(found);
    }
    if let (Some(namespace), Some(container)) = (&kubernetes.namespace, &kubernetes.container) {
        return Some((
            cap(&format!("{namespace}/{container}"), MAX_DERIVED_VALUE),
            ServiceSource::Kubernetes,
        ));
    }
    if let Some(id) = container_id {
        return Some((short_id(id).to_string(), ServiceSource::Container));
    }
    let program = launchers::program_from_argv(argv, env)?;
    Some((
        cap(&program.name, MAX_DERIVED_VALUE),
        ServiceSource::Program,
    ))
}

/// The first 12 characters of a container id: what `docker ps`, `crictl ps` and `podman ps`
/// show, and unique in practice on one host.
pub fn short_id(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

// ---------------------------------------------------------------------------------------------
// /proc reads and small helpers

#[derive(Default)]
struct Capped {
    bytes: Vec<u8>,
    /// The file had more than the cap: its last entry may be cut.
    truncated: bool,
}

fn read_capped(path: &str, cap: usize) -> std::io::Result<Capped> {
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    // One byte more than the cap tells a file of exactly `cap` bytes from a longer one.
    file.take(cap as u64 + 1).read_to_end(&mut bytes)?;
    let truncated = bytes.len() > cap;
    bytes.truncate(cap);
    Ok(Capped { bytes, truncated })
}

/// NUL-separated entries; when the read stopped early, the last one is dropped: it may be cut,
/// and a prefix must not pass for a whole value. (A complete file's last entry may lack its
/// NUL: a process that rewrote its command line.)
fn entries(bytes: &[u8], truncated: bool) -> impl Iterator<Item = &[u8]> {
    let mut parts: Vec<&[u8]> = bytes.split(|&b| b == 0).collect();
    if truncated {
        parts.pop();
    }
    parts.into_iter().filter(|p| !p.is_empty())
}

fn split_cmdline(bytes: &[u8], truncated: bool) -> Vec<std::borrow::Cow<'_, str>> {
    entries(bytes, truncated)
        .take(MAX_ARGS)
        .map(String::from_utf8_lossy)
        .collect()
}

pub(crate) fn basename(path: &str) -> &str {
    let trimmed = path.trim_end_matches('/');
    trimmed.rsplit('/').next().unwrap_or(trimmed)
}

/// `s` cut to at most `max` bytes at a character boundary.
pub(crate) fn cap(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn pod(namespace: Option<&str>, container: Option<&str>) -> Kubernetes {
        Kubernetes {
            namespace: namespace.map(Into::into),
            container: container.map(Into::into),
            pod: Some("web-7d9f".into()),
            pod_uid: None,
        }
    }

    #[test]
    fn environment_then_pod_then_container_then_program() {
        let none = Environ::default();
        let app = ["python3", "app.py"];
        let in_pod = pod(Some("shop"), Some("api"));
        assert_eq!(
            service_name(&none, &in_pod, Some(ID), &app),
            Some(("shop/api".into(), ServiceSource::Kubernetes))
        );
        let told = Environ {
            otel_service_name: Some("checkout".into()),
            ..Environ::default()
        };
        assert_eq!(
            service_name(&told, &in_pod, Some(ID), &app),
            Some(("checkout".into(), ServiceSource::OtelServiceName))
        );
        // Half a pod (no container name) does not make a name.
        assert_eq!(
            service_name(&none, &pod(Some("shop"), None), Some(ID), &app),
            Some(("0123456789ab".into(), ServiceSource::Container))
        );
        let nowhere = Kubernetes::default();
        assert_eq!(
            service_name(&none, &nowhere, Some(ID), &app),
            Some(("0123456789ab".into(), ServiceSource::Container))
        );
        assert_eq!(
            service_name(&none, &nowhere, None, &app),
            Some(("app".into(), ServiceSource::Program))
        );
        assert_eq!(service_name(&none, &nowhere, None, &[]), None);
    }

    #[test]
    fn resolves_this_process() {
        let me = std::process::id();
        let found = resolve(me, "3.12").unwrap();
        assert_eq!(found.pid, me);
        assert!(!found.comm.is_empty());
        assert!(!found.service_name.is_empty());
        assert!(matches!(
            resolve(u32::MAX - 1, "3.12"),
            Err(ResolveError::Gone { .. })
        ));
    }

    #[test]
    fn a_host_process_looks_up_no_container() {
        let identities = Identities::default();
        let me = identities.resolve(std::process::id(), "3.12").unwrap();
        if me.container_id.is_none() {
            assert!(me.kubernetes.is_empty());
            assert_eq!(identities.stats().containers, 0);
            assert_eq!(identities.stats().bundle_not_found, 0);
        }
    }
}
