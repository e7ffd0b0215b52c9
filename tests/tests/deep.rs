//! Deep stacks, address reuse, generators and coroutines (the kernel path plus userspace
//! completion), on real interpreters.

use std::collections::HashMap;

use tests::{
    interpreters_logged, marker_lines, parse_label, record, record_command, Interpreter, PyLabel,
    Workload,
};

fn labels(stack: &[String]) -> Vec<Option<PyLabel>> {
    stack.iter().map(|f| parse_label(f)).collect()
}

fn is_truncated(stack: &[String]) -> bool {
    stack
        .iter()
        .any(|f| f == "<truncated>" || f == "<partial stack>")
}

/// The `stacks:` summary line pyebpf printed, for the log.
fn stacks_summary(rec: &tests::Recording) -> &str {
    rec.stderr
        .lines()
        .find(|l| l.contains("stacks:"))
        .unwrap_or("")
}

/// Recursion 1000 deep: every sample reported complete has all 1001 `rec` frames, in order,
/// with the right lines, between `<module>` and `leaf`.
#[test]
fn recursion_1000_deep_is_complete_and_ordered() {
    let lines = marker_lines("deep.py");
    for interp in &interpreters_logged() {
        let workload = Workload::start(interp, "deep.py", &["1000"]);
        let pid = workload.pid().to_string();
        let rec = record(&["-p", &pid, "-d", "2", "-r", "200"]);
        drop(workload);
        assert!(rec.status.success(), "{}: {}", interp.label, rec.stderr);
        let mut expected = vec![PyLabel {
            function: "<module>".into(),
            file: "deep.py".into(),
            line: lines["module"],
        }];
        expected.extend((0..1000).map(|_| PyLabel {
            function: "rec".into(),
            file: "deep.py".into(),
            line: lines["rec"],
        }));
        expected.push(PyLabel {
            function: "rec".into(),
            file: "deep.py".into(),
            line: lines["rec_leaf"],
        });
        expected.push(PyLabel {
            function: "leaf".into(),
            file: "deep.py".into(),
            line: lines["leaf"],
        });
        let (mut complete, mut truncated) = (0, 0);
        for (stack, count) in &rec.stacks {
            if is_truncated(stack) {
                truncated += count;
                continue;
            }
            let got: Vec<PyLabel> = labels(stack)
                .into_iter()
                .map(|l| l.expect("python frame"))
                .collect();
            assert_eq!(
                got.len(),
                expected.len(),
                "{}: complete stack of {} frames",
                interp.label,
                got.len()
            );
            assert!(
                got == expected,
                "{}: complete stack differs from the recursion",
                interp.label
            );
            complete += count;
        }
        let stats = stacks_summary(&rec);
        eprintln!(
            "{}: {complete} complete, {truncated} truncated; {stats}",
            interp.label
        );
        assert!(
            complete >= 50,
            "{}: only {complete} complete samples: {}",
            interp.label,
            rec.stderr
        );
        assert!(
            complete >= 4 * truncated,
            "{}: {truncated} of {} truncated",
            interp.label,
            complete + truncated
        );
    }
}

/// Samples of chain a whole (root side `chain_a`/`branch_x` with leaf `leaf_x`), of chain b
/// whole, and of stacks holding parts of both: a root side with the other chain's leaf is
/// what a tail spliced from the wrong stack looks like.
fn chain_mixing(rec: &tests::Recording) -> (u64, u64, u64) {
    let (mut a, mut b, mut mixed) = (0, 0, 0);
    for (stack, count) in &rec.stacks {
        let names: Vec<String> = labels(stack)
            .into_iter()
            .flatten()
            .map(|l| l.function)
            .collect();
        let has = |n: &str| names.iter().any(|f| f == n);
        let root_a = has("chain_a") || has("branch_x");
        let root_b = has("chain_b") || has("branch_y");
        let (leaf_a, leaf_b) = (has("leaf_x"), has("leaf_y"));
        if (root_a || leaf_a) && (root_b || leaf_b) {
            mixed += count;
        } else if root_a && leaf_a {
            a += count;
        } else if root_b && leaf_b {
            b += count;
        }
    }
    (a, b, mixed)
}

/// Chains that alternate every ~2 ms at the same frame addresses are never mixed in one stack,
/// whether the kernel records them whole (shallow) or userspace completes them (300 deep):
/// each chain's leaf (recorded by the kernel) agrees with its root side (completed).
#[test]
fn alternating_chains_never_mix() {
    let interps = interpreters_logged();
    let picked: Vec<&Interpreter> = [11, 14, 15]
        .iter()
        .filter_map(|m| interps.iter().find(|i| i.minor() == *m))
        .collect();
    for interp in picked {
        for depth in ["0", "300"] {
            let workload = Workload::start(interp, "alternate.py", &[depth]);
            let pid = workload.pid().to_string();
            let secs = if depth == "0" { "6" } else { "4" };
            let rec = record(&["-p", &pid, "-d", secs, "-r", "2500"]);
            drop(workload);
            assert!(rec.status.success(), "{}: {}", interp.label, rec.stderr);
            let (a, b, mixed) = chain_mixing(&rec);
            let stats = stacks_summary(&rec);
            eprintln!(
                "{} depth {depth}: chain_a {a}, chain_b {b}, mixed {mixed}; {stats}",
                interp.label
            );
            assert_eq!(
                mixed, 0,
                "{} depth {depth}: {mixed} stacks hold both chains",
                interp.label
            );
            assert!(
                a >= 200 && b >= 200,
                "{} depth {depth}: chain_a {a}, chain_b {b}",
                interp.label
            );
            if depth == "0" {
                assert!(a + b >= 5000, "{}: only {} samples", interp.label, a + b);
            }
        }
    }
}

/// A generator's frame sits between its consumer and the work it calls; an awaited coroutine
/// between the coroutine awaiting it and its work.
#[test]
fn generator_and_coroutine_frames_are_in_place() {
    let lines = marker_lines("generators.py");
    for interp in &interpreters_logged() {
        for (mode, outer, inner) in [("gen", "consume", "produce"), ("async", "main", "compute")] {
            let workload = Workload::start(interp, "generators.py", &[mode]);
            let pid = workload.pid().to_string();
            let rec = record(&["-p", &pid, "-d", "3"]);
            drop(workload);
            assert!(rec.status.success(), "{}: {}", interp.label, rec.stderr);
            let (mut good, mut work_total) = (0, 0);
            for (stack, count) in &rec.stacks {
                let ls: Vec<PyLabel> = labels(stack).into_iter().flatten().collect();
                if ls.last().map(|l| l.function.as_str()) != Some("work") {
                    continue;
                }
                work_total += count;
                let n = ls.len();
                if n >= 3
                    && ls[n - 2].function == inner
                    && ls[n - 2].line == lines[inner]
                    && ls[n - 3].function == outer
                    && ls[n - 3].line == lines[outer]
                {
                    good += count;
                }
            }
            eprintln!(
                "{} {mode}: {good}/{work_total} samples in work() under {outer} → {inner}",
                interp.label
            );
            assert!(
                work_total >= 30,
                "{} {mode}: {work_total} samples in work(): {:#?}",
                interp.label,
                rec.stacks
            );
            assert!(
                good as f64 >= 0.95 * work_total as f64,
                "{} {mode}: {good}/{work_total}: {:#?}",
                interp.label,
                rec.stacks
            );
        }
    }
}

/// Fresh code objects compiled in a loop reuse freed ones' addresses; every sample still names
/// the function that ran, so no name absorbs the samples of the ones after it.
#[test]
fn replaced_code_objects_never_show_the_old_name() {
    for interp in &interpreters_logged() {
        let rec = record_command(
            interp,
            "exec_loop.py",
            &["100"],
            &["-r", "1000", "-d", "120"],
        );
        assert!(rec.status.success(), "{}: {}", interp.label, rec.stderr);
        let distinct: usize = rec
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("distinct "))
            .and_then(|l| l.split(' ').next())
            .and_then(|n| n.parse().ok())
            .expect("exec_loop printed its address count");
        let mut per: HashMap<String, u64> = HashMap::new();
        for (stack, count) in &rec.stacks {
            if let Some(l) = stack.last().and_then(|f| parse_label(f)) {
                if l.function.starts_with("fn_") {
                    *per.entry(l.function).or_default() += count;
                }
            }
        }
        let mut counts: Vec<u64> = per.values().copied().collect();
        counts.sort();
        let median = counts.get(counts.len() / 2).copied().unwrap_or(0);
        let max = counts.last().copied().unwrap_or(0);
        eprintln!(
            "{}: {} code addresses for 100 functions; {} names sampled, median {median}, max {max}",
            interp.label,
            distinct,
            per.len()
        );
        assert!(
            distinct <= 25,
            "{}: addresses were not reused ({distinct}), the test proves nothing",
            interp.label
        );
        assert!(
            per.len() >= 70,
            "{}: only {} of 100 functions seen",
            interp.label,
            per.len()
        );
        assert!(
            max <= 6 * median.max(1),
            "{}: one name got {max} samples (median {median}): stale names",
            interp.label
        );
    }
}

/// `--debug-bpf=limits` makes the BPF sampler say, through aya-log, that it stopped recording
/// a 300-frame stack at its frame limit (and completion still finishes those stacks); without
/// the flag the default programs, which carry no log code, say nothing.
#[test]
fn debug_bpf_reports_the_frame_limit() {
    let interps = interpreters_logged();
    let interp = interps.first().expect("no supported interpreter found");
    let workload = Workload::start(interp, "deep.py", &["300"]);
    let pid = workload.pid().to_string();
    let with = record(&["-p", &pid, "-d", "2", "--debug-bpf=limits"]);
    let without = record(&["-p", &pid, "-d", "1"]);
    drop(workload);
    assert!(with.status.success(), "{}", with.stderr);
    let says = format!("pid {pid} tid {pid}: stack deeper than the 128 frames recorded");
    let messages = with.stderr.lines().filter(|l| l.contains(&says)).count();
    eprintln!(
        "{}: {messages} limit messages, {} samples",
        interp.label,
        with.total()
    );
    assert!(
        messages >= 20 && with.total() >= 20,
        "{}: {messages} `{says}` lines for {} samples: {}",
        interp.label,
        with.total(),
        with.stderr
    );
    assert!(without.status.success(), "{}", without.stderr);
    assert!(
        !without.stderr.contains("stack deeper than"),
        "logged without --debug-bpf: {}",
        without.stderr
    );
}
