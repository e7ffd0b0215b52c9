//! `pyebpf record` end to end: the real BPF programs sampling real interpreters.

use std::collections::HashMap;

use tests::{
    interpreters_logged, marker_lines, parse_label, record, record_command, PyLabel, Workload,
};

fn py(function: &str, file: &str, line: u32) -> PyLabel {
    PyLabel {
        function: function.into(),
        file: file.into(),
        line,
    }
}

/// `<module> → top → mid → leaf` with the right file:line for every frame, on every interpreter.
#[test]
fn chain_has_exact_frames_and_lines() {
    let interps = interpreters_logged();
    assert!(!interps.is_empty(), "no supported interpreter found");
    let lines = marker_lines("chain.py");
    let expected = vec![
        py("<module>", "chain.py", lines["module"]),
        py("top", "chain.py", lines["top"]),
        py("mid", "chain.py", lines["mid"]),
        py("leaf", "chain.py", lines["leaf"]),
    ];
    for interp in &interps {
        let workload = Workload::start(interp, "chain.py", &[]);
        let pid = workload.pid().to_string();
        let rec = record(&["-p", &pid, "-d", "2"]);
        drop(workload);
        assert!(
            rec.status.success(),
            "{}: pyebpf failed: {}",
            interp.label,
            rec.stderr
        );
        let total = rec.total();
        let exact: u64 = rec
            .stacks
            .iter()
            .filter(|(stack, _)| {
                stack
                    .iter()
                    .map(|f| parse_label(f))
                    .collect::<Option<Vec<_>>>()
                    == Some(expected.clone())
            })
            .map(|(_, c)| c)
            .sum();
        eprintln!(
            "{}: {exact}/{total} samples with the exact chain",
            interp.label
        );
        assert!(
            total >= 30,
            "{}: only {total} samples: {}",
            interp.label,
            rec.stderr
        );
        assert!(
            exact as f64 >= 0.95 * total as f64,
            "{}: {exact}/{total} samples match {expected:?}; stacks: {:#?}",
            interp.label,
            rec.stacks
        );
    }
}

/// Fixed work split 70/30 between two functions is measured within ±5 points.
#[test]
fn cpu_split_is_measured_within_five_points() {
    for interp in &interpreters_logged() {
        let workload = Workload::start(interp, "split.py", &[]);
        let pid = workload.pid().to_string();
        let rec = record(&["-p", &pid, "-d", "5", "-r", "1000"]);
        drop(workload);
        assert!(rec.status.success(), "{}: {}", interp.label, rec.stderr);
        let mut per: HashMap<&str, u64> = HashMap::new();
        for (stack, count) in &rec.stacks {
            for f in stack {
                if let Some(l) = parse_label(f) {
                    if l.function == "seventy" || l.function == "thirty" {
                        *per.entry(if l.function == "seventy" {
                            "seventy"
                        } else {
                            "thirty"
                        })
                        .or_default() += count;
                    }
                }
            }
        }
        let (s, t) = (
            per.get("seventy").copied().unwrap_or(0),
            per.get("thirty").copied().unwrap_or(0),
        );
        let n = s + t;
        eprintln!("{}: seventy {s}, thirty {t} of {n}", interp.label);
        assert!(
            n >= 1000,
            "{}: only {n} samples in the two functions",
            interp.label
        );
        let share = 100.0 * s as f64 / n as f64;
        assert!(
            (share - 70.0).abs() <= 5.0,
            "{}: seventy got {share:.1}% (expected 70 ± 5)",
            interp.label
        );
    }
}

/// Both threads' stacks appear, each under its own thread id and its `threading` name (the
/// OS calls both `python3.X` before 3.14).
#[test]
fn two_threads_are_attributed_to_their_tids() {
    for interp in &interpreters_logged() {
        let workload = Workload::start(interp, "threads.py", &[]);
        let (alpha, beta) = (workload.printed("alpha"), workload.printed("beta"));
        let names = [
            (alpha.clone(), workload.printed("alpha_name")),
            (beta.clone(), workload.printed("beta_name")),
        ];
        let pid = workload.pid().to_string();
        let rec = record(&["-p", &pid, "-d", "2", "--threads"]);
        drop(workload);
        assert!(rec.status.success(), "{}: {}", interp.label, rec.stderr);
        let mut seen: HashMap<(String, String), u64> = HashMap::new();
        for (stack, count) in &rec.stacks {
            let frame = stack.iter().find_map(|f| f.strip_prefix("thread "));
            for (tid, name) in &names {
                if frame.is_some_and(|f| f.starts_with(&format!("{tid} "))) {
                    assert_eq!(
                        frame,
                        Some(format!("{tid} ({name})").as_str()),
                        "{}: thread {tid} is named by threading",
                        interp.label
                    );
                }
            }
            let thread = frame.map(|t| t.split(' ').next().unwrap().to_string());
            let leaf = stack
                .last()
                .and_then(|f| parse_label(f))
                .map(|l| l.function);
            if let (Some(thread), Some(leaf)) = (thread, leaf) {
                *seen.entry((thread, leaf)).or_default() += count;
            }
        }
        eprintln!("{}: {seen:?}", interp.label);
        let alpha_ok = seen
            .get(&(alpha.clone(), "spin_alpha".into()))
            .copied()
            .unwrap_or(0);
        let beta_ok = seen
            .get(&(beta.clone(), "spin_beta".into()))
            .copied()
            .unwrap_or(0);
        assert!(
            alpha_ok >= 10 && beta_ok >= 10,
            "{}: alpha {alpha_ok}, beta {beta_ok} samples: {seen:?}",
            interp.label
        );
        let crossed: u64 = seen
            .iter()
            .filter(|((t, f), _)| {
                (t == &alpha && f == "spin_beta") || (t == &beta && f == "spin_alpha")
            })
            .map(|(_, c)| c)
            .sum();
        assert_eq!(
            crossed, 0,
            "{}: a thread got the other thread's function: {seen:?}",
            interp.label
        );
    }
}

/// Samples match the workload's own CPU time (utime + stime, as the kernel accounts it) ×
/// the rate within ±15 %: losing samples (or inventing them) fails.
#[test]
fn samples_match_cpu_time_times_rate() {
    // Not a multiple of the kernel's scheduler tick: sampling in step with the tick that
    // preempts the workload would over- or under-count it.
    const RATE: f64 = 199.0;
    let mut failures = Vec::new();
    for interp in &interpreters_logged() {
        let rec = record_command(interp, "cpu_time.py", &["3"], &["-r", &RATE.to_string()]);
        assert!(rec.status.success(), "{}: {}", interp.label, rec.stderr);
        let cpu: f64 = rec
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("cpu "))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{}: no cpu line in {:?}", interp.label, rec.stdout));
        let expected = cpu * RATE;
        let got = rec.samples_in("work") as f64;
        let error = (got - expected) / expected;
        eprintln!(
            "{}: {got} samples in work(), {cpu:.3} s CPU × {RATE} Hz = {expected:.0} ({:+.1} %)",
            interp.label,
            100.0 * error
        );
        if error.abs() > 0.15 {
            failures.push(format!(
                "{}: {got} samples for {expected:.0} expected ({:+.1} %)\n{}",
                interp.label,
                100.0 * error,
                rec.stderr
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `-- CMD` launches the program, profiles it, and exits with its exit code.
#[test]
fn command_mode_profiles_and_propagates_exit_code() {
    for interp in &interpreters_logged() {
        let rec = record_command(interp, "exit_code.py", &["1.5", "7"], &["-d", "30"]);
        eprintln!("{}: {}", interp.label, rec.stderr.trim());
        assert_eq!(
            rec.status.code(),
            Some(7),
            "{}: {}",
            interp.label,
            rec.stderr
        );
        let work = rec.samples_in("work");
        assert!(
            work >= 20,
            "{}: {work} samples in work(): {}",
            interp.label,
            rec.stderr
        );
    }
}
