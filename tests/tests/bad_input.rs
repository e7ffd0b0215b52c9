//! Bad input: clear one-line errors with a fix, exit code 2; collected data survives exits.
//! A pid that cannot be profiled is named for what it is (unreadable, a kernel thread, a
//! zombie, a thread, a pid from inside a container), never "no process".

use std::process::Command;

use tests::{
    interpreters_logged, one_line_error, pyebpf_bin, pyebpf_unprivileged, record, Workload,
};

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
        tests::missing_prerequisite(
            "unsupported_version_names_version_and_binary",
            "no CPython 3.10 under /root/.pyenv/versions",
        );
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
    let output = pyebpf_unprivileged()
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
    // Each reaches pyebpf's own duration check (`-d -3` would be refused by clap as an unknown
    // flag before it); the message names the value.
    for (arg, value) in [("--duration=-3", "-3"), ("-d0", "0"), ("-dnan", "nan")] {
        let output = Command::new(pyebpf_bin())
            .args(["record", arg])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{arg}: {stderr}");
        assert!(
            stderr.contains(&format!("`{value}` is not a positive number of seconds")),
            "{arg}: {stderr}"
        );
    }
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

/// Whatever pid 1 is on this host, the error says that, not "no process with pid 1".
#[test]
fn pid_1_says_what_is_wrong_with_it() {
    let rec = record(&["-p", "1", "-d", "1"]);
    let line = one_line_error(&rec.stderr);
    eprintln!("{line}");
    assert_eq!(rec.status.code(), Some(2), "{}", rec.stderr);
    assert!(!line.contains("no process"), "{line}");
    match std::fs::read_to_string("/proc/1/maps") {
        Err(e) => {
            let errno = e.raw_os_error().expect("an OS error");
            assert!(
                line.contains("exists, but pyebpf may not read its maps")
                    && line.contains(&format!("(os error {errno})")),
                "{line}"
            );
        }
        Ok(maps) => {
            assert!(
                !maps.contains("python"),
                "pid 1 runs Python on this host: this test needs a host whose init is not Python"
            );
            assert!(line.contains("is not a CPython process"), "{line}");
        }
    }
}

/// The first kernel thread in `/proc` (flag PF_KTHREAD in `/proc/PID/stat`).
fn kernel_thread() -> (u32, String) {
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids.into_iter()
        .find_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (head, rest) = stat.rsplit_once(')')?;
            let comm = head.split_once('(')?.1.to_string();
            let flags: u64 = rest.split_whitespace().nth(6)?.parse().ok()?;
            (flags & 0x0020_0000 != 0).then_some((pid, comm))
        })
        .expect("a kernel thread")
}

#[test]
fn kernel_thread_is_named_as_one() {
    let (pid, comm) = kernel_thread();
    let rec = record(&["-p", &pid.to_string(), "-d", "1"]);
    assert_eq!(rec.status.code(), Some(2), "{}", rec.stderr);
    let line = one_line_error(&rec.stderr);
    assert!(
        line.contains(&format!("process {pid} ({comm}) is a kernel thread")),
        "{line}"
    );
}

#[test]
fn zombie_is_named_as_one() {
    // `true` exits at once; its parent, replaced by `sleep`, never reaps it.
    let mut parent = Command::new("sh")
        .args(["-c", "true & exec sleep 30"])
        .spawn()
        .unwrap();
    let parent_pid = parent.id();
    let started = std::time::Instant::now();
    let zombie = loop {
        let found = std::fs::read_dir("/proc").unwrap().find_map(|e| {
            let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let rest = stat.rsplit_once(')')?.1;
            let mut fields = rest.split_whitespace();
            let state = fields.next()?;
            let ppid: u32 = fields.next()?.parse().ok()?;
            (ppid == parent_pid && state == "Z").then_some(pid)
        });
        if let Some(pid) = found {
            break pid;
        }
        assert!(started.elapsed().as_secs() < 10, "no zombie appeared");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let rec = record(&["-p", &zombie.to_string(), "-d", "1"]);
    let _ = parent.kill();
    let _ = parent.wait();
    assert_eq!(rec.status.code(), Some(2), "{}", rec.stderr);
    let line = one_line_error(&rec.stderr);
    assert!(
        line.contains(&format!("process {zombie} "))
            && line.contains("zombie")
            && line.contains(&format!("parent {parent_pid}")),
        "{line}"
    );
}

#[test]
fn thread_id_names_its_process() {
    let interp = interpreters_logged()
        .into_iter()
        .next()
        .expect("an interpreter");
    let workload = Workload::start(&interp, "threads.py", &[]);
    let tid = workload.printed("alpha");
    let rec = record(&["-p", &tid, "-d", "1"]);
    let pid = workload.pid();
    drop(workload);
    assert_eq!(rec.status.code(), Some(2), "{}", rec.stderr);
    let line = one_line_error(&rec.stderr);
    assert!(
        line.contains(&format!("{tid} is a thread of process {pid}"))
            && line.contains(&format!("-p {pid}")),
        "{line}"
    );
}

/// A pid copied from inside a container (another pid namespace) that no host process has:
/// the error names the host pid of the process meant. (Dropping the workload kills `unshare`;
/// the namespace's init, and with it `sleep`, go too.)
#[test]
fn pid_from_a_container_names_the_host_pid() {
    // A pid free on the host now, which the container's next process will get.
    let ns_pid = (20_000..30_000)
        .find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
        .expect("a free pid");
    let script = format!(
        "echo {} > /proc/sys/kernel/ns_last_pid; sleep 60 & echo $!; echo ready; wait",
        ns_pid - 1
    );
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--pid",
        "--fork",
        "--kill-child",
        "--mount-proc",
        "sh",
        "-c",
        &script,
    ]);
    let workload = Workload::start_command(cmd, "sleep in a new pid namespace");
    assert_eq!(
        workload.lines[0],
        ns_pid.to_string(),
        "ns_last_pid not honoured"
    );
    // The host pid: the process whose innermost NSpid is ns_pid, below unshare.
    let host_pid = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("NSpid:"))
                    .is_some_and(|ids| {
                        let ids: Vec<&str> = ids.split_whitespace().collect();
                        ids.len() == 2 && ids[1] == ns_pid.to_string()
                    })
            })
        })
        .expect("the namespaced sleep's host pid");
    let rec = record(&["-p", &ns_pid.to_string(), "-d", "1"]);
    drop(workload);
    assert_eq!(rec.status.code(), Some(2), "{}", rec.stderr);
    let line = one_line_error(&rec.stderr);
    assert!(
        line.contains(&format!("no process with pid {ns_pid} here"))
            && line.contains(&format!("use `-p {host_pid}`")),
        "{line}"
    );
}
