//! Process plumbing for `cargo xtask bench`: children that are always cleaned up, rusage,
//! CPU of a process tree, BPF program run time, and the `kernel.bpf_stats_enabled` sysctl.
//!
//! Every child is started in its own process group and registered here. A dedicated thread
//! waits for SIGINT/SIGTERM/SIGHUP (blocked in every other thread); on one it kills every
//! registered group, restores the sysctl and exits. [`Cleanup`] does the same on drop, so an
//! error or a panic also leaves no stray targets or profilers (and with them no perf events or
//! BPF programs: those belong to the profiler's file descriptors).
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

/// Process groups (= leader pids) of live children.
static GROUPS: Mutex<Vec<i32>> = Mutex::new(Vec::new());
/// The value `kernel.bpf_stats_enabled` had before we changed it.
static SYSCTL_BEFORE: Mutex<Option<String>> = Mutex::new(None);

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Kills every registered process group and restores the sysctl.
pub fn cleanup_all() {
    let groups: Vec<i32> = lock(&GROUPS).drain(..).collect();
    for pg in groups {
        // SAFETY: plain syscall; a group that is already gone just yields ESRCH.
        unsafe { libc::kill(-pg, libc::SIGKILL) };
    }
    restore_bpf_stats();
}

/// Restores everything when dropped (normal end, error or panic).
pub struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        cleanup_all();
    }
}

/// Blocks the termination signals in this (main) thread, which every later thread inherits,
/// and starts the thread that handles them. Call before starting any other thread.
pub fn install_signal_handler() -> Result<Cleanup> {
    // SAFETY: sigset manipulation on a local, then pthread_sigmask on the calling thread.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        anyhow::ensure!(rc == 0, "pthread_sigmask failed ({rc})");
        set
    };
    std::thread::Builder::new()
        .name("bench-signals".into())
        .spawn(move || loop {
            let mut sig = 0;
            // SAFETY: waits for one of the blocked signals in `set`.
            if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
                eprintln!(
                    "\nbench: signal {sig}: stopping targets and profilers, restoring sysctl"
                );
                cleanup_all();
                std::process::exit(130);
            }
        })
        .context("starting the signal thread")?;
    Ok(Cleanup)
}

/// Starts `cmd` in a new process group with default signal handling and registers it.
pub fn spawn(cmd: &mut Command) -> Result<Child> {
    // SAFETY: the closure only calls async-signal-safe functions.
    unsafe {
        cmd.pre_exec(|| {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
            Ok(())
        });
    }
    cmd.process_group(0);
    let mut groups = lock(&GROUPS);
    let child = cmd
        .spawn()
        .with_context(|| format!("could not start {:?}", cmd.get_program()))?;
    groups.push(child.id() as i32);
    Ok(child)
}

/// Kills the group of `pid` (SIGKILL) and forgets it.
pub fn kill_group(pid: u32) {
    // SAFETY: plain syscall.
    unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
    forget(pid);
}

/// Sends `sig` to the group of `pid`.
pub fn signal_group(pid: u32, sig: i32) {
    // SAFETY: plain syscall.
    unsafe { libc::kill(-(pid as i32), sig) };
}

fn forget(pid: u32) {
    lock(&GROUPS).retain(|&g| g != pid as i32);
}

/// How a waited-for child ended and what CPU it (and its waited-for descendants) used.
#[derive(Debug, Clone, Copy)]
pub struct Exit {
    pub code: Option<i32>,
    pub user_s: f64,
    pub system_s: f64,
}

/// Waits for `pid` with `wait4` (so its rusage is ours). After `timeout` the group gets
/// SIGINT, 3 s later SIGKILL.
pub fn wait_rusage(pid: u32, timeout: Duration) -> Result<Exit> {
    let start = Instant::now();
    let mut interrupted = false;
    let mut killed = false;
    loop {
        let mut status = 0;
        // SAFETY: zeroed rusage is a valid out-parameter.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: pid is our child; WNOHANG never blocks.
        let rc = unsafe { libc::wait4(pid as i32, &mut status, libc::WNOHANG, &mut usage) };
        if rc == pid as i32 {
            // Anything the child left in its group goes too.
            kill_group(pid);
            let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
            let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
            return Ok(Exit {
                code,
                user_s: secs(usage.ru_utime),
                system_s: secs(usage.ru_stime),
            });
        }
        if rc < 0 {
            forget(pid);
            return Err(std::io::Error::last_os_error()).context(format!("wait4({pid})"));
        }
        let waited = start.elapsed();
        if !interrupted && waited > timeout {
            eprintln!("bench: pid {pid} still running after {timeout:?}: SIGINT");
            signal_group(pid, libc::SIGINT);
            interrupted = true;
        } else if !killed && waited > timeout + Duration::from_secs(3) {
            eprintln!("bench: pid {pid} ignored SIGINT: SIGKILL");
            signal_group(pid, libc::SIGKILL);
            killed = true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Clock ticks per second for `/proc/PID/stat` times.
fn ticks() -> f64 {
    // SAFETY: plain sysconf.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// CPU time of `pid` and all its descendants, in seconds: live threads from their
/// `schedstat` (nanoseconds), exited threads and reaped children from `stat` (ticks).
pub fn tree_cpu_s(pid: u32) -> f64 {
    let mut total = 0.0;
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        let mut live_ns = 0u64;
        let mut live = 0;
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) {
            for task in tasks.flatten() {
                if let Ok(ss) = std::fs::read_to_string(task.path().join("schedstat")) {
                    if let Some(Ok(ns)) = ss.split_whitespace().next().map(str::parse::<u64>) {
                        live_ns += ns;
                        live += 1;
                    }
                }
                if let Ok(children) = std::fs::read_to_string(task.path().join("children")) {
                    todo.extend(
                        children
                            .split_whitespace()
                            .filter_map(|c| c.parse::<u32>().ok()),
                    );
                }
            }
        }
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) {
            // Fields after `(comm)`: state is field 3 (index 0); utime 14, stime 15,
            // cutime 16, cstime 17.
            if let Some((_, rest)) = stat.rsplit_once(')') {
                let f: Vec<&str> = rest.split_whitespace().collect();
                let get = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
                let own = (get(11) + get(12)) / ticks();
                // A zombie has no live threads left: its own times are only in `stat`.
                total += if live > 0 { live_ns as f64 / 1e9 } else { own };
                total += (get(13) + get(14)) / ticks();
            }
        }
    }
    total
}

/// Sum of `run_time_ns` and `run_cnt` over the BPF programs `pid` holds open.
pub fn bpf_prog_stats(pid: u32) -> (u64, u64) {
    let (mut ns, mut cnt) = (0, 0);
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return (0, 0);
    };
    for fd in fds.flatten() {
        let Ok(info) = std::fs::read_to_string(fd.path()) else {
            continue;
        };
        if !info.contains("prog_type:") {
            continue;
        }
        for line in info.lines() {
            let mut kv = line.split(':');
            let (Some(k), Some(v)) = (kv.next(), kv.next()) else {
                continue;
            };
            let v = v.trim().parse::<u64>().unwrap_or(0);
            match k {
                "run_time_ns" => ns += v,
                "run_cnt" => cnt += v,
                _ => {}
            }
        }
    }
    (ns, cnt)
}

/// The most perf-event BPF links `pid` holds for one program: pyebpf holds one per CPU for
/// its sampler once attached (its tracepoints hold one each).
pub fn perf_links(pid: u32) -> usize {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return 0;
    };
    let mut per_prog: std::collections::HashMap<String, usize> = Default::default();
    for fd in fds.flatten() {
        let Ok(info) = std::fs::read_to_string(fd.path()) else {
            continue;
        };
        if !info
            .lines()
            .any(|l| l.starts_with("link_type:") && l.ends_with("perf"))
        {
            continue;
        }
        if let Some(id) = info.lines().find(|l| l.starts_with("prog_id:")) {
            *per_prog.entry(id.to_string()).or_default() += 1;
        }
    }
    per_prog.values().copied().max().unwrap_or(0)
}

/// Turns `kernel.bpf_stats_enabled` on (remembering the old value for [`restore_bpf_stats`]).
pub fn enable_bpf_stats() -> Result<()> {
    let before = std::fs::read_to_string(BPF_STATS)
        .with_context(|| format!("reading {BPF_STATS}"))?
        .trim()
        .to_string();
    {
        let mut saved = lock(&SYSCTL_BEFORE);
        if saved.is_none() {
            *saved = Some(before.clone());
        }
    }
    if before != "1" {
        eprintln!("$ sysctl kernel.bpf_stats_enabled=1   (was {before}; restored at the end)");
        std::fs::write(BPF_STATS, "1").with_context(|| format!("writing {BPF_STATS}"))?;
    }
    Ok(())
}

/// Puts `kernel.bpf_stats_enabled` back to what it was.
pub fn restore_bpf_stats() {
    if let Some(before) = lock(&SYSCTL_BEFORE).take() {
        if before != "1" {
            eprintln!("$ sysctl kernel.bpf_stats_enabled={before}");
            let _ = std::fs::write(BPF_STATS, &before);
        }
    }
}

/// Online CPUs.
pub fn cpus() -> u32 {
    std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1)
}
