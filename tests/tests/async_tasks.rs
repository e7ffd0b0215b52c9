//! `record --async`: `<task NAME>` frames and awaiter chains for asyncio programs, under every
//! interpreter the machine has.
//!
//! `tasks.py` runs the tasks alpha, beta and gamma (CPU slices 4, 2 and 1 ms, round-robin)
//! under the chain main → parent → {alpha, beta via `gather` in `supervise()`, gamma via a
//! `TaskGroup`}, and measures each task's own CPU time. On 3.14+ every task's samples must end
//! in its chain of `<task …>` frames, and pyebpf's share of samples per task must match the
//! workload's measured share within 3 percentage points. On 3.11–3.13 `--async` is named once
//! as needing 3.14+ and the process is still sampled.

use std::collections::HashMap;
use std::path::PathBuf;

use tests::{interpreters_logged, parse_label, record, Interpreter, Recording, Workload};

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
