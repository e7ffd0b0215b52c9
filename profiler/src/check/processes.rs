//! Every Python process in sight, inspected the way `record` would: the ones pyebpf can
//! profile (version, binary, layout source, namespaces), the ones it cannot and why, and the
//! processes it may not even look at.

use serde::Serialize;

use crate::discovery::{self, DiscoveryError};
use crate::procfs;
use crate::python::layout::LayoutSource;

#[derive(Debug, Default, Serialize)]
pub(crate) struct Processes {
    /// Interpreters pyebpf can profile.
    pub supported: Vec<Supported>,
    /// Python processes pyebpf cannot profile, with the reason.
    pub unsupported: Vec<Unsupported>,
    /// Processes whose memory map pyebpf may not read: whether they run Python is unknown.
    pub unreadable: Vec<Unreadable>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Supported {
    pub pid: u32,
    pub command: String,
    /// `3.11.2`.
    pub version: String,
    /// A free-threaded (`Py_GIL_DISABLED`) build.
    pub free_threaded: bool,
    /// The file holding the runtime: the executable of a static build, `libpython3.X.so` of a
    /// shared one; as `/proc/PID/maps` names it to pyebpf (under a chroot, with the chroot's
    /// path in front).
    pub binary: String,
    /// Address of `_PyRuntime` in the process, `0x…`.
    pub runtime: String,
    pub layout_source: LayoutSource,
    /// In a pid namespace other than pyebpf's (a container); `ns_pid` is its pid there.
    pub other_pid_namespace: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ns_pid: Option<u32>,
    /// In a mount namespace other than pyebpf's: `binary` is a path inside it.
    pub other_mount_namespace: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Unsupported {
    pub pid: u32,
    pub command: String,
    /// The CPython version and runtime binary, when they were found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binary: Option<String>,
    pub reason: String,
}

#[derive(Debug, Serialize)]
pub(crate) struct Unreadable {
    pub pid: u32,
    pub command: String,
    pub error: String,
}

/// Inspects every process on the host (except pyebpf).
pub(super) fn scan() -> Processes {
    let caches = discovery::Caches::default();
    let mut found = Processes::default();
    let mut pids = discovery::all_pids();
    pids.sort_unstable();
    for pid in pids {
        let maps = match discovery::read_maps(pid) {
            Ok(maps) => maps,
            Err(e) if procfs::is_absent(&e) => continue,
            Err(e) => {
                found.unreadable.push(Unreadable {
                    pid,
                    command: discovery::short_command(pid),
                    error: e.to_string(),
                });
                continue;
            }
        };
        if !discovery::mentions_python(&maps) {
            continue;
        }
        match discovery::inspect(pid, &caches) {
            Ok(proc) => found.supported.push(Supported {
                pid,
                command: proc.command,
                version: proc.layout.version.to_string(),
                free_threaded: proc.layout.free_threaded,
                binary: proc.binary,
                runtime: format!("{:#x}", proc.runtime),
                layout_source: proc.layout.source,
                other_pid_namespace: procfs::other_namespace(pid, "pid").unwrap_or(false),
                ns_pid: proc.ns_pid,
                other_mount_namespace: procfs::other_namespace(pid, "mnt").unwrap_or(false),
                container: proc.identity.container_id.clone(),
            }),
            Err(e) if e.is_gone() => {}
            Err(e) => found.unsupported.push(unsupported(pid, e)),
        }
    }
    found
}

fn unsupported(pid: u32, err: DiscoveryError) -> Unsupported {
    let (version, binary) = match &err {
        DiscoveryError::Unsupported {
            version, binary, ..
        } => (Some(version.clone()), Some(binary.clone())),
        DiscoveryError::Other { binary, .. } => (None, Some(binary.clone())),
        _ => (None, None),
    };
    let reason = match &err {
        // It maps a file named like Python, yet holds no runtime pyebpf knows.
        DiscoveryError::NotPython { .. } => {
            format!("{err} (CPython before 3.7 has no _PyRuntime to find)")
        }
        _ => err.to_string(),
    };
    Unsupported {
        pid,
        command: discovery::short_command(pid),
        version,
        binary,
        reason,
    }
}

impl Processes {
    pub(super) fn text(&self) -> String {
        let mut out = format!(
            "Python processes ({} pyebpf can profile)\n",
            self.supported.len()
        );
        if self.supported.is_empty() && self.unsupported.is_empty() {
            out.push_str(if self.unreadable.is_empty() {
                "  · none running\n"
            } else {
                "  · none among the processes pyebpf may read\n"
            });
        }
        for p in &self.supported {
            let mut places = Vec::new();
            if p.other_pid_namespace {
                places.push(match p.ns_pid {
                    Some(ns) => format!("other pid namespace (pid {ns} there)"),
                    None => "other pid namespace".to_string(),
                });
            }
            if p.other_mount_namespace {
                places.push("other mount namespace".to_string());
            }
            if let Some(id) = &p.container {
                places.push(format!("container {}", &id[..id.len().min(12)]));
            }
            let places = if places.is_empty() {
                String::new()
            } else {
                format!("; {}", places.join(", "))
            };
            let build = if p.free_threaded {
                " free-threaded (no GIL)"
            } else {
                ""
            };
            out.push_str(&format!(
                "  ✔ {} {}: CPython {}{build} from {}, layout: {}{places}\n",
                p.pid, p.command, p.version, p.binary, p.layout_source
            ));
        }
        for p in &self.unsupported {
            out.push_str(&format!("  · not profilable: {}\n", p.reason));
        }
        if !self.unreadable.is_empty() {
            // Without privileges that is most of the host: name a few, `--json` has them all.
            const LISTED: usize = 5;
            let count = self.unreadable.len();
            let mut listed: Vec<String> = self
                .unreadable
                .iter()
                .take(LISTED)
                .map(|p| format!("{} {} ({})", p.pid, p.command, p.error))
                .collect();
            if count > LISTED {
                listed.push(format!("{} more (--json lists them)", count - LISTED));
            }
            out.push_str(&format!(
                "  · may not read {count} process{} (Python or not, they cannot be profiled): {}\n",
                if count == 1 { "" } else { "es" },
                listed.join(", ")
            ));
        }
        out
    }
}
