//! `pyebpf check` on this host: the Python processes it lists match what the interpreters say
//! about themselves, its exit code follows its ✔/✘ facts, and without capabilities it reports
//! not-ready with the missing capability and the fix.

use std::process::Command;

use serde_json::Value;
use tests::{interpreters_logged, workloads_dir, Interpreter, Workload};

/// `pyebpf check --json` (under `wrapper`, e.g. setpriv): exit code and the parsed report.
fn check_json(wrapper: &[&str]) -> (i32, Value) {
    let out = command(wrapper, &["check", "--json"])
        .output()
        .expect("running pyebpf check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("check --json is not JSON ({e}): {stdout}"));
    (out.status.code().expect("an exit code"), report)
}

/// `pyebpf check` as text: exit code and stdout.
fn check_text(wrapper: &[&str]) -> (i32, String) {
    let out = command(wrapper, &["check"])
        .output()
        .expect("running pyebpf check");
    (
        out.status.code().expect("an exit code"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn command(wrapper: &[&str], args: &[&str]) -> Command {
    let mut cmd = tests::pyebpf_via(wrapper);
    cmd.args(args);
    cmd
}

fn facts(report: &Value) -> &Vec<Value> {
    report["host"].as_array().expect("host facts")
}

fn fact<'a>(report: &'a Value, id: &str) -> &'a Value {
    facts(report)
        .iter()
        .find(|f| f["id"] == id)
        .unwrap_or_else(|| panic!("no `{id}` fact: {report:#}"))
}

/// Exit 0 exactly when no fact is ✘, `ready` says the same, and every ✘ has a fix.
fn assert_consistent(code: i32, report: &Value) {
    let failed: Vec<&Value> = facts(report)
        .iter()
        .filter(|f| f["status"] == "fail")
        .collect();
    for f in &failed {
        assert!(
            f["fix"].as_str().is_some_and(|fix| !fix.is_empty()),
            "a ✘ without a fix: {f}"
        );
    }
    assert_eq!(report["ready"], failed.is_empty(), "{report:#}");
    assert_eq!(code, if failed.is_empty() { 0 } else { 1 }, "{report:#}");
}

fn supported(report: &Value, pid: u32) -> &Value {
    report["processes"]["supported"]
        .as_array()
        .expect("supported processes")
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid} not listed: {:#}", report["processes"]))
}

/// The file mapped at `address` in `pid`, as `/proc/PID/maps` names it to us.
fn mapped_file(pid: u32, address: &str) -> String {
    let address = u64::from_str_radix(address.trim_start_matches("0x"), 16).unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (lo, hi) = fields[0].split_once('-')?;
            let lo = u64::from_str_radix(lo, 16).ok()?;
            let hi = u64::from_str_radix(hi, 16).ok()?;
            (lo <= address && address < hi && fields.len() >= 6).then(|| fields[5].to_string())
        })
        .unwrap_or_else(|| panic!("nothing file-backed mapped at {address:#x} in {pid}"))
}

/// The binary holding the runtime of a sleeper.py workload: where its `_PyRuntime` lives.
fn runtime_binary(pid: u32, workload: &Workload) -> String {
    mapped_file(pid, &workload.printed("runtime"))
}

/// What the interpreter says about itself must be what `check` says about it.
fn assert_listed(report: &Value, pid: u32, workload: &Workload, minor: u32, what: &str) {
    let p = supported(report, pid);
    eprintln!("{what}: {p}");
    assert_eq!(p["version"], workload.printed("version"), "{what}: {p}");
    assert_eq!(p["runtime"], workload.printed("runtime"), "{what}: {p}");
    assert_eq!(p["binary"], runtime_binary(pid, workload), "{what}: {p}");
    // 3.13 and newer carry `_Py_DebugOffsets`; 3.11 and 3.12 use pyebpf's own tables.
    let source = if minor >= 13 {
        "debug_offsets"
    } else {
        "builtin_table"
    };
    assert_eq!(p["layout_source"], source, "{what}: {p}");
}

/// A process that maps a file named like Python but holds no runtime (a copy of `sleep`),
/// killed and removed when dropped.
struct FakePython {
    child: std::process::Child,
    dir: std::path::PathBuf,
}

impl FakePython {
    fn start() -> FakePython {
        let dir = tests::temp_path("fake-python", "d");
        std::fs::create_dir(&dir).unwrap();
        let exe = dir.join("python2-fake");
        std::fs::copy("/bin/sleep", &exe).unwrap();
        let child = Command::new(&exe).arg("60").spawn().unwrap();
        // Until exec is done, /proc/PID/maps still shows the test binary.
        let maps = format!("/proc/{}/maps", child.id());
        let started = std::time::Instant::now();
        while !std::fs::read_to_string(&maps).is_ok_and(|m| m.contains("python2-fake")) {
            assert!(
                started.elapsed().as_secs() < 10,
                "python2-fake did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        FakePython { child, dir }
    }
}

impl Drop for FakePython {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn lists_live_interpreters_with_version_binary_and_layout_source() {
    let interps: Vec<Interpreter> = interpreters_logged();
    let workloads: Vec<(Interpreter, Workload)> = interps
        .into_iter()
        .map(|i| {
            let w = Workload::start(&i, "sleeper.py", &[]);
            (i, w)
        })
        .collect();
    // The brief of this test: a static build (runtime in the executable) and a shared one
    // (runtime in libpython) at least.
    let shared = |w: &Workload| runtime_binary(w.pid(), w).contains("libpython");
    assert!(
        workloads.iter().any(|(_, w)| !shared(w)),
        "no static CPython build on this machine (Debian's /usr/bin/python3.11 is one)"
    );
    assert!(
        workloads.iter().any(|(_, w)| shared(w)),
        "no shared CPython build on this machine (pyenv builds are)"
    );
    let fake = FakePython::start();

    let (code, report) = check_json(&[]);
    let (text_code, text) = check_text(&[]);
    eprintln!("{text}");

    assert_consistent(code, &report);
    for (interp, w) in &workloads {
        assert_listed(&report, w.pid(), w, interp.minor(), &interp.label);
        assert_eq!(
            supported(&report, w.pid())["free_threaded"],
            interp.free_threaded,
            "{}",
            interp.label
        );
        let p = supported(&report, w.pid());
        // A chroot is no namespace: the sid root's interpreters share ours (and their paths
        // read from here include the root).
        assert_eq!(p["other_pid_namespace"], false, "{p}");
        assert_eq!(p["other_mount_namespace"], false, "{p}");
        // The text shows the same fact on the process's line.
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("  ✔ {} ", w.pid())))
            .unwrap_or_else(|| panic!("no ✔ line for {}: {text}", w.pid()));
        assert!(
            line.contains(&format!("CPython {}", w.printed("version")))
                && line.contains(&runtime_binary(w.pid(), w))
                && line.contains("free-threaded") == interp.free_threaded,
            "{line}"
        );
    }
    let unsupported = report["processes"]["unsupported"].as_array().unwrap();
    let listed = unsupported
        .iter()
        .find(|p| p["pid"] == fake.child.id())
        .unwrap_or_else(|| panic!("the fake python is not listed: {unsupported:?}"));
    assert!(
        listed["reason"]
            .as_str()
            .unwrap()
            .contains("is not a CPython process"),
        "{listed}"
    );
    // Text and JSON agree on readiness.
    assert_eq!(text_code, code, "{text}");
    let crosses = text.lines().filter(|l| l.starts_with("  ✘ ")).count();
    let fails = facts(&report)
        .iter()
        .filter(|f| f["status"] == "fail")
        .count();
    assert_eq!(crosses, fails, "{text}");
    assert_eq!(
        text.contains("Ready: pyebpf can profile this host."),
        code == 0,
        "{text}"
    );
}

/// An interpreter in its own pid and mount namespaces (a container, roughly) is listed with
/// its host pid, its pid inside, and both namespaces marked.
#[test]
fn marks_processes_in_other_namespaces() {
    let mut cmd = tests::unshare_pid_and_mount();
    cmd.arg("/usr/bin/python3.11")
        .arg(workloads_dir().join("sleeper.py"));
    let workload = Workload::start_command(cmd, "sleeper.py in new pid and mount namespaces");
    let host_pid = tests::namespaced_child(workload.pid());
    let (code, report) = check_json(&[]);
    assert_consistent(code, &report);
    assert_listed(&report, host_pid, &workload, 11, "python3.11 in namespaces");
    let p = supported(&report, host_pid);
    assert_eq!(p["other_pid_namespace"], true, "{p}");
    assert_eq!(p["ns_pid"], 1, "{p}");
    assert_eq!(p["other_mount_namespace"], true, "{p}");
}

/// Without capabilities (root's uid, every capability dropped), check is not ready, names
/// what is missing and how to grant it, and exits 1.
#[test]
fn without_capabilities_reports_not_ready_with_the_fix() {
    let drop_all = ["setpriv", "--inh-caps=-all", "--bounding-set=-all"];
    let (code, report) = check_json(&drop_all);
    eprintln!("{report:#}");
    assert_eq!(code, 1);
    assert_consistent(code, &report);
    let caps = fact(&report, "capabilities");
    assert_eq!(caps["status"], "fail", "{caps}");
    let text = caps["text"].as_str().unwrap();
    for cap in ["CAP_BPF", "CAP_PERFMON", "CAP_SYS_PTRACE"] {
        assert!(text.contains(cap), "{text}");
    }
    assert!(caps["fix"].as_str().unwrap().contains("setcap"), "{caps}");
    // Not inferred: the load was tried, and refused.
    assert_eq!(
        fact(&report, "bpf_programs")["status"],
        "fail",
        "{report:#}"
    );

    let (code, text) = check_text(&drop_all);
    assert_eq!(code, 1, "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("  ✘ capabilities: missing"))
        .unwrap_or_else(|| panic!("no ✘ capabilities line: {text}"));
    assert!(line.contains("CAP_BPF"), "{line}");
    assert!(text.contains("Not ready:"), "{text}");
}
