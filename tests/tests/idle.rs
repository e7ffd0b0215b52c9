//! `record --idle`: threads that are off-CPU are sampled from the interpreter's thread list.
//!
//! `idle.py` runs one thread burning CPU and one blocked in `time.sleep()` inside
//! `sleepy_wait`. With `--idle --threads` the sleeping thread shows up with about
//! duration × rate samples, its stack ending in `<idle>`; without `--idle` it is absent.

use tests::{interpreters_logged, marker_lines, parse_label, record, Recording, Workload};

const SECONDS: f64 = 3.0;
const RATE: u64 = 100;

fn thread_stacks<'a>(
    rec: &'a Recording,
    tid: &'a str,
) -> impl Iterator<Item = &'a (Vec<String>, u64)> + 'a {
    let prefix = format!("thread {tid} (");
    rec.stacks
        .iter()
        .filter(move |(s, _)| s.iter().any(|f| f.starts_with(&prefix)))
}

#[test]
fn idle_threads_are_sampled_at_the_rate() {
    let interps = interpreters_logged();
    assert!(!interps.is_empty(), "no supported interpreter found");
    let sleep_line = marker_lines("idle.py")["sleep"];
    let expected = SECONDS * RATE as f64;
    let rate = RATE.to_string();
    let duration = SECONDS.to_string();
    let mut failures = Vec::new();
    for interp in &interps {
        let workload = Workload::start(interp, "idle.py", &[]);
        let pid = workload.pid().to_string();
        let sleepy = workload.printed("sleepy");
        let busy = workload.printed("busy");
        let args = ["-p", &pid, "-d", &duration, "-r", &rate, "--threads"];
        let with = record(&[&args[..], &["--idle"]].concat());
        let without = record(&args);
        drop(workload);
        for rec in [&with, &without] {
            assert!(rec.status.success(), "{}: {}", interp.label, rec.stderr);
        }
        // The sleeping thread: every stack is sleepy_wait at the sleep line, then <idle>.
        let (mut sleeping, mut exact) = (0, 0);
        for (stack, count) in thread_stacks(&with, &sleepy) {
            sleeping += count;
            let leaf = stack.iter().rev().nth(1).and_then(|f| parse_label(f));
            if stack.last().map(String::as_str) == Some("<idle>")
                && leaf.is_some_and(|l| l.function == "sleepy_wait" && l.line == sleep_line)
            {
                exact += count;
            }
        }
        let busy_cpu: u64 = thread_stacks(&with, &busy)
            .filter(|(s, _)| s.last().is_some_and(|f| f.starts_with("busy_loop (")))
            .map(|(_, c)| c)
            .sum();
        let busy_idle: u64 = thread_stacks(&with, &busy)
            .filter(|(s, _)| s.last().is_some_and(|f| f == "<idle>"))
            .map(|(_, c)| c)
            .sum();
        let absent: u64 = thread_stacks(&without, &sleepy).map(|(_, c)| c).sum();
        let without_idle: u64 = without
            .stacks
            .iter()
            .filter(|(s, _)| s.iter().any(|f| f == "<idle>"))
            .map(|(_, c)| c)
            .sum();
        eprintln!(
            "{}: --idle: sleeping thread {sleeping} samples ({exact} at sleepy_wait:{sleep_line} + <idle>, expected ~{expected}), busy thread {busy_cpu} on CPU, {busy_idle} <idle>; without --idle: sleeping thread {absent}, <idle> {without_idle}",
            interp.label
        );
        // Within ±25 % of duration × rate; the busy thread is never idle (on a loaded machine
        // it waits for a CPU at times, runnable: that is not idle either).
        let ok = (sleeping as f64 - expected).abs() <= 0.25 * expected
            && exact as f64 >= 0.95 * sleeping as f64
            && busy_cpu > 0
            && busy_idle == 0
            && absent == 0
            && without_idle == 0;
        if !ok {
            failures.push(format!(
                "{}: sleeping {sleeping} (exact {exact}), busy {busy_cpu} ({busy_idle} idle), without --idle {absent}/{without_idle}\n{}",
                interp.label, with.stderr
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
