//! `cargo xtask bench`: overhead and accuracy of pyebpf, side by side with py-spy and Tachyon.
//!
//! A fixed-work CPU-bound workload (`bench/workload.py`, 70/30 split between two functions at
//! a chosen stack depth) runs alone and under each profiler, in interleaved rounds, for every
//! combination of sampling rate, stack depth and number of target processes. Measured: the
//! targets' slowdown, the profilers' CPU per sample (their rusage plus, for pyebpf, the BPF
//! program's run time from `kernel.bpf_stats_enabled`), samples delivered vs expected,
//! accuracy against the measured CPU split, and remote reads per sample. Results go to
//! `target/bench/results.json`, the tables and chart to `BENCHMARKS.md` and `bench/chart.png`.
//!
//! Modules: `proc_` (children, cleanup, rusage, BPF stats), `run` (one run),
//! `report` (tables and chart).
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context as _, Result};
use clap::Args;

pub mod dump;
mod proc_;
mod report;
mod run;

use crate::run::build_release;
use crate::sidroot::{self, SidrootArgs};
use crate::util;
use run::{Config, Env, Interp, Profiler, RunResult};

const PY_SPY: &str = "py-spy==0.4.3";

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// A short smoke run (~3 min here): 1 round, ~1 s of work per run (numbers are noisier).
    #[arg(long)]
    pub quick: bool,
    /// Rounds per configuration (medians are taken over them) [default: 3, --quick: 1]
    #[arg(long)]
    pub runs: Option<u32>,
    /// Seconds of fixed work per run, calibrated on the interpreter [default: 2, --quick: 1]
    #[arg(long)]
    pub work_secs: Option<f64>,
    /// Sampling rates in Hz.
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    pub rates: Vec<u32>,
    /// Python stack depths at the sampled functions.
    #[arg(long, value_delimiter = ',', default_value = "5,200")]
    pub depths: Vec<u32>,
    /// Numbers of target processes.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    pub procs: Vec<u32>,
    /// Profilers to run besides the baseline. The `--native` rows (`pyebpf-native`,
    /// `pyebpf-native-copy`, `py-spy-native`) are a separate run: with any of them, the report
    /// fills BENCHMARKS.md's native section instead of the main one, e.g.
    /// `cargo xtask bench --profilers pyebpf,pyebpf-native,pyebpf-native-copy,py-spy-native
    /// --depths 5,200 --procs 1`.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "pyebpf,py-spy,py-spy-nb,tachyon"
    )]
    pub profilers: Vec<Profiler>,
    /// Host interpreter for the pyebpf-vs-py-spy runs [default: newest pyenv 3.12, else 3.11]
    #[arg(long, value_name = "PYTHON")]
    pub python: Option<PathBuf>,
    /// Do not rewrite BENCHMARKS.md and bench/chart.png.
    #[arg(long)]
    pub no_report: bool,
    /// Only rebuild BENCHMARKS.md and the chart from target/bench/results.json.
    #[arg(long)]
    pub report_only: bool,
}

pub fn bench(args: &BenchArgs) -> Result<()> {
    let results_path = util::target_dir().join("bench/results.json");
    if args.report_only {
        let text = std::fs::read_to_string(&results_path)
            .with_context(|| format!("reading {}", results_path.display()))?;
        let run: report::Recorded = serde_json::from_str(&text)?;
        return report::write(&run, &util::workspace_root());
    }
    // Signals are handled by our own thread from here on; the guard cleans up on return.
    let _cleanup = proc_::install_signal_handler()?;
    let started = Instant::now();
    let runs = args.runs.unwrap_or(if args.quick { 1 } else { 3 }).max(1);
    let work_secs = args.work_secs.unwrap_or(if args.quick { 1.0 } else { 2.0 });

    let env = prepare(args)?;
    let mut notes = Vec::new();
    if env.py_spy.is_none() && wants(args, Profiler::PySpy) {
        notes.push("py-spy could not be installed: its rows are missing".to_string());
    }
    if env.sid_root.is_none() {
        notes.push(
            "no sid root with python3.15 (`cargo xtask sidroot`): the 3.15 / Tachyon rows are \
             skipped"
                .to_string(),
        );
    }
    if !env.perf {
        notes.push("perf is not available: py-spy/Tachyon remote reads not counted".to_string());
    }

    util::step("calibrate the workload");
    let mut chunks_per_s = Vec::new();
    let interps: Vec<Interp> = [Interp::Host, Interp::Sid]
        .into_iter()
        .filter(|i| *i == Interp::Host || env.sid_root.is_some())
        .collect();
    for &interp in &interps {
        let cps = calibrate(&env, interp)?;
        eprintln!("python {}: {cps:.0} chunks/s", env.version(interp));
        chunks_per_s.push((interp, cps));
    }

    proc_::enable_bpf_stats()?;
    let mut combos: Vec<(Interp, Profiler)> = Vec::new();
    for &interp in &interps {
        combos.push((interp, Profiler::Alone));
        for &p in &args.profilers {
            let ok = match p {
                Profiler::Alone => false,
                Profiler::Pyebpf | Profiler::PyebpfNative | Profiler::PyebpfNativeCopy => true,
                Profiler::PySpy | Profiler::PySpyNb | Profiler::PySpyNative => {
                    interp == Interp::Host && env.py_spy.is_some()
                }
                Profiler::Tachyon => interp == Interp::Sid,
            };
            if ok && !combos.contains(&(interp, p)) {
                combos.push((interp, p));
            }
        }
    }
    let configs: Vec<Config> = args
        .procs
        .iter()
        .flat_map(|&procs| {
            args.depths.iter().flat_map(move |&depth| {
                args.rates
                    .iter()
                    .map(move |&rate| Config { rate, depth, procs })
            })
        })
        .collect();
    let total = configs.len() * combos.len() * runs as usize;
    util::step(&format!(
        "{total} runs: {} configurations x {} profiler/interpreter pairs x {runs} rounds, \
         ~{work_secs} s of work each",
        configs.len(),
        combos.len()
    ));

    let mut recorded = report::Recorded {
        command: command_line(),
        commit: commit(),
        machine: machine(&env),
        notes,
        runs,
        work_secs,
        results: Vec::new(),
    };
    let mut done = 0;
    for cfg in &configs {
        for round in 0..runs {
            for &(interp, prof) in &combos {
                let cps = chunks_per_s
                    .iter()
                    .find(|(i, _)| *i == interp)
                    .map(|(_, c)| *c)
                    .unwrap_or(100.0);
                // The same total CPU work whatever the number of processes.
                let busy = cfg.procs.min(env.cpus) as f64;
                let chunks = ((work_secs * cps * busy / cfg.procs as f64).round() as u64).max(5);
                // Each target gets its share of `busy` CPUs: the wall time stays ~work_secs.
                let expect_wall = work_secs;
                done += 1;
                eprint!(
                    "[{done}/{total} {:.0}s] python {} {:<20} {:>4} Hz depth {:>3} x{:<2} round {} ... ",
                    started.elapsed().as_secs_f64(),
                    env.version(interp),
                    prof.label(),
                    cfg.rate,
                    cfg.depth,
                    cfg.procs,
                    round + 1
                );
                match run::run_once(&env, interp, prof, *cfg, chunks, expect_wall, round) {
                    Ok(r) => {
                        eprintln!("{}", summary(&r));
                        recorded.results.push(r);
                    }
                    Err(e) => {
                        eprintln!("FAILED: {e:#}");
                        recorded.notes.push(format!(
                            "a run failed: {} ({:?}): {e:#}",
                            prof.label(),
                            cfg
                        ));
                    }
                }
                save(&results_path, &recorded)?;
            }
        }
    }
    proc_::restore_bpf_stats();
    eprintln!(
        "bench: {} runs in {:.0} s; results in {}",
        recorded.results.len(),
        started.elapsed().as_secs_f64(),
        results_path.display()
    );
    if !args.no_report {
        report::write(&recorded, &util::workspace_root())?;
    }
    Ok(())
}

fn wants(args: &BenchArgs, p: Profiler) -> bool {
    args.profilers
        .iter()
        .any(|&q| q == p || (p == Profiler::PySpy && q.is_py_spy()))
}

fn summary(r: &RunResult) -> String {
    let mut s = format!("wall {:.2}s", r.wall_s);
    if r.profiler != Profiler::Alone {
        s += &format!(
            ", {} samples ({:.0}% of expected), {:.1} us CPU/sample (window {:.1}), work_a {:.1}% (truth {:.1}%)",
            r.samples,
            100.0 * r.work_samples as f64 / r.expected.max(1.0),
            r.prof_cpu_s() * 1e6 / r.samples.max(1) as f64,
            r.win_total_s() * 1e6 / r.work_samples.max(1) as f64,
            100.0 * r.a as f64 / (r.a + r.b).max(1) as f64,
            100.0 * r.truth_a
        );
    }
    s
}

fn save(path: &Path, recorded: &report::Recorded) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, serde_json::to_string_pretty(recorded)?)
        .with_context(|| format!("writing {}", path.display()))
}

fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("cargo xtask {}", args.join(" "))
}

/// HEAD of the workspace, `-dirty` when the profiler's sources have local changes.
fn commit() -> String {
    let root = util::workspace_root();
    let head = util::probe_stdout(Command::new("git").current_dir(&root).args([
        "rev-parse",
        "--short",
        "HEAD",
    ]))
    .unwrap_or_default();
    let dirty = util::probe_stdout(Command::new("git").current_dir(&root).args([
        "status",
        "--porcelain",
        "--",
        "profiler",
        "profiler-ebpf",
        "profiler-common",
    ]))
    .is_some_and(|s| !s.is_empty());
    format!("{head}{}", if dirty { "-dirty" } else { "" })
}

fn machine(env: &Env) -> String {
    let kernel = util::probe_stdout(Command::new("uname").arg("-r")).unwrap_or_default();
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines().next().and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|kb| kb.parse::<f64>().ok())
            })
        })
        .map(|kb| format!("{:.0} GiB", kb / 1024.0 / 1024.0))
        .unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    format!(
        "{} CPUs ({model}), {mem} RAM, Linux {kernel}; load average at start {load}; \
         host python {} ({})",
        env.cpus,
        env.host_version,
        env.host_python.display()
    )
}

/// Builds pyebpf, finds the interpreters, installs py-spy, stages the workload.
fn prepare(args: &BenchArgs) -> Result<Env> {
    let root = util::workspace_root();
    let pyebpf = build_release()?;
    let workload = root.join("bench/workload.py");
    anyhow::ensure!(workload.is_file(), "{} is missing", workload.display());
    let host_python = match &args.python {
        Some(p) => p.clone(),
        None => find_host_python().context(
            "no CPython 3.11/3.12 found (pyenv 3.12.x / 3.11.x or /usr/bin/python3.11); pass --python",
        )?,
    };
    let host_version = util::probe_stdout(
        Command::new(&host_python)
            .args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"]),
    )
    .with_context(|| format!("{} does not run", host_python.display()))?;
    let workdir = util::target_dir().join("bench/runs");
    std::fs::create_dir_all(&workdir)?;

    let py_spy = if wants(args, Profiler::PySpy) {
        match install_py_spy(&host_python) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("bench: py-spy unavailable, its rows are skipped: {e:#}");
                None
            }
        }
    } else {
        None
    };

    let sid = sidroot::root_dir(&SidrootArgs::default());
    let sid_root = if util::probe(Command::new("chroot").arg(&sid).args([
        "python3.15",
        "-c",
        "import profiling.sampling",
    ]))
    .is_some_and(|o| o.status.success())
    {
        let dest = sid.join(run::SID_WORKLOAD.trim_start_matches('/'));
        std::fs::create_dir_all(dest.parent().context("workload dir")?)?;
        std::fs::copy(&workload, &dest)
            .with_context(|| format!("copying the workload to {}", dest.display()))?;
        Some(sid)
    } else {
        eprintln!(
            "bench: no python3.15 with profiling.sampling in {}: 3.15 and Tachyon skipped \
             (create it with `cargo xtask sidroot`)",
            sid.display()
        );
        None
    };
    let perf = util::probe(Command::new("perf").args([
        "stat",
        "-e",
        "syscalls:sys_enter_process_vm_readv",
        "--",
        "true",
    ]))
    .is_some_and(|o| o.status.success());
    Ok(Env {
        pyebpf,
        host_python,
        host_version,
        py_spy,
        sid_root,
        workload,
        workdir,
        perf,
        cpus: proc_::cpus(),
    })
}

pub(crate) fn find_host_python() -> Option<PathBuf> {
    let pyenv = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pyenv")))
        .unwrap_or_else(|| PathBuf::from("/root/.pyenv"));
    for minor in ["3.12", "3.11"] {
        let mut found: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir(pyenv.join("versions"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let rest = name.strip_prefix(&format!("{minor}."))?;
                let patch = rest.parse::<u32>().ok()?;
                let bin = e.path().join(format!("bin/python{minor}"));
                bin.is_file().then_some((vec![patch], bin))
            })
            .collect();
        found.sort();
        if let Some((_, bin)) = found.pop() {
            return Some(bin);
        }
    }
    let debian = PathBuf::from("/usr/bin/python3.11");
    debian.is_file().then_some(debian)
}

/// py-spy from PyPI in a private venv under target/bench.
pub(crate) fn install_py_spy(python: &Path) -> Result<PathBuf> {
    let venv = util::target_dir().join("bench/venv");
    let bin = venv.join("bin/py-spy");
    if util::probe_stdout(Command::new(&bin).arg("--version")).is_some_and(|v| v.contains("0.4.3"))
    {
        return Ok(bin);
    }
    util::step(&format!("install {PY_SPY} into {}", venv.display()));
    util::run(Command::new(python).args(["-m", "venv"]).arg(&venv))?;
    util::run(
        Command::new(venv.join("bin/python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .arg(PY_SPY),
    )?;
    Ok(bin)
}

fn calibrate(env: &Env, interp: Interp) -> Result<f64> {
    let mut cmd = env.workload_cmd(interp, &["--calibrate".into(), "1.0".into()]);
    let out = cmd.output().context("running the workload")?;
    anyhow::ensure!(
        out.status.success(),
        "calibration failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    v["chunks_per_s"]
        .as_f64()
        .context("calibration printed no chunks_per_s")
}
