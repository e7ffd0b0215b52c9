//! `record -f otlp`: one binary `ExportProfilesServiceRequest` per recording, read by the
//! upstream `opentelemetry-proto` Python classes (tests/src/otlp.rs): the chain's frames and
//! exact lines through the dictionary and the process's resource; native frames (`--native`)
//! as locations in their module's mapping with its GNU build id; `<task NAME>` frames
//! (`--async`) as ordinary frames. The agent's OTLP export is tested in agent.rs.

use std::path::Path;
use std::process::Command;

use serde_json::json;
use tests::otlp::{self, Sample};
use tests::{interpreters_logged, marker_lines, pyebpf_bin, temp_path, Workload};

/// CPU seconds `pid` has used (utime + stime of `/proc/PID/stat`).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

/// `pyebpf record -f otlp -o FILE -d SECONDS ARGS`, decoded; the CPU seconds `pid` had in
/// those SECONDS, from its CPU share over the whole run (loading the BPF programs, which
/// takes seconds on a loaded machine, is not part of the recording).
fn record_otlp(pid: u32, seconds: f64, args: &[&str]) -> (serde_json::Value, f64) {
    let path = temp_path("record", "otlp.pb");
    let started = std::time::Instant::now();
    let before = cpu_seconds(pid);
    let out = Command::new(pyebpf_bin())
        .args(["record", "-p", &pid.to_string(), "-f", "otlp", "-o"])
        .arg(&path)
        .args(["-d", &seconds.to_string()])
        .args(args)
        .output()
        .unwrap();
    let share = (cpu_seconds(pid) - before) / started.elapsed().as_secs_f64();
    let cpu = share * seconds;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let decoded = otlp::decode_file(&path);
    let _ = std::fs::remove_file(&path);
    assert_eq!(decoded["problems"], json!([]), "{decoded}");
    (decoded, cpu)
}

/// The samples of the one resource of `pid`.
fn samples_of(request: &serde_json::Value, pid: u32) -> Vec<Sample> {
    let resources = otlp::resources_with(request, "process.pid", &json!(pid));
    assert_eq!(resources.len(), 1, "one resource per process: {request}");
    otlp::samples(resources[0])
}

#[test]
fn record_otlp_writes_a_request_the_upstream_classes_read() {
    let interp = &interpreters_logged()[0];
    let mut cmd = interp.command(&tests::workloads_dir().join("chain.py"), &[]);
    cmd.env("OTEL_SERVICE_NAME", "ledger");
    let chain = Workload::start_command(cmd, "chain.py");
    let (request, cpu) = record_otlp(chain.pid(), 3.0, &["-r", "97"]);
    let resource = otlp::resources_with(&request, "process.pid", &json!(chain.pid()))[0];
    let a = &resource["attributes"];
    assert_eq!(a["service.name"], "ledger");
    assert_eq!(a["process.runtime.name"], "cpython");
    assert_eq!(
        a["process.runtime.version"],
        json!(format!("{}.{}", interp.version.0, interp.version.1))
    );
    assert!(a["host.name"].as_str().is_some_and(|h| !h.is_empty()));
    let scope = &resource["scopes"][0];
    assert_eq!(scope["name"], "pyebpf");
    let profile = &scope["profiles"][0];
    assert_eq!(profile["sample_type"], json!(["cpu", "nanoseconds"]));
    assert_eq!(profile["period"], json!(1_000_000_000 / 97));
    let lines = marker_lines("chain.py");
    let want: Vec<String> = ["leaf", "mid", "top", "<module>"]
        .iter()
        .map(|f| {
            let marker = if *f == "<module>" { "module" } else { f };
            format!("{f} chain.py:{}", lines[marker])
        })
        .collect();
    let samples = samples_of(&request, chain.pid());
    let total: i64 = samples.iter().map(|s| s.value).sum();
    let exact: i64 = samples
        .iter()
        .filter(|s| s.frames == want)
        .map(|s| s.value)
        .sum();
    assert!(
        total as f64 >= 0.5 * 97.0 * cpu && total >= 20,
        "{total} samples for {cpu:.2} s of CPU at 97 Hz"
    );
    assert!(exact * 100 >= total * 95, "{exact}/{total}: {samples:#?}");
    for s in &samples {
        assert_eq!(s.attributes["thread.id"], json!(chain.pid()));
        for f in &s.raw_frames {
            assert_eq!(f["attributes"]["profile.frame.type"], "cpython", "{f}");
        }
    }
}

/// The GNU build id `readelf -n` reads from `path`.
fn build_id(path: &Path) -> String {
    let out = Command::new("readelf")
        .arg("-n")
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_string))
        .unwrap_or_else(|| panic!("no build id in {}", path.display()))
}

#[test]
fn record_otlp_native_frames_have_their_mapping_and_build_id() {
    let interp = &interpreters_logged()[0];
    let workload = Workload::start(interp, "native.py", &["compress"]);
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", workload.pid())).unwrap();
    let libz = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("libz.so"))
        .expect("native.py maps libz");
    let root = format!("/proc/{}/root{libz}", workload.pid());
    let want_id = build_id(Path::new(&root));
    let (request, cpu) = record_otlp(workload.pid(), 3.0, &["-r", "97", "--native"]);
    let line = marker_lines("native.py")["compress"];
    let compress = format!("compress_it native.py:{line}");
    let (mut with_libz, mut total) = (0, 0);
    for s in samples_of(&request, workload.pid()) {
        let Some(at) = s.frames.iter().position(|f| *f == compress) else {
            continue;
        };
        total += s.value;
        // Leaf first: libz's frames come before (under) the Python line.
        let libz_frames: Vec<&serde_json::Value> = s.raw_frames[..at]
            .iter()
            .filter(|f| f["mapping"].as_str().is_some_and(|m| m.contains("libz.so")))
            .collect();
        if libz_frames.is_empty() {
            continue;
        }
        with_libz += s.value;
        for f in libz_frames {
            assert_eq!(f["attributes"]["profile.frame.type"], "native", "{f}");
            assert_eq!(
                f["mapping_attributes"]["process.executable.build_id.gnu"],
                json!(want_id),
                "{f}"
            );
            assert!(f["function"].as_str().is_some_and(|n| !n.is_empty()));
        }
    }
    // The workload spends nearly all of its CPU time compressing.
    assert!(
        total as f64 >= 0.5 * 97.0 * cpu && total >= 10 && with_libz * 10 >= total * 8,
        "{with_libz} of {total} samples at {compress} with libz frames under it, for {cpu:.2} \
         s of CPU at 97 Hz"
    );
}

#[test]
fn record_otlp_task_frames_are_ordinary_frames() {
    let interps = interpreters_logged();
    let interp = interps
        .iter()
        .find(|i| i.minor() >= 14)
        .expect("an interpreter with asyncio task lists (3.14+)");
    let workload = Workload::start(interp, "tasks.py", &[]);
    let (request, cpu) = record_otlp(workload.pid(), 3.0, &["-r", "499", "--async"]);
    let samples = samples_of(&request, workload.pid());
    let total: i64 = samples.iter().map(|s| s.value).sum();
    let mut chained = 0;
    for s in &samples {
        // Leaf first: the task's own frame, then its awaiters' down to the root task.
        let tasks: Vec<&str> = s
            .frames
            .iter()
            .filter(|f| f.starts_with("<task "))
            .map(|f| f.as_str())
            .collect();
        let leaf = ["alpha", "beta", "gamma"]
            .iter()
            .find(|t| tasks.first() == Some(&format!("<task {t}> :0").as_str()));
        if let Some(t) = leaf {
            assert_eq!(
                tasks,
                [
                    format!("<task {t}> :0").as_str(),
                    "<task parent> :0",
                    "<task main> :0"
                ],
                "{s:?}"
            );
            chained += s.value;
        }
    }
    assert!(
        total as f64 >= 0.5 * 499.0 * cpu && total >= 20 && chained * 10 >= total * 7,
        "{chained} of {total} samples ran a task with its chain, for {cpu:.2} s of CPU at 499 Hz"
    );
}
