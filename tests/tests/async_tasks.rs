//! `record --async`: `<task NAME>` frames and awaiter chains for asyncio programs, under every
//! interpreter the machine has.
//!
//! `task_tree.py` is a task tree in the shape of pyperformance's async_tree (TaskGroup and
//! gather levels, default task names, CPU-bound leaves, tens of thousands of tasks a second)
//! with a task the program named `ingest` beside it: its profile must fold into the tree's
//! coroutines (a bounded number of stacks, whatever the number of tasks), lose at most 2 % of
//! its task samples, and show at every `<task X>` the coroutine the tree has there.
//! `tasks.py` runs the tasks alpha, beta and gamma (CPU slices 4, 2 and 1 ms, round-robin)
//! under the chain main → parent → {alpha, beta via `gather` in `supervise()`, gamma via a
//! `TaskGroup`}, and measures each task's own CPU time. On 3.14+ every task's samples must end
//! in its chain of `<task …>` frames, and pyebpf's share of samples per task must match the
//! workload's measured share within 3 percentage points. On 3.11–3.13 `--async` is named once
//! as needing 3.14+ and the process is still sampled.

use std::collections::HashMap;
use std::path::PathBuf;

use tests::pprof::{Pprof, Trace};
use tests::{
    interpreters_logged, parse_label, pyebpf_bin, record, slowdown, temp_path, Interpreter,
    Recording, Workload,
};

/// Allowed difference between pyebpf's and the workload's share of a task.
const SHARE_TOLERANCE_PP: f64 = 3.0;
const TASKS: [&str; 3] = ["alpha", "beta", "gamma"];

/// The task names of a root-first stack's `<task NAME>` frames, root first.
fn task_chain(stack: &[String]) -> Vec<&str> {
    stack
        .iter()
        .filter_map(|f| f.strip_prefix("<task ")?.strip_suffix('>'))
        .collect()
}

/// The workload's CPU seconds per task, from the file it keeps up to date.
fn measured(path: &PathBuf) -> HashMap<String, f64> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let value: serde_json::Value = serde_json::from_str(&text).expect("shares file is JSON");
    TASKS
        .iter()
        .map(|t| (t.to_string(), value[t].as_f64().unwrap_or(0.0)))
        .collect()
}

/// Where the host sees a path the interpreter wrote to.
fn host_path(interp: &Interpreter, path: &str) -> PathBuf {
    match &interp.root {
        Some(root) => root.join(path.trim_start_matches('/')),
        None => PathBuf::from(path),
    }
}

fn shares(values: &HashMap<String, f64>) -> HashMap<String, f64> {
    let total: f64 = values.values().sum();
    values
        .iter()
        .map(|(k, v)| (k.clone(), 100.0 * v / total.max(f64::MIN_POSITIVE)))
        .collect()
}

/// The awaiter chain and the frames each task's samples must show (root first).
fn expected_chain(task: &str) -> Vec<&'static str> {
    match task {
        "alpha" => vec!["main", "parent", "alpha"],
        "beta" => vec!["main", "parent", "beta"],
        _ => vec!["main", "parent", "gamma"],
    }
}

/// Checks one 3.14+ recording; returns the problems found.
fn check_tasks(label: &str, rec: &Recording, expected: &HashMap<String, f64>) -> Vec<String> {
    let mut problems = Vec::new();
    let mut per_task: HashMap<String, u64> = HashMap::new();
    let mut right_chain: HashMap<String, u64> = HashMap::new();
    for (stack, count) in &rec.stacks {
        let chain = task_chain(stack);
        let Some(&leaf) = chain.last() else {
            continue;
        };
        if !TASKS.contains(&leaf) {
            continue;
        }
        *per_task.entry(leaf.to_string()).or_default() += count;
        // The chain, and between `<task parent>` and the leaf task: parent's frames, in
        // `supervise()` (it awaits the gather there); then the leaf task's own coroutine.
        let functions: Vec<String> = stack
            .iter()
            .map(|f| match parse_label(f) {
                Some(l) => l.function,
                None => f.clone(),
            })
            .collect();
        let at = |name: &str| functions.iter().position(|f| f == name);
        let ok = chain == expected_chain(leaf)
            && functions.first().map(String::as_str) == Some("<task main>")
            && at("<task main>") < at("main")
            && at("main") < at("<task parent>")
            && at("<task parent>") < at("parent")
            && at("parent") < at("supervise")
            && at("supervise") < at(&format!("<task {leaf}>"))
            && at(&format!("<task {leaf}>")).map(|i| i + 1) == at(leaf);
        if ok {
            *right_chain.entry(leaf.to_string()).or_default() += count;
        }
    }
    let total: u64 = per_task.values().sum();
    if total < 500 {
        problems.push(format!(
            "{label}: only {total} samples in tasks\n{}",
            rec.stderr
        ));
        return problems;
    }
    let got = shares(
        &per_task
            .iter()
            .map(|(k, v)| (k.clone(), *v as f64))
            .collect(),
    );
    for task in TASKS {
        let (g, e) = (
            got.get(task).copied().unwrap_or(0.0),
            expected.get(task).copied().unwrap_or(0.0),
        );
        let chained = right_chain.get(task).copied().unwrap_or(0);
        let samples = per_task.get(task).copied().unwrap_or(0);
        eprintln!(
            "{label}: <task {task}>: {g:.1}% of task samples (workload measured {e:.1}%), \
             {chained} of {samples} with the full chain"
        );
        if (g - e).abs() > SHARE_TOLERANCE_PP {
            problems.push(format!(
                "{label}: task {task}: pyebpf {g:.1}% vs measured {e:.1}% (±{SHARE_TOLERANCE_PP})"
            ));
        }
        if (chained as f64) < 0.95 * samples as f64 {
            let example = rec
                .stacks
                .iter()
                .find(|(s, _)| task_chain(s).last() == Some(&task))
                .map(|(s, _)| s.join(";"))
                .unwrap_or_default();
            problems.push(format!(
                "{label}: task {task}: {chained} of {samples} samples with the chain \
                 main → parent (supervise) → {task}; e.g. {example}"
            ));
        }
    }
    problems
}

#[test]
fn task_frames_follow_awaiters_with_the_measured_cpu_shares() {
    let interps = interpreters_logged();
    assert!(!interps.is_empty(), "no supported interpreter found");
    let mut failures = Vec::new();
    let mut async_runs = 0;
    for interp in &interps {
        let running = Workload::start(interp, "tasks.py", &[]);
        let pid = running.pid().to_string();
        if interp.minor() < 14 {
            let rec = record(&["-p", &pid, "-d", "2", "-r", "997", "--async"]);
            drop(running);
            let told = rec
                .stderr
                .lines()
                .filter(|l| l.contains("--async needs CPython 3.14+") && l.contains(&pid))
                .count();
            let tasks = rec
                .stacks
                .iter()
                .filter(|(s, _)| !task_chain(s).is_empty())
                .count();
            eprintln!(
                "{}: {} samples, told {told} time(s) that --async needs 3.14+",
                interp.label,
                rec.total()
            );
            if !rec.status.success() || told != 1 || rec.total() < 20 || tasks != 0 {
                failures.push(format!(
                    "{}: status {}, message {told} times (want 1), {} samples, {tasks} stacks \
                     with task frames\n{}",
                    interp.label,
                    rec.status,
                    rec.total(),
                    rec.stderr
                ));
            }
            continue;
        }
        async_runs += 1;
        let shares_file = host_path(interp, &running.printed("shares_file"));
        // The file is rewritten every 0.1 s: wait for its first version.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !shares_file.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let before = measured(&shares_file);
        let rec = record(&["-p", &pid, "-d", "5", "-r", "1999", "--async"]);
        let after = measured(&shares_file);
        drop(running);
        let _ = std::fs::remove_file(&shares_file);
        if !rec.status.success() {
            failures.push(format!("{}: record failed\n{}", interp.label, rec.stderr));
            continue;
        }
        let delta: HashMap<String, f64> = TASKS
            .iter()
            .map(|t| (t.to_string(), after[*t] - before[*t]))
            .collect();
        failures.extend(check_tasks(&interp.label, &rec, &shares(&delta)));
    }
    if async_runs == 0 {
        eprintln!("no CPython 3.14+ here: only the message for older versions was checked");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// `task_tree.py`'s arguments: levels of tasks below `main` (≥ 4) and tasks per level.
const TREE_DEPTH: usize = 5;
const TREE_BRANCHES: usize = 3;
const TREE_RATE: f64 = 997.0;
/// Seconds each tree recording lasts.
const TREE_SECONDS: &str = "6";
/// Share of task samples that may lose their task.
const MAX_UNREADABLE: f64 = 0.02;
/// Functions of `task_tree.py` a sample can run leafward of a task's coroutine (main, ingest,
/// both recursions, leaf, crunch), and asyncio functions a running task calls into (the
/// TaskGroup's and gather's task creation, call_soon, sleep, ...), which the
/// tree's levels reach through at most one path per function.
const TREE_FUNCTIONS: usize = 6;
const ASYNCIO_FUNCTIONS: usize = 18;

/// Distinct stacks (by function) with task frames a task-tree profile may have: one chain per
/// position a running task can have (each tree level, `main`, `ingest`), times the call paths
/// leafward of its coroutine. Derived from the workload's code and depth, not from how many
/// tasks it made (tens of thousands in one recording).
fn tree_stack_bound() -> usize {
    (TREE_DEPTH + 2) * (TREE_FUNCTIONS + ASYNCIO_FUNCTIONS)
}

/// CPU seconds `pid` has used (utime + stime of `/proc/PID/stat`; 100 ticks a second).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (tick(11) + tick(12)) as f64 / 100.0
}

/// Tasks `task_tree.py` has created so far, from its stats file.
fn tasks_made(path: &PathBuf) -> f64 {
    let deadline = std::time::Instant::now() + tests::stretch(std::time::Duration::from_secs(5));
    loop {
        let value = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
        if let Some(n) = value.and_then(|v| v["tasks"].as_f64()) {
            return n;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no stats in {}",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The workload running, with what it did during a recording.
struct Tree {
    running: Workload,
    stats_file: PathBuf,
}

impl Tree {
    fn start(interp: &Interpreter) -> Tree {
        let (depth, branches) = (TREE_DEPTH.to_string(), TREE_BRANCHES.to_string());
        let running = Workload::start(interp, "task_tree.py", &[&depth, &branches]);
        let stats_file = host_path(interp, &running.printed("stats_file"));
        Tree {
            running,
            stats_file,
        }
    }

    fn pid(&self) -> u32 {
        self.running.pid()
    }

    /// Runs `recording` and returns it with the CPU seconds the workload used meanwhile, the
    /// wall seconds that took, and the tasks it created per CPU second.
    fn during<R>(&self, recording: impl FnOnce() -> R) -> (R, f64, f64, f64) {
        let (cpu0, tasks0) = (cpu_seconds(self.pid()), tasks_made(&self.stats_file));
        let started = std::time::Instant::now();
        let r = recording();
        let wall = started.elapsed().as_secs_f64();
        let (cpu1, tasks1) = (cpu_seconds(self.pid()), tasks_made(&self.stats_file));
        let cpu = cpu1 - cpu0;
        (r, cpu, wall, (tasks1 - tasks0) / cpu.max(0.01))
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.stats_file);
    }
}

/// The function of a collapsed frame label (`<task X>` and markers as they are).
fn function(frame: &str) -> String {
    parse_label(frame).map_or_else(|| frame.to_string(), |l| l.function)
}

/// What is wrong with a root-first stack with task frames of `task_tree.py`, if anything: its
/// root task is `main` (the tree) or `ingest` (the named task); below `main`, the task `p`
/// levels down runs `AsyncTree.recurse_with_gather` when `p` is odd and
/// `AsyncTree.recurse_with_task_group` when even, `p` ≤ [`TREE_DEPTH`]; each `<task X>` is
/// followed by X's own coroutine, and a task awaiting another is suspended where the tree
/// awaits (a TaskGroup's exit, or gather).
fn tree_stack_problem(stack: &[String]) -> Option<String> {
    let functions: Vec<String> = stack.iter().map(|f| function(f)).collect();
    let tasks: Vec<usize> = (0..functions.len())
        .filter(|&i| functions[i].starts_with("<task "))
        .collect();
    if tasks.first() != Some(&0) {
        return Some("does not start at a task".into());
    }
    // The name shown for task `t` (index into `tasks`).
    let name = |t: usize| {
        let f = &functions[tasks[t]];
        f["<task ".len()..f.len() - 1].to_string()
    };
    // The frames of task `t` (index into `tasks`): from its coroutine to the next task.
    let frames = |t: usize| {
        let end = tasks.get(t + 1).copied().unwrap_or(functions.len());
        functions[tasks[t] + 1..end].to_vec()
    };
    let last = tasks.len() - 1;
    match name(0).as_str() {
        "ingest" => {
            return (tasks.len() != 1 || frames(0).first().map(String::as_str) != Some("ingest"))
                .then(|| "<task ingest> not the only task, or not running ingest".into());
        }
        "main" => {}
        other => return Some(format!("root task {other}")),
    }
    let tg = [
        "AsyncTree.recurse_with_task_group",
        "TaskGroup.__aexit__",
        "TaskGroup._aexit",
    ];
    let f0 = frames(0);
    if f0.first().map(String::as_str) != Some("main") {
        return Some("<task main> not running main".into());
    }
    if last > 0 && f0[1..] != tg {
        return Some(format!("main awaits its children from {:?}", &f0[1..]));
    }
    if last > TREE_DEPTH {
        return Some(format!(
            "{last} tasks below main (the tree has {TREE_DEPTH})"
        ));
    }
    for p in 1..=last {
        let expected = if p % 2 == 1 {
            "AsyncTree.recurse_with_gather"
        } else {
            "AsyncTree.recurse_with_task_group"
        };
        if name(p) != expected {
            return Some(format!(
                "task {p} below main is <task {}>, not {expected}",
                name(p)
            ));
        }
        let f = frames(p);
        if f.first().map(String::as_str) != Some(expected) {
            return Some(format!("<task {expected}> runs {:?}", f.first()));
        }
        let awaiting_ok = match p % 2 {
            1 => f.len() == 1,
            _ => f == tg,
        };
        if p < last && !awaiting_ok {
            return Some(format!("task {p} awaits its children from {f:?}"));
        }
    }
    None
}

/// The `async` block of `--stats-json`, and how long the recording sampled.
fn async_stats(path: &PathBuf) -> (serde_json::Value, f64) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    (
        value["async"].clone(),
        value["duration_s"].as_f64().unwrap_or(0.0),
    )
}

#[test]
fn a_task_tree_folds_into_its_coroutines() {
    let mut failures = Vec::new();
    let mut runs = 0;
    for interp in interpreters_logged().iter().filter(|i| i.minor() >= 14) {
        runs += 1;
        let label = &interp.label;
        let tree = Tree::start(interp);
        let pid = tree.pid().to_string();
        let stats_json = temp_path("async-stats", "json");
        let stats_arg = stats_json.to_string_lossy().into_owned();
        // Under emulation (vm-test's TCG) the guest's CPU clock cannot fire ~1000 times a
        // second and Python makes its tasks ~10x slower: the rate and the workload's pace are
        // scaled by the slowdown, the assertions are not.
        let tree_rate = (TREE_RATE / slowdown()).round();
        let rate = tree_rate.to_string();
        let (rec, cpu_total, wall, tasks_per_cpu_s) = tree.during(|| {
            record(&[
                "-p",
                &pid,
                "-d",
                TREE_SECONDS,
                "-r",
                &rate,
                "--async",
                "--stats-json",
                &stats_arg,
            ])
        });
        let (stats, sampled_s) = async_stats(&stats_json);
        let _ = std::fs::remove_file(&stats_json);
        // The CPU time of the sampling itself: pyebpf loads its programs first (seconds on a
        // busy machine), and the workload's CPU rate is steady.
        let cpu = cpu_total * (sampled_s / wall).min(1.0);
        drop(tree);
        if !rec.status.success() {
            failures.push(format!("{label}: record failed\n{}", rec.stderr));
            continue;
        }
        let n = |key: &str| stats[key].as_u64().unwrap_or(0);
        let (task_samples, unreadable) = (n("task_samples"), n("task_unreadable"));
        let floor = 0.5 * tree_rate * cpu;
        let task_stacks: Vec<&(Vec<String>, u64)> = rec
            .stacks
            .iter()
            .filter(|(s, _)| s.iter().any(|f| f.starts_with("<task ")))
            .collect();
        let in_tasks: u64 = task_stacks.iter().map(|(_, c)| c).sum();
        let by_function: std::collections::HashSet<Vec<String>> = task_stacks
            .iter()
            .map(|(s, _)| s.iter().map(|f| function(f)).collect())
            .collect();
        let bad: Vec<(String, String, u64)> = task_stacks
            .iter()
            .filter_map(|(s, c)| tree_stack_problem(s).map(|p| (p, s.join(";"), *c)))
            .collect();
        let ingest: u64 = task_stacks
            .iter()
            .filter(|(s, _)| s.first().map(String::as_str) == Some("<task ingest>"))
            .map(|(_, c)| c)
            .sum();
        let unfolded: u64 = task_stacks
            .iter()
            .filter(|(s, _)| s.iter().any(|f| numbered_default(f)))
            .map(|(_, c)| c)
            .sum();
        eprintln!(
            "{label}: {:.2} CPU s, {tasks_per_cpu_s:.0} tasks per CPU second; {} samples (floor \
             {floor:.0}), {task_samples} ran a task, {unreadable} unreadable; {in_tasks} samples \
             in {} distinct stacks with task frames ({} by function, bound {}); <task ingest> \
             {ingest}; {} stacks wrong",
            cpu,
            rec.total(),
            task_stacks.len(),
            by_function.len(),
            tree_stack_bound(),
            bad.len()
        );
        if tasks_per_cpu_s < 1000.0 / slowdown() {
            failures.push(format!(
                "{label}: the workload made only {tasks_per_cpu_s:.0} tasks per CPU second"
            ));
        }
        if (rec.total() as f64) < floor || task_samples == 0 {
            failures.push(format!(
                "{label}: {} samples ({task_samples} in tasks) for {cpu:.2} CPU s at {tree_rate} \
                 Hz (floor {floor:.0})\n{}",
                rec.total(),
                rec.stderr
            ));
            continue;
        }
        if unreadable as f64 > MAX_UNREADABLE * task_samples as f64 {
            failures.push(format!(
                "{label}: {unreadable} of {task_samples} task samples unreadable (max {:.0} %)\n{stats}",
                100.0 * MAX_UNREADABLE
            ));
        }
        // Bounded by the tree's shape, and far from one stack per task (or per sample).
        if by_function.len() > tree_stack_bound() || by_function.len() as u64 * 2 > in_tasks {
            failures.push(format!(
                "{label}: {} distinct stacks (by function) for {in_tasks} task samples (bound {})",
                by_function.len(),
                tree_stack_bound()
            ));
        }
        if let Some((problem, stack, count)) = bad.first() {
            failures.push(format!(
                "{label}: {} stacks whose tasks are not where the tree has them, e.g. {problem} \
                 ({count} samples): {stack}",
                bad.len()
            ));
        }
        if unfolded > 0 || ingest == 0 {
            failures.push(format!(
                "{label}: {unfolded} samples under a default-named <task Task-n> frame, {ingest} \
                 under <task ingest>"
            ));
        }
    }
    if runs == 0 {
        eprintln!("no CPython 3.14+ here: nothing to check");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// `--task-labels` puts the running task's own name in a `task_name` sample label, as `go tool
/// pprof` reads it from pprof and the upstream `opentelemetry-proto` classes read it from OTLP
/// (a sample attribute); without it, no sample has one.
#[test]
fn the_task_name_label_is_there_only_when_asked() {
    let mut failures = Vec::new();
    let pprof = Pprof::new();
    for interp in interpreters_logged().iter().filter(|i| i.minor() >= 14) {
        let label = &interp.label;
        let tree = Tree::start(interp);
        let pid = tree.pid().to_string();
        for (format, with_labels) in [
            ("pprof", true),
            ("pprof", false),
            ("otlp", true),
            ("otlp", false),
        ] {
            let label = format!("{label} -f {format}");
            let path = temp_path("task-labels", format);
            let mut args = vec!["record", "-f", format, "-d", "3", "-r", "499", "-p", &pid];
            args.push("--async");
            if with_labels {
                args.push("--task-labels");
            }
            let out = std::process::Command::new(pyebpf_bin())
                .args(&args)
                .arg("-o")
                .arg(&path)
                .output()
                .expect("running pyebpf");
            if !out.status.success() {
                failures.push(format!(
                    "{label}: {args:?} failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
                continue;
            }
            let traces = match format {
                "pprof" => pprof.traces(&path, &[]),
                _ => otlp_traces(&path, tree.pid()),
            };
            let _ = std::fs::remove_file(&path);
            // Leaf first: the root task is the last frame.
            let in_tasks: Vec<_> = traces
                .iter()
                .filter(|t| t.stack.iter().any(|f| f.starts_with("<task ")))
                .collect();
            let labelled = traces
                .iter()
                .filter(|t| t.labels.contains_key("task_name"))
                .count();
            let names: std::collections::HashSet<&str> = in_tasks
                .iter()
                .filter_map(|t| t.labels.get("task_name").map(String::as_str))
                .collect();
            let stacks: std::collections::HashSet<&Vec<String>> =
                in_tasks.iter().map(|t| &t.stack).collect();
            eprintln!(
                "{label}: --task-labels {with_labels}: {} traces, {} with task frames in {} \
                 stacks, {labelled} with task_name ({} distinct)",
                traces.len(),
                in_tasks.len(),
                stacks.len(),
                names.len()
            );
            if in_tasks.is_empty() {
                failures.push(format!("{label}: no sample with task frames"));
                continue;
            }
            if !with_labels {
                if labelled > 0 {
                    failures.push(format!(
                        "{label}: {labelled} samples with task_name without --task-labels"
                    ));
                }
                continue;
            }
            for t in &in_tasks {
                let root = t.stack.last().map(String::as_str).unwrap_or("");
                let name = t.labels.get("task_name").map(String::as_str);
                let ok = match (root, name) {
                    ("<task ingest>", Some(name)) => name == "ingest",
                    ("<task main>", Some(name)) => name
                        .strip_prefix("Task-")
                        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())),
                    _ => false,
                };
                if !ok {
                    failures.push(format!(
                        "{label}: a sample under {root} has task_name {name:?}: {t:?}"
                    ));
                    break;
                }
            }
            // The label keeps what the frames fold: many tasks, few stacks.
            if names.len() <= stacks.len() {
                failures.push(format!(
                    "{label}: {} task names for {} stacks",
                    names.len(),
                    stacks.len()
                ));
            }
        }
        drop(tree);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// A `record -f otlp` file as the upstream classes decode it, as pprof-like traces of `pid`'s
/// samples: function names leaf first (without `file:line`), string attributes as labels.
fn otlp_traces(path: &std::path::Path, pid: u32) -> Vec<Trace> {
    let request = tests::otlp::decode_file(path);
    assert_eq!(request["problems"], serde_json::json!([]), "{request}");
    let resources = tests::otlp::resources_with(&request, "process.pid", &serde_json::json!(pid));
    assert_eq!(resources.len(), 1, "one resource per process: {request}");
    tests::otlp::samples(resources[0])
        .into_iter()
        .map(|s| Trace {
            labels: s
                .attributes
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect(),
            count: s.value,
            stack: s
                .frames
                .iter()
                .map(|f| {
                    f.rsplit_once(' ')
                        .map_or(f.as_str(), |(name, _)| name)
                        .to_string()
                })
                .collect(),
        })
        .collect()
}

/// `top --async`: the tree's tasks are rows named by their coroutine (and `ingest` by its
/// name), each with the share of the CPU time spent on its behalf; no `Task-<n>` row.
#[test]
fn top_counts_the_time_spent_for_each_task() {
    let mut failures = Vec::new();
    for interp in interpreters_logged().iter().filter(|i| i.minor() >= 14) {
        let label = &interp.label;
        let tree = Tree::start(interp);
        let pid = tree.pid().to_string();
        let out = std::process::Command::new(pyebpf_bin())
            .args([
                "top", "--async", "--once", "--delay", "2", "-r", "499", "-p", &pid,
            ])
            .output()
            .expect("running pyebpf top");
        drop(tree);
        let stdout = String::from_utf8_lossy(&out.stdout);
        // Rows: `%Own %Total OwnTime TotalTime Process… Function`.
        let total = |task: &str| {
            stdout
                .lines()
                .find(|l| l.trim_end().ends_with(&format!("<task {task}>")))
                .and_then(|l| l.split_whitespace().nth(1)?.strip_suffix('%')?.parse().ok())
                .unwrap_or(0.0f64)
        };
        let (main, gather, group, ingest) = (
            total("main"),
            total("AsyncTree.recurse_with_gather"),
            total("AsyncTree.recurse_with_task_group"),
            total("ingest"),
        );
        eprintln!(
            "{label}: %Total of <task main> {main}, recurse_with_gather {gather}, \
             recurse_with_task_group {group}, ingest {ingest}"
        );
        // Every tree task's time is also main's; the named task runs beside the tree.
        let ok = out.status.success()
            && main > 0.0
            && gather > 0.0
            && group > 0.0
            && ingest > 0.0
            && gather <= main
            && main + ingest <= 100.0
            && !stdout.lines().any(|l| numbered_default(l.trim_end()));
        if !ok {
            failures.push(format!(
                "{label}: status {}\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// `dump --async` keeps the raw names the profiles fold: on the task tree, every task it reads
/// is `ingest` or asyncio's `Task-<n>` (the `asyncio.run` task, created first, `Task-1`),
/// never the coroutine name `record` shows instead.
#[test]
fn dump_keeps_the_raw_task_names() {
    let mut failures = Vec::new();
    for interp in interpreters_logged().iter().filter(|i| i.minor() >= 14) {
        let label = &interp.label;
        let tree = Tree::start(interp);
        // The tree is built and torn down level by level: a dump that lands between two
        // generations lists a handful of tasks. Up to five dumps, the first that lists ten tree
        // tasks is checked (the names are checked on whichever is kept).
        let mut attempt = 0;
        let (tasks, read, tree_tasks, odd, main) = loop {
            attempt += 1;
            let out = std::process::Command::new(pyebpf_bin())
                .args(["dump", "--json", "--async", "-p", &tree.pid().to_string()])
                .output()
                .expect("running pyebpf dump");
            if !out.status.success() {
                break (
                    Err(String::from_utf8_lossy(&out.stderr).into_owned()),
                    vec![],
                    0,
                    vec![],
                    vec![],
                );
            }
            let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("dump is JSON");
            let tasks = doc["processes"][0]["tasks"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            // The tree churns while dump reads it (a level's tasks all finish at once): a task freed
            // between the listing and its read is reported as unreadable, however many that is.
            let read: Vec<serde_json::Value> = tasks
                .iter()
                .filter(|t| t["error"].is_null())
                .cloned()
                .collect();
            let name = |t: &serde_json::Value| t["name"].as_str().unwrap_or("").to_string();
            // Innermost frame last: the coroutine the task was created with.
            let coroutine = |t: &serde_json::Value| {
                t["coroutine_stack"]
                    .as_array()
                    .and_then(|s| s.last())
                    .and_then(|f| f["function"].as_str())
                    .unwrap_or("")
                    .to_string()
            };
            let default = |n: &str| {
                n.strip_prefix("Task-")
                    .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            };
            let odd: Vec<_> = read
                .iter()
                .filter(|t| name(t) != "ingest" && !default(&name(t)))
                .map(|t| (name(t), coroutine(t)))
                .collect();
            let main: Vec<_> = read
                .iter()
                .filter(|t| coroutine(t) == "main")
                .map(&name)
                .collect();
            let tree_tasks = read
                .iter()
                .filter(|t| {
                    coroutine(t).starts_with("AsyncTree.recurse_with_") && default(&name(t))
                })
                .count();
            if tree_tasks >= 10 || attempt == 5 {
                break (Ok(tasks), read, tree_tasks, odd, main);
            }
        };
        drop(tree);
        let tasks = match tasks {
            Ok(tasks) => tasks,
            Err(stderr) => {
                failures.push(format!("{label}: dump failed: {stderr}"));
                continue;
            }
        };
        eprintln!(
            "{label}: {} tasks, {} read, {tree_tasks} tree tasks named Task-<n>, main {main:?}",
            tasks.len(),
            read.len()
        );
        if !odd.is_empty()
            || main != ["Task-1"]
            || !read.iter().any(|t| t["name"].as_str() == Some("ingest"))
            || tree_tasks < 10
        {
            failures.push(format!(
                "{label}: names other than ingest and Task-<n>: {odd:?}; main task {main:?}; \
                 {tree_tasks} tree tasks named Task-<n>; {} of {} tasks read",
                read.len(),
                tasks.len()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Whether `frame` (or a line ending in it) is a `<task Task-<n>>` frame: one frame per task,
/// which a default-named task must never get (`<task Task-?>`, a task whose coroutine could
/// not be named, folds them all into one).
fn numbered_default(frame: &str) -> bool {
    frame
        .rsplit("<task Task-")
        .next()
        .filter(|_| frame.contains("<task Task-"))
        .and_then(|rest| rest.strip_suffix('>'))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}
