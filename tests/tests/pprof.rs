//! `pyebpf record -f pprof` read back by the consumer people use, `go tool pprof`: the real
//! BPF programs sample real interpreters, and every check is on what `go tool pprof` prints
//! (`-raw` for the profile as decoded, `-traces` for each sample with its labels as a report
//! shows it, `-top` and `-tagfocus` for what a user filters and ranks).
//!
//! Go runs offline (`GOTOOLCHAIN=local`, `GOPROXY=off`) with `HOME` and `GOCACHE` in a
//! temporary directory. `cargo xtask test` installs `golang-go` when `go` is missing; without
//! it these tests fail and say so.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::Command;

use tests::pprof::{nanoseconds, Pprof};
use tests::{
    interpreters_logged, marker_lines, pyebpf_bin, temp_path, workloads_dir, Interpreter, Workload,
};

/// Sampling rate of every recording here: not the default, so that the period is checked.
const RATE: u32 = 200;
const PERIOD_NS: i64 = 1_000_000_000 / RATE as i64;
/// How long each recording lasts, in seconds: short on the run over every interpreter.
const SECONDS: &str = "1.5";
const SECONDS_EACH: &str = "1";
/// Fewest samples a recording must hold for its shares to mean something: a chain workload
/// on a loaded machine (other builds and tests running) may get 10% of a CPU, 30 samples.
const MIN_SAMPLES: i64 = 20;

/// The tests take turns: each keeps one or two CPUs busy, which would starve the others'
/// workloads of samples.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A profile `pyebpf record -f pprof` wrote; removed when dropped.
struct Recorded {
    path: PathBuf,
    stderr: String,
}

impl Drop for Recorded {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Runs `pyebpf record -f pprof -o <tmp> -r RATE ARGS`; panics unless it succeeds.
fn record_pprof(args: &[&str], what: &str) -> Recorded {
    let path = temp_path("record", "pb.gz");
    let rate = RATE.to_string();
    let default_rate: &[&str] = if args.contains(&"-r") {
        &[]
    } else {
        &["-r", &rate]
    };
    let out = Command::new(pyebpf_bin())
        .arg("record")
        .args(["-f", "pprof", "-o"])
        .arg(&path)
        .args(default_rate)
        .args(args)
        .output()
        .expect("running pyebpf");
    let recorded = Recorded {
        path,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(
        out.status.success(),
        "{what}: pyebpf record failed ({}): {}",
        out.status,
        recorded.stderr
    );
    assert!(
        recorded.path.exists(),
        "{what}: no profile written: {}",
        recorded.stderr
    );
    recorded
}

/// Line of `def <name>(` in a workload: the function's first line.
fn def_line(script: &str, name: &str) -> u32 {
    let text = std::fs::read_to_string(workloads_dir().join(script)).expect("reading workload");
    let at = text
        .lines()
        .position(|l| l.starts_with(&format!("def {name}(")))
        .unwrap_or_else(|| panic!("no def {name} in {script}"));
    at as u32 + 1
}

/// What discovery calls a process run as `<exe> <script>`: both basenames.
fn short_command(interp: &Interpreter, script: &str) -> String {
    let exe = interp.exe.file_name().unwrap().to_string_lossy();
    format!("{exe} {script}")
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The chain.py stack, leaf first, as (function, file name, line, first line).
fn chain_frames() -> Vec<(String, String, u32, u32)> {
    let lines = marker_lines("chain.py");
    [
        ("leaf", "leaf", def_line("chain.py", "leaf")),
        ("mid", "mid", def_line("chain.py", "mid")),
        ("top", "top", def_line("chain.py", "top")),
        ("<module>", "module", 1),
    ]
    .into_iter()
    .map(|(function, marker, first)| {
        (
            function.to_string(),
            "chain.py".to_string(),
            lines[marker],
            first,
        )
    })
    .collect()
}

const CHAIN: [&str; 4] = ["leaf", "mid", "top", "<module>"];

fn first_interpreter() -> Interpreter {
    interpreters_logged()
        .into_iter()
        .next()
        .expect("no supported interpreter found")
}

/// On every interpreter: sample and period types, period = 1e9 / rate, values = count and
/// count × period, `leaf ← mid ← top ← <module>` with file:line and first lines, `<module>`
/// named as such by the report layer (not simplified away), and each sample's labels.
#[test]
fn chain_types_period_stack_and_labels_on_every_interpreter() {
    let _turn = one_at_a_time();
    let interps = interpreters_logged();
    assert!(!interps.is_empty(), "no supported interpreter found");
    let pprof = Pprof::new();
    let expected = chain_frames();
    for interp in &interps {
        let what = &interp.label;
        let workload = Workload::start(interp, "chain.py", &[]);
        let pid = workload.pid();
        // chain.py imports threading: its thread is named as threading names it.
        let thread_name = "MainThread";
        let rec = record_pprof(&["-p", &pid.to_string(), "-d", SECONDS_EACH], what);
        drop(workload);

        let raw = pprof.raw(&rec.path);
        assert!(
            raw.comments.iter().any(|c| c.starts_with("pyebpf record")),
            "{what}: comments {:?}",
            raw.comments
        );
        assert_eq!(raw.period_type, "cpu nanoseconds", "{what}");
        assert_eq!(raw.period, PERIOD_NS, "{what}: period is not 1e9/{RATE}");
        assert_eq!(
            raw.sample_types, "samples/count cpu/nanoseconds[dflt]",
            "{what}"
        );
        for sample in &raw.samples {
            assert_eq!(sample.values.len(), 2, "{what}: {sample:?}");
            assert!(sample.values[0] > 0, "{what}: {sample:?}");
            assert_eq!(
                sample.values[1],
                sample.values[0] * PERIOD_NS,
                "{what}: cpu is not count × period: {sample:?}"
            );
        }
        for loc in raw.locations.values() {
            assert!(
                !loc.function.is_empty(),
                "{what}: a function with no name (simplified away?): {:?}",
                raw.locations
            );
        }
        let total = raw.count();
        let exact: i64 = raw
            .samples
            .iter()
            .filter(|s| {
                let frames: Vec<(String, String, u32, u32)> = raw
                    .frames(s)
                    .into_iter()
                    .map(|l| {
                        let file = basename(&l.file).to_string();
                        (l.function, file, l.line, l.start_line)
                    })
                    .collect();
                frames == expected
            })
            .map(|s| s.values[0])
            .sum();
        eprintln!(
            "{what}: {exact}/{total} samples with the exact chain ({})",
            rec.stderr.trim()
        );
        assert!(
            total >= MIN_SAMPLES,
            "{what}: only {total} samples: {}",
            rec.stderr
        );
        assert!(
            exact as f64 >= 0.95 * total as f64,
            "{what}: {exact}/{total} samples are {expected:?}; locations {:#?}, samples {:#?}",
            raw.locations,
            raw.samples
        );

        // The report layer (where pprof simplifies C++-looking names) shows the same chain.
        let traces = pprof.traces(&rec.path, &[]);
        let traced: i64 = traces.iter().map(|t| t.count).sum();
        assert_eq!(traced, total, "{what}: -traces and -raw disagree");
        let chain: i64 = traces
            .iter()
            .filter(|t| t.stack == CHAIN)
            .map(|t| t.count)
            .sum();
        assert_eq!(chain, exact, "{what}: -traces: {traces:#?}");
        let process = short_command(interp, "chain.py");
        for t in &traces {
            assert_eq!(t.label("pid"), pid.to_string(), "{what}: {t:?}");
            assert_eq!(t.label("tid"), pid.to_string(), "{what}: {t:?}");
            assert_eq!(t.label("thread_name"), thread_name, "{what}: {t:?}");
            assert_eq!(t.label("process"), process, "{what}: {t:?}");
            assert_eq!(
                t.label("service_name"),
                t.program_service("chain"),
                "{what}: {t:?}"
            );
            let unexpected: Vec<&String> = t
                .labels
                .keys()
                .filter(|k| {
                    ![
                        "pid",
                        "tid",
                        "thread_name",
                        "process",
                        "service_name",
                        "container_id",
                    ]
                    .contains(&k.as_str())
                })
                .collect();
            assert!(
                unexpected.is_empty(),
                "{what}: labels {unexpected:?}: {t:?}"
            );
        }
    }
}

/// `OTEL_SERVICE_NAME` in the target's environment names its service, and pid and tid are
/// numeric labels: pprof's numeric `-tagfocus` ranges select exactly the workload's samples
/// (a string label would match none).
#[test]
fn otel_service_name_and_numeric_pid_filters() {
    let _turn = one_at_a_time();
    let interp = first_interpreter();
    let pprof = Pprof::new();
    let mut cmd = interp.command(&workloads_dir().join("chain.py"), &[]);
    cmd.env("OTEL_SERVICE_NAME", "myservice");
    let workload = Workload::start_command(cmd, &format!("chain.py under {}", interp.label));
    let pid = workload.pid();
    let rec = record_pprof(&["-p", &pid.to_string(), "-d", SECONDS], &interp.label);
    drop(workload);

    let traces = pprof.traces(&rec.path, &[]);
    let total: i64 = traces.iter().map(|t| t.count).sum();
    assert!(total >= MIN_SAMPLES, "only {total} samples: {}", rec.stderr);
    for t in &traces {
        assert_eq!(t.label("service_name"), "myservice", "{t:?}");
        assert_eq!(t.label("pid"), pid.to_string(), "{t:?}");
    }

    let shown = |focus: &str| -> i64 {
        let top = pprof.top(&rec.path, &["-sample_index=samples", "-tagfocus", focus]);
        top.shown.parse().unwrap_or_else(|_| panic!("{top:?}"))
    };
    assert_eq!(shown(&format!("pid={pid}")), total, "pid={pid}");
    assert_eq!(shown(&format!("pid={pid}:{pid}")), total, "pid range");
    assert_eq!(shown(&format!("tid={pid}")), total, "tid={pid}");
    assert_eq!(shown(&format!("pid={}", pid + 1)), 0, "another pid");
    assert_eq!(shown("service_name=myservice"), total, "service_name");
    assert_eq!(shown("service_name=chain"), 0, "the program's name");
}

/// `-top`: `leaf` holds nearly all the flat time, its callers none of it but all the
/// cumulative time, and the CPU total is the samples × period the file holds.
#[test]
fn top_ranks_leaf_and_totals_cpu_time() {
    let _turn = one_at_a_time();
    let interp = first_interpreter();
    let pprof = Pprof::new();
    let workload = Workload::start(&interp, "chain.py", &[]);
    let rec = record_pprof(&["-p", &workload.pid().to_string(), "-d", SECONDS], "top");
    drop(workload);

    let raw = pprof.raw(&rec.path);
    let count = raw.count();
    assert!(count >= MIN_SAMPLES, "only {count} samples: {}", rec.stderr);
    let cpu: i64 = raw.samples.iter().map(|s| s.values[1]).sum();
    assert_eq!(cpu, count * raw.period);

    let top = pprof.top(&rec.path, &["-unit=ns"]);
    eprintln!("{top:#?}");
    assert_eq!(nanoseconds(&top.total), count * raw.period, "{top:#?}");
    assert_eq!(nanoseconds(&top.shown), count * raw.period, "{top:#?}");
    let leaf = top.row("leaf");
    assert!(leaf.flat_pct >= 95.0, "leaf flat {leaf:?}");
    assert_eq!(top.rows[0].name, "leaf", "leaf is not first: {top:#?}");
    for caller in ["mid", "top", "<module>"] {
        let row = top.row(caller);
        assert_eq!(row.flat, "0", "{caller} has flat time: {row:?}");
        assert!(row.cum_pct >= 95.0, "{caller}: {row:?}");
    }

    let by_count = pprof.top(&rec.path, &["-sample_index=samples"]);
    assert_eq!(by_count.total, count.to_string(), "{by_count:#?}");
    let leaf_samples: i64 = by_count.row("leaf").flat.parse().expect("leaf flat count");
    assert!(
        leaf_samples as f64 >= 0.95 * count as f64,
        "{leaf_samples}/{count} in leaf"
    );

    // With -lines, each node is a line: leaf's is the marked one.
    let lines = pprof.top(&rec.path, &["-lines"]);
    let leaf_line = marker_lines("chain.py")["leaf"];
    assert!(
        lines.rows[0].name.starts_with("leaf ")
            && lines.rows[0]
                .name
                .ends_with(&format!("/chain.py:{leaf_line}")),
        "{lines:#?}"
    );
}

/// `-top` shares of a pprof recording match the collapsed output of a recording of the same
/// seconds: two `record`s side by side on split.py (70/30 by fixed work), one writing pprof and
/// one collapsed stacks, agree on `seventy`'s and `thirty`'s shares within 5 points.
#[test]
fn top_shares_match_collapsed_of_the_same_seconds() {
    let _turn = one_at_a_time();
    let interp = first_interpreter();
    let pprof = Pprof::new();
    let workload = Workload::start(&interp, "split.py", &[]);
    let pid = workload.pid().to_string();
    let collapsed = std::thread::spawn({
        let pid = pid.clone();
        move || tests::record(&["-p", &pid, "-d", "4", "-r", "1000"])
    });
    let rec = record_pprof(&["-p", &pid, "-d", "4", "-r", "1000"], "side by side");
    let collapsed = collapsed.join().unwrap();
    drop(workload);
    assert!(collapsed.status.success(), "{}", collapsed.stderr);

    let top = pprof.top(&rec.path, &["-sample_index=samples"]);
    let total = collapsed.total() as f64;
    assert!(total >= 100.0, "{total} collapsed samples");
    for function in ["seventy", "thirty"] {
        let in_collapsed = collapsed
            .stacks
            .iter()
            .filter(|(stack, _)| stack.iter().any(|f| f.starts_with(&format!("{function} "))))
            .map(|(_, c)| *c)
            .sum::<u64>() as f64;
        let from_collapsed = 100.0 * in_collapsed / total;
        let from_pprof = top.row(function).cum_pct;
        assert!(
            (from_pprof - from_collapsed).abs() <= 5.0,
            "{function}: {from_pprof:.1}% in go tool pprof -top, {from_collapsed:.1}% in the \
             collapsed stacks; {top:#?}"
        );
    }
}

/// `-p A -p B` with two different workloads: both pids are label values, each sample's pid,
/// tid, thread name (`threading`'s where the program has one), process and service match the
/// code it ran, and `-tagfocus=pid=` keeps one process's functions.
#[test]
fn two_processes_keep_their_own_labels() {
    let _turn = one_at_a_time();
    let interp = first_interpreter();
    let pprof = Pprof::new();
    let chain = Workload::start(&interp, "chain.py", &[]);
    let threads = Workload::start(&interp, "threads.py", &[]);
    let (a, b) = (chain.pid(), threads.pid());
    let alpha: u32 = threads.printed("alpha").parse().expect("alpha tid");
    let beta: u32 = threads.printed("beta").parse().expect("beta tid");
    // Threads carry threading's names, which the OS does not know before 3.14.
    let names: HashMap<u32, String> = HashMap::from([
        (a, "MainThread".to_string()),
        (alpha, threads.printed("alpha_name")),
        (beta, threads.printed("beta_name")),
    ]);
    let rec = record_pprof(
        &["-p", &a.to_string(), "-p", &b.to_string(), "-d", SECONDS],
        "two processes",
    );
    drop(chain);
    drop(threads);

    let traces = pprof.traces(&rec.path, &[]);
    let pids: BTreeSet<&str> = traces.iter().map(|t| t.label("pid")).collect();
    assert_eq!(
        pids,
        BTreeSet::from([a.to_string().as_str(), b.to_string().as_str()]),
        "{traces:#?}"
    );
    let mut per: HashMap<&str, i64> = HashMap::new();
    for t in &traces {
        let pid: u32 = t.label("pid").parse().expect("numeric pid");
        let tid: u32 = t.label("tid").parse().expect("numeric tid");
        if pid == a {
            assert!(
                t.stack.iter().all(|f| CHAIN.contains(&f.as_str())),
                "chain.py's pid on another stack: {t:?}"
            );
            assert_eq!(tid, a, "{t:?}");
            assert_eq!(t.label("service_name"), t.program_service("chain"), "{t:?}");
            assert_eq!(
                t.label("process"),
                short_command(&interp, "chain.py"),
                "{t:?}"
            );
        } else {
            assert_eq!(pid, b, "{t:?}");
            assert!(
                !CHAIN[..3].iter().any(|f| t.has(f)),
                "threads.py's pid on chain.py's stack: {t:?}"
            );
            assert_eq!(
                t.label("service_name"),
                t.program_service("threads"),
                "{t:?}"
            );
            assert_eq!(
                t.label("process"),
                short_command(&interp, "threads.py"),
                "{t:?}"
            );
            if t.has("spin_alpha") {
                assert_eq!(tid, alpha, "spin_alpha on another thread: {t:?}");
            }
            if t.has("spin_beta") {
                assert_eq!(tid, beta, "spin_beta on another thread: {t:?}");
            }
        }
        if let Some(name) = names.get(&tid) {
            assert_eq!(t.label("thread_name"), name, "{t:?}");
        }
        for f in ["leaf", "spin_alpha", "spin_beta"] {
            if t.has(f) {
                *per.entry(f).or_default() += t.count;
            }
        }
    }
    eprintln!("samples per function: {per:?} ({})", rec.stderr.trim());
    for f in ["leaf", "spin_alpha", "spin_beta"] {
        let n = per.get(f).copied().unwrap_or(0);
        assert!(n >= MIN_SAMPLES, "{f}: only {n} samples: {per:?}");
    }

    let functions = |pid: u32| -> BTreeSet<String> {
        let focus = format!("pid={pid}");
        let top = pprof.top(&rec.path, &["-sample_index=samples", "-tagfocus", &focus]);
        top.rows.into_iter().map(|r| r.name).collect()
    };
    let of_a = functions(a);
    let of_b = functions(b);
    assert!(
        of_a.contains("leaf") && !of_a.contains("spin_alpha"),
        "{of_a:?}"
    );
    assert!(
        of_b.contains("spin_alpha") && of_b.contains("spin_beta") && !of_b.contains("leaf"),
        "{of_b:?}"
    );
}
