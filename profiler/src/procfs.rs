//! Facts about a process from `/proc/PID/*` that explain why it can or cannot be profiled: its
//! state and kind (`stat`), its thread group (`status`), and the namespaces it lives in.
//!
//! A leaf module: it imports nothing of pyebpf, so `discovery`, `check` and the commands can all
//! use it. Every reader returns `None`/`Err` instead of guessing when `/proc` says nothing.

use std::os::unix::fs::MetadataExt;

/// `PF_KTHREAD` in `/proc/PID/stat`'s `flags` (include/linux/sched.h): a kernel thread.
const PF_KTHREAD: u64 = 0x0020_0000;
/// The inode number of the initial pid namespace (`PROC_PID_INIT_INO`, include/linux/proc_ns.h):
/// fixed by the kernel, so "am I in the host's pid namespace" needs no other process.
const INIT_PID_NS_INO: u64 = 0xEFFF_FFFC;

/// The fields of `/proc/PID/stat` that say what kind of process this is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ProcStat {
    /// `comm`, as the kernel keeps it (at most 15 bytes).
    pub comm: String,
    /// `R`, `S`, `D`, `Z` (zombie), `X` (dead), ...
    pub state: char,
    pub ppid: u32,
    pub flags: u64,
}

impl ProcStat {
    pub(crate) fn is_zombie(&self) -> bool {
        self.state == 'Z' || self.state == 'X'
    }

    pub(crate) fn is_kernel_thread(&self) -> bool {
        self.flags & PF_KTHREAD != 0
    }
}

pub(crate) fn stat(pid: u32) -> std::io::Result<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(&text).ok_or_else(|| std::io::Error::other(format!("malformed /proc/{pid}/stat")))
}

fn parse_stat(text: &str) -> Option<ProcStat> {
    // `pid (comm) state ppid pgrp session tty_nr tpgid flags ...`; comm may hold spaces and
    // parentheses, so it ends at the last `)`.
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let mut rest = text.get(close + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    let flags = rest.nth(4)?.parse().ok()?;
    Some(ProcStat {
        comm,
        state,
        ppid,
        flags,
    })
}

/// When thread `tid` of `pid` started (`starttime` of its `stat`, clock ticks since boot):
/// with the tid, it tells a thread from a later one that reuses its id.
pub(crate) fn thread_start(pid: u32, tid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    // Field 22; fields after `comm`'s closing parenthesis start at 3 (state).
    text.get(text.rfind(')')? + 1..)?
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// Whether a thread is running and how often it was switched out, from
/// `/proc/PID/task/TID/status`: a thread that is not runnable now and was not switched since
/// the last look has not run in between.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sched {
    /// `R`, `S`, `D`, `T`, ...
    pub state: char,
    /// Voluntary plus involuntary context switches.
    pub switches: u64,
}

impl Sched {
    /// On a CPU or waiting for one.
    pub(crate) fn runnable(&self) -> bool {
        self.state == 'R'
    }
}

pub(crate) fn sched(pid: u32, tid: u32) -> Option<Sched> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    parse_sched(&text)
}

fn parse_sched(status: &str) -> Option<Sched> {
    let mut state = None;
    let mut switches = [None, None];
    for line in status.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key {
            "State" => state = value.chars().next(),
            "voluntary_ctxt_switches" => switches[0] = value.parse::<u64>().ok(),
            "nonvoluntary_ctxt_switches" => switches[1] = value.parse::<u64>().ok(),
            _ => {}
        }
    }
    Some(Sched {
        state: state?,
        switches: switches[0]?.wrapping_add(switches[1]?),
    })
}

/// The thread-group id (the process id) of task `tid`: differs from `tid` for a thread that
/// is not its process's main thread.
pub(crate) fn tgid(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))?
        .trim()
        .parse()
        .ok()
}

/// A namespace's identity: the device and inode of its `/proc/PID/ns/KIND` file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Namespace {
    pub dev: u64,
    pub ino: u64,
}

/// The `kind` namespace (`pid`, `mnt`, ...) of `pid`, or of this process with `None`.
pub(crate) fn namespace(pid: Option<u32>, kind: &str) -> std::io::Result<Namespace> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/ns/{kind}"),
        None => format!("/proc/self/ns/{kind}"),
    };
    let meta = std::fs::metadata(path)?;
    Ok(Namespace {
        dev: meta.dev(),
        ino: meta.ino(),
    })
}

/// Whether `pid` lives in another `kind` namespace than this process; `None` when either
/// cannot be read.
pub(crate) fn other_namespace(pid: u32, kind: &str) -> Option<bool> {
    Some(namespace(Some(pid), kind).ok()? != namespace(None, kind).ok()?)
}

/// True when this process runs in the host's pid namespace, so `/proc` shows every process.
pub(crate) fn in_host_pid_namespace() -> bool {
    namespace(None, "pid").is_ok_and(|ns| ns.ino == INIT_PID_NS_INO)
}

/// Pids (`NSpid:` of `/proc/PID/status`, host first, innermost last) of `pid`.
pub(crate) fn nspids(pid: u32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    parse_nspids(&status)
}

/// The innermost pid of `pid`, when the process lives in a pid namespace below ours.
pub(crate) fn namespace_pid(pid: u32) -> Option<u32> {
    innermost(&nspids(pid))
}

fn innermost(nspids: &[u32]) -> Option<u32> {
    match nspids {
        [_, .., inner] => Some(*inner),
        _ => None,
    }
}

fn parse_nspids(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|ids| {
            ids.split_whitespace()
                .filter_map(|f| f.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Processes (as host pids) that are known as `pid` inside a pid namespace below ours: what a
/// user who copied a pid from inside a container meant.
pub(crate) fn namesakes(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&host| host != pid)
        .filter(|&host| {
            let ids = nspids(host);
            ids.len() > 1 && ids[1..].contains(&pid)
        })
        .collect();
    found.sort_unstable();
    found
}

/// Whether `err` means the process is gone (or never was), rather than hidden from us.
pub(crate) fn is_absent(err: &std::io::Error) -> bool {
    err.kind() == std::io::ErrorKind::NotFound || err.raw_os_error() == Some(libc::ESRCH)
}

/// A process that still runs (exists and is not a zombie). Called for every watched process
/// once a second, so one small read: the state follows the pid and the command name (at most
/// 16 bytes), so 256 bytes always reach it.
pub(crate) fn alive(pid: u32) -> bool {
    use std::io::Read;
    let mut buf = [0u8; 256];
    let Ok(n) = std::fs::File::open(format!("/proc/{pid}/stat")).and_then(|mut f| f.read(&mut buf))
    else {
        return false;
    };
    let stat = &buf[..n];
    stat.iter()
        .rposition(|&b| b == b')')
        .and_then(|at| stat[at + 1..].iter().find(|b| !b.is_ascii_whitespace()))
        .is_some_and(|&state| state != b'Z' && state != b'X')
}

/// How long `pid` has been running (from its start time in `/proc/PID/stat`).
pub(crate) fn age(pid: u32) -> Option<std::time::Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name; `starttime` is field 22 of the whole line.
    let (_, rest) = stat.rsplit_once(')')?;
    let start_ticks: f64 = rest.split_whitespace().nth(19)?.parse().ok()?;
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks <= 0 {
        return None;
    }
    let age = uptime - start_ticks / ticks as f64;
    Some(std::time::Duration::from_secs_f64(age.max(0.0)))
}

/// `pid`'s `/proc/PID/maps` when a file whose name contains `python` is mapped into it (an
/// executable or a `libpython`): the cheap test before a full inspection, whose text the
/// inspection then parses rather than reading it again. `Err` when the maps can't be read
/// (the process is gone, or may not be read).
pub(crate) fn python_maps(pid: u32) -> std::io::Result<Option<String>> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let python = maps
        .lines()
        .any(|l| l.rsplit('/').next().is_some_and(|b| b.contains("python")));
    Ok(python.then_some(maps))
}

/// The threads of process `pid`, as (id in the process's own pid namespace → host id), from
/// the `NSpid` lines of `/proc/PID/task/*/status` (CPython records the former; `/proc` and
/// labels need the latter). Empty when the task list cannot be read.
pub(crate) fn host_tids(pid: u32) -> Vec<(u32, u32)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for task in tasks.flatten() {
        let Some(host) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        if let Some(&inner) = parse_nspids(&status).last() {
            out.push((inner, host));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines() {
        let s = parse_stat("2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0").unwrap();
        assert_eq!((s.comm.as_str(), s.state, s.ppid), ("kthreadd", 'S', 0));
        assert!(s.is_kernel_thread());
        assert!(!s.is_zombie());
        let s = parse_stat("77 (a) b) (c) Z 12 77 77 0 -1 4194564 0 0").unwrap();
        assert_eq!((s.comm.as_str(), s.state, s.ppid), ("a) b) (c", 'Z', 12));
        assert!(s.is_zombie());
        assert!(!s.is_kernel_thread());
        assert_eq!(parse_stat("1 (x"), None);
        assert_eq!(parse_stat("1 (x) S"), None);
        assert_eq!(parse_stat(""), None);
    }

    #[test]
    fn sched_from_status() {
        let status = "Name:\tpython3\nState:\tS (sleeping)\nTgid:\t7\n\
                      voluntary_ctxt_switches:\t150\nnonvoluntary_ctxt_switches:\t7\n";
        assert_eq!(
            parse_sched(status),
            Some(Sched {
                state: 'S',
                switches: 157
            })
        );
        assert_eq!(parse_sched("State:\tR (running)\n"), None);
        let (me, tid) = (std::process::id(), nix::unistd::gettid().as_raw() as u32);
        let now = sched(me, tid).expect("this thread's status");
        assert!(now.runnable(), "this thread runs: {now:?}");
        let start = thread_start(me, tid).expect("this thread's start");
        assert_eq!(thread_start(me, tid), Some(start));
    }

    #[test]
    fn nspid_lines() {
        assert_eq!(parse_nspids("Name:\tx\nNSpid:\t4242\t7\n"), vec![4242, 7]);
        assert_eq!(parse_nspids("NSpid:\t9\n"), vec![9]);
        let innermost_of = |status| innermost(&parse_nspids(status));
        assert_eq!(innermost_of("Name:\tpython3\nNSpid:\t4242\n"), None);
        assert_eq!(innermost_of("NSpid:\t4242\t17\t1\nPPid:\t1\n"), Some(1));
        assert_eq!(innermost_of("Name:\tx\n"), None);
        assert!(parse_nspids("Name:\tx\n").is_empty());
    }

    #[test]
    fn this_process() {
        let me = std::process::id();
        let s = stat(me).unwrap();
        assert!(!s.is_zombie() && !s.is_kernel_thread());
        assert_eq!(tgid(me), Some(me));
        assert_eq!(other_namespace(me, "pid"), Some(false));
        assert_eq!(other_namespace(me, "mnt"), Some(false));
    }
}
