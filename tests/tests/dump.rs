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
