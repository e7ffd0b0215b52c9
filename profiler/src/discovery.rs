//! Which processes are CPython interpreters, and what their layout is.
//!
//! A process is an interpreter when its executable or a mapped `libpython*` carries a CPython
//! runtime (`.PyRuntime` section or `_PyRuntime` symbol). Files are opened through
//! `/proc/PID/root`, so processes in containers and chroots resolve to their own binaries.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;

use crate::elf::{ElfCache, PythonElf};
use crate::identity::{Identities, ProcessLabels};
use crate::memory::ProcessMemory;
use crate::python::layout::{PyLayout, PyVersion};
use crate::python::{debug_offsets, tables};

/// A mapping from `/proc/PID/maps` that is backed by a file.
#[derive(Clone, Debug)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub path: String,
}

/// An interpreter process ready to be registered with the kernel.
#[derive(Clone, Debug)]
pub(crate) struct PythonProcess {
    pub pid: u32,
    /// Short command line, e.g. `python3.12 app.py`.
    pub command: String,
    /// The binary holding the runtime, as the process sees it.
    pub binary: String,
    /// Address of `_PyRuntime`.
    pub runtime: u64,
    pub layout: PyLayout,
    /// The pid inside the process's own pid namespace, when that is not the host's.
    pub ns_pid: Option<u32>,
    /// Who it is: service name, container id, comm, version (see [`crate::identity`]), read
    /// once when it is found.
    pub identity: Arc<ProcessLabels>,
    /// Whether the binary's eval loop keeps frame pointers (`None`: not known), which decides
    /// how `--native` captures its stacks.
    pub frame_pointers: Option<bool>,
}

impl PythonProcess {
    /// `(1234)`, or `(1234, ns pid 7, container 0123456789ab)` for a namespaced process:
    /// the suffix of the process's label in profiles.
    pub(crate) fn id_label(&self) -> String {
        let mut label = format!("({}", self.pid);
        if let Some(ns) = self.ns_pid {
            label.push_str(&format!(", ns pid {ns}"));
        }
        if let Some(id) = &self.identity.container_id {
            label.push_str(&format!(", container {}", &id[..id.len().min(12)]));
        }
        label.push(')');
        label
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum DiscoveryError {
    #[error("no process with pid {pid}{}", absent_hint(*pid, .namesakes))]
    NoSuchProcess {
        pid: u32,
        /// Host pids of processes known as `pid` inside a pid namespace below ours (filled in
        /// for pids the user gave, see [`inspect_requested`]).
        namesakes: Vec<(u32, String)>,
    },
    #[error("{tid} is a thread of process {pid} ({command}), not a process: use `-p {pid}`")]
    Thread { tid: u32, pid: u32, command: String },
    #[error("process {pid} ({command}) has exited: it is a zombie until its parent {parent} reaps it, and has no memory left to profile")]
    Zombie {
        pid: u32,
        command: String,
        parent: u32,
    },
    #[error("process {pid} ({command}) is a kernel thread, not a CPython process: pass the pid of a Python process (`pyebpf check` lists them){}", namesake_hint(*pid, .namesakes))]
    KernelThread {
        pid: u32,
        command: String,
        namesakes: Vec<(u32, String)>,
    },
    #[error("process {pid} ({command}) exists, but pyebpf may not read its {file}: {error}: {}{}", unreadable_fix(.error, *pid, .file), namesake_hint(*pid, .namesakes))]
    Unreadable {
        pid: u32,
        command: String,
        namesakes: Vec<(u32, String)>,
        /// The `/proc/PID/` file that could not be read, e.g. `maps`.
        file: &'static str,
        /// Not a `source`: the message already says it, once.
        error: std::io::Error,
    },
    #[error("process {pid} ({command}) is not a CPython process: neither its executable nor a mapped libpython holds a Python runtime{}", namesake_hint(*pid, .namesakes))]
    NotPython {
        pid: u32,
        command: String,
        namesakes: Vec<(u32, String)>,
    },
    #[error("process {pid} runs CPython {version} ({binary}), which pyebpf does not support: supported versions are 3.11 to 3.15")]
    Unsupported {
        pid: u32,
        binary: String,
        version: String,
    },
    #[error("process {pid} ({binary}): {cause:#}")]
    Other {
        pid: u32,
        binary: String,
        cause: anyhow::Error,
    },
}

impl DiscoveryError {
    /// True when the process simply isn't (or is no longer) an interpreter: not worth a warning
    /// in a system-wide scan.
    pub(crate) fn is_benign(&self) -> bool {
        matches!(
            self,
            DiscoveryError::NoSuchProcess { .. }
                | DiscoveryError::NotPython { .. }
                | DiscoveryError::Zombie { .. }
                | DiscoveryError::KernelThread { .. }
        )
    }

    /// The process is gone (exited, or exiting): nothing to retry.
    pub(crate) fn is_gone(&self) -> bool {
        matches!(
            self,
            DiscoveryError::NoSuchProcess { .. } | DiscoveryError::Zombie { .. }
        )
    }

    fn no_such_process(pid: u32) -> DiscoveryError {
        DiscoveryError::NoSuchProcess {
            pid,
            namesakes: Vec::new(),
        }
    }
}

/// The fix after "no process with pid N": the processes a container user may have meant, or
/// that pyebpf itself sits in a container and sees only its processes.
fn absent_hint(pid: u32, namesakes: &[(u32, String)]) -> String {
    if !namesakes.is_empty() {
        return format!(" here; {}", namesakes_text(pid, namesakes));
    }
    if !crate::procfs::in_host_pid_namespace() {
        return " in pyebpf's pid namespace: pyebpf runs in a container of its own and sees only \
                its processes; run it in the host's pid namespace (e.g. `docker run --pid=host`)"
            .to_string();
    }
    format!(": check the pid with `ps -p {pid}`")
}

/// Appended to errors about an existing process when other processes are known as `pid` in a
/// container: the user may have meant one of those.
fn namesake_hint(pid: u32, namesakes: &[(u32, String)]) -> String {
    if namesakes.is_empty() {
        return String::new();
    }
    format!(
        "; if you meant a process in a container: {}",
        namesakes_text(pid, namesakes)
    )
}

/// "inside another pid namespace, pid 7 is host pid 1234 (python3 app.py): pyebpf takes host
/// pids, use `-p 1234`".
fn namesakes_text(pid: u32, namesakes: &[(u32, String)]) -> String {
    // Every container has a pid 1: name a few, count the rest.
    const LISTED: usize = 3;
    let mut listed: Vec<String> = namesakes
        .iter()
        .take(LISTED)
        .map(|(host, command)| format!("{host} ({command})"))
        .collect();
    if namesakes.len() > LISTED {
        listed.push(format!("{} more", namesakes.len() - LISTED));
    }
    let advice = match namesakes {
        [(host, _)] => format!("use `-p {host}`"),
        _ => "use one of those".to_string(),
    };
    format!(
        "inside another pid namespace, pid {pid} is host pid {}: pyebpf takes host pids, {advice}",
        listed.join(" or ")
    )
}

/// What to do when `/proc/PID/<file>` of an existing process cannot be read.
fn unreadable_fix(err: &std::io::Error, pid: u32, file: &str) -> String {
    let denied = matches!(err.raw_os_error(), Some(libc::EACCES | libc::EPERM));
    if !denied {
        return format!("check `cat /proc/{pid}/{file}`");
    }
    if crate::privileges::missing().contains(&"CAP_SYS_PTRACE") {
        return "reading another user's process needs CAP_SYS_PTRACE: run pyebpf with sudo"
            .to_string();
    }
    format!(
        "the kernel refused even though pyebpf has CAP_SYS_PTRACE, so a security module or \
         sandbox (Landlock, SELinux, AppArmor, Yama, a container) stands between pyebpf and this \
         process: run pyebpf outside that sandbox, in the host's namespaces (`cat /proc/{pid}/{file}` \
         from the same shell fails the same way)"
    )
}

pub(crate) fn read_maps(pid: u32) -> std::io::Result<Vec<Mapping>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    Ok(text.lines().filter_map(parse_maps_line).collect())
}

pub(crate) fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut fields = line.splitn(6, ' ');
    let range = fields.next()?;
    let _perms = fields.next()?;
    let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let _dev = fields.next()?;
    let _inode = fields.next()?;
    let path = fields.next()?.trim_start();
    if !path.starts_with('/') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        offset,
        path: path.strip_suffix(" (deleted)").unwrap_or(path).to_string(),
    })
}

/// `python3.12 app.py`-style short command line (basename of argv[0] plus the first argument).
pub(crate) fn short_command(pid: u32) -> String {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let mut args = cmdline
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned());
    let Some(argv0) = args.next() else {
        return std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|c| c.trim().to_string())
            .unwrap_or_else(|_| "?".into());
    };
    let mut command = argv0.rsplit('/').next().unwrap_or(&argv0).to_string();
    if let Some(arg) = args.find(|a| !a.starts_with('-')) {
        command.push(' ');
        command.push_str(arg.rsplit('/').next().unwrap_or(&arg));
    }
    command
}

pub(crate) fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// `3.12` from names like `python3.12`, `libpython3.12.so.1.0`, `libpython3.12d.so`.
fn version_from_name(path: &str) -> Option<(u8, u8)> {
    let name = basename(path);
    let rest = &name[name.find("python")? + "python".len()..];
    let (major, rest) = rest.split_once('.')?;
    let minor: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    Some((major.parse().ok()?, minor.parse().ok()?))
}

fn is_candidate(path: &str, exe: &str) -> bool {
    path == exe || basename(path).starts_with("libpython")
}

/// What inspecting many processes shares: parsed binaries, and the identities of containers.
#[derive(Default)]
pub(crate) struct Caches {
    pub elves: ElfCache,
    pub identities: Identities,
}

/// Finds the CPython runtime of `pid` and its layout.
pub(crate) fn inspect(pid: u32, caches: &Caches) -> Result<PythonProcess, DiscoveryError> {
    inspect_maps(pid, caches, None)
}

/// [`inspect`], given the text of `/proc/PID/maps` when the caller already read it.
pub(crate) fn inspect_maps(
    pid: u32,
    caches: &Caches,
    maps_text: Option<String>,
) -> Result<PythonProcess, DiscoveryError> {
    let command = short_command(pid);
    let maps = match maps_text {
        Some(text) => Ok(text.lines().filter_map(parse_maps_line).collect()),
        None => read_maps(pid),
    };
    let maps = maps.map_err(|error| {
        if crate::procfs::is_absent(&error) {
            return DiscoveryError::no_such_process(pid);
        }
        DiscoveryError::Unreadable {
            pid,
            command: command.clone(),
            namesakes: Vec::new(),
            file: "maps",
            error,
        }
    })?;
    if maps.is_empty() {
        // Zombies and kernel threads have no memory map; say which, not just "not Python".
        if let Ok(stat) = crate::procfs::stat(pid) {
            if stat.is_zombie() {
                return Err(DiscoveryError::Zombie {
                    pid,
                    command: stat.comm,
                    parent: stat.ppid,
                });
            }
            if stat.is_kernel_thread() {
                return Err(DiscoveryError::KernelThread {
                    pid,
                    command: stat.comm,
                    namesakes: Vec::new(),
                });
            }
        }
    }
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let exe = exe.strip_suffix(" (deleted)").unwrap_or(&exe).to_string();
    // libpython first: a shared build's executable has no runtime of its own.
    let mut candidates: Vec<&str> = maps
        .iter()
        .map(|m| m.path.as_str())
        .filter(|p| is_candidate(p, &exe))
        .collect();
    candidates.sort_by_key(|p| (!basename(p).starts_with("libpython"), *p));
    candidates.dedup();
    for binary in candidates {
        let on_disk = openable_path(pid, &maps, binary);
        let other = |cause: anyhow::Error| DiscoveryError::Other {
            pid,
            binary: binary.to_string(),
            cause,
        };
        let Some(elf) = caches.elves.get(&on_disk).map_err(other)? else {
            continue;
        };
        let runtime = runtime_address(&maps, binary, &elf).ok_or_else(|| {
            other(anyhow::anyhow!(
                "_PyRuntime (file offset {:#x}) is not mapped",
                elf.runtime_file_offset
            ))
        })?;
        let layout = layout_of(pid, binary, runtime, &elf)?;
        // `3.13t` names a free-threaded build, as its executable and ABI tag do.
        let version = format!(
            "{}.{}{}",
            layout.version.major,
            layout.version.minor,
            if layout.free_threaded { "t" } else { "" }
        );
        let identity = Arc::new(identity_of(&caches.identities, pid, &version, &command));
        return Ok(PythonProcess {
            pid,
            command,
            binary: binary.to_string(),
            runtime,
            layout,
            ns_pid: crate::procfs::namespace_pid(pid),
            identity,
            frame_pointers: elf.frame_pointers,
        });
    }
    Err(DiscoveryError::NotPython {
        pid,
        command,
        namesakes: Vec::new(),
    })
}

/// [`Identities::resolve`]; a process that vanished mid-inspection still gets a name (its
/// samples so far are kept) from its command line.
fn identity_of(identities: &Identities, pid: u32, version: &str, command: &str) -> ProcessLabels {
    identities
        .resolve(pid, version)
        .unwrap_or_else(|_| ProcessLabels::from_command(pid, version, command))
}

/// [`inspect`] for a pid the user named (`-p`): also refuses a thread id, and when the pid is
/// wrong names the processes known by that pid inside containers, which the user may have
/// meant.
pub(crate) fn inspect_requested(
    pid: u32,
    caches: &Caches,
) -> Result<PythonProcess, DiscoveryError> {
    if let Some(tgid) = crate::procfs::tgid(pid).filter(|&tgid| tgid != pid) {
        return Err(DiscoveryError::Thread {
            tid: pid,
            pid: tgid,
            command: short_command(tgid),
        });
    }
    inspect(pid, caches).map_err(|mut err| {
        if let DiscoveryError::NoSuchProcess { namesakes, .. }
        | DiscoveryError::NotPython { namesakes, .. }
        | DiscoveryError::KernelThread { namesakes, .. }
        | DiscoveryError::Unreadable { namesakes, .. } = &mut err
        {
            *namesakes = crate::procfs::namesakes(pid)
                .into_iter()
                .map(|host| (host, short_command(host)))
                .collect();
        }
        err
    })
}

/// A path through which this process can open a file `pid` maps. `/proc/PID/map_files`
/// names the mapped file itself, whatever namespace or chroot the path in `maps` is relative
/// to; the process's root directory is the fallback.
pub(crate) fn openable_path(pid: u32, maps: &[Mapping], path: &str) -> PathBuf {
    if let Some(m) = maps.iter().find(|m| m.path == path) {
        let direct = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end));
        if direct.exists() {
            return direct;
        }
    }
    let in_root = host_path(pid, path);
    if in_root.exists() {
        return in_root;
    }
    PathBuf::from(path)
}

/// The path of a file as `pid` sees it, reachable from here (through its root, for containers).
pub(crate) fn host_path(pid: u32, path: &str) -> PathBuf {
    Path::new(&format!("/proc/{pid}/root")).join(path.trim_start_matches('/'))
}

fn runtime_address(maps: &[Mapping], binary: &str, elf: &PythonElf) -> Option<u64> {
    maps.iter().filter(|m| m.path == binary).find_map(|m| {
        let inside = elf
            .runtime_file_offset
            .checked_sub(m.offset)
            .filter(|&at| at < m.end.saturating_sub(m.start))?;
        m.start.checked_add(inside)
    })
}

fn layout_of(
    pid: u32,
    binary: &str,
    runtime: u64,
    elf: &PythonElf,
) -> Result<PyLayout, DiscoveryError> {
    let memory = ProcessMemory::new(pid);
    let head = memory
        .read_vec(runtime, debug_offsets::READ_SIZE)
        .with_context(|| format!("reading _PyRuntime at {runtime:#x}"))
        .map_err(|cause| DiscoveryError::Other {
            pid,
            binary: binary.to_string(),
            cause,
        })?;
    if head.starts_with(debug_offsets::COOKIE) {
        #[allow(unreachable_patterns)]
        return debug_offsets::parse(&head).map_err(|e| match e {
            debug_offsets::DebugOffsetsError::UnsupportedVersion { version } => {
                DiscoveryError::Unsupported {
                    pid,
                    binary: binary.to_string(),
                    version: PyVersion::from_hex(version).to_string(),
                }
            }
            e => DiscoveryError::Other {
                pid,
                binary: binary.to_string(),
                cause: e.into(),
            },
        });
    }
    let version = match (elf.version_hex, version_from_name(binary)) {
        (Some(hex), _) => PyVersion::from_hex(hex),
        (None, Some((major, minor))) => {
            PyVersion::from_hex(((major as u64) << 24) | ((minor as u64) << 16))
        }
        (None, None) => {
            return Err(DiscoveryError::Unsupported {
                pid,
                binary: binary.to_string(),
                version: "unknown".into(),
            })
        }
    };
    tables::builtin(version).ok_or_else(|| DiscoveryError::Unsupported {
        pid,
        binary: binary.to_string(),
        version: version.to_string(),
    })
}

/// Every pid under `/proc`, except this process.
pub(crate) fn all_pids() -> Vec<u32> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&pid| pid != me)
        .collect()
}

/// Does any mapped file look like Python (`python3.12`, `libpython3.12.so`, ...)?
pub(crate) fn mentions_python(maps: &[Mapping]) -> bool {
    maps.iter().any(|m| basename(&m.path).contains("python"))
}

/// Cheap pre-filter for system-wide scans: does anything mapped look like Python?
pub(crate) fn python_maps(pid: u32) -> Option<String> {
    crate::procfs::python_maps(pid).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_names() {
        assert_eq!(version_from_name("/usr/bin/python3.11"), Some((3, 11)));
        assert_eq!(
            version_from_name("/x/lib/libpython3.12.so.1.0"),
            Some((3, 12))
        );
        assert_eq!(version_from_name("/x/lib/libpython3.13d.so"), Some((3, 13)));
        assert_eq!(version_from_name("/usr/bin/python"), None);
    }

    #[test]
    fn maps_lines() {
        let m =
            parse_maps_line("7f00-7f10 r-xp 00001000 08:01 1234    /usr/lib/libpython3.12.so.1.0")
                .unwrap();
        assert_eq!((m.start, m.end, m.offset), (0x7f00, 0x7f10, 0x1000));
        assert_eq!(m.path, "/usr/lib/libpython3.12.so.1.0");
        assert!(parse_maps_line("7f00-7f10 rw-p 00000000 00:00 0 ").is_none());
        assert!(parse_maps_line("7f00-7f10 rw-p 00000000 00:00 0    [heap]").is_none());
    }
}
