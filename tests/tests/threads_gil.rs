//! `record --threads --gil`: only samples whose thread holds the GIL are kept.
//!
//! `gil.py` runs one thread spinning in pure Python (it holds the GIL whenever it runs) and one
//! hashing a 32 MiB buffer in a loop: `hashlib` releases the GIL for the whole digest, so that
//! thread is on a CPU without the GIL nearly all the time. A free-threaded build has no GIL:
//! there `--gil` keeps every sample of both threads, and says so in one line.

use tests::{interpreters_logged, record, record_command, Recording, Workload};

/// Samples under the `thread <tid> (…)` frame of `tid` with a Python frame of `function`.
fn thread_samples(rec: &Recording, tid: &str, function: &str) -> u64 {
    let prefix = format!("thread {tid} (");
    rec.stacks
        .iter()
        .filter(|(s, _)| {
            s.iter().any(|f| f.starts_with(&prefix))
                && s.iter().any(|f| f.starts_with(&format!("{function} (")))
        })
        .map(|(_, c)| c)
        .sum()
}

#[test]
fn gil_keeps_only_gil_holders() {
    let interps = interpreters_logged();
    assert!(!interps.is_empty(), "no supported interpreter found");
    let mut failures = Vec::new();
    for interp in &interps {
        // With --gil: the whole program under `record -- CMD`, so the spinning thread's own
        // CPU time (it prints it) × the rate is what it should get.
        let with = record_command(
            interp,
            "gil.py",
            &["2"],
            &["-r", "997", "--threads", "--gil"],
        );
        let printed = |name: &str| {
            with.stdout
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .unwrap_or_else(|| panic!("{}: gil.py printed no {name}", interp.label))
                .to_string()
        };
        let (python, hash) = (printed("python"), printed("hash"));
        let spin_cpu: f64 = printed("spin_cpu").parse().unwrap();
        // Without --gil: both threads show.
        let workload = Workload::start(interp, "gil.py", &[]);
        let pid = workload.pid().to_string();
        let without = record(&["-p", &pid, "-d", "2", "-r", "997", "--threads"]);
        let (python_all, hash_all) = (workload.printed("python"), workload.printed("hash"));
        drop(workload);
        for rec in [&with, &without] {
            assert!(rec.status.success(), "{}: {}", interp.label, rec.stderr);
        }
        let (py_gil, hash_gil) = (
            thread_samples(&with, &python, "spin_python"),
            thread_samples(&with, &hash, "spin_hash"),
        );
        let (py_all, hash_all) = (
            thread_samples(&without, &python_all, "spin_python"),
            thread_samples(&without, &hash_all, "spin_hash"),
        );
        let expected = spin_cpu * 997.0;
        eprintln!(
            "{}: --gil: spin_python {py_gil} of {expected:.0} ({spin_cpu:.2} s CPU × 997 Hz), spin_hash {hash_gil}; without: spin_python {py_all}, spin_hash {hash_all}",
            interp.label
        );
        // The spinning thread holds the GIL whenever it runs: --gil keeps (nearly) all of the
        // samples its CPU time stands for, not a token few.
        let spinner_kept = py_gil as f64 >= 0.8 * expected && py_all >= 30 && hash_all >= 30;
        let ok = if interp.free_threaded {
            // No GIL: the hashing thread's samples are all kept too, nothing is left out, and
            // the one line says why.
            let said: Vec<&str> = with
                .stderr
                .lines()
                .filter(|l| {
                    l.contains(
                        "is free-threaded: it has no GIL, so --gil keeps every one of its samples",
                    )
                })
                .collect();
            spinner_kept && hash_gil >= 30 && said.len() == 1 && with.stderr.contains(" 0 left out")
        } else {
            spinner_kept
                && (hash_gil as f64) <= 0.05 * py_gil as f64
                && !with.stderr.contains("does not expose its GIL")
        };
        if !ok {
            failures.push(format!(
                "{}: --gil python {py_gil} of {expected:.0} hash {hash_gil}; without python {py_all} hash {hash_all}\n{}",
                interp.label, with.stderr
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
