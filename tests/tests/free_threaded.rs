//! Free-threaded CPython (`--disable-gil`; the 3.13t that `cargo xtask freethreaded` builds):
//! the build really has no GIL, threads running at the same time each get their own stack, and
//! a free-threaded process whose `_Py_DebugOffsets` do not validate is refused, never walked.
//!
//! Every other per-interpreter test runs on the free-threaded build too ([`tests::interpreters`]
//! lists it); `--gil` on it is checked in `threads_gil.rs`, `check`'s report in `check.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tests::pprof::{Pprof, Raw};

use tests::{
    interpreters_logged, marker_lines, one_line_error, parse_label, pyebpf_bin, record,
    record_command, Interpreter, PyLabel, Running, Workload, FREETHREADED_LABEL,
};

/// The free-threaded interpreters of this run (the 3.13t build, unless
/// `PYEBPF_TEST_INTERPRETERS` leaves it out on purpose: a missing build fails
/// [`interpreters_logged`]).
fn free_threaded() -> Vec<Interpreter> {
    let all = interpreters_logged();
    let ft: Vec<Interpreter> = all.into_iter().filter(|i| i.free_threaded).collect();
    if ft.is_empty() {
        eprintln!(
            "no free-threaded interpreter in this run ({FREETHREADED_LABEL} left out on purpose)"
        );
    }
    ft
}

/// The build exists and runs without a GIL: a build that silently kept its GIL (configure
/// without `--disable-gil`, or `PYTHON_GIL=1`) would pass every other test.
#[test]
fn the_free_threaded_build_has_no_gil() {
    for interp in free_threaded() {
        let out = interp
            .command_c(
                "import sys, sysconfig; \
                 print(sys._is_gil_enabled(), sysconfig.get_config_var('Py_GIL_DISABLED'))",
            )
            .env_remove("PYTHON_GIL")
            .output()
            .expect("running the free-threaded interpreter");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}: {}",
            interp.label,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            said.trim(),
            "False 1",
            "{}: sys._is_gil_enabled(), Py_GIL_DISABLED",
            interp.label
        );
    }
}

/// Four threads, each in its own functions, all busy at once: every sample of a thread ends in
/// that thread's own function at its exact line (never in another thread's, though all four
/// stacks change millions of times a second side by side), `--threads` shows exactly the four,
/// and each gets at least half the samples its CPU time stands for.
#[test]
fn four_threads_in_parallel_each_get_their_own_stack() {
    const RATE: f64 = 997.0;
    let lines = marker_lines("parallel.py");
    for interp in free_threaded() {
        // `record -- CMD`: sampled from the program's start, so each thread's own CPU time
        // (it prints it) × the rate is what that thread should get. The threads run until each
        // has had 0.5 s of CPU, however busy the machine is.
        let rec = record_command(
            &interp,
            "parallel.py",
            &["0.5"],
            &["-r", &RATE.to_string(), "--threads"],
        );
        let printed = |name: &str| {
            rec.stdout
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .unwrap_or_else(|| {
                    panic!(
                        "{}: parallel.py printed no {name}: {}",
                        interp.label, rec.stdout
                    )
                })
                .to_string()
        };
        let tids: Vec<String> = (0..4).map(|i| printed(&format!("t{i}"))).collect();
        let cpu: Vec<f64> = (0..4)
            .map(|i| printed(&format!("cpu{i}")).parse().unwrap())
            .collect();
        assert!(rec.status.success(), "{}: {}", interp.label, rec.stderr);

        let own = |i: usize| {
            let work = PyLabel {
                function: format!("work_{i}"),
                file: "parallel.py".into(),
                line: lines[&format!("work_{i}")],
            };
            let step = PyLabel {
                function: format!("step_{i}"),
                file: "parallel.py".into(),
                line: lines[&format!("step_{i}")],
            };
            (work, step)
        };
        let worker_frame = |l: &PyLabel, j: usize| {
            l.function == format!("work_{j}") || l.function == format!("step_{j}")
        };
        // thread id -> (samples, samples ending exactly in its own functions, the others)
        let mut per_thread: BTreeMap<String, (u64, u64, Vec<String>)> = BTreeMap::new();
        // Threads with a sample in any thread's work_N/step_N: what `--threads` shows busy.
        let mut busy: BTreeSet<String> = BTreeSet::new();
        for (stack, count) in &rec.stacks {
            let Some(at) = stack.iter().position(|f| f.starts_with("thread ")) else {
                panic!("{}: a stack without a thread: {stack:?}", interp.label);
            };
            let tid = stack[at]["thread ".len()..]
                .split(' ')
                .next()
                .unwrap()
                .to_string();
            let python: Vec<PyLabel> = stack[at + 1..]
                .iter()
                .filter_map(|f| parse_label(f))
                .collect();
            if python.iter().any(|l| (0..4).any(|j| worker_frame(l, j))) {
                busy.insert(tid.clone());
            }
            let entry = per_thread.entry(tid.clone()).or_default();
            entry.0 += count;
            let Some(i) = tids.iter().position(|t| *t == tid) else {
                // The main thread: its start-up (imports, starting the threads), then a join.
                continue;
            };
            let (work, step) = own(i);
            let n = python.len();
            let exact = (n >= 1 && python[n - 1] == work)
                || (n >= 2 && python[n - 2] == work && python[n - 1] == step);
            let in_own = python.iter().any(|l| worker_frame(l, i));
            let foreign = python
                .iter()
                .any(|l| (0..4).filter(|&j| j != i).any(|j| worker_frame(l, j)));
            if in_own && exact && !foreign {
                entry.1 += count;
            } else if in_own || foreign {
                entry.2.push(format!("{count} × {}", stack.join(";")));
            }
            // Else the thread's own start-up, before it entered work_N (`run`, `Event.set`).
        }
        eprintln!(
            "{}: per thread (samples, exact): {:?}; CPU s: {cpu:.2?}",
            interp.label,
            per_thread
                .iter()
                .map(|(t, (n, e, _))| (t.as_str(), *n, *e))
                .collect::<Vec<_>>()
        );
        let expected: BTreeSet<String> = tids.iter().cloned().collect();
        assert_eq!(
            busy, expected,
            "{}: --threads must show the four busy threads, each apart",
            interp.label
        );
        for (i, tid) in tids.iter().enumerate() {
            let (samples, exact, odd) = &per_thread[tid];
            // Every sample in its own work_N ends there exactly; none has another thread's
            // frames; the few others are its start-up.
            let startup = samples - exact - odd.len() as u64;
            assert!(
                odd.is_empty() && startup <= 2.max(samples / 20),
                "{}: thread t{i} ({tid}): {exact} of {samples} samples end exactly in work_{i}/step_{i}, {startup} in its start-up; the others: {odd:#?}",
                interp.label
            );
            let floor = 0.5 * cpu[i] * RATE;
            assert!(
                *samples > 0 && *samples as f64 >= floor,
                "{}: thread t{i} ({tid}) got {samples} samples for {:.2} s of CPU at {RATE} Hz (floor {floor:.0})",
                interp.label,
                cpu[i]
            );
        }
    }
}

/// A free-threaded process whose `_Py_DebugOffsets` do not validate (here its
/// `runtime_state.size` overwritten by the process itself, leaving no room for the
/// `interpreters_head` the walk starts from) is refused in one line naming it, and listed as
/// not profilable by `check`: pyebpf never walks memory whose layout it cannot trust.
#[test]
fn free_threaded_offsets_that_do_not_validate_are_refused() {
    const CORRUPT: &str = "\
import ctypes, time
runtime = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, '_PyRuntime'))
assert ctypes.string_at(runtime, 8) == b'xdebugpy'
assert int.from_bytes(ctypes.string_at(runtime + 16, 8), 'little') == 1  # free_threaded
# cookie, version, free_threaded, then runtime_state.size
ctypes.memmove(runtime + 24, (8).to_bytes(8, 'little'), 8)
print('ready', flush=True)
n = 0
while True: n = (n * 31 + 7) % 1000003
";
    for interp in free_threaded() {
        let mut child = interp
            .command_c(CORRUPT)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("starting the corrupting workload");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line.trim(), "ready", "{}", interp.label);
        let pid = child.id();

        let rec = record(&["-p", &pid.to_string(), "-d", "1"]);
        let check = Command::new(tests::pyebpf_bin())
            .args(["check", "--json"])
            .output()
            .expect("running pyebpf check");
        let _ = child.kill();
        let _ = child.wait();

        assert_eq!(
            rec.status.code(),
            Some(2),
            "{}: {}",
            interp.label,
            rec.stderr
        );
        let error = one_line_error(&rec.stderr);
        eprintln!("{}: {error}", interp.label);
        assert!(
            error.contains(&pid.to_string())
                && error.contains("free-threaded")
                && error.contains("runtime_state.interpreters_head"),
            "{}: {error}",
            interp.label
        );
        assert_eq!(
            rec.total(),
            0,
            "{}: samples of a refused process",
            interp.label
        );

        let report: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
        let refused = report["processes"]["unsupported"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"] == pid)
            .unwrap_or_else(|| {
                panic!(
                    "{}: check does not list pid {pid} as not profilable: {:#}",
                    interp.label, report["processes"]
                )
            });
        assert!(
            refused["reason"]
                .as_str()
                .is_some_and(|r| r.contains("implausible _Py_DebugOffsets")),
            "{}: {refused}",
            interp.label
        );
    }
}

/// `top` and the agent on a free-threaded process whose four threads are busy at once: top's
/// table has each thread's functions, and in the profile the agent serves, every sample of a
/// thread (its `tid` label) that is in its work_N ends there at the exact line, and none holds
/// another thread's functions.
#[test]
fn top_and_agent_keep_parallel_threads_apart() {
    let lines = marker_lines("parallel.py");
    for interp in free_threaded() {
        let workload = Workload::start(&interp, "parallel.py", &[]);
        let pid = workload.pid().to_string();
        let tids: Vec<String> = (0..4).map(|i| workload.printed(&format!("t{i}"))).collect();

        let top = Command::new(pyebpf_bin())
            .args(["top", "-p", &pid, "--once", "--delay", "3", "-r", "997"])
            .output()
            .expect("running pyebpf top");
        let table = String::from_utf8_lossy(&top.stdout);
        assert!(
            top.status.success(),
            "{}: top: {}",
            interp.label,
            String::from_utf8_lossy(&top.stderr)
        );
        for i in 0..4 {
            let shown = table.lines().any(|l| {
                l.contains(&format!(" {pid} "))
                    && (l.contains(&format!(" work_{i} (")) || l.contains(&format!(" step_{i} (")))
            });
            assert!(
                shown,
                "{}: top shows no row of thread t{i}:\n{table}",
                interp.label
            );
        }

        let mut agent = Running::start(&["agent", "--listen", "127.0.0.1:0", "-r", "997"]);
        agent.wait_for("serving /debug/pprof/profile", Duration::from_secs(120));
        let addr = agent
            .stderr
            .last()
            .unwrap()
            .rsplit("http://")
            .next()
            .unwrap()
            .trim()
            .to_string();
        let url = format!("http://{addr}/debug/pprof/profile?seconds=3&pid={pid}");
        // pprof's own timeout (1.5 × seconds) is too short for a loaded machine.
        let raw = Raw::parse(&Pprof::new().run(&["-raw", "-timeout", "120"], Path::new(&url)));
        agent.signal("TERM");
        let (status, stderr) = agent.finish(Duration::from_secs(60));
        assert!(status.success(), "{}: agent: {stderr}", interp.label);
        drop(workload);

        let frame =
            |f: &str, i: usize| format!("{f}_{i} parallel.py:{}", lines[&format!("{f}_{i}")]);
        let mut per_thread: BTreeMap<usize, i64> = BTreeMap::new();
        let mut wrong = Vec::new();
        for sample in &raw.samples {
            let frames: Vec<String> = raw
                .frames(sample)
                .iter()
                .map(|l| {
                    format!(
                        "{} {}:{}",
                        l.function,
                        l.file.rsplit('/').next().unwrap_or(&l.file),
                        l.line
                    )
                })
                .collect();
            let tid = sample.labels.get("tid").cloned().unwrap_or_default();
            let Some(i) = tids.iter().position(|t| *t == tid) else {
                continue;
            };
            *per_thread.entry(i).or_default() += sample.values[0];
            let mine = |f: &String| {
                f.starts_with(&format!("work_{i} ")) || f.starts_with(&format!("step_{i} "))
            };
            let worker = |f: &String| f.starts_with("work_") || f.starts_with("step_");
            let foreign = frames.iter().any(|f| worker(f) && !mine(f));
            let exact = frames.first() == Some(&frame("work", i))
                || (frames.first() == Some(&frame("step", i))
                    && frames.get(1) == Some(&frame("work", i)));
            if foreign || (frames.iter().any(mine) && !exact) {
                wrong.push(format!("t{i}: {frames:?}"));
            }
        }
        eprintln!("{}: agent samples per thread {per_thread:?}", interp.label);
        assert!(wrong.is_empty(), "{}: {wrong:#?}", interp.label);
        assert_eq!(
            per_thread.len(),
            4,
            "{}: the agent's profile lacks a thread: {per_thread:?}",
            interp.label
        );
    }
}
