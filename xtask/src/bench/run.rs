//! One benchmark run: start the targets, attach a profiler, release the fixed work, measure.
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};

use super::proc_;

/// Who samples the targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Profiler {
    /// No profiler: the baseline.
    Alone,
    Pyebpf,
    /// py-spy, default (blocking: pauses the target for each sample).
    PySpy,
    /// py-spy --nonblocking.
    PySpyNb,
    /// CPython 3.15's `profiling.sampling attach`.
    Tachyon,
    /// pyebpf --native (auto: frame pointers where the interpreter keeps them, else stack
    /// copies).
    PyebpfNative,
    /// pyebpf --native --native-unwind stack-copy.
    PyebpfNativeCopy,
    /// py-spy --native.
    PySpyNative,
}

impl Profiler {
    pub fn label(self) -> &'static str {
        match self {
            Profiler::Alone => "alone",
            Profiler::Pyebpf => "pyebpf",
            Profiler::PySpy => "py-spy",
            Profiler::PySpyNb => "py-spy --nonblocking",
            Profiler::Tachyon => "Tachyon",
            Profiler::PyebpfNative => "pyebpf --native",
            Profiler::PyebpfNativeCopy => "pyebpf --native (stack copy)",
            Profiler::PySpyNative => "py-spy --native",
        }
    }

    /// pyebpf, with or without native frames.
    pub fn is_pyebpf(self) -> bool {
        matches!(
            self,
            Profiler::Pyebpf | Profiler::PyebpfNative | Profiler::PyebpfNativeCopy
        )
    }

    /// A `--native` row.
    pub fn is_native(self) -> bool {
        matches!(
            self,
            Profiler::PyebpfNative | Profiler::PyebpfNativeCopy | Profiler::PySpyNative
        )
    }

    /// py-spy, in any mode.
    pub fn is_py_spy(self) -> bool {
        matches!(
            self,
            Profiler::PySpy | Profiler::PySpyNb | Profiler::PySpyNative
        )
    }

    /// Samples on-CPU time (perf cpu-clock) rather than wall time per process.
    pub fn cpu_clock(self) -> bool {
        self.is_pyebpf()
    }
}

/// Target interpreter: the host's pyenv 3.12 (or 3.11), or the sid root's 3.15 under chroot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Interp {
    Host,
    Sid,
}

/// Everything the runs need to know about this machine.
pub struct Env {
    pub pyebpf: PathBuf,
    pub host_python: PathBuf,
    pub host_version: String,
    pub py_spy: Option<PathBuf>,
    /// The sid root, when its python3.15 has `profiling.sampling`.
    pub sid_root: Option<PathBuf>,
    pub workload: PathBuf,
    pub workdir: PathBuf,
    pub perf: bool,
    pub cpus: u32,
}

/// Where the workload lives inside the sid root.
pub const SID_WORKLOAD: &str = "/tmp/pyebpf-bench/workload.py";

impl Env {
    pub fn version(&self, interp: Interp) -> &str {
        match interp {
            Interp::Host => &self.host_version,
            Interp::Sid => "3.15",
        }
    }

    /// `python workload.py ARGS` for `interp`.
    pub fn workload_cmd(&self, interp: Interp, args: &[String]) -> Command {
        match (interp, &self.sid_root) {
            (Interp::Sid, Some(root)) => {
                let mut c = Command::new("chroot");
                c.arg(root).arg("python3.15").arg(SID_WORKLOAD).args(args);
                c
            }
            _ => {
                let mut c = Command::new(&self.host_python);
                c.arg(&self.workload).args(args);
                c
            }
        }
    }

    /// The sid root's python3.15 run on the host (its own loader and libraries), so that it
    /// sees the host's /proc and the target's binaries under their host paths.
    fn sid_python_on_host(&self) -> Command {
        let root = self.sid_root.as_deref().unwrap_or(Path::new("/"));
        let mut c = Command::new(root.join("lib64/ld-linux-x86-64.so.2"));
        c.arg("--library-path")
            .arg(format!(
                "{0}/lib/x86_64-linux-gnu:{0}/usr/lib/x86_64-linux-gnu",
                root.display()
            ))
            .arg(root.join("usr/bin/python3.15"))
            .env("PYTHONHOME", root.join("usr"));
        c
    }
}

/// One point of the matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Config {
    pub rate: u32,
    pub depth: u32,
    pub procs: u32,
}

/// What the workload prints at the end.
#[derive(Debug, Deserialize)]
struct WorkResult {
    wall_s: f64,
    cpu_s: f64,
    truth_a: f64,
}

/// Everything measured in one run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunResult {
    pub interp: Interp,
    pub version: String,
    pub profiler: Profiler,
    pub config: Config,
    pub round: u32,
    /// Mean fixed-work wall time over the targets.
    pub wall_s: f64,
    pub wall_sum_s: f64,
    pub cpu_sum_s: f64,
    /// Measured share of work_a in the targets' CPU (the ground truth).
    pub truth_a: f64,
    /// Samples in the profiler's output; those inside the work; in work_a; in work_b;
    /// work samples whose stack has every one of the `depth` workload frames.
    pub samples: u64,
    pub work_samples: u64,
    pub a: u64,
    pub b: u64,
    pub full: u64,
    pub expected: f64,
    /// Profiler processes' own CPU (wait4 rusage), whole run.
    pub prof_user_s: f64,
    pub prof_sys_s: f64,
    /// BPF program run time and runs, whole run (pyebpf only).
    pub bpf_ns: u64,
    pub bpf_runs: u64,
    /// The same over the work window only (from go to the last result).
    pub window_s: f64,
    pub win_cpu_s: f64,
    pub win_bpf_ns: u64,
    pub win_bpf_runs: u64,
    /// process_vm_readv (+ pread64) calls by the profiler, whole run.
    pub remote_reads: Option<u64>,
    pub pyebpf_stats: Option<serde_json::Value>,
    /// The work outlasted the profiler's duration: it stopped sampling before the end.
    #[serde(default)]
    pub capped: bool,
}

impl RunResult {
    pub fn prof_cpu_s(&self) -> f64 {
        self.prof_user_s + self.prof_sys_s + self.bpf_ns as f64 / 1e9
    }
    pub fn win_total_s(&self) -> f64 {
        self.win_cpu_s + self.win_bpf_ns as f64 / 1e9
    }
}

/// Counts from collapsed stacks (`frame;frame;... count`), in any of the three dialects.
#[derive(Debug, Default, Clone, Copy)]
pub struct Parsed {
    pub total: u64,
    pub work: u64,
    pub a: u64,
    pub b: u64,
    pub full: u64,
}

pub fn parse_collapsed(text: &str, depth: u32) -> Parsed {
    let mut p = Parsed::default();
    for line in text.lines() {
        let Some((stack, n)) = line.trim_end().rsplit_once(' ') else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else {
            continue;
        };
        p.total += n;
        let frames: Vec<&str> = stack.split(';').collect();
        let leaf = frames.iter().rev().find_map(|f| {
            if f.contains("work_a") {
                Some(true)
            } else if f.contains("work_b") {
                Some(false)
            } else {
                None
            }
        });
        if let Some(is_a) = leaf {
            p.work += n;
            if is_a {
                p.a += n;
            } else {
                p.b += n;
            }
            let py_frames = frames.iter().filter(|f| f.contains("workload.py")).count();
            if py_frames >= depth as usize {
                p.full += n;
            }
        }
    }
    p
}

/// Counts `name,value` lines of `perf stat -x,` output.
fn perf_stat_total(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut total = 0;
    let mut any = false;
    for line in text.lines() {
        let mut f = line.split(',');
        if let Some(Ok(v)) = f.next().map(|v| v.trim().parse::<u64>()) {
            total += v;
            any = true;
        }
    }
    any.then_some(total)
}

struct Target {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: BufReader<std::process::ChildStdout>,
}

/// A started profiler process.
struct Prof {
    pid: u32,
    out: PathBuf,
    perf_out: Option<PathBuf>,
}

/// Runs the workload `chunks` times on each of `cfg.procs` targets under `prof`.
pub fn run_once(
    env: &Env,
    interp: Interp,
    prof: Profiler,
    cfg: Config,
    chunks: u64,
    expect_wall_s: f64,
    round: u32,
) -> Result<RunResult> {
    let tag = format!(
        "{}-{}-r{}-d{}-p{}-{round}",
        env.version(interp),
        prof.label().replace([' ', '-'], ""),
        cfg.rate,
        cfg.depth,
        cfg.procs
    );
    let dir = env.workdir.join(&tag);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let result = run_in(env, interp, prof, cfg, chunks, expect_wall_s, round, &dir);
    if result.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!("bench: logs of the failed run kept in {}", dir.display());
    }
    result
}

#[allow(clippy::too_many_arguments)]
fn run_in(
    env: &Env,
    interp: Interp,
    prof: Profiler,
    cfg: Config,
    chunks: u64,
    expect_wall_s: f64,
    round: u32,
    dir: &Path,
) -> Result<RunResult> {
    // 1. Targets, each parked right before its timed work.
    let args = [
        "--depth".to_string(),
        cfg.depth.to_string(),
        "--chunks".to_string(),
        chunks.to_string(),
    ];
    let mut targets = Vec::new();
    for i in 0..cfg.procs {
        let mut cmd = env.workload_cmd(interp, &args);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join(format!("target{i}.err")))?);
        let mut child = proc_::spawn(&mut cmd)?;
        let stdin = child.stdin.take().context("target stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("target stdout")?);
        targets.push(Target {
            child,
            stdin,
            stdout,
        });
    }
    let mut pids = Vec::new();
    for t in &mut targets {
        let mut line = String::new();
        t.stdout.read_line(&mut line)?;
        let pid = line
            .strip_prefix("ready ")
            .and_then(|p| p.trim().parse::<u32>().ok())
            .with_context(|| format!("workload did not say `ready PID` but {line:?}"))?;
        pids.push(pid);
    }

    // 2. The profiler(s), attached before the work starts.
    // Long enough for a 3x slowdown; a profiler slower than that is stopped (SIGINT) before
    // the work ends (the run is then flagged `capped`: its slowdown is a lower bound).
    let duration = (expect_wall_s * 3.0 + 5.0).ceil() as u64;
    let profs = start_profiler(env, prof, cfg, &pids, duration, dir)?;
    wait_attached(env, prof, cfg, &profs)?;

    // 3. Release the work and measure the window.
    let cpu0: f64 = profs.iter().map(|p| proc_::tree_cpu_s(p.pid)).sum();
    let bpf0 = bpf_of(prof, &profs);
    let t0 = Instant::now();
    for t in &mut targets {
        t.stdin.write_all(b"go\n")?;
        t.stdin.flush()?;
    }
    // py-spy's --duration counts samples, not seconds: a profiler that slows the target down
    // would sample (and slow it) far longer. Stop every profiler at the wall-clock deadline.
    let stop = std::sync::Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let watchdog = {
        let stop = stop.clone();
        let pids: Vec<u32> = profs.iter().map(|p| p.pid).collect();
        let deadline = t0 + Duration::from_secs(duration);
        std::thread::spawn(move || {
            let (lock, cv) = &*stop;
            let mut done = lock.lock().unwrap_or_else(|e| e.into_inner());
            while !*done {
                let now = Instant::now();
                if now >= deadline {
                    for &pid in &pids {
                        proc_::signal_group(pid, libc::SIGINT);
                    }
                    return;
                }
                done = cv
                    .wait_timeout(done, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        })
    };
    let mut works = Vec::new();
    for (i, t) in targets.iter_mut().enumerate() {
        let mut line = String::new();
        t.stdout.read_line(&mut line)?;
        let w: WorkResult = serde_json::from_str(line.trim()).with_context(|| {
            format!(
                "target {i} printed {line:?}; see {}",
                dir.join(format!("target{i}.err")).display()
            )
        })?;
        works.push(w);
    }
    let window_s = t0.elapsed().as_secs_f64();
    let capped = prof != Profiler::Alone && window_s > duration as f64 - 0.5;
    let cpu1: f64 = profs.iter().map(|p| proc_::tree_cpu_s(p.pid)).sum();
    let bpf1 = bpf_of(prof, &profs);
    {
        let (lock, cv) = &*stop;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
    }
    let _ = watchdog.join();
    for t in targets {
        let pid = t.child.id();
        drop(t.stdin);
        proc_::wait_rusage(pid, Duration::from_secs(10))?;
    }

    // 4. Profilers exit when their targets do; collect their CPU and output.
    let mut user = 0.0;
    let mut sys = 0.0;
    for p in &profs {
        let exit = proc_::wait_rusage(p.pid, Duration::from_secs(duration + 30))?;
        if exit.code != Some(0) {
            eprintln!(
                "bench: {} exited with {:?} (log: {})",
                prof.label(),
                exit.code,
                dir.display()
            );
        }
        user += exit.user_s;
        sys += exit.system_s;
    }
    let mut parsed = Parsed::default();
    let mut reads: Option<u64> = None;
    let mut stats = None;
    for p in &profs {
        let text = std::fs::read_to_string(&p.out).unwrap_or_default();
        if text.is_empty() {
            bail!(
                "{} wrote no output to {} (logs in {})",
                prof.label(),
                p.out.display(),
                dir.display()
            );
        }
        let one = parse_collapsed(&text, cfg.depth);
        parsed.total += one.total;
        parsed.work += one.work;
        parsed.a += one.a;
        parsed.b += one.b;
        parsed.full += one.full;
        if let Some(path) = &p.perf_out {
            if let Some(n) = perf_stat_total(path) {
                reads = Some(reads.unwrap_or(0) + n);
            }
        }
    }
    let (mut bpf_ns, mut bpf_runs) = (0, 0);
    if prof.is_pyebpf() {
        let text = std::fs::read_to_string(dir.join("stats.json"))?;
        let v: serde_json::Value = serde_json::from_str(&text)?;
        bpf_ns = v["bpf_run_time_ns"].as_u64().unwrap_or(0);
        bpf_runs = v["bpf_run_count"].as_u64().unwrap_or(0);
        reads = v["remote_reads"].as_u64();
        stats = Some(v);
    }

    let wall_sum_s: f64 = works.iter().map(|w| w.wall_s).sum();
    let cpu_sum_s: f64 = works.iter().map(|w| w.cpu_s).sum();
    let truth_a = works.iter().map(|w| w.truth_a * w.cpu_s).sum::<f64>() / cpu_sum_s.max(1e-9);
    let expected = if prof == Profiler::Alone {
        0.0
    } else if prof.cpu_clock() {
        cfg.rate as f64 * cpu_sum_s
    } else {
        cfg.rate as f64 * wall_sum_s
    };
    Ok(RunResult {
        interp,
        version: env.version(interp).to_string(),
        profiler: prof,
        config: cfg,
        round,
        wall_s: wall_sum_s / works.len() as f64,
        wall_sum_s,
        cpu_sum_s,
        truth_a,
        samples: parsed.total,
        work_samples: parsed.work,
        a: parsed.a,
        b: parsed.b,
        full: parsed.full,
        expected,
        prof_user_s: user,
        prof_sys_s: sys,
        bpf_ns,
        bpf_runs,
        window_s,
        win_cpu_s: (cpu1 - cpu0).max(0.0),
        win_bpf_ns: bpf1.0.saturating_sub(bpf0.0),
        win_bpf_runs: bpf1.1.saturating_sub(bpf0.1),
        remote_reads: reads,
        pyebpf_stats: stats,
        capped,
    })
}

fn bpf_of(prof: Profiler, profs: &[Prof]) -> (u64, u64) {
    if !prof.is_pyebpf() {
        return (0, 0);
    }
    profs.iter().fold((0, 0), |(n, c), p| {
        let (n2, c2) = proc_::bpf_prog_stats(p.pid);
        (n + n2, c + c2)
    })
}

/// `perf stat` counting the remote-read syscalls of `cmd`, when perf works here.
fn counted(env: &Env, cmd: Command, perf_out: &Path) -> Command {
    if !env.perf {
        return cmd;
    }
    let mut c = Command::new("perf");
    c.args(["stat", "-x,", "-o"])
        .arg(perf_out)
        .args([
            "-e",
            "syscalls:sys_enter_process_vm_readv,syscalls:sys_enter_pread64",
            "--",
        ])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c
}

fn start_profiler(
    env: &Env,
    prof: Profiler,
    cfg: Config,
    pids: &[u32],
    duration: u64,
    dir: &Path,
) -> Result<Vec<Prof>> {
    let mut out = Vec::new();
    let log = |name: &str| std::fs::File::create(dir.join(name));
    match prof {
        Profiler::Alone => {}
        Profiler::Pyebpf | Profiler::PyebpfNative | Profiler::PyebpfNativeCopy => {
            let path = dir.join("pyebpf.txt");
            let mut cmd = Command::new(&env.pyebpf);
            cmd.arg("record");
            match prof {
                Profiler::PyebpfNative => {
                    cmd.arg("--native");
                }
                Profiler::PyebpfNativeCopy => {
                    cmd.args(["--native", "--native-unwind", "stack-copy"]);
                }
                _ => {}
            }
            for pid in pids {
                cmd.arg("-p").arg(pid.to_string());
            }
            cmd.args(["-d", &duration.to_string(), "-r", &cfg.rate.to_string()])
                .args(["-f", "collapsed", "-o"])
                .arg(&path)
                .arg("--stats-json")
                .arg(dir.join("stats.json"))
                .stdin(Stdio::null())
                .stdout(log("pyebpf.log")?)
                .stderr(log("pyebpf.err")?);
            let child = proc_::spawn(&mut cmd)?;
            out.push(Prof {
                pid: child.id(),
                out: path,
                perf_out: None,
            });
        }
        Profiler::PySpy | Profiler::PySpyNb | Profiler::PySpyNative => {
            let py_spy = env.py_spy.as_ref().context("py-spy is not installed")?;
            out = spawn_per_pid(env, pids, dir, "py-spy", |pid, path| {
                let mut base = Command::new(py_spy);
                base.args(["record", "--pid", &pid.to_string()])
                    .args(["--rate", &cfg.rate.to_string()])
                    .args(["--duration", &duration.to_string()])
                    .args(["--format", "raw", "-o"])
                    .arg(path);
                if prof == Profiler::PySpyNb {
                    base.arg("--nonblocking");
                }
                if prof == Profiler::PySpyNative {
                    base.arg("--native");
                }
                base
            })?;
        }
        Profiler::Tachyon => {
            out = spawn_per_pid(env, pids, dir, "tachyon", |pid, path| {
                let mut base = env.sid_python_on_host();
                base.args(["-m", "profiling.sampling", "attach"])
                    .args(["-r", &cfg.rate.to_string()])
                    .args(["-d", &duration.to_string()])
                    .args(["--collapsed", "-o"])
                    .arg(path)
                    .arg(pid.to_string());
                base
            })?;
        }
    }
    Ok(out)
}

/// Starts one `tool` per target (py-spy and Tachyon attach to a single process each), counted
/// under perf when asked: `command(pid, profile)` builds it; the profile, log and perf counts
/// of the i-th are `<tool><i>.*` in `dir`.
fn spawn_per_pid(
    env: &Env,
    pids: &[u32],
    dir: &Path,
    tool: &str,
    command: impl Fn(u32, &Path) -> Command,
) -> Result<Vec<Prof>> {
    let mut out = Vec::new();
    for (i, &pid) in pids.iter().enumerate() {
        let path = dir.join(format!("{tool}{i}.txt"));
        let perf_out = dir.join(format!("{tool}{i}.perf"));
        let mut cmd = counted(env, command(pid, &path), &perf_out);
        cmd.stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join(format!("{tool}{i}.log")))?)
            .stderr(std::fs::File::create(dir.join(format!("{tool}{i}.err")))?);
        let child = proc_::spawn(&mut cmd)?;
        out.push(Prof {
            pid: child.id(),
            out: path,
            perf_out: env.perf.then_some(perf_out),
        });
    }
    Ok(out)
}

/// Waits until the profiler samples: pyebpf once it holds its per-CPU perf links (plus time
/// to register the targets); py-spy and Tachyon after a start-up allowance.
fn wait_attached(env: &Env, prof: Profiler, cfg: Config, profs: &[Prof]) -> Result<()> {
    let n = cfg.procs as f64;
    let grace = match prof {
        Profiler::Alone => return Ok(()),
        Profiler::Pyebpf | Profiler::PyebpfNative | Profiler::PyebpfNativeCopy => {
            let start = Instant::now();
            let pid = profs[0].pid;
            while proc_::perf_links(pid) < env.cpus as usize {
                if start.elapsed() > Duration::from_secs(60) {
                    bail!("pyebpf did not attach its perf events within 60 s");
                }
                check_alive(prof, pid)?;
                std::thread::sleep(Duration::from_millis(20));
            }
            0.4 + 0.03 * n
        }
        Profiler::PySpy | Profiler::PySpyNb | Profiler::PySpyNative => 0.5 + 0.1 * n,
        Profiler::Tachyon => 1.2 + 0.3 * n,
    };
    std::thread::sleep(Duration::from_secs_f64(grace));
    for p in profs {
        check_alive(prof, p.pid)?;
    }
    Ok(())
}

fn check_alive(prof: Profiler, pid: u32) -> Result<()> {
    let mut status = 0;
    // SAFETY: WNOHANG probe of our own child; a reaped child is reported as exited.
    let rc = unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) };
    if rc == pid as i32 {
        proc_::kill_group(pid);
        bail!("{} exited before the work started", prof.label());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_collapsed_dialects() {
        // pyebpf, py-spy (raw) and Tachyon (tid frame first), depth 5.
        let text = "\
<module> (/b/workload.py:97);main (/b/workload.py:91);descend (/b/workload.py:65);leaf (/b/workload.py:44);work_a (/b/workload.py:25) 7
<module> (workload.py:97);main (workload.py:91);descend (workload.py:65);leaf (workload.py:46);work_b (workload.py:32) 3
tid:1;workload.py:<module>:97;workload.py:main:91;workload.py:leaf:42 5
tid:1;workload.py:descend:65;workload.py:leaf:44;workload.py:work_a:25 2
garbage line
";
        let p = parse_collapsed(text, 5);
        assert_eq!((p.total, p.work, p.a, p.b), (17, 12, 9, 3));
        // The truncated Tachyon stack (3 workload frames) is not a full one.
        assert_eq!(p.full, 10);
    }
}
