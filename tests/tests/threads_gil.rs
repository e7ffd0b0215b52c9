//! `record --threads --gil`: only samples whose thread holds the GIL are kept.
//!
//! `gil.py` runs one thread spinning in pure Python (it holds the GIL whenever it runs) and one
//! hashing a 32 MiB buffer in a loop: `hashlib` releases the GIL for the whole digest, so that
//! thread is on a CPU without the GIL nearly all the time.

use tests::{interpreters_logged, record, Recording, Workload};

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
        let workload = Workload::start(interp, "gil.py", &[]);
        let pid = workload.pid().to_string();
        let python = workload.printed("python");
        let hash = workload.printed("hash");
        // Both at once, over the same seconds: the spinning thread's samples with --gil are
        // then comparable to all of its samples, whatever else the machine is doing.
        let (with, without) = std::thread::scope(|scope| {
            let with = scope.spawn(|| record(&["-p", &pid, "-d", "2", "--threads", "--gil"]));
            let without = record(&["-p", &pid, "-d", "2", "--threads"]);
            (with.join().unwrap(), without)
        });
        drop(workload);
        for rec in [&with, &without] {
            assert!(rec.status.success(), "{}: {}", interp.label, rec.stderr);
        }
        let (py_gil, hash_gil) = (
            thread_samples(&with, &python, "spin_python"),
            thread_samples(&with, &hash, "spin_hash"),
        );
        let (py_all, hash_all) = (
            thread_samples(&without, &python, "spin_python"),
            thread_samples(&without, &hash, "spin_hash"),
        );
        eprintln!(
            "{}: --gil: spin_python {py_gil}, spin_hash {hash_gil}; without: spin_python {py_all}, spin_hash {hash_all}",
            interp.label
        );
        // 2 s at 100 Hz: a thread on a CPU the whole time gets ~200 samples; the bounds leave
        // room for a loaded 2-CPU machine.
        // The spinning thread holds the GIL whenever it runs: --gil keeps (nearly) all of its
        // samples, not a token few.
        let ok = py_gil >= 30
            && py_gil as f64 >= 0.8 * py_all as f64
            && (hash_gil as f64) <= 0.05 * py_gil as f64
            && py_all >= 30
            && hash_all >= 30
            && !with.stderr.contains("does not expose its GIL");
        if !ok {
            failures.push(format!(
                "{}: --gil python {py_gil} hash {hash_gil}; without python {py_all} hash {hash_all}\n{}",
                interp.label, with.stderr
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
