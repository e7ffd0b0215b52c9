//! `pyebpf dump`: every thread's name, state and Python frames (with `--locals`, their
//! variables), read from a live process without stopping it, under every interpreter.
//!
//! `dump_threads.py` runs three named threads in known places (a spinner on a CPU, a sleeper
//! with known locals, a waiter on an Event) and a heartbeat thread.

use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tests::{interpreters_logged, marker_lines, one_line_error, pyebpf_bin, temp_path, Workload};

fn dump(args: &[&str]) -> std::process::Output {
    Command::new(pyebpf_bin())
        .arg("dump")
        .args(args)
        .output()
        .expect("running pyebpf dump")
}

fn dump_json(pid: u32, extra: &[&str]) -> Value {
    let pid = pid.to_string();
    let mut args = vec!["-p", &pid, "--json"];
    args.extend_from_slice(extra);
    let out = dump(&args);
    assert!(
        out.status.success(),
        "dump failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("dump --json is JSON")
}

/// The thread with host id `tid` in the one process of `doc`.
fn thread<'a>(doc: &'a Value, tid: &str) -> &'a Value {
    doc["processes"][0]["threads"]
        .as_array()
        .expect("threads")
        .iter()
        .find(|t| t["tid"].as_u64() == tid.parse().ok())
        .unwrap_or_else(|| panic!("no thread {tid} in {doc}"))
}

fn frames(thread: &Value) -> Vec<(String, u64)> {
    thread["frames"]
        .as_array()
        .expect("frames")
        .iter()
        .map(|f| {
            (
                f["function"].as_str().unwrap_or("").to_string(),
                f["line"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

/// name → (value, is argument) of the top frame.
fn top_locals(thread: &Value) -> HashMap<String, (String, bool)> {
    thread["frames"][0]["locals"]
        .as_array()
        .expect("locals")
        .iter()
        .map(|l| {
            (
                l["name"].as_str().unwrap().to_string(),
                (
                    l["value"].as_str().unwrap().to_string(),
                    l["arg"].as_bool().unwrap(),
                ),
            )
        })
        .collect()
}

/// Heartbeats so far and the longest gap between two (seconds), from the workload's file.
fn heartbeat(path: &std::path::Path) -> (u64, f64) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut parts = text.split_whitespace();
    (
        parts.next().and_then(|p| p.parse().ok()).unwrap_or(0),
        parts.next().and_then(|p| p.parse().ok()).unwrap_or(0.0),
    )
}

/// Watches every thread of `pid` until stopped: whether any was ever seen stopped (`T`) or in
/// a tracing stop (`t`), which pausing a process to read it would show.
fn watch_for_stops(pid: u32, done: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<String>> {
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        while !done.load(Ordering::Relaxed) {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                break;
            };
            for task in tasks.flatten() {
                let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
                    continue;
                };
                let state = stat
                    .rsplit_once(") ")
                    .and_then(|(_, rest)| rest.chars().next());
                if matches!(state, Some('T' | 't')) {
                    seen.push(stat);
                }
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        seen
    })
}

#[test]
fn dump_shows_each_thread_without_stopping_it() {
    let interps = interpreters_logged();
    assert!(!interps.is_empty(), "no supported interpreter found");
    let lines = marker_lines("dump_threads.py");
    let mut failures = Vec::new();
    for interp in &interps {
        // The heartbeat file is written by the workload: inside the chroot for the sid ones.
        let inside = temp_path("dump-heartbeat", "txt");
        let host = match &interp.root {
            Some(root) => root.join(inside.strip_prefix("/").unwrap()),
            None => inside.clone(),
        };
        let workload = Workload::start(interp, "dump_threads.py", &[inside.to_str().unwrap()]);
        let pid = workload.pid();
        let tids: HashMap<&str, String> = ["spinner", "sleeper", "waiter", "main"]
            .into_iter()
            .map(|n| (n, workload.printed(n)))
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let (beats_before, _) = heartbeat(&host);
        let done = Arc::new(AtomicBool::new(false));
        let watcher = watch_for_stops(pid, done.clone());
        let docs: Vec<Value> = (0..5).map(|_| dump_json(pid, &["--locals"])).collect();
        let text = dump(&["-p", &pid.to_string()]);
        done.store(true, Ordering::Relaxed);
        let stops = watcher.join().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let (beats_after, _) = heartbeat(&host);
        drop(workload);
        let _ = std::fs::remove_file(&host);

        let mut problems = Vec::new();
        let mut check = |ok: bool, what: String| {
            if !ok {
                problems.push(what);
            }
        };
        check(stops.is_empty(), format!("a thread was stopped: {stops:?}"));
        check(
            beats_after > beats_before,
            format!("heartbeats {beats_before} → {beats_after}: the target made no progress"),
        );
        let doc = &docs[0];
        let p = &doc["processes"][0];
        check(p["pid"].as_u64() == Some(pid as u64), format!("pid in {p}"));
        check(
            p["threads"].as_array().map(|t| t.len()) == Some(5),
            "five thread states (main, three workers, heartbeat)".into(),
        );
        // Names: the OS names each thread gave itself.
        for name in ["spinner", "sleeper", "waiter"] {
            let t = thread(doc, &tids[name]);
            check(t["name"] == name, format!("{name}: named {}", t["name"]));
        }
        // Frames, most recent first, at the marked lines.
        // The spinner is caught on its loop's line or on the loop's jump back (`while`).
        let expect_top = [
            ("spinner", "spin", [lines["spin"], lines["spin_loop"]]),
            ("sleeper", "nap", [lines["nap"]; 2]),
            ("main", "main", [lines["main"]; 2]),
        ];
        for (who, function, at) in expect_top {
            let f = frames(thread(doc, &tids[who]));
            check(
                f.first()
                    .is_some_and(|(name, line)| name == function && at.contains(&(*line as u32))),
                format!(
                    "{who}: top frame {:?}, expected {function}:{at:?}",
                    f.first()
                ),
            );
        }
        let waiter = frames(thread(doc, &tids["waiter"]));
        let at = waiter.iter().position(|f| f.0 == "wait_here");
        check(
            at.is_some_and(|i| i > 0 && waiter[i].1 == lines["wait"] as u64)
                && waiter.iter().any(|f| f.0 == "Event.wait"),
            format!("waiter: {waiter:?}"),
        );
        let main = frames(thread(doc, &tids["main"]));
        check(
            main.last().is_some_and(|f| f.0 == "<module>"),
            format!("main thread: {main:?}"),
        );
        // States: the sleeper and waiter are idle in every dump; the spinner was seen on a
        // CPU, holding the GIL, in at least one of five. A free-threaded build has no GIL:
        // nobody holds one (`null`), and the process says it is free-threaded.
        let (holding, not_holding) = if interp.free_threaded {
            (Value::Null, Value::Null)
        } else {
            (Value::Bool(true), Value::Bool(false))
        };
        check(
            p["free_threaded"] == interp.free_threaded,
            format!("free_threaded: {}", p["free_threaded"]),
        );
        for who in ["sleeper", "waiter"] {
            let states: Vec<&Value> = docs
                .iter()
                .map(|d| &thread(d, &tids[who])["state"])
                .collect();
            check(
                states.iter().all(|s| *s == "idle"),
                format!("{who}: states {states:?}"),
            );
            let gil: Vec<&Value> = docs
                .iter()
                .map(|d| &thread(d, &tids[who])["holds_gil"])
                .collect();
            check(
                gil.iter().all(|g| **g == not_holding),
                format!("{who}: holds_gil {gil:?}"),
            );
        }
        let spinner: Vec<&Value> = docs.iter().map(|d| thread(d, &tids["spinner"])).collect();
        check(
            spinner
                .iter()
                .any(|t| t["state"] == "running" && t["holds_gil"] == holding),
            format!(
                "spinner never seen running with the GIL: {:?}",
                spinner
                    .iter()
                    .map(|t| (&t["state"], &t["holds_gil"]))
                    .collect::<Vec<_>>()
            ),
        );
        // Locals, read from the target's memory.
        let sleeper = top_locals(thread(doc, &tids["sleeper"]));
        let want = [
            ("seconds", "30.5", true),
            ("name", "'sleeper'", false),
            ("data", "b'\\x00ab\\''", false),
            ("ratio", "0.25", false),
            ("flag", "True", false),
            ("nothing", "None", false),
            ("big", "1180591620717411303424", false),
            ("neg", "-12345", false),
        ];
        for (name, value, arg) in want {
            check(
                sleeper.get(name) == Some(&(value.to_string(), arg)),
                format!(
                    "sleeper local {name}: {:?}, expected {value}",
                    sleeper.get(name)
                ),
            );
        }
        check(
            sleeper
                .get("items")
                .is_some_and(|v| v.0.starts_with("<list at 0x")),
            format!("sleeper local items: {:?}", sleeper.get("items")),
        );
        let spin = top_locals(thread(doc, &tids["spinner"]));
        check(
            spin.get("rounds") == Some(&("7".into(), true))
                && spin.get("label") == Some(&("'spin-label'".into(), true)),
            format!("spinner locals {spin:?}"),
        );
        // The spinner's counter moves between dumps: it kept running.
        let counts: std::collections::HashSet<String> = spinner
            .iter()
            .filter_map(|t| {
                t["frames"][0]["locals"]
                    .as_array()?
                    .iter()
                    .find(|l| l["name"] == "count")
                    .map(|l| l["value"].to_string())
            })
            .collect();
        check(
            counts.len() > 1,
            format!("spinner's count never changed: {counts:?}"),
        );
        // The text form.
        let text = String::from_utf8_lossy(&text.stdout);
        check(
            text.contains(&format!(
                "Thread {} \"sleeper\": idle (S)\n    nap (",
                tids["sleeper"]
            )) && text.contains(&format!("Process {pid}: ")),
            format!("text dump:\n{text}"),
        );
        eprintln!(
            "{}: ok={} heartbeats {beats_before}→{beats_after}, spinner counts {}",
            interp.label,
            problems.is_empty(),
            counts.len()
        );
        if !problems.is_empty() {
            failures.push(format!("{}:\n  {}", interp.label, problems.join("\n  ")));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn dump_several_processes_at_once() {
    let interp = &interpreters_logged()[0];
    let a = Workload::start(interp, "threads.py", &[]);
    let b = Workload::start(interp, "sleeper.py", &[]);
    let (pa, pb) = (a.pid().to_string(), b.pid().to_string());
    let out = dump(&["-p", &pa, "-p", &pb, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let pids: Vec<String> = doc["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].to_string())
        .collect();
    assert_eq!(pids, [pa, pb]);
    let alpha = a.printed("alpha");
    let threads = doc["processes"][0]["threads"].as_array().unwrap();
    assert!(
        threads
            .iter()
            .any(|t| t["tid"].as_u64() == alpha.parse().ok()
                && t["frames"][0]["function"] == "spin_alpha"),
        "{doc}"
    );
}

#[test]
fn dump_bad_pid_is_one_line_exit_2() {
    let sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = sleeper.id().to_string();
    let out = dump(&["-p", &pid]);
    let mut sleeper = sleeper;
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let line = one_line_error(&stderr);
    assert!(line.contains("is not a CPython process"), "{line}");
    assert!(out.stdout.is_empty(), "nothing printed for a bad pid");
    let out = dump(&[]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn dump_native_for_threads_on_a_cpu() {
    let interp = &interpreters_logged()[0];
    let inside = temp_path("dump-native-heartbeat", "txt");
    let workload = Workload::start(interp, "dump_threads.py", &[inside.to_str().unwrap()]);
    let doc = dump_json(workload.pid(), &["--native"]);
    let spinner = thread(&doc, &workload.printed("spinner"));
    let sleeper = thread(&doc, &workload.printed("sleeper"));
    drop(workload);
    let _ = std::fs::remove_file(&inside);
    let sampled = &spinner["native"]["sampled"];
    let functions: Vec<&str> = sampled["frames"]
        .as_array()
        .unwrap_or_else(|| panic!("spinner has no sampled native stack: {spinner}"))
        .iter()
        .map(|f| f["function"].as_str().unwrap())
        .collect();
    assert!(
        functions.contains(&"spin") && functions.contains(&"Thread._bootstrap"),
        "{functions:?}"
    );
    let why = sleeper["native"]["unavailable"]
        .as_str()
        .unwrap_or_else(|| panic!("{sleeper}"));
    assert!(why.contains("without pausing it"), "{why}");
}

/// `python -m asyncio pstree PID` of the interpreter itself, run inside its root with a
/// `/proc` of its own (the sid root has none) and the host path of its binary reachable (the
/// target's maps name it by the host path): (task name → the name of the task it hangs under).
fn pstree_links(interp: &tests::Interpreter, pid: u32) -> HashMap<String, Option<String>> {
    let root = interp
        .root
        .as_ref()
        .expect("3.14+ interpreters come from the sid root");
    let host_root = root.join(root.strip_prefix("/").unwrap());
    if !host_root.exists() {
        std::fs::create_dir_all(host_root.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink("/", &host_root).unwrap();
    }
    let script = format!(
        "mount -t proc proc {root}/proc && exec chroot {root} {exe} -m asyncio pstree {pid}",
        root = root.display(),
        exe = interp.exe.display()
    );
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .output()
        .expect("running asyncio pstree");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "pstree failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Each task is a `(T) NAME` line; its parent is the nearest task line above it that is
    // indented less.
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut links = HashMap::new();
    for line in text.lines() {
        let Some(at) = line.find("(T) ") else {
            continue;
        };
        let depth = line[..at].chars().count();
        let name = line[at + 4..].trim().to_string();
        while stack.last().is_some_and(|(d, _)| *d >= depth) {
            stack.pop();
        }
        links.insert(name.clone(), stack.last().map(|(_, n)| n.clone()));
        stack.push((depth, name));
    }
    links
}

#[test]
fn dump_async_matches_asyncio_pstree() {
    let interps: Vec<_> = interpreters_logged()
        .into_iter()
        .filter(|i| i.version >= (3, 14))
        .collect();
    assert!(
        interps.len() >= 2,
        "the sid 3.14 and 3.15 interpreters are required"
    );
    let lines = marker_lines("async_tree.py");
    let mut failures = Vec::new();
    for interp in &interps {
        let workload = Workload::start(interp, "async_tree.py", &[]);
        let pid = workload.pid();
        let doc = dump_json(pid, &["--async"]);
        let theirs = pstree_links(interp, pid);
        let text = dump(&["-p", &pid.to_string(), "--async"]);
        drop(workload);
        let tasks = doc["processes"][0]["tasks"]
            .as_array()
            .unwrap_or_else(|| panic!("{}: no tasks in {doc}", interp.label));
        let names: HashMap<&str, &str> = tasks
            .iter()
            .map(|t| (t["id"].as_str().unwrap(), t["name"].as_str().unwrap()))
            .collect();
        let ours: HashMap<String, Option<String>> = tasks
            .iter()
            .map(|t| {
                let parent = t["awaited_by"]
                    .as_array()
                    .and_then(|a| a.first())
                    .and_then(|id| names.get(id.as_str()?))
                    .map(|n| n.to_string());
                (t["name"].as_str().unwrap().to_string(), parent)
            })
            .collect();
        let leaf_stack_ok = tasks.iter().filter(|t| t["name"] == "leaf-a1").all(|t| {
            let stack = t["coroutine_stack"].as_array().unwrap();
            stack
                .iter()
                .any(|f| f["function"] == "leaf" && f["line"] == lines["leaf"])
                && stack.first().is_some_and(|f| f["function"] == "Event.wait")
        });
        let text = String::from_utf8_lossy(&text.stdout);
        eprintln!("{}: ours {ours:?}\n  pstree {theirs:?}", interp.label);
        if ours != theirs || theirs.len() != 6 || !leaf_stack_ok || !text.contains("(T) leaf-b1") {
            failures.push(format!(
                "{}: ours {ours:?} pstree {theirs:?} leaf stack ok {leaf_stack_ok}\n{text}",
                interp.label
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn dump_async_needs_314() {
    let interp = interpreters_logged()
        .into_iter()
        .find(|i| i.version < (3, 14))
        .expect("an interpreter older than 3.14");
    let workload = Workload::start(&interp, "async_tree.py", &[]);
    let out = dump(&["-p", &workload.pid().to_string(), "--async"]);
    drop(workload);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("needs CPython 3.14"), "{stderr}");
    // The threads are still dumped: the main thread waits in the event loop.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("_run_once"),
        "threads still shown: {stdout}"
    );
}

/// A process in its own pid and mount namespaces (a container, roughly), named by its host
/// pid: its threads are listed by host thread id, with the ids they have inside.
#[test]
fn dump_a_process_in_a_container() {
    let inside = temp_path("dump-container-heartbeat", "txt");
    let mut cmd = tests::unshare_pid_and_mount();
    cmd.arg("/usr/bin/python3.11")
        .arg(tests::workloads_dir().join("dump_threads.py"))
        .arg(&inside);
    let workload = Workload::start_command(cmd, "dump_threads.py in new pid and mount namespaces");
    let host_pid = tests::namespaced_child(workload.pid());
    let doc = dump_json(host_pid, &[]);
    let ns_sleeper = workload.printed("sleeper");
    // While it runs: the host's thread ids of the process.
    let host_tids: Vec<u64> = std::fs::read_dir(format!("/proc/{host_pid}/task"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    drop(workload);
    let _ = std::fs::remove_file(&inside);
    let p = &doc["processes"][0];
    assert_eq!(p["ns_pid"], 1, "{p}");
    let sleeper = p["threads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["ns_tid"].as_u64() == ns_sleeper.parse().ok())
        .unwrap_or_else(|| panic!("no thread with ns tid {ns_sleeper}: {p}"));
    let tid = sleeper["tid"].as_u64().unwrap();
    assert_ne!(tid.to_string(), ns_sleeper, "the host tid is shown");
    assert!(
        host_tids.contains(&tid),
        "thread {tid} is not one of {host_pid}'s on the host: {host_tids:?}"
    );
    assert_eq!(sleeper["name"], "sleeper");
    assert_eq!(sleeper["frames"][0]["function"], "nap", "{sleeper}");
}

/// The progress counter `dump_busy.py` keeps in its mapped file (0 before it starts).
fn progress(path: &std::path::Path) -> u64 {
    std::fs::read(path)
        .ok()
        .and_then(|b| Some(u64::from_le_bytes(b.get(..8)?.try_into().ok()?)))
        .unwrap_or(0)
}

/// The host path of a file the workload under `interp` writes at `inside` (its chroot's for
/// the sid interpreters).
fn host_path(interp: &tests::Interpreter, inside: &std::path::Path) -> std::path::PathBuf {
    match &interp.root {
        Some(root) => root.join(inside.strip_prefix("/").unwrap()),
        None => inside.to_path_buf(),
    }
}

/// Median and maximum.
fn median_max(values: &mut [f64]) -> (f64, f64) {
    values.sort_by(|a, b| a.total_cmp(b));
    let n = values.len();
    match n {
        0 => (0.0, 0.0),
        _ => (values[n / 2], values[n - 1]),
    }
}

/// A CPU-bound process whose stack changes depth and functions tens of thousands of times a
/// second (alternating recursion 5–40 deep), one per interpreter, all running at once: 50
/// dumps of all of them. Every dump must show each main thread's whole stack: rooted at
/// `<module>`, checked (not "changed while read"), every frame a function the workload has at a
/// line it can be on, each called by a function that calls it. The targets keep running: their
/// progress counters advance across every dump and no thread is ever seen stopped. Prints how
/// many stacks came from the interrupt and how many from userspace.
#[test]
fn dump_a_cpu_bound_process_whole_every_time() {
    const DUMPS: usize = 50;
    let interps = interpreters_logged();
    let lines = marker_lines("dump_busy.py");
    // function → the lines it can be on.
    let mut allowed: HashMap<String, std::collections::HashSet<u64>> = HashMap::new();
    for (marker, &line) in &lines {
        let function = marker.split('_').next().unwrap();
        let function = match function {
            "module" => "<module>",
            f => f,
        };
        allowed
            .entry(function.to_string())
            .or_default()
            .insert(line as u64);
    }
    // callee → its callers.
    let callers: HashMap<&str, &[&str]> = HashMap::from([
        ("leaf", &["red", "green", "blue"][..]),
        ("red", &["blue", "<module>"][..]),
        ("green", &["red"][..]),
        ("blue", &["green"][..]),
    ]);
    let mut targets = Vec::new();
    for interp in &interps {
        let inside = temp_path("dump-busy-progress", "bin");
        let host = host_path(interp, &inside);
        let workload = Workload::start(interp, "dump_busy.py", &[inside.to_str().unwrap()]);
        targets.push((interp, workload, host));
    }
    let pids: Vec<String> = targets.iter().map(|t| t.1.pid().to_string()).collect();
    let done = Arc::new(AtomicBool::new(false));
    let watchers: Vec<_> = targets
        .iter()
        .map(|t| watch_for_stops(t.1.pid(), done.clone()))
        .collect();
    let mut args: Vec<&str> = pids.iter().flat_map(|p| ["-p", p.as_str()]).collect();
    args.push("--json");
    // Per interpreter: stacks from the interrupt, from userspace; problems.
    let mut counts: Vec<(u32, u32)> = vec![(0, 0); targets.len()];
    let mut problems: Vec<Vec<String>> = vec![Vec::new(); targets.len()];
    let mut window_ms = Vec::new();
    let mut whole = vec![0u32; targets.len()];
    for n in 0..DUMPS {
        let before: Vec<u64> = targets.iter().map(|t| progress(&t.2)).collect();
        let out = dump(&args);
        let after: Vec<u64> = targets.iter().map(|t| progress(&t.2)).collect();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "dump {n} failed: {stderr}");
        let doc: Value = serde_json::from_slice(&out.stdout).expect("dump --json is JSON");
        window_ms.push(doc["window"]["ms"].as_f64().unwrap_or(-1.0));
        for (k, (interp, workload, _)) in targets.iter().enumerate() {
            let mut bad = |what: String| problems[k].push(format!("dump {n}: {what}"));
            if after[k] <= before[k] {
                bad(format!(
                    "progress {} → {}: the target did not run during the dump",
                    before[k], after[k]
                ));
            }
            let Some(p) = doc["processes"]
                .as_array()
                .and_then(|ps| ps.iter().find(|p| p["pid"] == workload.pid()))
            else {
                bad(format!("no process {} in {doc}", workload.pid()));
                continue;
            };
            let Some(main) = p["threads"]
                .as_array()
                .and_then(|ts| ts.iter().find(|t| t["tid"] == workload.pid()))
            else {
                bad(format!("no main thread in {p}"));
                continue;
            };
            match main["source"].as_str() {
                Some("interrupt") => counts[k].0 += 1,
                Some("userspace") => counts[k].1 += 1,
                other => bad(format!("stack source {other:?}: {main}")),
            }
            let f = frames(main);
            let mut ok = main["consistent"] == true
                && main["error"].is_null()
                && main["truncated"] == false
                && f.last().is_some_and(|(name, _)| name == "<module>");
            for (i, (function, line)) in f.iter().enumerate() {
                let known = allowed
                    .get(function)
                    .is_some_and(|lines| lines.contains(line));
                let called_right = match f.get(i + 1) {
                    Some((caller, _)) => callers
                        .get(function.as_str())
                        .is_some_and(|c| c.contains(&caller.as_str())),
                    None => function == "<module>",
                };
                ok &= known && called_right;
            }
            if ok {
                whole[k] += 1;
            } else {
                bad(format!("{} stack not whole: {main}", interp.label));
            }
        }
    }
    // --locals: read after the stack was taken, so a frame that returned since shows none,
    // and a frame that is still there shows its own: red/green/blue's (n, k), one less n
    // than its caller's; leaf's (k, x, i).
    args.push("--locals");
    let (mut with_locals, mut returned) = (0, 0);
    for n in 0..10 {
        let out = dump(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc: Value = serde_json::from_slice(&out.stdout).expect("dump --json is JSON");
        for (k, (_, workload, _)) in targets.iter().enumerate() {
            let main = doc["processes"]
                .as_array()
                .and_then(|ps| ps.iter().find(|p| p["pid"] == workload.pid()))
                .and_then(|p| {
                    p["threads"]
                        .as_array()?
                        .iter()
                        .find(|t| t["tid"] == workload.pid())
                });
            let Some(main) = main else {
                problems[k].push(format!("--locals dump {n}: no main thread"));
                continue;
            };
            if main["source"] == "interrupt" && !main["locals_read_after_ms"].is_number() {
                problems[k].push(format!(
                    "--locals dump {n}: not marked as read after: {main}"
                ));
            }
            let frames = main["frames"].as_array().cloned().unwrap_or_default();
            let value = |f: &Value, name: &str| {
                f["locals"]
                    .as_array()?
                    .iter()
                    .find(|l| l["name"] == name)
                    .and_then(|l| l["value"].as_str()?.parse::<i64>().ok())
            };
            for (i, f) in frames.iter().enumerate() {
                let Some(locals) = f["locals"].as_array() else {
                    returned += f["locals_unavailable"].is_string() as u32;
                    continue;
                };
                with_locals += 1;
                let names: Vec<&str> = locals.iter().filter_map(|l| l["name"].as_str()).collect();
                let function = f["function"].as_str().unwrap_or("");
                let allowed: &[&str] = match function {
                    "red" | "green" | "blue" => &["n", "k"],
                    "leaf" => &["k", "x", "i"],
                    _ => &[],
                };
                let mut ok = names.iter().all(|n| allowed.contains(n));
                if let (Some(callee_n), Some(caller)) = (value(f, "n"), frames.get(i + 1)) {
                    if let Some(caller_n) = value(caller, "n") {
                        ok &= callee_n == caller_n - 1;
                    }
                }
                // A frame whose n is 0 calls the leaf: if it shows n = 0 under another callee,
                // its variables are a later call's.
                if value(f, "n") == Some(0) && i > 0 {
                    ok &= frames[i - 1]["function"] == "leaf";
                }
                if function == "leaf" {
                    if let (Some(k1), Some(k2)) =
                        (value(f, "k"), frames.get(i + 1).and_then(|c| value(c, "k")))
                    {
                        ok &= k1 == k2;
                    }
                }
                if !ok {
                    problems[k].push(format!(
                        "--locals dump {n}: frame {i} has another frame's variables: {main}"
                    ));
                }
            }
        }
    }
    eprintln!("--locals: {with_locals} frames with their variables, {returned} returned before they were read");
    done.store(true, Ordering::Relaxed);
    let stops: Vec<String> = watchers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    let (median, max) = median_max(&mut window_ms);
    eprintln!(
        "{DUMPS} dumps of {} processes; window median {median} ms, max {max} ms",
        targets.len()
    );
    for (k, (interp, _, host)) in targets.iter().enumerate() {
        let (interrupt, userspace) = counts[k];
        eprintln!(
            "{}: {} of {DUMPS} whole; main thread from the interrupt {interrupt} ({:.0}%), \
             from userspace {userspace} ({:.0}%)",
            interp.label,
            whole[k],
            100.0 * interrupt as f64 / DUMPS as f64,
            100.0 * userspace as f64 / DUMPS as f64,
        );
        let _ = std::fs::remove_file(host);
    }
    drop(targets);
    assert!(stops.is_empty(), "a thread was stopped: {stops:?}");
    let problems: Vec<String> = problems.into_iter().flatten().collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// One busy thread and three sleeping ones, named only through `threading`: on every
/// interpreter each of the five threads shows its `threading` name (the OS knows them as
/// `python3.X` before 3.14, and cuts them at 15 bytes from 3.14), the busy thread's stack comes
/// from the interrupt and the sleeping ones' from userspace, checked, at their marked lines.
#[test]
fn dump_names_threads_as_threading_does() {
    let interps = interpreters_logged();
    let lines = marker_lines("dump_named.py");
    let names = [
        "MainThread",
        "busy-cruncher-thread",
        "sleeping-in-time-sleep",
        "waiting-on-an-event",
        "blocked-on-a-lock",
    ];
    // name → (function at the top of its marked frames, lines it may be on, source).
    let expect: HashMap<&str, (&str, Vec<u32>, &str)> = HashMap::from([
        ("MainThread", ("main", vec![lines["main"]], "userspace")),
        (
            "busy-cruncher-thread",
            (
                "crunch",
                vec![lines["crunch"], lines["crunch_loop"]],
                "interrupt",
            ),
        ),
        (
            "sleeping-in-time-sleep",
            ("doze", vec![lines["doze"]], "userspace"),
        ),
        (
            "waiting-on-an-event",
            ("wait_event", vec![lines["wait_event"]], "userspace"),
        ),
        (
            "blocked-on-a-lock",
            ("hold_lock", vec![lines["hold_lock"]], "userspace"),
        ),
    ]);
    let mut failures = Vec::new();
    for interp in &interps {
        let workload = Workload::start(interp, "dump_named.py", &[]);
        let pid = workload.pid();
        let tids: HashMap<&str, String> = names.iter().map(|&n| (n, workload.printed(n))).collect();
        // A generous window: the busy thread must get a CPU on a loaded machine.
        let docs: Vec<Value> = (0..3)
            .map(|_| dump_json(pid, &["--window", "2000"]))
            .collect();
        let text = dump(&["-p", &pid.to_string(), "--window", "2000"]);
        drop(workload);
        let mut problems = Vec::new();
        for (n, doc) in docs.iter().enumerate() {
            let count = doc["processes"][0]["threads"].as_array().map(|t| t.len());
            if count != Some(5) {
                problems.push(format!("dump {n}: {count:?} threads"));
            }
            for name in names {
                let t = thread(doc, &tids[name]);
                let (function, at, source) = &expect[name];
                let f = frames(t);
                let top = f.iter().find(|(fun, _)| fun == function);
                let ok = t["name"] == name
                    && t["name_source"] == "threading"
                    && t["source"] == *source
                    && t["consistent"] == true
                    && top.is_some_and(|(_, line)| at.contains(&(*line as u32)))
                    && f.last()
                        .is_some_and(|(fun, _)| fun == "<module>" || fun.ends_with("_bootstrap"));
                let state_ok = match *source {
                    "interrupt" => t["state"] == "running",
                    _ => t["state"] == "idle",
                };
                // Before 3.14 the OS knows none of these names.
                let os_ok =
                    interp.version >= (3, 14) || name == "MainThread" || t["os_name"] != name;
                if !(ok && state_ok && os_ok) {
                    problems.push(format!("dump {n}: {name}: {t}"));
                }
            }
        }
        let text = String::from_utf8_lossy(&text.stdout);
        for name in names {
            if !text.contains(&format!("Thread {} \"{name}\"", tids[name])) {
                problems.push(format!("text dump lacks {name}:\n{text}"));
            }
        }
        eprintln!("{}: ok={}", interp.label, problems.is_empty());
        if !problems.is_empty() {
            failures.push(format!("{}:\n  {}", interp.label, problems.join("\n  ")));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `--async` on 3.14+: the task running on a CPU (the event loop's thread is busy in it) gets
/// its coroutine stack from the sampler's interrupt, like its thread; the suspended tasks are
/// copied from userspace and checked.
#[test]
fn dump_async_takes_the_running_task_from_the_interrupt() {
    let interps: Vec<_> = interpreters_logged()
        .into_iter()
        .filter(|i| i.version >= (3, 14))
        .collect();
    assert!(
        interps.len() >= 2,
        "the sid 3.14 and 3.15 interpreters are required"
    );
    let lines = marker_lines("dump_async_busy.py");
    const DUMPS: usize = 5;
    let mut failures = Vec::new();
    for interp in &interps {
        let workload = Workload::start(interp, "dump_async_busy.py", &[]);
        let pid = workload.pid();
        let docs: Vec<Value> = (0..DUMPS)
            .map(|_| dump_json(pid, &["--async", "--window", "2000"]))
            .collect();
        drop(workload);
        let mut problems = Vec::new();
        let mut from_interrupt = 0;
        for (n, doc) in docs.iter().enumerate() {
            let tasks = doc["processes"][0]["tasks"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let task = |name: &str| tasks.iter().find(|t| t["name"] == name);
            let Some(cruncher) = task("cruncher") else {
                problems.push(format!("dump {n}: no cruncher task: {doc}"));
                continue;
            };
            let stack: Vec<(String, u64)> = cruncher["coroutine_stack"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|f| {
                    (
                        f["function"].as_str().unwrap_or("").to_string(),
                        f["line"].as_u64().unwrap_or(0),
                    )
                })
                .collect();
            if cruncher["source"] == "interrupt" {
                from_interrupt += 1;
                // Leaf first: crunch at one of its lines, then the task's coroutine, last.
                let ok = stack.first().is_some_and(|(f, l)| {
                    f == "crunch" && [lines["crunch"], lines["crunch_loop"]].contains(&(*l as u32))
                }) && stack
                    .last()
                    .is_some_and(|(f, l)| f == "cruncher" && *l as u32 == lines["cruncher"])
                    && cruncher["consistent"] == true;
                if !ok {
                    problems.push(format!("dump {n}: cruncher from the interrupt: {cruncher}"));
                }
            }
            for name in ["idle-1", "idle-2"] {
                let ok = task(name).is_some_and(|t| {
                    t["source"] == "userspace"
                        && t["consistent"] == true
                        && t["coroutine_stack"]
                            .as_array()
                            .and_then(|s| s.last())
                            .is_some_and(|f| f["function"] == "idle" && f["line"] == lines["idle"])
                });
                if !ok {
                    problems.push(format!("dump {n}: {name}: {:?}", task(name)));
                }
            }
        }
        // The loop runs something other than crunch() for well under 1% of the time.
        if from_interrupt + 1 < DUMPS {
            problems.push(format!(
                "the cruncher came from the interrupt in {from_interrupt} of {DUMPS} dumps"
            ));
        }
        eprintln!(
            "{}: cruncher from the interrupt in {from_interrupt} of {DUMPS}; ok={}",
            interp.label,
            problems.is_empty()
        );
        if !problems.is_empty() {
            failures.push(format!("{}:\n  {}", interp.label, problems.join("\n  ")));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
