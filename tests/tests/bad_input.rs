//! Bad input: clear one-line errors with a fix, exit code 2; collected data survives exits.

use std::process::Command;

use tests::{interpreters_logged, pyebpf_bin, record, Workload};

fn one_line_error(stderr: &str) -> &str {
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("pyebpf: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "expected one error line, got: {stderr}");
    errors[0]
}

#[test]
fn nonexistent_pid_is_a_usage_error() {
    let rec = record(&["-p", "999999999", "-d", "1"]);
    assert_eq!(rec.status.code(), Some(2), "{}", rec.stderr);
    let line = one_line_error(&rec.stderr);
    assert!(line.contains("no process with pid 999999999"), "{line}");
}

#[test]
fn non_python_pid_is_a_usage_error() {
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = sleeper.id().to_string();
    let rec = record(&["-p", &pid, "-d", "1"]);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert_eq!(rec.status.code(), Some(2), "{}", rec.stderr);
    let line = one_line_error(&rec.stderr);
    assert!(
        line.contains("not a CPython process") && line.contains(&pid),
        "{line}"
    );
}

#[test]
fn unsupported_version_names_version_and_binary() {
    let Some(dir) = std::fs::read_dir("/root/.pyenv/versions")
        .ok()
        .and_then(|d| {
            d.filter_map(|e| e.ok()).map(|e| e.path()).find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("3.10"))
            })
        })
    else {
        eprintln!("skipped: no CPython 3.10 under /root/.pyenv/versions");
        return;
    };
    let exe = dir.join("bin/python3.10");
    let mut old = Command::new(&exe)
        .args(["-c", "import time\nwhile True: time.sleep(0.1)"])
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let pid = old.id().to_string();
    let rec = record(&["-p", &pid, "-d", "1"]);
    let _ = old.kill();
    let _ = old.wait();
    assert_eq!(rec.status.code(), Some(2), "{}", rec.stderr);
    let line = one_line_error(&rec.stderr);
    assert!(
        line.contains("3.10") && line.contains("libpython3.10"),
        "{line}"
    );
}

#[test]
fn missing_privileges_say_what_and_how() {
    // Drop every capability and become `nobody`, as an unprivileged user would run it.
    let output = Command::new("setpriv")
        .args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ])
        .arg(pyebpf_bin())
        .args(["record", "-d", "1"])
        .output()
        .expect("running setpriv");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    let line = one_line_error(&stderr);
    assert!(
        line.contains("CAP_BPF") && line.contains("CAP_PERFMON") && line.contains("sudo"),
        "{line}"
    );
}

#[test]
fn bad_arguments_exit_2() {
    let output = Command::new(pyebpf_bin())
        .args(["record", "-r", "0"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let output = Command::new(pyebpf_bin())
        .args(["record", "-d", "-3"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn target_exit_during_recording_keeps_samples() {
    let interp = interpreters_logged()
        .into_iter()
        .next()
        .expect("an interpreter");
    let workload = Workload::start(&interp, "exit_code.py", &["1.5", "0"]);
    let pid = workload.pid().to_string();
    let started = std::time::Instant::now();
    let rec = record(&["-p", &pid, "-d", "60"]);
    assert!(rec.status.success(), "{}", rec.stderr);
    assert!(
        started.elapsed().as_secs() < 20,
        "recording did not stop when its target exited"
    );
    let work = rec.samples_in("work");
    assert!(work >= 20, "{work} samples in work(): {}", rec.stderr);
    drop(workload);
}
