//! `record --native`: native frames from the same interrupt as the Python ones, merged in call
//! order, under every interpreter the machine has (stack copies for builds without frame
//! pointers, the kernel's frame-pointer walk for those with them: sid's 3.14 and 3.15).
//!
//! `native.py` runs zlib, hashlib and a ctypes `qsort` with a Python comparison callback, one
//! thread each.

use tests::{interpreters_logged, marker_lines, parse_label, record, Recording, Workload};

/// A native frame label: `function (module)` (no `:line`).
fn is_native(label: &str) -> bool {
    parse_label(label).is_none()
        && label.ends_with(')')
        && !label.starts_with('<')
        && !label.starts_with("thread ")
}

/// The stacks (root first) whose Python projection has `function` at `line` as its leaf.
fn leaf_stacks<'a>(
    rec: &'a Recording,
    function: &'a str,
    line: u32,
) -> impl Iterator<Item = (&'a Vec<String>, u64)> + 'a {
    rec.stacks.iter().filter_map(move |(s, c)| {
        let leaf = s.iter().rev().find_map(|f| parse_label(f))?;
        (leaf.function == function && leaf.line == line).then_some((s, *c))
    })
}

/// The native frames leafward of the last Python frame of a root-first stack.
fn native_leaf(stack: &[String]) -> &[String] {
    let last_py = stack.iter().rposition(|f| parse_label(f).is_some());
    &stack[last_py.map_or(0, |i| i + 1)..]
}

/// `record --native` of `pid` for `secs` seconds.
fn record_native(pid: u32, secs: &str) -> Recording {
    let pid = pid.to_string();
    record(&["-p", &pid, "-d", secs, "--native"])
}

/// Under every interpreter, `workload` (a native.py thread) spends its time in C under
/// `function` at the `marker` line: nearly all of its samples must show a native frame
/// containing `native` between that line and the leaf, and only native frames there.
fn c_frames_under_their_line(workload: &str, function: &str, marker: &str, native: &str) {
    let interps = interpreters_logged();
    assert!(!interps.is_empty(), "no supported interpreter found");
    let line = marker_lines("native.py")[marker];
    let mut failures = Vec::new();
    for interp in &interps {
        let running = Workload::start(interp, "native.py", &[workload]);
        let rec = record_native(running.pid(), "3");
        drop(running);
        assert!(rec.status.success(), "{}: {}", interp.label, rec.stderr);
        let (mut with, mut total) = (0, 0);
        for (stack, count) in leaf_stacks(&rec, function, line) {
            total += count;
            let leaf = native_leaf(stack);
            if leaf.iter().all(|f| is_native(f))
                && leaf.iter().any(|f| f.to_lowercase().contains(native))
            {
                with += count;
            }
        }
        eprintln!(
            "{}: {function}: {with} of {total} samples at line {line} have a `{native}` frame \
             under them",
            interp.label
        );
        // Nearly all the thread's time is in the C call; a loaded machine and the samples
        // between calls leave some without.
        if total < 40 || (with as f64) < 0.7 * total as f64 {
            let example = leaf_stacks(&rec, function, line)
                .next()
                .map(|(s, _)| s.join(";"))
                .unwrap_or_default();
            failures.push(format!(
                "{}: {function}: {with} of {total} samples with `{native}` under line {line}; \
                 e.g. {example}\n{}",
                interp.label, rec.stderr
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// zlib's `deflate` (libz) directly under `zlib.compress`'s line.
#[test]
fn zlib_frames_sit_under_their_python_line() {
    c_frames_under_their_line("compress", "compress_it", "compress", "deflate");
}

/// OpenSSL's SHA-256 (libcrypto) directly under `hashlib.sha256`'s line. Which assembly
/// OpenSSL runs depends on the CPU: this machine's takes the SHA-extension code, whose CFI
/// framehop follows; the SSSE3/AVX code a CPU without SHA extensions gets (qemu's, in
/// `cargo xtask vm-test`) keeps its CFA in a DWARF expression framehop does not evaluate.
#[test]
fn openssl_frames_sit_under_their_python_line() {
    c_frames_under_their_line("hash", "hash_it", "hash", "sha256");
}

/// Python → `qsort` (libc) → Python callback, in that order, every time the stack merged.
#[test]
fn ctypes_callbacks_interleave_python_and_libc() {
    let interps = interpreters_logged();
    let lines = marker_lines("native.py");
    let mut failures = Vec::new();
    for interp in &interps {
        let workload = Workload::start(interp, "native.py", &["sort"]);
        // The callback runs behind libc's qsort, which Debian builds without frame pointers:
        // with frame-pointer builds, those samples carry stack copies. Five seconds: a fifth
        // of the thread's time is on the callback's line.
        let rec = record_native(workload.pid(), "5");
        drop(workload);
        assert!(rec.status.success(), "{}: {}", interp.label, rec.stderr);
        let (mut ordered, mut unmerged, mut wrong, mut total) = (0, 0, 0, 0);
        let mut example = String::new();
        for (stack, count) in leaf_stacks(&rec, "py_compare", lines["compare"]) {
            total += count;
            if stack.iter().any(|f| f.starts_with('<')) {
                unmerged += count;
                continue;
            }
            let at = |pred: &dyn Fn(&str) -> bool| stack.iter().position(|f| pred(f));
            let sort = at(&|f| parse_label(f).is_some_and(|l| l.function == "sort_it"));
            let qsort = at(&|f| is_native(f) && f.contains("libc.so") && f.contains("sort"));
            let compare = at(&|f| parse_label(f).is_some_and(|l| l.function == "py_compare"));
            match (sort, qsort, compare) {
                (Some(s), Some(q), Some(c)) if s < q && q < c => ordered += count,
                _ => {
                    wrong += count;
                    example = stack.join(";");
                }
            }
        }
        eprintln!(
            "{}: py_compare: {ordered} ordered, {unmerged} unmerged, {wrong} wrong of {total}",
            interp.label
        );
        if total < 20 || wrong > 0 || ordered < total * 8 / 10 {
            failures.push(format!(
                "{}: {ordered} ordered, {unmerged} unmerged, {wrong} wrong of {total}; e.g. \
                 {example}\n{}",
                interp.label, rec.stderr
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The summary's count of `what` (`frame-pointer walks`, `stack copies`).
fn summary_count(stderr: &str, what: &str) -> u64 {
    let line = stderr
        .lines()
        .find(|l| l.contains("native stacks:"))
        .unwrap_or_else(|| panic!("no native summary in\n{stderr}"));
    let before = line.split(&format!(" {what}")).next().unwrap_or_default();
    before
        .rsplit([' ', ';', ','])
        .find(|w| !w.is_empty())
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no count of {what} in {line}"))
}

/// `auto` decides per binary, from the eval loop's prologue: sid's 3.15 keeps frame pointers
/// (PEP 831) and pure Python there is walked by them; builds without (Debian's 3.11, pyenv's
/// -O3 builds, sid's 3.13) copy stacks. Every stack merges either way.
#[test]
fn unwinding_method_follows_the_binary() {
    let lines = marker_lines("native.py");
    let mut failures = Vec::new();
    for interp in &interpreters_logged() {
        let workload = Workload::start(interp, "native.py", &["spin"]);
        let rec = record_native(workload.pid(), "3");
        drop(workload);
        assert!(rec.status.success(), "{}: {}", interp.label, rec.stderr);
        let walks = summary_count(&rec.stderr, "frame-pointer walks");
        let copies = summary_count(&rec.stderr, "stack copies");
        let total: u64 = leaf_stacks(&rec, "spin_it", lines["spin"])
            .map(|(_, c)| c)
            .sum();
        let merged = rec
            .stacks
            .iter()
            .filter(|(s, _)| !s.iter().any(|f| f.starts_with('<')))
            .map(|(_, c)| c)
            .sum::<u64>();
        let method = if walks > copies {
            "frame pointers"
        } else {
            "stack copies"
        };
        eprintln!(
            "{}: {method} ({walks} walks, {copies} copies), {merged} of {} samples merged, \
             {total} in spin_it",
            interp.label,
            rec.total()
        );
        let want_walks = interp.label.contains("sid 3.15");
        let ok = total >= 100
            && merged * 100 >= rec.total() * 97
            && if want_walks {
                walks * 10 >= (walks + copies) * 9
            } else {
                walks == 0
            };
        if !ok {
            failures.push(format!("{}: {method}\n{}", interp.label, rec.stderr));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Over 10 k samples, the Python frames of every merged stack are the kernel walk's, in its
/// order: the thread's entry point rootward, one worker, the callback only above `sort_it`.
#[test]
fn ten_thousand_native_samples_keep_python_order() {
    let interps = interpreters_logged();
    let interp = interps
        .iter()
        .find(|i| i.label.contains("3.11"))
        .unwrap_or(&interps[0]);
    let workload = Workload::start(interp, "native.py", &[]);
    let pid = workload.pid().to_string();
    let rec = record(&["-p", &pid, "-d", "12", "-r", "997", "--native"]);
    drop(workload);
    assert!(rec.status.success(), "{}", rec.stderr);
    assert!(
        rec.total() >= 10_000,
        "{} samples\n{}",
        rec.total(),
        rec.stderr
    );
    let workers = ["compress_it", "hash_it", "sort_it"];
    let mut bad = Vec::new();
    for (stack, count) in &rec.stacks {
        let py: Vec<String> = stack
            .iter()
            .filter_map(|f| parse_label(f))
            .map(|l| l.function)
            .collect();
        let worker = py.iter().position(|f| workers.contains(&f.as_str()));
        let ok = match worker {
            // Samples before a worker started, or of the main thread waiting.
            None => !py.iter().any(|f| f == "py_compare"),
            Some(w) => {
                let rest = &py[w + 1..];
                py[..w].iter().all(|f| !workers.contains(&f.as_str()))
                    && rest.iter().all(|f| f == "py_compare")
                    && (rest.is_empty() || py[w] == "sort_it")
            }
        };
        if !ok {
            bad.push(format!("{count} × {}", stack.join(";")));
        }
    }
    assert!(
        bad.is_empty(),
        "{} stacks out of order:\n{}",
        bad.len(),
        bad.join("\n")
    );
    // The summary shows how the merge went.
    assert!(rec.stderr.contains("native"), "{}", rec.stderr);
}
