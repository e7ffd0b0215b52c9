//! `cargo xtask fuzz`: runs the libFuzzer targets in `fuzz/` (cargo-fuzz, nightly, ASan).
//!
//! Each target runs for `--seconds` (or `--runs` inputs) from its checked-in seeds
//! (`fuzz/seeds/<target>/`) plus the corpus it grew before (`target/fuzz-corpus/<target>/`, not
//! checked in). The memory-image targets also write seeds built from every known layout into
//! that corpus at start (`PYEBPF_FUZZ_SEEDS`).
//!
//! The limits are what make a finding out of "allocates what the data claims": a parser that
//! trusts a length read from a target asks for up to 2^40 bytes, and `-malloc_limit_mb` turns
//! that one call into a crash report, where without it ASan would merely fail the allocation
//! or the machine would swap. The largest honest allocation is a 16 MiB stack-chunk copy
//! (`complete.rs`). `-timeout` catches a walk that loops on a cyclic chain.
//!
//! `--seeds` regenerates the seeds taken from real interpreters (see `seeds`). Not part of
//! `cargo xtask test`: a campaign is minutes of CPU per target.

mod seeds;

use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context as _, Result};
use clap::Args;

use crate::{setup, util};

/// Largest single allocation allowed (MiB): above every parser's cap, far below 2^40.
const MALLOC_LIMIT_MB: u64 = 64;
/// Resident memory allowed (MiB): the ASan binary, its quarantine (256 MiB) and the corpus.
const RSS_LIMIT_MB: u64 = 2048;
/// Seconds one input may take.
const TIMEOUT_S: u64 = 10;

#[derive(Args)]
pub struct FuzzArgs {
    /// Seconds per target.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Stop each target after this many inputs instead (libFuzzer's `-runs`).
    #[arg(long)]
    pub runs: Option<u64>,
    /// Regenerate fuzz/seeds/ from the interpreters the tests use, then stop.
    #[arg(long)]
    pub seeds: bool,
    /// One target (default: all; `cargo fuzz list` names them).
    pub target: Option<String>,
}

/// What one target's run gave.
#[derive(Debug, Default, PartialEq)]
struct Outcome {
    execs: u64,
    cov: u64,
    ft: u64,
    seconds: f64,
    /// Crash, timeout or out-of-memory, with the saved input.
    failure: Option<String>,
}

pub fn fuzz(args: &FuzzArgs) -> Result<()> {
    if args.seeds {
        return seeds::generate(&util::workspace_root().join("fuzz/seeds"));
    }
    util::step("fuzz: nightly toolchain and cargo-fuzz");
    setup::ensure_nightly()?;
    ensure_cargo_fuzz()?;
    let root = util::workspace_root();
    let targets = match &args.target {
        Some(t) => vec![t.clone()],
        None => list_targets()?,
    };
    util::step("fuzz: building the targets");
    util::run(fuzz_cmd().arg("build"))?;
    let mut rows = Vec::new();
    for target in &targets {
        util::step(&format!("fuzz {target}"));
        let corpus = util::target_dir().join("fuzz-corpus").join(target);
        std::fs::create_dir_all(&corpus)?;
        let log = util::target_dir()
            .join("fuzz-corpus")
            .join(format!("{target}.log"));
        let mut cmd = fuzz_cmd();
        cmd.args(["run", target.as_str()])
            .arg(&corpus)
            .arg(root.join("fuzz/seeds").join(target))
            .arg("--")
            .args(libfuzzer_flags(args));
        cmd.env("PYEBPF_FUZZ_SEEDS", &corpus);
        eprintln!("+ {}", util::render(&cmd));
        let started = Instant::now();
        let out = std::fs::File::create(&log)?;
        let status = cmd
            .stdout(Stdio::null())
            .stderr(out)
            .status()
            .context("running cargo fuzz")?;
        let text = std::fs::read_to_string(&log)?;
        let mut outcome = parse_output(&text);
        if outcome.seconds == 0.0 {
            outcome.seconds = started.elapsed().as_secs_f64();
        }
        if !status.success() && outcome.failure.is_none() {
            outcome.failure = Some(format!("exit {status}; see {}", log.display()));
        }
        eprintln!(
            "{target}: {} execs, cov {}, ft {}, {:.0} s{}",
            outcome.execs,
            outcome.cov,
            outcome.ft,
            outcome.seconds,
            outcome
                .failure
                .as_deref()
                .map(|f| format!(", FAILED: {f}"))
                .unwrap_or_default()
        );
        rows.push((target.clone(), outcome));
    }
    println!("\n| target | executions | cov | ft | time (s) | result |");
    println!("| --- | ---: | ---: | ---: | ---: | --- |");
    for (target, o) in &rows {
        println!(
            "| {target} | {} | {} | {} | {:.0} | {} |",
            o.execs,
            o.cov,
            o.ft,
            o.seconds,
            o.failure
                .as_deref()
                .unwrap_or("0 crashes, 0 timeouts, 0 OOM")
        );
    }
    let failed = rows.iter().filter(|(_, o)| o.failure.is_some()).count();
    if failed > 0 {
        bail!("{failed} target(s) failed; the inputs are under fuzz/artifacts/");
    }
    Ok(())
}

/// libFuzzer's flags for one run.
fn libfuzzer_flags(args: &FuzzArgs) -> Vec<String> {
    let mut flags = vec![
        format!("-rss_limit_mb={RSS_LIMIT_MB}"),
        format!("-malloc_limit_mb={MALLOC_LIMIT_MB}"),
        format!("-timeout={TIMEOUT_S}"),
        "-print_final_stats=1".to_string(),
    ];
    match args.runs {
        Some(runs) => flags.push(format!("-runs={runs}")),
        None => flags.push(format!("-max_total_time={}", args.seconds)),
    }
    flags
}

/// `cargo +nightly fuzz` in the workspace root, with the BPF build skipped: the targets never
/// load BPF programs, and building them needs bpf-linker.
fn fuzz_cmd() -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(util::workspace_root())
        .args(["+nightly", "fuzz"])
        .env("AYA_BUILD_SKIP", "1");
    cmd
}

fn ensure_cargo_fuzz() -> Result<()> {
    let installed = Command::new("cargo")
        .args(["fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if installed {
        eprintln!("ok: cargo-fuzz");
        return Ok(());
    }
    eprintln!("installing cargo-fuzz ...");
    util::with_fix(
        util::run(Command::new("cargo").args(["install", "cargo-fuzz"])),
        "could not install cargo-fuzz",
        "check network access to crates.io, then run `cargo install cargo-fuzz`",
    )
}

fn list_targets() -> Result<Vec<String>> {
    let out = util::stdout_of(fuzz_cmd().arg("list"))?;
    Ok(out
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect())
}

/// Executions and coverage from libFuzzer's output: the last `#N ... cov: C ft: F` status line
/// (or `stat::number_of_executed_units`), and the first crash/timeout/OOM report.
fn parse_output(text: &str) -> Outcome {
    let mut o = Outcome::default();
    let field = |line: &str, name: &str| -> Option<u64> {
        let rest = line.split(name).nth(1)?;
        rest.split_whitespace().next()?.parse().ok()
    };
    for line in text.lines() {
        if let Some(status) = line.strip_prefix('#') {
            if let Some(n) = status
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
            {
                o.execs = o.execs.max(n);
            }
            o.cov = field(line, "cov: ").unwrap_or(o.cov);
            o.ft = field(line, "ft: ").unwrap_or(o.ft);
        }
        if let Some(n) = field(line, "stat::number_of_executed_units: ") {
            o.execs = o.execs.max(n);
        }
        // `Done 1000000 runs in 45 second(s)`: libFuzzer's own time, without the build.
        if let Some(s) = line
            .strip_prefix("Done ")
            .and_then(|l| field(l, " runs in "))
        {
            o.seconds = s as f64;
        }
        let failed = [
            "ERROR: libFuzzer: ",
            "ERROR: AddressSanitizer",
            "panicked at",
        ]
        .iter()
        .any(|m| line.contains(m));
        if failed && o.failure.is_none() {
            o.failure = Some(line.trim().to_string());
        }
        if let Some(path) = line.split("Test unit written to ").nth(1) {
            let first = o.failure.take().unwrap_or_default();
            o.failure = Some(format!("{first} -> {}", path.trim()));
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libfuzzer_status_and_failures() {
        let ok = "INFO: Seed: 1\n#2\tINITED cov: 10 ft: 12 corp: 1/1b\n\
                  #1048576\tpulse  cov: 311 ft: 902 corp: 80/2Kb\n\
                  #1200000\tDONE   cov: 312 ft: 910 corp: 81/2Kb\n\
                  Done 1200000 runs in 45 second(s)\n\
                  stat::number_of_executed_units: 1200000\n";
        let o = parse_output(ok);
        assert_eq!(
            (o.execs, o.cov, o.ft, o.failure),
            (1_200_000, 312, 910, None)
        );
        assert_eq!(o.seconds, 45.0);
        let oom = "#100\tNEW cov: 5 ft: 5\n==1== ERROR: libFuzzer: out-of-memory (malloc(1099511627776))\n\
                   artifact_prefix='a/'; Test unit written to a/oom-123\n";
        let o = parse_output(oom);
        assert_eq!(
            o.failure.as_deref(),
            Some("==1== ERROR: libFuzzer: out-of-memory (malloc(1099511627776)) -> a/oom-123")
        );
    }
}
