//! `pyebpf top` end to end: the live view driven in tmux, and the plain-text snapshots.

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tests::{
    interpreters_logged, marker_lines, pyebpf_bin, pyebpf_unprivileged, Interpreter, Workload,
};

fn first_interpreter() -> Interpreter {
    interpreters_logged()
        .into_iter()
        .next()
        .expect("no supported interpreter found")
}

/// The tests share two CPUs and time limits: one at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The table rows (lines after the header) of a text snapshot or a screen.
fn rows(screen: &str) -> Vec<&str> {
    screen
        .lines()
        .skip_while(|l| !(l.contains("%Own") && l.contains("TotalTime")))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .collect()
}

/// A row of process `pid` whose function column starts with `function (`.
fn has_row(screen: &str, pid: u32, function: &str) -> bool {
    let pid = format!(" {pid} ");
    let function = format!(" {function} (");
    rows(screen)
        .iter()
        .any(|r| r.contains(&pid) && r.contains(&function))
}

/// `pyebpf top ARGS` in text mode, its snapshots (separated by blank lines) read as they come.
struct Snapshots {
    top: std::process::Child,
    rx: mpsc::Receiver<String>,
}

impl Snapshots {
    fn start(args: &[&str]) -> Snapshots {
        let mut top = Command::new(pyebpf_bin())
            .arg("top")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = top.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            let mut snapshot = String::new();
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.is_empty() {
                    if tx.send(std::mem::take(&mut snapshot)).is_err() {
                        break;
                    }
                } else {
                    snapshot.push_str(&line);
                    snapshot.push('\n');
                }
            }
        });
        Snapshots { top, rx }
    }

    fn next(&mut self, what: &str) -> String {
        self.rx
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("no snapshot while waiting for {what}"))
    }

    /// Reads snapshots until one `shows` what is awaited and returns it; panics with the last
    /// one once `limit` has passed since `since` without.
    fn until(
        &mut self,
        what: &str,
        since: Instant,
        limit: Duration,
        shows: impl Fn(&str) -> bool,
    ) -> String {
        loop {
            let snap = self.next(what);
            if shows(&snap) {
                return snap;
            }
            assert!(
                since.elapsed() < limit,
                "{what}: not seen after {:?}:\n{snap}",
                since.elapsed()
            );
        }
    }
}

impl Drop for Snapshots {
    fn drop(&mut self) {
        let _ = self.top.kill();
        let _ = self.top.wait();
    }
}

/// `top -p PID` follows an interpreter that re-execs (`os.execv`, same pid) into another
/// Python program: the kernel drops the old image's entry at exec, and `top` must register the
/// new one from the exec event.
#[test]
fn follows_a_process_through_exec() {
    let _serial = serial();
    let interp = first_interpreter();
    let workload = Workload::start(&interp, "reexec.py", &["1.5"]);
    let pid = workload.pid();
    let mut snapshots = Snapshots::start(&["-p", &pid.to_string(), "-n", "20", "--delay", "0.5"]);
    let started = Instant::now();
    snapshots.until("before_exec", started, Duration::from_secs(3), |s| {
        has_row(s, pid, "before_exec")
    });
    let what = format!("pid {pid} followed through its exec to after_exec");
    let snap = snapshots.until(&what, started, Duration::from_secs(6), |s| {
        has_row(s, pid, "after_exec")
    });
    eprintln!(
        "after_exec shown {:?} after start:\n{snap}",
        started.elapsed()
    );
    drop(workload);
}

/// Every interpreter at once, one text snapshot: each process's hot function is its top row,
/// with the right file:line, and the process is named.
#[test]
fn text_snapshot_shows_hot_function_and_process() {
    let _serial = serial();
    let interps = interpreters_logged();
    assert!(!interps.is_empty(), "no supported interpreter found");
    let lines = marker_lines("chain.py");
    let workloads: Vec<(String, Workload)> = interps
        .iter()
        .map(|i| (i.label.clone(), Workload::start(i, "chain.py", &[])))
        .collect();
    let mut args: Vec<String> = vec![
        "top".into(),
        "--once".into(),
        "--delay".into(),
        "1.5".into(),
    ];
    for (_, w) in &workloads {
        args.push("-p".into());
        args.push(w.pid().to_string());
    }
    let output = Command::new(pyebpf_bin()).args(&args).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(output.status.success(), "{stderr}");
    assert!(stdout.starts_with("pyebpf top: "), "{stdout}");
    assert_eq!(
        stdout.matches("pyebpf top: ").count(),
        1,
        "--once prints one snapshot"
    );
    for (label, w) in &workloads {
        let pid = w.pid();
        let mine: Vec<&str> = rows(&stdout)
            .into_iter()
            .filter(|r| r.contains(&format!(" {pid} python")))
            .collect();
        assert!(!mine.is_empty(), "{label}: no row of pid {pid}:\n{stdout}");
        assert!(
            mine[0].contains(" leaf (") && mine[0].contains("chain.py:"),
            "{label}: the top row of {pid} is not leaf: {}",
            mine[0]
        );
        assert!(
            mine[0].contains("chain.py"),
            "{label}: command missing: {}",
            mine[0]
        );
        for f in ["top", "mid", "<module>"] {
            assert!(
                has_row(&stdout, pid, f),
                "{label}: no {f} row for {pid}:\n{stdout}"
            );
        }
        // Per-function rows carry the function's first line.
        let def = lines["leaf"] - 2;
        assert!(
            mine[0].contains(&format!("chain.py:{def})")),
            "{label}: {}",
            mine[0]
        );
    }
    // Per-line rows carry the executing line.
    let w = &workloads[0].1;
    let output = Command::new(pyebpf_bin())
        .args(["top", "-n", "1", "--lines", "--delay", "1", "-p"])
        .arg(w.pid().to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let first = rows(&stdout)[0].to_string();
    assert!(
        first.contains(" leaf (") && first.contains(&format!("chain.py:{})", lines["leaf"])),
        "{stdout}"
    );
}

/// The Thread column names each row's thread as `threading` does (`Thread-1 (run)`; the OS
/// calls it `python3.X` before 3.14), on every interpreter at once.
#[test]
fn text_snapshot_names_threads_as_threading_does() {
    let _serial = serial();
    let workloads: Vec<(String, Workload)> = interpreters_logged()
        .iter()
        .map(|i| (i.label.clone(), Workload::start(i, "threads.py", &[])))
        .collect();
    let mut args: Vec<String> = vec!["top".into(), "--once".into(), "--delay".into(), "2".into()];
    for (_, w) in &workloads {
        args.push("-p".into());
        args.push(w.pid().to_string());
    }
    let output = Command::new(pyebpf_bin()).args(&args).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for (label, w) in &workloads {
        for (function, name) in [
            ("spin_alpha", w.printed("alpha_name")),
            ("spin_beta", w.printed("beta_name")),
        ] {
            let row = rows(&stdout).into_iter().find(|r| {
                r.contains(&format!(" {} ", w.pid())) && r.contains(&format!(" {function} ("))
            });
            assert!(
                row.is_some_and(|r| r.contains(&format!(" {name} "))),
                "{label}: the {function} row does not name {name:?}:\n{stdout}"
            );
        }
    }
}

/// System-wide text mode: a process started while `top` runs appears, and disappears after
/// it exits, each within about two seconds.
#[test]
fn text_mode_follows_processes_starting_and_exiting() {
    let _serial = serial();
    let interp = first_interpreter();
    let mut snapshots = Snapshots::start(&["-n", "12", "--delay", "0.5"]);
    snapshots.next("the first snapshot");
    let workload = Workload::start(&interp, "chain.py", &[]);
    let pid = workload.pid();
    let started = Instant::now();
    let what = format!("the new process {pid}");
    let snap = snapshots.until(&what, started, Duration::from_secs(3), |s| {
        has_row(s, pid, "leaf")
    });
    eprintln!("appeared after {:?}:\n{snap}", started.elapsed());
    drop(workload);
    let exited = Instant::now();
    let what = format!("process {pid} gone after its exit");
    snapshots.until(&what, exited, Duration::from_secs(3), |s| {
        !s.contains(&format!(" {pid} "))
    });
    eprintln!("gone after {:?}", exited.elapsed());
    drop(snapshots);
}

#[test]
fn bad_input_gives_the_same_errors_as_record() {
    let _serial = serial();
    let output = Command::new(pyebpf_bin())
        .args(["top", "--once", "-p", "999999999"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("pyebpf: error: no process with pid 999999999"),
        "{stderr}"
    );

    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let output = Command::new(pyebpf_bin())
        .args(["top", "--once", "-p"])
        .arg(sleeper.id().to_string())
        .output()
        .unwrap();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("not a CPython process"), "{stderr}");

    let output = pyebpf_unprivileged()
        .args(["top", "--once"])
        .output()
        .expect("running setpriv");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("CAP_BPF") && stderr.contains("sudo"),
        "{stderr}"
    );

    let output = Command::new(pyebpf_bin())
        .args(["top", "--delay", "0"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
}

/// A tmux server of its own, killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn start(width: u16, height: u16) -> Option<Tmux> {
        if Command::new("tmux")
            .arg("-V")
            .output()
            .map(|o| !o.status.success())
            .unwrap_or(true)
        {
            return None;
        }
        let tmux = Tmux {
            socket: format!("pyebpf-test-{}", std::process::id()),
        };
        let (w, h) = (width.to_string(), height.to_string());
        tmux.run(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            &w,
            "-y",
            &h,
            "sh",
        ]);
        Some(tmux)
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("running tmux");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "top"];
        args.extend(keys);
        self.run(&args);
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "top"])
    }

    /// Polls the screen until `pred` holds; panics with the screen after `timeout`.
    fn wait_for(&self, what: &str, timeout: Duration, pred: impl Fn(&str) -> bool) -> String {
        let started = Instant::now();
        loop {
            let screen = self.screen();
            if pred(&screen) {
                return screen;
            }
            assert!(
                started.elapsed() < timeout,
                "{what}: not within {timeout:?}; screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}

/// The live view in a real terminal: the hot function shows within 3 s, sort and filter
/// keys change the table, small terminals get a message, `q` gives the shell back.
#[test]
fn live_view_in_tmux() {
    let _serial = serial();
    let Some(tmux) = Tmux::start(140, 40) else {
        tests::missing_prerequisite("live_view_in_tmux", "tmux is not installed");
        return;
    };
    let interp = first_interpreter();
    let chain = Workload::start(&interp, "chain.py", &[]);
    let split = Workload::start(&interp, "split.py", &[]);
    let (c, s) = (chain.pid(), split.pid());
    let command = format!("{} top -p {c} -p {s}", pyebpf_bin().display());
    let started = Instant::now();
    tmux.keys(&[&command, "Enter"]);
    let screen = tmux.wait_for("the hot function on screen", Duration::from_secs(3), |s| {
        has_row(s, c, "leaf")
    });
    eprintln!(
        "hot function shown after {:?}:\n{screen}",
        started.elapsed()
    );
    assert!(screen.contains("q quit"), "no help line:\n{screen}");
    let screen = tmux.wait_for("both processes", Duration::from_secs(3), |sc| {
        has_row(sc, s, "unit")
    });

    // Sorted by %Own, a module frame (no own time) is not first; by function name it is.
    let first = rows(&screen)[0].to_string();
    assert!(!first.contains("<module> ("), "{screen}");
    tmux.keys(&["7"]);
    let screen = tmux.wait_for("sorted by function", Duration::from_secs(2), |sc| {
        rows(sc).first().is_some_and(|r| r.contains("<module> ("))
    });
    assert!(screen.contains("Function (file:line)▲"), "{screen}");
    tmux.keys(&["1"]);
    tmux.wait_for("sorted by %Own", Duration::from_secs(2), |sc| {
        rows(sc).first().is_some_and(|r| !r.contains("<module> ("))
    });

    // Filter to the split process: chain's rows go.
    tmux.keys(&["/"]);
    tmux.wait_for("the filter prompt", Duration::from_secs(2), |sc| {
        sc.contains("Filter by pid")
    });
    tmux.keys(&[&s.to_string(), "Enter"]);
    let screen = tmux.wait_for("the filtered table", Duration::from_secs(2), |sc| {
        has_row(sc, s, "seventy") && !has_row(sc, c, "leaf")
    });
    assert!(
        rows(&screen).iter().all(|r| r.contains(&format!(" {s} "))),
        "{screen}"
    );
    // And by name.
    tmux.keys(&["/", "chain", "Enter"]);
    tmux.wait_for("filter by name", Duration::from_secs(2), |sc| {
        has_row(sc, c, "leaf") && !has_row(sc, s, "seventy")
    });
    tmux.keys(&["/", "Enter"]);

    // Per line: the leaf row carries its executing line.
    tmux.keys(&["l"]);
    let leaf_line = marker_lines("chain.py")["leaf"];
    tmux.wait_for("per-line rows", Duration::from_secs(2), |sc| {
        sc.contains(&format!("chain.py:{leaf_line})")) && sc.contains("by line")
    });

    // Too small, then big again.
    tmux.run(&["resize-window", "-t", "top", "-x", "40", "-y", "6"]);
    tmux.wait_for("the too-small message", Duration::from_secs(2), |sc| {
        sc.contains("Terminal too small")
    });
    tmux.run(&["resize-window", "-t", "top", "-x", "140", "-y", "40"]);
    tmux.wait_for("the table again", Duration::from_secs(2), |sc| {
        !sc.contains("Terminal too small") && has_row(sc, c, "leaf")
    });

    tmux.keys(&["q"]);
    let screen = tmux.wait_for("the shell back", Duration::from_secs(3), |sc| {
        !sc.contains("%Own")
            && tmux
                .run(&["display", "-p", "-t", "top", "#{pane_current_command}"])
                .trim()
                == "sh"
    });
    eprintln!("after q:\n{screen}");
    drop(split);
    drop(chain);
}

/// The pid of the `pyebpf top` started with `args` (found by its command line).
fn pyebpf_top_pid(args: &str) -> u32 {
    let wanted = format!("{} {args}", pyebpf_bin().display());
    let started = Instant::now();
    loop {
        let found = std::fs::read_dir("/proc").unwrap().find_map(|e| {
            let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            (cmdline.trim_end() == wanted).then_some(pid)
        });
        if let Some(pid) = found {
            return pid;
        }
        assert!(started.elapsed().as_secs() < 10, "no process `{wanted}`");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGTERM and SIGHUP end the live view like `q`: the shell comes back with the terminal out
/// of raw mode (canonical input and echo on again).
#[test]
fn live_view_restores_the_terminal_on_sigterm_and_sighup() {
    let _serial = serial();
    let Some(tmux) = Tmux::start(140, 40) else {
        tests::missing_prerequisite(
            "live_view_restores_the_terminal_on_sigterm_and_sighup",
            "tmux is not installed",
        );
        return;
    };
    let interp = first_interpreter();
    let chain = Workload::start(&interp, "chain.py", &[]);
    let c = chain.pid();
    for signal in ["TERM", "HUP"] {
        let args = format!("top -p {c}");
        tmux.keys(&[&format!("{} {args}", pyebpf_bin().display()), "Enter"]);
        tmux.wait_for("the hot function on screen", Duration::from_secs(10), |s| {
            has_row(s, c, "leaf")
        });
        let pid = pyebpf_top_pid(&args);
        let status = Command::new("kill")
            .args(["-s", signal, &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        tmux.wait_for(
            &format!("the shell back after SIG{signal}"),
            Duration::from_secs(5),
            |sc| {
                !sc.contains("%Own")
                    && tmux
                        .run(&["display", "-p", "-t", "top", "#{pane_current_command}"])
                        .trim()
                        == "sh"
            },
        );
        let stty = tests::temp_path("stty", "txt");
        tmux.keys(&["clear", "Enter"]);
        tmux.keys(&[&format!("stty -a > {}", stty.display()), "Enter"]);
        let started = Instant::now();
        let modes = loop {
            match std::fs::read_to_string(&stty) {
                Ok(text) if text.contains("icanon") => break text,
                _ => {
                    assert!(started.elapsed().as_secs() < 5, "stty -a did not run");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        };
        let _ = std::fs::remove_file(&stty);
        let flags: Vec<&str> = modes.split_whitespace().collect();
        assert!(
            flags.contains(&"icanon") && flags.contains(&"echo"),
            "SIG{signal} left the terminal raw: {modes}"
        );
    }
    drop(chain);
}
