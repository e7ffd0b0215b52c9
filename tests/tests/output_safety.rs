//! A recording is never lost because of its output: an unwritable `-o` fails before sampling,
//! a write that fails at the end falls back to the temporary directory, and SIGTERM/SIGHUP
//! end a recording with its profile written, like Ctrl-C.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tests::{interpreters_logged, one_line_error, parse_collapsed, temp_path, Running, Workload};

/// pyebpf logs this (at -v) once a target is registered with the sampler: recording has begun.
const RECORDING: &str = "profiling pid";
/// Generous: the debug build loads the BPF programs slowly on a loaded 2-CPU machine.
const START_TIMEOUT: Duration = Duration::from_secs(60);

fn first_interpreter() -> tests::Interpreter {
    interpreters_logged()
        .into_iter()
        .next()
        .expect("an interpreter")
}

/// Runs `pyebpf ARGS` to completion; (exit code, stderr, seconds taken).
fn run(args: &[&str]) -> (Option<i32>, String, f64) {
    let started = Instant::now();
    let out = std::process::Command::new(tests::pyebpf_bin())
        .args(args)
        .output()
        .expect("running pyebpf");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        started.elapsed().as_secs_f64(),
    )
}

#[test]
fn unwritable_output_fails_before_sampling() {
    let missing = temp_path("missing-dir", "d").join("x.svg");
    let missing = missing.to_str().unwrap();
    let (code, stderr, secs) = run(&["record", "-d", "30", "-o", missing]);
    eprintln!("{secs:.3}s: {stderr}");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(secs < 5.0, "took {secs:.1}s: it recorded before checking");
    let line = one_line_error(&stderr);
    assert!(
        line.contains(missing) && line.contains("mkdir -p"),
        "{line}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    // A directory given as the file.
    let dir = std::env::temp_dir();
    let (code, stderr, secs) = run(&["record", "-d", "30", "-o", dir.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(secs < 5.0, "took {secs:.1}s");
    let line = one_line_error(&stderr);
    assert!(line.contains("Is a directory"), "{line}");

    // The stats file is checked the same way.
    let (code, stderr, secs) = run(&["record", "-d", "30", "--stats-json", missing]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(secs < 5.0, "took {secs:.1}s");
    assert!(
        one_line_error(&stderr).contains("cannot write the stats"),
        "{stderr}"
    );
}

/// `pyebpf record -v -p PID -d SECONDS -f collapsed -o OUT EXTRA` in the background, once it
/// has begun recording.
fn recording(pid: &str, seconds: &str, out: &Path, extra: &[&str]) -> Running {
    let mut args = vec![
        "record",
        "-v",
        "-p",
        pid,
        "-d",
        seconds,
        "-f",
        "collapsed",
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend(extra);
    let mut pyebpf = Running::start(&args);
    pyebpf.wait_for(RECORDING, START_TIMEOUT);
    pyebpf
}

/// The path a `saved to PATH instead` line names.
fn fallback_named(stderr: &str, extension: &str) -> PathBuf {
    stderr
        .lines()
        .filter(|l| l.starts_with("pyebpf: error:"))
        .find_map(|l| {
            let path = l.split(" was saved to ").nth(1)?.strip_suffix(" instead")?;
            path.ends_with(extension).then(|| PathBuf::from(path))
        })
        .unwrap_or_else(|| panic!("no fallback .{extension} named in: {stderr}"))
}

#[test]
fn output_directory_removed_while_recording_falls_back_to_temp() {
    let interp = first_interpreter();
    let workload = Workload::start(&interp, "chain.py", &[]);
    let pid = workload.pid().to_string();
    let dir = temp_path("vanishing", "d");
    std::fs::create_dir(&dir).unwrap();
    let out = dir.join("out.txt");
    let stats = dir.join("stats.json");
    let pyebpf = recording(&pid, "4", &out, &["--stats-json", stats.to_str().unwrap()]);
    // Both paths were checked (and left uncreated); now the directory goes away.
    std::fs::remove_dir(&dir).expect("the checks left files behind");
    let (status, stderr) = pyebpf.finish(Duration::from_secs(60));
    drop(workload);
    eprintln!("{stderr}");
    assert_eq!(status.code(), Some(1), "{stderr}");
    let profile = fallback_named(&stderr, ".txt");
    let stats_fallback = fallback_named(&stderr, ".stats.json");
    assert_eq!(profile.parent(), Some(std::env::temp_dir().as_path()));
    let text = std::fs::read_to_string(&profile).expect("reading the fallback profile");
    let leaf = leaf_samples(&text);
    eprintln!("fallback {}: {leaf} samples in leaf()", profile.display());
    assert!(leaf >= 20, "{leaf} samples in leaf(): {text}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats_fallback).unwrap())
            .expect("the fallback stats parse");
    assert!(json["session"]["samples"].as_u64().unwrap() >= leaf);
    let _ = std::fs::remove_file(&profile);
    let _ = std::fs::remove_file(&stats_fallback);
}

/// Starts `pyebpf record -p <chain.py>` (until stopped), sends `signal` after two seconds of
/// recording, and checks the profile was written and pyebpf exited 0.
fn signal_ends_recording(signal: &str) {
    let interp = first_interpreter();
    let workload = Workload::start(&interp, "chain.py", &[]);
    let pid = workload.pid().to_string();
    let out = temp_path(&format!("sig{signal}"), "txt");
    let pyebpf = recording(&pid, "120", &out, &[]);
    std::thread::sleep(Duration::from_secs(2));
    let sent = Instant::now();
    pyebpf.signal(signal);
    let (status, stderr) = pyebpf.finish(Duration::from_secs(30));
    let stopped = sent.elapsed();
    drop(workload);
    eprintln!(
        "SIG{signal}: exited {:.2}s after the signal\n{stderr}",
        stopped.as_secs_f64()
    );
    assert_eq!(status.code(), Some(0), "SIG{signal}: {stderr}");
    assert!(
        stderr.contains("samples from 1 process"),
        "no summary: {stderr}"
    );
    let text = read_and_remove(&out);
    let leaf = leaf_samples(&text);
    assert!(leaf >= 20, "SIG{signal}: {leaf} samples in leaf(): {text}");
}

/// Samples with `leaf()` on their stack in collapsed `text`.
fn leaf_samples(text: &str) -> u64 {
    parse_collapsed(text)
        .iter()
        .filter(|(s, _)| s.iter().any(|f| f.starts_with("leaf (")))
        .map(|(_, c)| c)
        .sum()
}

/// The pid in pyebpf's "profiling pid N (...)" line.
fn launched_pid(stderr: &str) -> u32 {
    stderr
        .lines()
        .find_map(|l| {
            l.split(RECORDING)
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no `{RECORDING} N` line: {stderr}"))
}

fn read_and_remove(path: &Path) -> String {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no profile at {}: {e}", path.display()));
    let _ = std::fs::remove_file(path);
    text
}

#[test]
fn sigterm_ends_recording_with_profile_written() {
    signal_ends_recording("TERM");
}

#[test]
fn sighup_ends_recording_with_profile_written() {
    signal_ends_recording("HUP");
}

/// With `-- COMMAND`, SIGTERM reaches pyebpf alone: it writes the profile, passes the signal
/// on, and exits with the command's status (killed by SIGTERM: 128 + 15).
#[test]
fn sigterm_in_command_mode_stops_the_command_too() {
    let interp = first_interpreter();
    let out = temp_path("sigterm-cmd", "txt");
    let program = interp.argv(&tests::workloads_dir().join("chain.py"), &[]);
    let mut args = vec![
        "record",
        "-v",
        "-f",
        "collapsed",
        "-o",
        out.to_str().unwrap(),
        "--",
    ];
    args.extend(program.iter().map(String::as_str));
    let mut pyebpf = Running::start(&args);
    pyebpf.wait_for(RECORDING, START_TIMEOUT);
    let command = launched_pid(&pyebpf.stderr.join("\n"));
    std::thread::sleep(Duration::from_secs(2));
    pyebpf.signal("TERM");
    let (status, stderr) = pyebpf.finish(Duration::from_secs(30));
    eprintln!("{stderr}");
    // pyebpf waited for (and reaped) the command; one still running was not stopped.
    if std::path::Path::new(&format!("/proc/{command}")).exists() {
        let _ = std::process::Command::new("kill")
            .args(["-9", &command.to_string()])
            .status();
        panic!("the command {command} still runs after pyebpf exited: {stderr}");
    }
    assert_eq!(status.code(), Some(128 + 15), "{stderr}");
    let text = read_and_remove(&out);
    let leaf = leaf_samples(&text);
    assert!(leaf >= 20, "{leaf} samples in leaf(): {text}");
}
