//! Every interpreter on the host: processes found at exec, forgotten at exit, in other pid
//! namespaces, embedded in C programs, with many threads, and many at once.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tests::{interpreters_logged, parse_label, workloads_dir, Interpreter, Recording, Workload};

/// A `pyebpf record -f collapsed` running in the background.
struct Background {
    child: std::process::Child,
    out: PathBuf,
    stats: PathBuf,
}

/// These tests record system-wide and count map entries, so each must have the machine's
/// Python processes to itself: they run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("pyebpf-lifecycle-{}-{name}", std::process::id()))
}

impl Background {
    /// Starts a system-wide recording and waits until its sampler is attached.
    fn start(tag: &str, args: &[&str]) -> Background {
        Self::start_via(tag, &[], args)
    }

    /// [`Background::start`], with pyebpf run by `launcher` (a command that ends by
    /// exec'ing its arguments, so the child's pid stays pyebpf's).
    fn start_via(tag: &str, launcher: &[&str], args: &[&str]) -> Background {
        let out = temp(&format!("{tag}.txt"));
        let stats = temp(&format!("{tag}.json"));
        let child = tests::pyebpf_via(launcher)
            .arg("record")
            .args(["-f", "collapsed", "-o"])
            .arg(&out)
            .arg("--stats-json")
            .arg(&stats)
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .expect("running pyebpf");
        // Loading and attaching takes well under a second; give it margin on a loaded VM.
        std::thread::sleep(tests::stretch(Duration::from_millis(1500)));
        Background { child, out, stats }
    }

    fn finish(mut self) -> (Rec, serde_json::Value) {
        let mut stderr = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            std::io::Read::read_to_string(&mut e, &mut stderr).ok();
        }
        let status = self.child.wait().expect("waiting for pyebpf");
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        let stats = std::fs::read_to_string(&self.stats)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(serde_json::Value::Null);
        let _ = std::fs::remove_file(&self.out);
        let _ = std::fs::remove_file(&self.stats);
        assert!(status.success(), "pyebpf failed: {stderr}");
        (
            Rec {
                stderr,
                stacks: tests::parse_collapsed(&text),
            },
            stats,
        )
    }
}

/// What a background recording wrote.
struct Rec {
    stderr: String,
    stacks: Vec<(Vec<String>, u64)>,
}

impl From<Recording> for Rec {
    fn from(r: Recording) -> Rec {
        Rec {
            stderr: r.stderr,
            stacks: r.stacks,
        }
    }
}

/// Samples per root label (process) whose Python frames include `function`.
fn samples_with(rec: &Rec, root_contains: &str, function: &str) -> u64 {
    rec.stacks
        .iter()
        .filter(|(s, _)| s.first().is_some_and(|r| r.contains(root_contains)))
        .filter(|(s, _)| {
            s.iter()
                .filter_map(|f| parse_label(f))
                .any(|l| l.function == function)
        })
        .map(|(_, c)| c)
        .sum()
}

/// The `<module> → top → mid → leaf` chain of chain.py, as function names.
fn chain_samples(rec: &Rec, root_contains: &str) -> (u64, u64) {
    let want = ["<module>", "top", "mid", "leaf"];
    let mut exact = 0;
    let mut total = 0;
    for (stack, count) in &rec.stacks {
        if !stack.first().is_some_and(|r| r.contains(root_contains)) {
            continue;
        }
        total += count;
        let functions: Vec<String> = stack
            .iter()
            .filter_map(|f| parse_label(f))
            .filter(|l| l.file == "chain.py")
            .map(|l| l.function)
            .collect();
        if functions == want {
            exact += count;
        }
    }
    (exact, total)
}

/// A Python process started after recording began is found through its exec and sampled
/// within 1 s of its start.
#[test]
fn exec_pickup_within_one_second() {
    let _serial = serial();
    for interp in &interpreters_logged() {
        let k = tests::slowdown();
        let duration = format!("{}", 4.0 * k);
        let bg = Background::start("exec", &["-d", &duration, "-r", "199"]);
        let started = Instant::now();
        let launched = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
            .to_string();
        let workload = Workload::start(interp, "late_start.py", &[&launched, &k.to_string()]);
        let pid = workload.pid();
        std::thread::sleep(
            tests::stretch(Duration::from_millis(2000)).saturating_sub(started.elapsed()),
        );
        let (rec, stats) = bg.finish();
        let root = format!("({pid}");
        let first = samples_with(&rec, &root, "first_second");
        let after = samples_with(&rec, &root, "afterwards");
        eprintln!(
            "{}: pid {pid}: {first} samples in first_second, {after} afterwards; lifecycle {}",
            interp.label, stats["lifecycle"]
        );
        assert!(
            first >= 5,
            "{}: the process was not sampled within its first 0.8 s ({first} samples): {}",
            interp.label,
            rec.stderr
        ); // Found through its exec, not by a later /proc scan.
        assert!(
            stats["lifecycle"]["added_on_exec"].as_u64().unwrap_or(0) >= 1,
            "{}: the late process was not added at its exec: {}",
            interp.label,
            stats["lifecycle"]
        );
    }
}

/// Those of `ours` that a stats-json id array (a kernel map's pids or tids) still lists.
fn still_held(ours: &HashSet<u64>, held: &serde_json::Value) -> Vec<u64> {
    let held: HashSet<u64> = held
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_u64())
        .collect();
    ours.intersection(&held).copied().collect()
}

/// After 100 short-lived interpreters come and go, the kernel's pid and thread maps hold none
/// of them: back to their size before.
#[test]
fn exit_cleanup_after_100_processes() {
    let _serial = serial();
    let interps = interpreters_logged();
    assert!(!interps.is_empty());
    let k = tests::slowdown();
    let duration = format!("{}", 30.0 * k);
    let lifetime = format!("{}", 0.15 * k);
    let bg = Background::start("exit", &["-d", &duration, "-r", "199"]);
    let mut tids = HashSet::new();
    let mut pids = HashSet::new();
    let started = Instant::now();
    // Five at a time, round-robin over the interpreters.
    for batch in 0..20 {
        let children: Vec<std::process::Child> = (0..5)
            .map(|i| {
                let interp = &interps[(batch * 5 + i) % interps.len()];
                interp
                    .command(&workloads_dir().join("short_lived.py"), &[&lifetime])
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("starting short_lived.py")
            })
            .collect();
        for child in children {
            pids.insert(child.id() as u64);
            let out = child
                .wait_with_output()
                .expect("waiting for short_lived.py");
            let text = String::from_utf8_lossy(&out.stdout);
            tids.extend(
                text.lines()
                    .filter_map(|l| l.strip_prefix("tid "))
                    .filter_map(|t| t.parse::<u64>().ok()),
            );
        }
    }
    eprintln!("100 processes in {:.1}s", started.elapsed().as_secs_f64());
    std::thread::sleep(tests::stretch(Duration::from_millis(500)));
    // Stop the recording now (SIGINT), it writes its stats on the way out.
    unsafe { libc_kill(bg.child.id() as i32, 2) };
    let (rec, stats) = bg.finish();
    let maps = &stats["maps"];
    let lc = &stats["lifecycle"];
    eprintln!("maps: {maps}");
    eprintln!("lifecycle: {lc}");
    let short = samples_with(&rec, "short_lived.py", "short_main")
        + samples_with(&rec, "short_lived.py", "short_helper");
    eprintln!("{short} samples of short-lived processes");
    assert!(
        lc["added_on_exec"].as_u64().unwrap_or(0) >= 90,
        "fewer than 90 of 100 short-lived interpreters were found at exec: {lc}"
    );
    let left = still_held(&tids, &maps["end_tids"]);
    assert!(
        left.is_empty(),
        "THREADS still holds exited threads {left:?}"
    );
    assert!(
        maps["peak"]["procs"].as_u64() > maps["start"]["procs"].as_u64(),
        "the short-lived processes never reached PROCS: {maps}"
    );
    // Other tests may start or stop interpreters meanwhile: only ours are accounted for, and
    // none of them may be left in PROCS.
    let left = still_held(&pids, &maps["end_pids"]);
    assert!(
        left.is_empty(),
        "PROCS still holds exited processes {left:?}"
    );
    assert_eq!(
        lc["exit_events"].as_u64(),
        stats["kernel"]["exit_procs_removed"].as_u64(),
        "every PROCS removal at exit reached userspace"
    );
    // Userspace's /proc sweep empties the maps too: only the kernel's own exit events prove
    // the exit hook works.
    let added = lc["added_on_exec"].as_u64().unwrap_or(0);
    assert!(
        lc["exit_events"].as_u64().unwrap_or(0) * 10 >= added * 9,
        "the kernel's exit hook reported fewer than 90% of the {added} registered processes: {lc}"
    );
}

/// Unmounts tracefs and debugfs in the private mount namespace `unshare -m` made, proves they
/// are gone, then execs its arguments: a fresh machine's view of /sys.
const WITHOUT_TRACEFS: &str = r#"
for m in /sys/kernel/debug/tracing /sys/kernel/tracing /sys/kernel/debug; do
    while grep -q " $m " /proc/self/mountinfo; do umount "$m" || exit 96; done
done
if grep -Eq ' - (tracefs|debugfs) ' /proc/self/mountinfo; then
    echo "tracefs or debugfs is still mounted" >&2; exit 97
fi
exec "$@"
"#;

/// tracefs and debugfs mounts in `pid`'s mount namespace (`None`: it has exited).
fn trace_mounts(pid: u32) -> Option<Vec<String>> {
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).ok()?;
    Some(
        mountinfo
            .lines()
            .filter(|l| l.contains(" - tracefs ") || l.contains(" - debugfs "))
            .map(str::to_string)
            .collect(),
    )
}

/// With neither tracefs nor debugfs mounted (as on a fresh machine, a minimal VM or a
/// hardened host), a system-wide recording starts, and an interpreter launched during it is
/// found through the kernel's exec hook and profiled.
#[test]
fn no_tracefs_system_wide_catches_a_late_process() {
    let _serial = serial();
    let interps = interpreters_logged();
    let interp = interps.first().expect("no supported interpreter found");
    let launcher = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        WITHOUT_TRACEFS,
        "sh",
    ];
    let duration = format!("{}", 5.0 * tests::slowdown());
    let bg = Background::start_via("notracefs", &launcher, &["-d", &duration, "-r", "199"]);
    let pyebpf = bg.child.id();
    // Read while it runs: the namespace pyebpf actually sampled from.
    let mounts = trace_mounts(pyebpf);
    let launched = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        .to_string();
    let workload = Workload::start(interp, "late_start.py", &[&launched]);
    let pid = workload.pid();
    let (rec, stats) = bg.finish();
    drop(workload);
    // (finish() has already failed the test if pyebpf could not run.)
    let mounts = mounts.expect("pyebpf's mount table could not be read while it ran");
    assert!(
        mounts.is_empty(),
        "pyebpf ran with tracefs/debugfs mounted, so this proves nothing: {mounts:?}"
    );
    let root = format!("({pid}");
    let late = samples_with(&rec, &root, "first_second") + samples_with(&rec, &root, "afterwards");
    let lc = &stats["lifecycle"];
    eprintln!(
        "{}: pid {pid}: {late} samples; lifecycle {lc}",
        interp.label
    );
    assert!(
        lc["exec_events"].as_u64().unwrap_or(0) > 0
            && lc["added_on_exec"].as_u64().unwrap_or(0) > 0,
        "the exec hook reported nothing without tracefs: {lc}; {}",
        rec.stderr
    );
    assert!(
        late >= 20,
        "{}: the process started during the recording got {late} samples: {}",
        interp.label,
        rec.stderr
    );
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// Host pid of the only child of `pid` (the interpreter `unshare --fork` started).
fn child_of(pid: u32) -> Option<u32> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        if let Some(c) = children
            .split_whitespace()
            .next()
            .and_then(|c| c.parse().ok())
        {
            return Some(c);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// A process in its own pid namespace is profiled with correct stacks and labeled with its
/// host pid and namespace pid.
#[test]
fn pid_namespaced_process_has_correct_stacks() {
    let _serial = serial();
    for interp in &interpreters_logged() {
        let mut cmd = tests::unshare_pid_and_mount();
        cmd.args(interp.argv(&workloads_dir().join("chain.py"), &[]));
        let workload = Workload::start_command(cmd, &format!("unshare {}", interp.label));
        let host_pid = child_of(workload.pid()).expect("unshare's child");
        let rec: Rec = tests::record(&["-d", "2", "-r", "499"]).into();
        drop(workload);
        let root = format!("({host_pid}, ns pid 1");
        let (exact, total) = chain_samples(&rec, &root);
        eprintln!(
            "{}: host pid {host_pid}: {exact}/{total} samples with the exact chain",
            interp.label
        );
        // The host may be busy with other tests: a few dozen samples prove the point.
        assert!(
            total >= 20,
            "{}: only {total} samples labeled {root:?}: {:?}",
            interp.label,
            rec.stacks
                .iter()
                .map(|(s, _)| &s[0])
                .collect::<HashSet<_>>()
        );
        assert!(
            exact as f64 >= 0.95 * total as f64,
            "{}: {exact}/{total} exact: {:#?}",
            interp.label,
            rec.stacks
        );
    }
}

/// A shared-build CPython to embed: (include flags, link flags) from `python3.X-config`.
fn embed_flags() -> Option<(String, Vec<String>, Vec<String>)> {
    for minor in [12, 11, 13] {
        let Ok(dirs) = std::fs::read_dir("/root/.pyenv/versions") else {
            return None;
        };
        for dir in dirs.filter_map(|d| d.ok()).map(|d| d.path()) {
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            if !name.starts_with(&format!("3.{minor}.")) {
                continue;
            }
            let config = dir.join(format!("bin/python3.{minor}-config"));
            let lib = dir.join(format!("lib/libpython3.{minor}.so"));
            if !config.exists() || !lib.exists() {
                continue;
            }
            let run = |flag: &str| -> Option<Vec<String>> {
                let out = Command::new(&config)
                    .args(["--embed", flag])
                    .output()
                    .ok()?;
                out.status.success().then(|| {
                    String::from_utf8_lossy(&out.stdout)
                        .split_whitespace()
                        .map(str::to_string)
                        .collect()
                })
            };
            let mut ldflags = run("--ldflags")?;
            ldflags.push(format!("-Wl,-rpath,{}", dir.join("lib").display()));
            return Some((format!("pyenv {name}"), run("--cflags")?, ldflags));
        }
    }
    None
}

/// A C program embedding CPython (not named python*) is found through its mapped libpython
/// and profiled with exact stacks.
#[test]
fn embedded_interpreter_has_correct_stacks() {
    let _serial = serial();
    let Some((label, cflags, ldflags)) = embed_flags() else {
        tests::missing_prerequisite(
            "embedded_interpreter_has_correct_stacks",
            "no shared-library CPython 3.11-3.13 under /root/.pyenv/versions",
        );
        return;
    };
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("embedded/embed.c");
    let exe = temp("embed-host");
    let out = Command::new("cc")
        .args(&cflags)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .args(&ldflags)
        .output()
        .expect("running cc");
    assert!(
        out.status.success(),
        "compiling embed.c against {label}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut cmd = Command::new(&exe);
    cmd.arg(workloads_dir().join("chain.py"));
    let workload = Workload::start_command(cmd, "embed-host");
    let pid = workload.pid();
    // System-wide, so discovery itself (not an explicit -p) has to find it.
    let rec: Rec = tests::record(&["-d", "2", "-r", "499"]).into();
    drop(workload);
    let _ = std::fs::remove_file(&exe);
    let root = format!("({pid})");
    let (exact, total) = chain_samples(&rec, &root);
    eprintln!("embedded {label}: pid {pid}: {exact}/{total} samples with the exact chain");
    let roots: HashSet<_> = rec.stacks.iter().map(|(s, _)| s[0].clone()).collect();
    assert!(
        total >= 20,
        "embedded interpreter pid {pid} not profiled ({total} samples); roots: {roots:?}"
    );
    assert!(
        roots.iter().any(|r| r.contains("embed-host chain.py")),
        "{roots:?}"
    );
    assert!(exact as f64 >= 0.95 * total as f64, "{:#?}", rec.stacks);
}

/// 32 busy threads: each appears under its own tid with its own function.
#[test]
fn every_busy_thread_of_32_appears() {
    let _serial = serial();
    for interp in &interpreters_logged() {
        let workload = Workload::start(interp, "many_threads.py", &["32"]);
        let tids: HashMap<String, String> = workload
            .lines
            .iter()
            .filter_map(|l| l.strip_prefix("thread "))
            .filter_map(|l| l.split_once(' '))
            .map(|(i, tid)| (tid.to_string(), format!("worker_{i}")))
            .collect();
        assert_eq!(tids.len(), 32);
        let pid = workload.pid().to_string();
        let rec = tests::record(&["-p", &pid, "-d", "3", "-r", "997", "--threads"]);
        drop(workload);
        assert!(rec.status.success(), "{}: {}", interp.label, rec.stderr);
        let rec: Rec = rec.into();
        let mut per_thread: HashMap<String, u64> = HashMap::new();
        let mut wrong = 0;
        for (stack, count) in &rec.stacks {
            let Some(tid) = stack
                .first()
                .and_then(|t| t.strip_prefix("thread "))
                .and_then(|t| t.split_whitespace().next())
            else {
                continue;
            };
            let Some(expected) = tids.get(tid) else {
                continue;
            };
            let functions: Vec<String> = stack
                .iter()
                .filter_map(|f| parse_label(f))
                .map(|l| l.function)
                .collect();
            if functions.last() == Some(expected) {
                *per_thread.entry(tid.to_string()).or_default() += count;
            } else if functions.iter().any(|f| f.starts_with("worker_")) {
                wrong += count;
            }
        }
        let min = tids
            .keys()
            .map(|t| per_thread.get(t).copied().unwrap_or(0))
            .min()
            .unwrap_or(0);
        eprintln!(
            "{}: {} of 32 threads seen with their own worker, fewest samples {min}, {wrong} misattributed",
            interp.label,
            per_thread.len()
        );
        assert_eq!(
            per_thread.len(),
            32,
            "{}: threads missing: {:?}",
            interp.label,
            tids.keys()
                .filter(|t| !per_thread.contains_key(*t))
                .collect::<Vec<_>>()
        );
        assert_eq!(wrong, 0, "{}: samples under the wrong thread", interp.label);
    }
}

/// 64 concurrent interpreters of mixed versions all appear in one system-wide recording.
#[test]
fn sixty_four_interpreters_in_one_recording() {
    let _serial = serial();
    let interps = interpreters_logged();
    assert!(!interps.is_empty());
    let workloads: Vec<(Workload, &Interpreter, String)> = (0..64)
        .map(|i| {
            let interp = &interps[i % interps.len()];
            let tag = format!("p{i}");
            // 2 ms of CPU every 100 ms: 64 of them need ~1.3 of the VM's 2 CPUs.
            let w = Workload::start(interp, "bursty.py", &["0.1", "0.002", &tag]);
            (w, interp, tag)
        })
        .collect();
    let rec: Rec = tests::record(&["-d", "5", "-r", "499"]).into();
    let mut missing = Vec::new();
    for (w, interp, tag) in &workloads {
        let n = samples_with(&rec, &format!("({}", w.pid()), &format!("burst_{tag}"));
        if n == 0 {
            missing.push(format!("{} pid {} ({tag})", interp.label, w.pid()));
        }
    }
    let per_version: HashMap<&str, usize> =
        workloads.iter().fold(HashMap::new(), |mut m, (_, i, _)| {
            *m.entry(i.label.as_str()).or_default() += 1;
            m
        });
    eprintln!("64 interpreters: {per_version:?}; missing: {missing:?}");
    eprintln!("{}", rec.stderr.lines().last().unwrap_or(""));
    drop(workloads);
    assert!(missing.is_empty(), "not in the recording: {missing:?}");
}
