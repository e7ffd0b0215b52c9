//! `cargo xtask test`: the project's one test command.
//!
//! fmt check -> setup -> go (for `go tool pprof`) -> tmux -> chromium and speedscope (for the
//! consumer tests) -> the Python venv (the OTLP receiver's protocol classes) -> sid root ->
//! podman and the Python image (for the container tests) -> build `pyebpf` -> the free-threaded
//! CPython 3.13 (built beside the steps before) -> the pyebpf image from it ->
//! `cargo test --workspace` with `PYEBPF_BIN`, `PYEBPF_SID_ROOT`, `PYEBPF_FREETHREADED`,
//! `PYEBPF_TEST_VENV`, the images (`PYEBPF_TEST_IMAGE`, `PYEBPF_TEST_PYTHON_IMAGE`) and the
//! consumers' paths (`consumers::Consumers::env`) set for the integration tests -> the tests
//! per interpreter, which must include every interpreter provisioned here in a whole run.
use std::ffi::OsString;
use std::time::Instant;

use anyhow::{bail, Context as _, Result};
use clap::Args;

use crate::apt;
use crate::consumers;
use crate::freethreaded::{self, FreethreadedArgs};
use crate::image;
use crate::setup::{self, SetupArgs};
use crate::sidroot::{self, SidrootArgs};
use crate::util;
use crate::venv;

#[derive(Args, Debug)]
pub struct TestArgs {
    /// Don't build the sid root nor the free-threaded CPython: the 3.13-3.15 and 3.13t tests
    /// then fail unless they already exist (narrow the interpreters with
    /// PYEBPF_TEST_INTERPRETERS to leave them out on purpose).
    #[arg(long)]
    pub no_sidroot: bool,
    /// Skip the `cargo fmt --check` that normally runs first.
    #[arg(long)]
    pub no_fmt_check: bool,
    /// Extra arguments for `cargo test`; those after a second `--` go to the test binaries,
    /// e.g. `cargo xtask test -- -p tests sid_3_15 -- --nocapture`.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    pub args: Vec<OsString>,
}

pub fn test(args: &TestArgs) -> Result<()> {
    let started = Instant::now();
    let mut timings: Vec<(&str, f64)> = Vec::new();
    let mut lap = Instant::now();
    let mut done = |name, lap: &mut Instant| {
        timings.push((name, lap.elapsed().as_secs_f64()));
        *lap = Instant::now();
    };

    if !args.no_fmt_check {
        util::step("cargo fmt --check");
        let fmt = util::status(util::cargo().args(["fmt", "--all", "--", "--check"]))?;
        if !fmt.success() {
            bail!(
                "code is not formatted (diff above)\n  fix: run `cargo fmt --all` and commit the \
                 result"
            );
        }
    }
    done("fmt", &mut lap);

    // Every per-interpreter test runs on a free-threaded build too. None can be installed, so
    // it is built from source once (about 4 min of CPU) and cached; it builds beside the steps
    // below, which mostly wait on the network, and is waited for before the tests start.
    let ft_args = FreethreadedArgs::default();
    let ft_dir = freethreaded::build_dir(&ft_args);
    let ft_build = if args.no_sidroot {
        eprintln!(
            "free-threaded CPython not requested (--no-sidroot); the 3.13t tests need {} to exist",
            ft_dir.display()
        );
        None
    } else {
        Some(std::thread::spawn(move || {
            freethreaded::freethreaded(&ft_args).map(|_| ())
        }))
    };

    setup::setup(&SetupArgs::default())?;
    done("setup", &mut lap);

    // tests/tests/pprof.rs reads pyebpf's profiles with `go tool pprof`, the consumer people
    // use; Debian's Go ships it. Not fatal: without it those tests fail and say why.
    util::step("go (for `go tool pprof`)");
    if util::on_path("go") {
        eprintln!("ok: go");
    } else if let Err(err) = apt::ensure(&["golang-go"]) {
        eprintln!("could not install golang-go: {err:#}; the pprof tests will fail");
    }
    done("go", &mut lap);

    // tests/tests/top.rs drives the live view in a real terminal (tmux).
    util::step("tmux (for top's terminal tests)");
    if util::on_path("tmux") {
        eprintln!("ok: tmux");
    } else if let Err(err) = apt::ensure(&["tmux"]) {
        eprintln!("could not install tmux: {err:#}; top's terminal tests will fail");
    }
    done("tmux", &mut lap);

    // tests/tests/consumers.rs opens the flame graph and the speedscope profile where users do.
    util::step("chromium and speedscope (for the consumer tests)");
    let consumers = consumers::ensure();
    done("consumers", &mut lap);

    // tests/tests/agent.rs's OTLP receiver decodes with the upstream protocol classes
    // (opentelemetry-proto from PyPI). Not fatal: without them those tests fail and say why.
    util::step("the tests' Python venv (the OTLP receiver's protocol classes)");
    let venv = match venv::ensure() {
        Ok(venv) => Some(venv),
        Err(err) => {
            eprintln!("{err:#}; the OTLP tests will fail");
            None
        }
    };
    done("venv", &mut lap);

    let sid_args = SidrootArgs::default();
    let sid_root = sidroot::root_dir(&sid_args);
    if args.no_sidroot {
        eprintln!("sid root not requested (--no-sidroot); the 3.13-3.15 tests need it to exist");
    } else {
        // The sid root holds every interpreter read through `_Py_DebugOffsets`: without it
        // those tests would have nothing to run on, so the run stops here.
        sidroot::sidroot(&sid_args)
            .context("the sid root (CPython 3.13-3.15) could not be built; the tests need it")?;
    }
    done("sid root", &mut lap);

    // tests/tests/kubernetes.rs runs Python in podman containers (the sid root imported as an
    // image) and the pyebpf image as the DaemonSet runs it. Not fatal: those tests fail and
    // say why.
    let containers = image::ensure_podman().and_then(|()| image::ensure_python_image(&sid_root));
    if let Err(err) = &containers {
        eprintln!("{err:#}; the container tests will fail");
    }
    done("podman", &mut lap);

    util::step("build pyebpf (debug)");
    util::run(util::cargo().args(["build", "-p", "profiler"]))
        .context("building pyebpf failed (errors above)")?;
    let bin = util::target_dir().join("debug/pyebpf");
    done("build", &mut lap);

    if let Some(build) = ft_build {
        util::step("free-threaded CPython (waiting for its build)");
        build
            .join()
            .map_err(|_| anyhow::anyhow!("the free-threaded build panicked"))?
            .context("the free-threaded CPython 3.13 could not be built; the tests need it")?;
    }
    // Only the wait: the build itself overlapped the steps above.
    done("free-threaded CPython wait", &mut lap);

    // The image the DaemonSet runs, from the binary just built: `cargo xtask image` is the same
    // recipe with the release binary, which the tests need not wait for.
    if containers.is_ok() {
        if let Err(err) = image::build(&bin, image::TEST_TAG, None) {
            eprintln!("{err:#}; the image tests will fail");
        }
    }
    done("image", &mut lap);

    util::step("cargo test --workspace");
    let (cargo_args, harness_args) = split_at_dashdash(&args.args);
    let runs = util::target_dir().join("pyebpf-test-runs.tsv");
    let _ = std::fs::remove_file(&runs);
    let mut cmd = util::cargo();
    cmd.env("PYEBPF_BIN", &bin)
        .env("PYEBPF_SID_ROOT", &sid_root)
        .env("PYEBPF_FREETHREADED", &ft_dir)
        .env("PYEBPF_TEST_RUNS", &runs)
        .env("PYEBPF_TEST_IMAGE", image::TEST_TAG)
        .env("PYEBPF_TEST_PYTHON_IMAGE", image::PYTHON_IMAGE)
        .envs(consumers.env());
    if let Some(venv) = &venv {
        cmd.env("PYEBPF_TEST_VENV", venv);
    }
    cmd.args(["test", "--workspace", "--no-fail-fast"])
        .args(cargo_args)
        .arg("--");
    if !harness_args
        .iter()
        .any(|a| a.to_string_lossy().starts_with("--test-threads"))
    {
        cmd.arg("--test-threads=2");
    }
    cmd.args(harness_args);
    let mut ok = util::status(&mut cmd)?.success();
    done("cargo test", &mut lap);
    let per = runs_per_interpreter(&runs);
    eprintln!("{}", summary_line(&per));
    // A whole run must have profiled every interpreter this command provisions: one that
    // silently dropped out of every test loop would otherwise leave a green run.
    let narrowed = std::env::var_os("PYEBPF_TEST_INTERPRETERS").is_some_and(|v| !v.is_empty());
    if cargo_args.is_empty() && is_whole_run(harness_args) && !narrowed {
        for label in missing_from_summary(&per) {
            eprintln!(
                "error: no test ran a Python workload under {label}; `cargo xtask test` \
                 provisions it, so every per-interpreter test should have (see the \
                 `interpreter:` lines above)"
            );
            ok = false;
        }
    }

    let summary: Vec<String> = timings
        .iter()
        .map(|(n, s)| format!("{n} {s:.1}s"))
        .collect();
    eprintln!(
        "timings: {} (total {:.1}s)",
        summary.join(", "),
        started.elapsed().as_secs_f64()
    );
    if !ok {
        bail!("tests failed (see above)");
    }
    eprintln!("all tests passed");
    Ok(())
}

/// Interpreters `cargo xtask test` itself provides (the sid root's and the free-threaded
/// build), by their label in tests/src/lib.rs: a whole run has tests on each.
const PROVISIONED: &[&str] = &["sid 3.13", "sid 3.14", "sid 3.15", "free-threaded 3.13t"];

/// Tests per interpreter label.
type Runs = std::collections::BTreeMap<String, usize>;

/// How many tests ran a Python workload under each interpreter, from the lines the tests
/// append to `runs` (`binary\ttest\tinterpreter`); the harness hides passing tests' output.
fn runs_per_interpreter(runs: &std::path::Path) -> Runs {
    let text = std::fs::read_to_string(runs).unwrap_or_default();
    let mut per: std::collections::BTreeMap<&str, std::collections::BTreeSet<(&str, &str)>> =
        Default::default();
    for line in text.lines() {
        if let [binary, test, interpreter] = line.split('\t').collect::<Vec<_>>()[..] {
            per.entry(interpreter).or_default().insert((binary, test));
        }
    }
    per.into_iter()
        .map(|(interpreter, tests)| (interpreter.to_string(), tests.len()))
        .collect()
}

fn summary_line(per: &Runs) -> String {
    if per.is_empty() {
        return "tests that ran a Python workload: none".to_string();
    }
    let counts: Vec<String> = per
        .iter()
        .map(|(interpreter, tests)| format!("{interpreter}: {tests}"))
        .collect();
    format!(
        "tests that ran a Python workload, per interpreter: {}",
        counts.join(", ")
    )
}

/// The [`PROVISIONED`] interpreters no test ran under.
fn missing_from_summary(per: &Runs) -> Vec<&'static str> {
    PROVISIONED
        .iter()
        .copied()
        .filter(|label| per.get(*label).is_none_or(|n| *n == 0))
        .collect()
}

/// The harness arguments select every test (only options such as `--test-threads` or
/// `--nocapture`, no name filter).
fn is_whole_run(harness_args: &[OsString]) -> bool {
    harness_args
        .iter()
        .all(|a| a.to_string_lossy().starts_with("--"))
}

/// `a b -- c d` -> (`a b`, `c d`); without `--` everything is for cargo.
fn split_at_dashdash(args: &[OsString]) -> (&[OsString], &[OsString]) {
    match args.iter().position(|a| a == "--") {
        Some(i) => (&args[..i], &args[i + 1..]),
        None => (args, &[]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provisioned_interpreter_without_runs_is_missing() {
        let dir = std::env::temp_dir().join(format!("xtask-runs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let runs = dir.join("runs.tsv");
        // The same test recorded twice counts once; a malformed line is ignored.
        std::fs::write(
            &runs,
            "dump\tshows_frames\tsid 3.13\ndump\tshows_frames\tsid 3.13\n\
             dump\tshows_frames\tsid 3.14\ndeep\tdeep\tsid 3.15\nbroken line\n",
        )
        .unwrap();
        let per = runs_per_interpreter(&runs);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(per.get("sid 3.13"), Some(&1));
        assert_eq!(missing_from_summary(&per), ["free-threaded 3.13t"]);
        assert_eq!(
            summary_line(&per),
            "tests that ran a Python workload, per interpreter: sid 3.13: 1, sid 3.14: 1, \
             sid 3.15: 1"
        );
        let mut all = per.clone();
        all.insert("free-threaded 3.13t".into(), 3);
        assert!(missing_from_summary(&all).is_empty());
    }

    #[test]
    fn only_options_make_a_whole_run() {
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        assert!(is_whole_run(&args(&[])));
        assert!(is_whole_run(&args(&["--nocapture", "--test-threads=1"])));
        assert!(!is_whole_run(&args(&["deep"])));
        assert!(!is_whole_run(&args(&["--skip", "deep"])));
    }
}
