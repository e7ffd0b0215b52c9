//! The container a process runs in: its id, runtime and pod from the cgroup path, and its OCI
//! bundle (the runtime's `config.json`, whose annotations name the pod; see
//! [`super::kubernetes`]).
//!
//! **The cgroup path** (`/proc/PID/cgroup`, v1 and v2, systemd and cgroupfs drivers) holds the
//! 64-hex container id, wrapped by each runtime its own way: `docker-<id>.scope` or
//! `/docker/<id>`, `cri-containerd-<id>.scope` or `…:cri-containerd:<id>`, `crio-<id>.scope`,
//! `libpod-<id>.scope`, or bare under a kubepods directory (cgroupfs driver). Under Kubernetes
//! it also holds the pod UID: `kubepods-burstable-pod<uid with _>.slice` (systemd) or
//! `/kubepods/burstable/pod<uid>/` (cgroupfs). Paths are as the agent's cgroup namespace shows
//! them: from a private one (a pod on cgroup v2) they start with `/../..`, which changes
//! nothing here.
//!
//! **Finding the bundle without knowing where runtimes keep it.** Every runtime starts a
//! monitor that parents the container's first process and keeps the bundle at hand:
//! - CRI-O and podman start `conmon -b BUNDLE -c ID …` with the bundle as its working
//!   directory (CRI-O `internal/oci/runtime_oci.go`: `"-b", c.bundlePath` and
//!   `cmd.Dir = c.bundlePath`; conmon `src/cli.c` takes its working directory when `-b` is
//!   missing). CRI-O's bundle is `<runroot>/overlay-containers/<id>/userdata`, podman's the same
//!   under its graph root.
//! - containerd starts `containerd-shim-runc-v2 -namespace NS -id ID …` in the bundle
//!   (`pkg/shim/util.go`: `cmd.Dir = config.Path`, kept by the daemon it forks), which is
//!   `<state>/io.containerd.runtime.v2.task/<ns>/<id>` (`core/runtime/v2/bundle.go`). Under
//!   Kubernetes one shim serves a whole pod and sits in the *sandbox's* bundle, so another
//!   container's bundle is the sibling `../<id>`: the shim finds it the same way
//!   (`manager_linux.go`, `Stop`: `filepath.Join(filepath.Dir(cwd), id)`).
//!
//! So the monitor is the first ancestor of the process outside its container (by cgroup), and
//! its bundle is read through `/proc/MONITOR/root`: this works wherever a distribution keeps
//! its state (k3s's `/run/k3s/containerd`, a CRI-O `runroot`, a rootless podman) and needs no
//! host directory mounted into the agent's pod. Only when no monitor is found (the first
//! process exited and its children were re-parented) are the default locations tried, under
//! the host's root (`/proc/1/root`, the node's with `hostPID`).
//!
//! Bounds: at most [`MAX_ANCESTORS`] parents are walked, a `config.json` is read up to
//! [`MAX_BUNDLE_BYTES`] (larger is refused, not cut), a monitor's command line up to
//! [`super::PROC_READ_CAP`]. Everything here is read from other processes and never panics.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::read_capped;

/// Parents walked up from a process to find its container's monitor: a container's process
/// tree is rarely more than a few levels deep.
pub(crate) const MAX_ANCESTORS: usize = 32;
/// Bytes of a bundle's `config.json` read at most; a Kubernetes container's is 10–50 KiB (its
/// environment and mounts), so more is not a config any runtime wrote.
pub(crate) const MAX_BUNDLE_BYTES: usize = 1024 * 1024;
/// Bytes read from `/proc/PID/cgroup` (one line per hierarchy, a few hundred bytes each).
pub(crate) const CGROUP_READ_CAP: usize = 16 * 1024;

/// Where runtimes keep bundles by default, `{id}` for the container id: containerd's CRI
/// namespace (`k8s.io`), CRI-O's `runroot`, podman's (rootful) graph root.
const DEFAULT_BUNDLES: [&str; 3] = [
    "/run/containerd/io.containerd.runtime.v2.task/k8s.io/{id}",
    "/run/containers/storage/overlay-containers/{id}/userdata",
    "/var/lib/containers/storage/overlay-containers/{id}/userdata",
];

/// The container runtime, as the cgroup path names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Runtime {
    Containerd,
    CriO,
    Docker,
    Podman,
}

impl Runtime {
    /// As OpenTelemetry's `container.runtime` would name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Containerd => "containerd",
            Runtime::CriO => "cri-o",
            Runtime::Docker => "docker",
            Runtime::Podman => "podman",
        }
    }
}

/// What a `/proc/PID/cgroup` text says about where the process runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cgroup {
    /// 64 hex digits, lower case.
    pub container_id: Option<String>,
    /// `None` where the path does not say (the cgroupfs driver's bare id).
    pub runtime: Option<Runtime>,
    /// The pod's UID (`8-4-4-4-12` hex, or 32 hex for a static pod), when the path is under a
    /// `kubepods` directory.
    pub pod_uid: Option<String>,
}

/// Parses a `/proc/PID/cgroup` text. The first line with a container id gives it (under cgroup
/// v1 every hierarchy repeats the path; under v2 there is one `0::` line), and in that path the
/// innermost component that is one: nested runtimes (docker in docker) put the container that
/// really holds the process last. The pod UID comes from the same line, else any line.
pub fn parse_cgroup(text: &str) -> Cgroup {
    let paths = || text.lines().filter_map(|l| l.splitn(3, ':').nth(2));
    let mut found = Cgroup::default();
    for path in paths() {
        let components: Vec<&str> = path.split('/').collect();
        let innermost = (0..components.len()).rev().find_map(|i| {
            let (id, runtime) = container_component(components[i])?;
            // `/docker/<id>`: the directory above names the runtime.
            let parent = i.checked_sub(1).map(|p| components[p]);
            Some((
                id,
                runtime.or((parent == Some("docker")).then_some(Runtime::Docker)),
            ))
        });
        if let Some((id, runtime)) = innermost {
            found.container_id = Some(id);
            found.runtime = runtime;
            found.pod_uid = pod_uid(path);
            break;
        }
    }
    if found.pod_uid.is_none() {
        found.pod_uid = paths().find_map(pod_uid);
    }
    found
}

/// The container id (and runtime) a path component names, if it names one.
fn container_component(component: &str) -> Option<(String, Option<Runtime>)> {
    let name = component.strip_suffix(".scope").unwrap_or(component);
    // `libpod-conmon-<id>.scope` and `crio-conmon-<id>.scope` hold the runtime's monitor,
    // not the container.
    if name.contains("conmon-") {
        return None;
    }
    let (prefix, id) = match name.rfind(['-', ':']) {
        Some(at) => (&name[..at], &name[at + 1..]),
        None => ("", name),
    };
    if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let prefix = prefix.trim_end_matches(':');
    let runtime = if prefix.ends_with("cri-containerd") {
        Some(Runtime::Containerd)
    } else if prefix.ends_with("crio") {
        Some(Runtime::CriO)
    } else if prefix.ends_with("docker") {
        Some(Runtime::Docker)
    } else if prefix.ends_with("libpod") {
        Some(Runtime::Podman)
    } else {
        None
    };
    Some((id.to_ascii_lowercase(), runtime))
}

/// The pod UID in a cgroup path under `kubepods`: `kubepods-<qos>-pod<uid>.slice` (systemd
/// driver, `-` in the UID written `_`) or `pod<uid>` (cgroupfs driver).
fn pod_uid(path: &str) -> Option<String> {
    let mut components = path.split('/');
    components.find(|c| c.starts_with("kubepods"))?;
    // The pod's directory is the first one below `kubepods` that names a pod (the QoS class
    // sits between them).
    components.take(3).find_map(|c| {
        let name = c.strip_suffix(".slice").unwrap_or(c);
        let uid = match name.rfind("-pod") {
            Some(at) if name.starts_with("kubepods") => &name[at + 4..],
            _ => name.strip_prefix("pod")?,
        };
        valid_uid(&uid.replace('_', "-"))
    })
}

/// A pod UID: a UUID (`8-4-4-4-12` hex digits), or the 32 hex digits of a static pod's
/// (the kubelet hashes its manifest). Lower case.
pub(crate) fn valid_uid(uid: &str) -> Option<String> {
    let uid = uid.to_ascii_lowercase();
    let uuid = uid.len() == 36
        && uid.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        });
    let hash = uid.len() == 32 && uid.bytes().all(|b| b.is_ascii_hexdigit());
    (uuid || hash).then_some(uid)
}

/// `pid`'s cgroup facts; `None` when `/proc/PID/cgroup` cannot be read.
pub(crate) fn cgroup_of(pid: u32) -> Option<Cgroup> {
    let cgroup = read_capped(&format!("/proc/{pid}/cgroup"), CGROUP_READ_CAP).ok()?;
    Some(parse_cgroup(&String::from_utf8_lossy(&cgroup.bytes)))
}

/// Why a container's bundle gave nothing.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BundleError {
    #[error("no bundle found (no monitor process, and none at the default locations)")]
    NotFound,
    #[error("{path}: {source}")]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is larger than {MAX_BUNDLE_BYTES} bytes")]
    TooLarge { path: PathBuf },
}

impl BundleError {
    /// The reason label of the `/metrics` counter.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            BundleError::NotFound => "not_found",
            BundleError::Unreadable { .. } => "unreadable",
            BundleError::TooLarge { .. } => "too_large",
        }
    }
}

/// The `config.json` of container `id`, which process `pid` runs in: from its monitor's
/// bundle (see the module docs), else from a default location.
pub(crate) fn read_bundle_config(pid: u32, id: &str) -> Result<Vec<u8>, BundleError> {
    let mut candidates = Vec::new();
    if let Some(monitor) = monitor_of(pid, id) {
        let root = PathBuf::from(format!("/proc/{monitor}/root"));
        let cmdline = read_capped(&format!("/proc/{monitor}/cmdline"), super::PROC_READ_CAP)
            .unwrap_or_default();
        let argv = super::split_cmdline(&cmdline.bytes, cmdline.truncated);
        let argv: Vec<&str> = argv.iter().map(|a| a.as_ref()).collect();
        let cwd = std::fs::read_link(format!("/proc/{monitor}/cwd")).ok();
        for dir in monitor_bundles(&argv, cwd.as_deref(), id) {
            candidates.push(within(&root, &dir));
        }
    }
    let host = Path::new("/proc/1/root");
    for template in DEFAULT_BUNDLES {
        candidates.push(within(host, Path::new(&template.replace("{id}", id))));
    }
    let mut unreadable = None;
    for dir in candidates {
        let path = dir.join("config.json");
        match read_config(&path) {
            Ok(bytes) => return Ok(bytes),
            Err(err @ BundleError::TooLarge { .. }) => return Err(err),
            Err(BundleError::Unreadable { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => {
                unreadable.get_or_insert(err);
            }
        }
    }
    Err(unreadable.unwrap_or(BundleError::NotFound))
}

fn read_config(path: &Path) -> Result<Vec<u8>, BundleError> {
    let unreadable = |source| BundleError::Unreadable {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(unreadable)?;
    let mut bytes = Vec::new();
    file.take(MAX_BUNDLE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    if bytes.len() > MAX_BUNDLE_BYTES {
        return Err(BundleError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    Ok(bytes)
}

/// `path` (absolute, in another mount namespace) under that namespace's `root`.
fn within(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// The first ancestor of `pid` that is not in container `id`: the runtime's monitor (conmon,
/// the containerd shim). `None` when the walk reaches init or a process that is gone.
fn monitor_of(pid: u32, id: &str) -> Option<u32> {
    let mut current = pid;
    for _ in 0..MAX_ANCESTORS {
        let parent = crate::procfs::stat(current).ok()?.ppid;
        if parent <= 1 {
            return None;
        }
        if cgroup_of(parent)?.container_id.as_deref() != Some(id) {
            return Some(parent);
        }
        current = parent;
    }
    None
}

/// The directories a monitor with command line `argv` and working directory `cwd` may keep
/// container `id`'s bundle in, most certain first: conmon's `-b`/`--bundle` (when its
/// `-c`/`--cid` is `id` or absent), the working directory when it is `id`'s (a path component
/// is `id`), else its sibling `../id` (a containerd shim serving a pod from its sandbox's
/// bundle).
pub(crate) fn monitor_bundles(argv: &[&str], cwd: Option<&Path>, id: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let cid = option_value(argv, "-c", "--cid");
    if let Some(bundle) = option_value(argv, "-b", "--bundle") {
        if cid.is_none_or(|c| c.eq_ignore_ascii_case(id)) && bundle.starts_with('/') {
            found.push(PathBuf::from(bundle));
        }
    }
    if let Some(cwd) = cwd.filter(|c| c.is_absolute()) {
        if cwd.components().any(|c| c.as_os_str() == id) {
            found.push(cwd.to_path_buf());
        } else if let Some(parent) = cwd.parent() {
            found.push(parent.join(id));
        }
    }
    found.dedup();
    found
}

/// The value of a short or long option in `argv`, GLib-style: `-b V`, `-bV`, `--bundle V`,
/// `--bundle=V`. The first occurrence wins.
fn option_value<'a>(argv: &[&'a str], short: &str, long: &str) -> Option<&'a str> {
    let mut args = argv.iter().skip(1);
    while let Some(&arg) = args.next() {
        if arg == "--" {
            break;
        }
        if arg == short || arg == long {
            return args.next().copied();
        }
        if let Some(value) = arg.strip_prefix(long).and_then(|v| v.strip_prefix('=')) {
            return Some(value);
        }
        if !arg.starts_with("--") {
            if let Some(value) = arg.strip_prefix(short).filter(|v| !v.is_empty()) {
                return Some(value);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const UID: &str = "1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9";

    fn id(text: &str) -> Option<String> {
        parse_cgroup(text).container_id
    }

    #[test]
    fn container_ids_and_runtimes() {
        let upper = ID.to_uppercase();
        for (path, runtime) in [
            (format!("0::/system.slice/docker-{ID}.scope"), Some(Runtime::Docker)),
            (format!("0::/docker/{ID}"), Some(Runtime::Docker)),
            (format!("0::/kubepods/besteffort/pod1/cri-containerd-{ID}.scope"), Some(Runtime::Containerd)),
            (format!("12:pids:/kubepods/pod1/{ID}\n0::/"), None),
            (format!("0::/machine.slice/libpod-{ID}.scope/container"), Some(Runtime::Podman)),
            (format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1f2e_3d4c.slice/crio-{ID}.scope"), Some(Runtime::CriO)),
            (format!("0::/system.slice/containerd.service/kubepods-besteffort-pod7.slice:cri-containerd:{ID}"), Some(Runtime::Containerd)),
            (format!("0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{upper}.scope"), Some(Runtime::Podman)),
            (format!("0::/../../kubepods.slice/kubepods-pod{}.slice/cri-containerd-{ID}.scope", UID.replace('-', "_")), Some(Runtime::Containerd)),
        ] {
            let found = parse_cgroup(&path);
            assert_eq!(found.container_id.as_deref(), Some(ID), "{path}");
            assert_eq!(found.runtime, runtime, "{path}");
        }
        assert_eq!(id("0::/user.slice/session-2.scope"), None);
        assert_eq!(id("0::/"), None);
        assert_eq!(id(""), None);
        assert_eq!(id("garbage\n::\n:::"), None);
        // This machine's own memory cgroup: 32 hex digits are not a container.
        assert_eq!(
            id("4:memory:/process_api/6320f40e8721e12d4e8990ede70781cd"),
            None
        );
        // A pod UID (32 hex digits with dashes or underscores) is not a container.
        assert_eq!(
            id("0::/kubepods/burstable/pod0a1b2c3d-0a1b-0a1b-0a1b-0a1b2c3d4e5f"),
            None
        );
        // The runtime's monitor is not the container.
        assert_eq!(
            id(&format!("0::/machine.slice/libpod-conmon-{ID}.scope")),
            None
        );
    }

    #[test]
    fn nested_containers_give_the_innermost() {
        let inner = "f".repeat(64);
        assert_eq!(id(&format!("0::/docker/{ID}/docker/{inner}")), Some(inner));
    }

    #[test]
    fn pod_uids_from_both_drivers() {
        let systemd = UID.replace('-', "_");
        for path in [
            format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{systemd}.slice/cri-containerd-{ID}.scope"),
            format!("0::/kubepods.slice/kubepods-pod{systemd}.slice/crio-{ID}.scope"),
            format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{systemd}.slice/{ID}"),
            format!("11:memory:/kubepods/burstable/pod{UID}/{ID}\n0::/"),
            format!("0::/kubepods/pod{UID}/{ID}"),
            format!("0::/../../kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{systemd}.slice/cri-containerd-{ID}.scope"),
            format!("0::/kubepods/besteffort/pod{}/{ID}", UID.to_uppercase()),
        ] {
            let found = parse_cgroup(&path);
            assert_eq!(found.pod_uid.as_deref(), Some(UID), "{path}");
            assert_eq!(found.container_id.as_deref(), Some(ID), "{path}");
        }
        // A static pod's UID is its manifest's hash.
        let hash = "6cbd9a2b1a2a5e4d0cbd7ee6b9e1ef30";
        assert_eq!(
            parse_cgroup(&format!("0::/kubepods/burstable/pod{hash}/{ID}"))
                .pod_uid
                .as_deref(),
            Some(hash)
        );
        // Not under kubepods, or not a UID: no pod.
        for path in [
            format!("0::/machine.slice/libpod-{ID}.scope"),
            format!("0::/system.slice/pod{UID}/{ID}"),
            format!("0::/kubepods/burstable/podnotauid/{ID}"),
            "0::/kubepods.slice/kubepods-burstable.slice".to_string(),
        ] {
            assert_eq!(parse_cgroup(&path).pod_uid, None, "{path}");
        }
    }

    #[test]
    fn monitors_point_at_the_bundle() {
        let userdata = format!("/var/lib/containers/storage/overlay-containers/{ID}/userdata");
        // conmon, as podman and CRI-O start it.
        let conmon = [
            "/usr/bin/conmon",
            "--api-version",
            "1",
            "-c",
            ID,
            "-u",
            ID,
            "-b",
            &userdata,
            "-p",
            "/x/pidfile",
        ];
        assert_eq!(
            monitor_bundles(&conmon, Some(Path::new(&userdata)), ID),
            vec![PathBuf::from(&userdata)]
        );
        let glued = format!("--bundle={userdata}");
        assert_eq!(
            monitor_bundles(&["conmon", "--cid", ID, &glued], None, ID),
            vec![PathBuf::from(&userdata)]
        );
        // Another container's conmon: its -b is not ours.
        let other = "a".repeat(64);
        assert!(monitor_bundles(&["conmon", "-c", &other, "-b", "/b"], None, ID).is_empty());
        // A containerd shim started for this container sits in its bundle ...
        let task = "/run/k3s/containerd/io.containerd.runtime.v2.task/k8s.io";
        let shim = [
            "/usr/bin/containerd-shim-runc-v2",
            "-namespace",
            "k8s.io",
            "-id",
            ID,
            "-address",
            "/run/containerd/containerd.sock",
        ];
        let own = PathBuf::from(format!("{task}/{ID}"));
        assert_eq!(monitor_bundles(&shim, Some(&own), ID), vec![own.clone()]);
        // ... and one serving the pod from its sandbox's bundle finds the sibling.
        let sandbox = PathBuf::from(format!("{task}/{}", "b".repeat(64)));
        assert_eq!(monitor_bundles(&shim, Some(&sandbox), ID), vec![own]);
        // Nothing to go on.
        assert!(monitor_bundles(&[], None, ID).is_empty());
        assert!(monitor_bundles(&["x"], Some(Path::new("relative")), ID).is_empty());
    }

    #[test]
    fn options_glib_style() {
        let argv = ["conmon", "-bdir", "-c", "id", "--", "-b", "late"];
        assert_eq!(option_value(&argv, "-b", "--bundle"), Some("dir"));
        assert_eq!(option_value(&argv, "-c", "--cid"), Some("id"));
        assert_eq!(option_value(&["conmon", "-b"], "-b", "--bundle"), None);
        assert_eq!(
            option_value(&["conmon", "--bundlex"], "-b", "--bundle"),
            None
        );
    }

    #[test]
    fn a_process_outside_containers_has_no_bundle_to_find() {
        // This test's own process: whatever runs it, its parent is not a container monitor
        // of a container named by this id.
        assert!(matches!(
            read_bundle_config(std::process::id(), ID),
            Err(BundleError::NotFound) | Err(BundleError::Unreadable { .. })
        ));
    }
}
