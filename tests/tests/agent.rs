//! `pyebpf agent` end to end: the real BPF programs sampling real interpreters, its profiles
//! read by `go tool pprof`, its pushes received on 127.0.0.1 by a server that decodes them
//! with Pyroscope's own `push.proto` types and hands the profiles to `go tool pprof`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message;
use tests::pprof::{Pprof, Raw, RawSample};
use tests::{
    interpreters_logged, marker_lines, one_line_error, pyebpf_bin, stretch, Running, Workload,
};

use profiler::proto::push::v1::PushRequest;

/// The agent's tests run one at a time: each samples the whole host, and workloads of one
/// test would take CPU from another's.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// CPU seconds `pid` has used (utime + stime of `/proc/PID/stat`; 100 ticks a second).
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

/// Starts the agent with `args`, listening on a free loopback port; its address.
fn agent(args: &[&str]) -> (Running, String) {
    let mut all = vec!["agent", "--listen", "127.0.0.1:0"];
    all.extend_from_slice(args);
    let mut running = Running::start(&all);
    running.wait_for("serving /debug/pprof/profile", Duration::from_secs(60));
    let line = running.stderr.last().unwrap().clone();
    let addr = line
        .rsplit("http://")
        .next()
        .expect("the agent names its address")
        .trim()
        .to_string();
    (running, addr)
}

fn get(url: &str) -> (u16, String) {
    let agent = ureq::Agent::new_with_config(
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build(),
    );
    let mut response = agent.get(url).call().expect("HTTP request");
    let status = response.status().as_u16();
    let body = response.body_mut().read_to_string().unwrap_or_default();
    (status, body)
}

/// `go tool pprof -raw TARGET` (a file or a URL), parsed.
fn raw(target: &str) -> Raw {
    Raw::parse(&Pprof::new().run(&["-raw"], Path::new(target)))
}

/// The chain.py stack as `-raw` shows it, leaf first.
fn chain_frames() -> Vec<String> {
    let lines = marker_lines("chain.py");
    ["leaf", "mid", "top", "module"]
        .iter()
        .map(|m| {
            let f = if *m == "module" { "<module>" } else { m };
            format!("{f} chain.py:{}", lines[*m])
        })
        .collect()
}

/// A sample's frames as `function file:line`, leaf first.
fn frames_of(raw: &Raw, sample: &RawSample) -> Vec<String> {
    raw.frames(sample)
        .iter()
        .map(|l| {
            let file = l.file.rsplit('/').next().unwrap_or(&l.file);
            format!("{} {file}:{}", l.function, l.line)
        })
        .collect()
}

/// A pull for one pid is what `go tool pprof` fetches: the chain, leaf first, only that pid,
/// labelled; the `service=` filter keeps only that service.
#[test]
fn pull_is_read_by_go_tool_pprof_and_filters() {
    let _serial = serial();
    let interp = &interpreters_logged()[0];
    let chain = Workload::start(interp, "chain.py", &[]);
    let mut other_cmd = interp.command(&tests::workloads_dir().join("split.py"), &[]);
    other_cmd.env("OTEL_SERVICE_NAME", "checkout");
    let other = Workload::start_command(other_cmd, "split.py");
    let (running, addr) = agent(&[]);

    let url = format!(
        "http://{addr}/debug/pprof/profile?seconds=4&pid={}",
        chain.pid()
    );
    let cpu_before = cpu_seconds(chain.pid());
    let profile = raw(&url);
    let cpu = cpu_seconds(chain.pid()) - cpu_before;
    let total = profile.count();
    let exact: i64 = profile
        .samples
        .iter()
        .filter(|s| frames_of(&profile, s) == chain_frames())
        .map(|s| s.values[0])
        .sum();
    // 19 Hz over the CPU time the process had (the pull starts and ends within the window
    // `cpu` was measured over, which is a little longer).
    // Random subsampling makes the count itself random: at 60 samples one standard deviation
    // is 13 %.
    let expected = cpu * 19.0;
    assert!(
        expected >= 20.0 && (0.6 * expected..=1.3 * expected).contains(&(total as f64)),
        "{total} samples for {cpu:.2} s of CPU at 19 Hz: {profile:#?}"
    );
    assert!(
        exact * 100 >= total * 95,
        "{exact}/{total} exact: {profile:#?}"
    );
    assert_eq!(profile.period_type, "cpu nanoseconds");
    assert_eq!(profile.period, 1_000_000_000 / 19);
    for s in &profile.samples {
        assert_eq!(
            s.labels.get("pid"),
            Some(&chain.pid().to_string()),
            "a sample of another process in a pid={} pull: {s:?}",
            chain.pid()
        );
        assert_eq!(
            s.labels.get("service_name").map(String::as_str),
            Some("chain")
        );
    }

    let url = format!("http://{addr}/debug/pprof/profile?seconds=3&service=checkout");
    let profile = raw(&url);
    assert!(profile.count() >= 15, "{profile:#?}");
    assert!(
        profile
            .samples
            .iter()
            .all(|s| s.labels.get("pid") == Some(&other.pid().to_string())
                && s.labels.get("service_name").map(String::as_str) == Some("checkout")),
        "{profile:#?}"
    );

    let (status, body) = get(&format!("http://{addr}/debug/pprof/profile?seconds=0"));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("from 1 to 300"), "{body}");
    running.signal("TERM");
    let (status, stderr) = running.finish(Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
}

/// `agent --native`: a pulled profile carries the C frames under their Python line, as
/// `go tool pprof` reads them (function, and the module as the file name).
#[test]
fn native_frames_reach_go_tool_pprof() {
    let _serial = serial();
    let interp = &interpreters_logged()[0];
    let workload = Workload::start(interp, "native.py", &["compress"]);
    let (running, addr) = agent(&["--native", "--rate", "97"]);
    watching(&addr);
    let url = format!(
        "http://{addr}/debug/pprof/profile?seconds=3&pid={}",
        workload.pid()
    );
    let profile = raw(&url);
    let line = marker_lines("native.py")["compress"];
    let compress = format!("compress_it native.py:{line}");
    let (mut under, mut total) = (0, 0);
    for sample in &profile.samples {
        let frames = frames_of(&profile, sample);
        let Some(at) = frames.iter().position(|f| *f == compress) else {
            continue;
        };
        total += sample.values[0];
        // Leaf first: libz's frames come before (under) the Python line.
        if frames[..at].iter().any(|f| f.contains(" libz.so")) {
            under += sample.values[0];
        }
    }
    assert!(
        total >= 100 && under * 10 >= total * 8,
        "{under} of {total} samples at {compress} with libz under it: {profile:#?}"
    );
    running.signal("TERM");
    let (status, stderr) = running.finish(Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
}

/// Waits until the agent's loop runs and watches a process (it serves HTTP before its BPF
/// programs are loaded, which takes seconds under emulation).
fn watching(addr: &str) {
    let deadline = Instant::now() + stretch(Duration::from_secs(60));
    loop {
        let (status, text) = get(&format!("http://{addr}/metrics"));
        if status == 200
            && text.lines().any(|l| {
                l.strip_prefix("pyebpf_processes ")
                    .is_some_and(|v| v != "0")
            })
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the agent never watched a process: {text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Prometheus samples of a scrape: `name{labels}` → value.
fn scrape(addr: &str) -> BTreeMap<String, f64> {
    let (status, text) = get(&format!("http://{addr}/metrics"));
    assert_eq!(status, 200, "{text}");
    assert!(text.ends_with("# EOF\n"), "not OpenMetrics: {text}");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// `/metrics` counts what happens: samples and the agent's own CPU go up between scrapes,
/// the watched process is counted, and `/healthz` answers from the loop.
#[test]
fn metrics_move_and_health_answers() {
    let _serial = serial();
    let interp = &interpreters_logged()[0];
    let _chain = Workload::start(interp, "chain.py", &[]);
    let (running, addr) = agent(&["--rate", "49"]);
    watching(&addr);
    std::thread::sleep(Duration::from_secs(2));
    let first = scrape(&addr);
    let cpu_before = cpu_seconds(_chain.pid());
    std::thread::sleep(Duration::from_secs(3));
    let cpu = cpu_seconds(_chain.pid()) - cpu_before;
    // Samples are counted once a second, when the agent drains the kernel's buffer.
    std::thread::sleep(Duration::from_millis(1100));
    let second = scrape(&addr);
    let v = |m: &BTreeMap<String, f64>, k: &str| -> f64 {
        *m.get(k).unwrap_or_else(|| panic!("no {k} in {m:#?}"))
    };
    let grew = v(&second, "pyebpf_samples_total") - v(&first, "pyebpf_samples_total");
    // At least what the workload's CPU time gives at 49 Hz; at most what every CPU of the
    // host busy all along would (other Python processes on the host count too), give or take
    // the second of undrained samples at either end.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    assert!(
        grew >= 0.6 * cpu * 49.0 && grew <= 1.4 * cpus * 5.0 * 49.0,
        "samples grew by {grew} over {cpu:.2} s of the workload's CPU at 49 Hz"
    );
    assert!(v(&second, "pyebpf_processes") >= 1.0);
    assert!(v(&second, "pyebpf_processes_profiled_total") >= 1.0);
    assert!(
        v(&second, "pyebpf_cpu_seconds_total{mode=\"user\"}")
            > v(&first, "pyebpf_cpu_seconds_total{mode=\"user\"}") - 1e-9
    );
    assert!(v(&second, "pyebpf_cpu_seconds_total{mode=\"bpf\"}") > 0.0);
    assert!(v(&second, "pyebpf_resident_memory_bytes") > 1e6);
    assert_eq!(
        v(
            &second,
            "pyebpf_dropped_samples_total{reason=\"ring_buffer\"}"
        ),
        0.0
    );
    let (status, body) = get(&format!("http://{addr}/healthz"));
    assert_eq!((status, body.trim()), (200, "ok"));
    running.signal("TERM");
    let (status, stderr) = running.finish(Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
}

/// What a Pyroscope receiver got: every request's decoded series, and its HTTP details.
#[derive(Default)]
struct Received {
    requests: Vec<(String, Option<String>, PushRequest)>,
    /// Answers still to give before 200s: status codes.
    script: Vec<u16>,
}

/// A push receiver on 127.0.0.1: decodes `PushRequest`s with the upstream proto's types.
fn receiver(script: Vec<u16>) -> (SocketAddr, Arc<Mutex<Received>>) {
    use axum::body::Bytes;
    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::post;
    let state = Arc::new(Mutex::new(Received {
        script,
        ..Default::default()
    }));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let shared = state.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let app = axum::Router::new()
                .route(
                    "/push.v1.PusherService/Push",
                    post(
                        |State(state): State<Arc<Mutex<Received>>>,
                         headers: HeaderMap,
                         body: Bytes| async move {
                            let mut state = state.lock().unwrap();
                            if !state.script.is_empty() {
                                let status = state.script.remove(0);
                                return StatusCode::from_u16(status).unwrap();
                            }
                            let ctype = headers
                                .get("content-type")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or_default()
                                .to_string();
                            let tenant = headers
                                .get("x-scope-orgid")
                                .and_then(|v| v.to_str().ok())
                                .map(String::from);
                            match PushRequest::decode(body.as_ref()) {
                                Ok(request) => {
                                    state.requests.push((ctype, tenant, request));
                                    StatusCode::OK
                                }
                                Err(_) => StatusCode::BAD_REQUEST,
                            }
                        },
                    ),
                )
                .with_state(shared);
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    (addr, state)
}

/// Writes a pushed profile where `go tool pprof` can read it.
fn save(raw_profile: &[u8], n: usize) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "pyebpf-test-{}-pushed-{n}.pb.gz",
        std::process::id()
    ));
    std::fs::write(&path, raw_profile).unwrap();
    path
}

fn label<'a>(
    series: &'a profiler::proto::push::v1::RawProfileSeries,
    name: &str,
) -> Option<&'a str> {
    series
        .labels
        .iter()
        .find(|l| l.name == name)
        .map(|l| l.value.as_str())
}

/// Windows reach a Pyroscope receiver through two 503s (retried, counted), as `PushRequest`s
/// whose series carry the agent's and the operator's labels and whose profiles `go tool
/// pprof` reads with the chain in them.
#[test]
fn pushes_reach_pyroscope_through_failures() {
    let _serial = serial();
    let interp = &interpreters_logged()[0];
    let mut cmd = interp.command(&tests::workloads_dir().join("chain.py"), &[]);
    cmd.env("OTEL_SERVICE_NAME", "payments");
    let chain = Workload::start_command(cmd, "chain.py");
    let (recv, received) = receiver(vec![503, 503]);
    let url = format!("http://{recv}");
    let (running, addr) = agent(&[
        "--interval",
        "2",
        "--pyroscope",
        &url,
        "--tenant",
        "team-a",
        "--label",
        "env=test",
    ]);
    // Two 503s cost about 1 + 2 s of backoff; windows keep coming meanwhile.
    let deadline = Instant::now() + Duration::from_secs(30);
    while received.lock().unwrap().requests.len() < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let metrics = scrape(&addr);
    running.signal("TERM");
    let (status, stderr) = running.finish(Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
    let retried = metrics
        .get("pyebpf_export_retries_total{backend=\"pyroscope\",cause=\"server\"}")
        .copied();
    assert_eq!(retried, Some(2.0), "{metrics:#?}");
    assert!(
        metrics["pyebpf_exports_total{backend=\"pyroscope\",result=\"ok\"}"] >= 1.0,
        "{metrics:#?}"
    );

    let received = received.lock().unwrap();
    assert!(received.requests.len() >= 3, "{stderr}");
    let mut pushed = 0;
    for (n, (ctype, tenant, request)) in received.requests.iter().enumerate() {
        assert_eq!(ctype, "application/proto");
        assert_eq!(tenant.as_deref(), Some("team-a"));
        for series in &request.series {
            if label(series, "service_name") != Some("payments") {
                continue;
            }
            assert_eq!(label(series, "__name__"), Some("process_cpu"));
            assert_eq!(label(series, "env"), Some("test"));
            assert_eq!(label(series, "pid"), Some(chain.pid().to_string().as_str()));
            // `3.13t` for a free-threaded build.
            let t = if interp.free_threaded { "t" } else { "" };
            let version = format!("{}.{}{t}", interp.version.0, interp.version.1);
            assert_eq!(label(series, "python_version"), Some(version.as_str()));
            assert!(label(series, "hostname").is_some_and(|h| !h.is_empty()));
            let names: Vec<&str> = series.labels.iter().map(|l| l.name.as_str()).collect();
            assert_eq!(&names[..2], ["__name__", "service_name"]);
            for sample in &series.samples {
                let profile = raw(save(&sample.raw_profile, n).to_str().unwrap());
                pushed += profile
                    .samples
                    .iter()
                    .filter(|s| frames_of(&profile, s) == chain_frames())
                    .map(|s| s.values[0])
                    .sum::<i64>();
            }
        }
    }
    // At least two windows of 2 s at 19 Hz, of a process that had at least half a CPU.
    assert!(pushed >= 30, "{pushed} chain samples pushed; {stderr}");
}

/// SIGTERM pushes the window in progress (a long interval never ends on its own) and exits 0.
#[test]
fn sigterm_pushes_the_last_window() {
    let _serial = serial();
    let interp = &interpreters_logged()[0];
    let _chain = Workload::start(interp, "chain.py", &[]);
    let (recv, received) = receiver(Vec::new());
    let url = format!("http://{recv}");
    let (running, addr) = agent(&["--interval", "600", "--pyroscope", &url]);
    watching(&addr);
    std::thread::sleep(stretch(Duration::from_secs(4)));
    let samples = scrape(&addr)["pyebpf_samples_total"];
    running.signal("TERM");
    let (status, stderr) = running.finish(stretch(Duration::from_secs(30)));
    assert!(status.success(), "{stderr}");
    let received = received.lock().unwrap();
    let series: Vec<_> = received
        .requests
        .iter()
        .flat_map(|(_, _, r)| &r.series)
        .collect();
    assert_eq!(
        series
            .iter()
            .filter(|s| label(s, "service_name") == Some("chain"))
            .count(),
        1,
        "one window of chain.py, pushed at SIGTERM: {stderr}"
    );
    let mut pushed = 0;
    for (n, s) in series.iter().enumerate() {
        pushed += raw(save(&s.samples[0].raw_profile, 100 + n).to_str().unwrap()).count();
    }
    // Everything counted before the signal is in the pushed windows, and more since.
    assert!(
        pushed as f64 >= samples && samples >= 20.0,
        "pushed {pushed}, counted {samples} before SIGTERM"
    );
}

/// Bad configuration is one line with the fix and exit code 2, before anything is loaded.
#[test]
fn bad_configuration_is_one_line_exit_2() {
    for (args, expect) in [
        (vec!["--label", "no-equals"], "--label"),
        (vec!["--pyroscope", "ftp://host"], "--pyroscope"),
        (vec!["--tenant", "x"], "--pyroscope URL"),
        (vec!["--listen", "off"], "go nowhere"),
        (vec!["--listen", "256.1.1.1:1"], "--listen"),
    ] {
        let out = Command::new(pyebpf_bin())
            .arg("agent")
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            one_line_error(&stderr).contains(expect),
            "{args:?}: {stderr}"
        );
    }
}

/// A backend that is down: the agent keeps sampling, retries with backoff and counts each
/// failed attempt, keeps its queue bounded, and still exits 0 on SIGTERM within its flush
/// timeout.
#[test]
fn a_dead_backend_is_retried_counted_and_does_not_hold_the_agent() {
    let _serial = serial();
    let interp = &interpreters_logged()[0];
    let _chain = Workload::start(interp, "chain.py", &[]);
    // A port nobody listens on: bound, then closed.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let url = format!("http://{dead}");
    let (running, addr) = agent(&[
        "--interval",
        "1",
        "--pyroscope",
        &url,
        "--flush-timeout",
        "2",
    ]);
    watching(&addr);
    std::thread::sleep(Duration::from_secs(6));
    let metrics = scrape(&addr);
    let (status, health) = get(&format!("http://{addr}/healthz"));
    assert_eq!(status, 200, "{health}");
    let stopped = Instant::now();
    running.signal("TERM");
    let (status, stderr) = running.finish(Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
    assert!(
        stopped.elapsed() < Duration::from_secs(10),
        "took {:?} to stop with a dead backend",
        stopped.elapsed()
    );
    let v = |k: &str| metrics.get(k).copied().unwrap_or(-1.0);
    assert!(
        v("pyebpf_export_retries_total{backend=\"pyroscope\",cause=\"connect\"}") >= 2.0,
        "{metrics:#?}"
    );
    assert_eq!(
        v("pyebpf_exports_total{backend=\"pyroscope\",result=\"ok\"}"),
        0.0
    );
    // Six 1 s windows (the first may be cut before the first sample).
    assert!(v("pyebpf_windows_total") >= 4.0, "{metrics:#?}");
    assert!(v("pyebpf_push_queue_depth") >= 1.0, "{metrics:#?}");
    assert!(v("pyebpf_samples_total") >= 20.0, "{metrics:#?}");
    assert!(stderr.contains("could not be pushed"), "{stderr}");
}

// ---------------------------------------------------------------------------------------------
// OTLP profiles, read by the upstream Python classes (tests/src/otlp.rs).

use serde_json::{json, Value};
use tests::otlp::{self, Receiver};

/// [`agent`] with variables added to its environment.
fn agent_with_env(args: &[&str], env: &[(&str, &str)]) -> (Running, String) {
    let mut all = vec!["agent", "--listen", "127.0.0.1:0"];
    all.extend_from_slice(args);
    let mut running = Running::start_with_env(&all, env);
    running.wait_for("serving /debug/pprof/profile", Duration::from_secs(60));
    let line = running.stderr.last().unwrap().clone();
    let addr = line.rsplit("http://").next().unwrap().trim().to_string();
    (running, addr)
}

/// Requests the receiver answered with 200.
fn accepted(requests: &[Value]) -> Vec<&Value> {
    requests.iter().filter(|r| r["status"] == 200).collect()
}

/// Samples per stack (`function file:line;…`, leaf first).
type Stacks = BTreeMap<String, i64>;

fn otlp_stacks(samples: &[otlp::Sample]) -> Stacks {
    let mut stacks = Stacks::new();
    for s in samples {
        *stacks.entry(s.frames.join(";")).or_default() += s.value;
    }
    stacks
}

fn pprof_stacks(profile: &Raw) -> Stacks {
    let mut stacks = Stacks::new();
    for s in &profile.samples {
        *stacks.entry(frames_of(profile, s).join(";")).or_default() += s.values[0];
    }
    stacks
}

/// The agent feeds an OTLP receiver and Pyroscope at once. The receiver answers 503 twice:
/// the window is retried (counted) and nothing is lost: after SIGTERM, every window of the
/// service reached both backends, with the same samples per stack in the OTLP request as in
/// the pprof of the same window. The upstream classes read the chain's frames and exact lines
/// through the dictionary, the process's resource (service.name from its OTEL_SERVICE_NAME,
/// pid, executable, runtime, the host's OTEL_RESOURCE_ATTRIBUTES, the operator's label) and
/// thread.id / thread.name on each sample.
#[test]
fn otlp_and_pyroscope_at_once_through_503s() {
    let _serial = serial();
    let interp = &interpreters_logged()[0];
    let mut cmd = interp.command(&tests::workloads_dir().join("chain.py"), &[]);
    cmd.env("OTEL_SERVICE_NAME", "payments");
    let chain = Workload::start_command(cmd, "chain.py");
    let collector = Receiver::start(&["503", "503"]);
    let (recv, pyroscope) = receiver(Vec::new());
    let pyroscope_url = format!("http://{recv}");
    let cpu_before = cpu_seconds(chain.pid());
    let (running, addr) = agent_with_env(
        &[
            "--interval",
            "2",
            "--pyroscope",
            &pyroscope_url,
            "--otlp",
            &collector.url(),
            "--label",
            "env=test",
        ],
        &[
            ("OTEL_RESOURCE_ATTRIBUTES", "k8s.node.name=node-7"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20t0ken"),
        ],
    );
    // Two 503s, each answered with Retry-After: 1; windows keep coming meanwhile.
    let deadline = Instant::now() + stretch(Duration::from_secs(60));
    while accepted(&collector.requests()).len() < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let metrics = scrape(&addr);
    running.signal("TERM");
    let (status, stderr) = running.finish(stretch(Duration::from_secs(30)));
    let cpu = cpu_seconds(chain.pid()) - cpu_before;
    assert!(status.success(), "{stderr}");
    let v = |k: &str| metrics.get(k).copied().unwrap_or(-1.0);
    assert_eq!(
        v("pyebpf_export_retries_total{backend=\"otlp\",cause=\"server\"}"),
        2.0,
        "{metrics:#?}"
    );
    assert!(v("pyebpf_exports_total{backend=\"otlp\",result=\"ok\"}") >= 1.0);
    assert_eq!(
        v("pyebpf_exports_total{backend=\"otlp\",result=\"rejected\"}"),
        0.0
    );
    assert!(v("pyebpf_exports_total{backend=\"pyroscope\",result=\"ok\"}") >= 1.0);
    assert!(v("pyebpf_export_dictionary_entries{backend=\"otlp\"}") > 10.0);
    assert!(v("pyebpf_export_queue_depth{backend=\"otlp\"}") >= 0.0);

    let requests = collector.requests();
    assert!(requests.len() >= 5, "{stderr}");
    // The window refused twice is the one accepted next, whole.
    assert_eq!(
        (
            &requests[0]["status"],
            &requests[1]["status"],
            &requests[2]["status"]
        ),
        (&json!(503), &json!(503), &json!(200))
    );
    assert_eq!(requests[0]["resources"], requests[2]["resources"]);
    for r in &requests {
        assert_eq!(r["path"], "/v1development/profiles");
        assert_eq!(r["headers"]["content-type"], "application/x-protobuf");
        assert_eq!(r["headers"]["content-encoding"], "gzip");
        assert_eq!(r["headers"]["authorization"], "Bearer t0ken");
        assert_eq!(r["problems"], json!([]), "{r}");
        assert!(r.get("error").is_none(), "{r}");
    }

    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let executable = std::fs::read_link(format!("/proc/{}/exe", chain.pid())).unwrap();
    // The agent's `python_version`, `3.13t` for a free-threaded build.
    let t = if interp.free_threaded { "t" } else { "" };
    let version = format!("{}.{}{t}", interp.version.0, interp.version.1);
    let mut otlp_windows = Vec::new();
    let mut exact = 0;
    let mut total = 0;
    for request in accepted(&requests) {
        let payments = otlp::resources_with(request, "service.name", &json!("payments"));
        if payments.is_empty() {
            continue;
        }
        assert_eq!(payments.len(), 1, "one resource per process: {request}");
        let resource = payments[0];
        let a = &resource["attributes"];
        assert_eq!(a["process.pid"], json!(chain.pid()));
        assert_eq!(
            a["process.executable.name"],
            json!(executable.file_name().unwrap().to_string_lossy())
        );
        assert_eq!(a["process.runtime.name"], "cpython");
        assert_eq!(a["process.runtime.version"], json!(version));
        assert_eq!(a["host.name"], json!(hostname.trim()));
        assert_eq!(a["k8s.node.name"], "node-7");
        assert_eq!(a["env"], "test");
        let scope = &resource["scopes"][0];
        assert_eq!(scope["name"], "pyebpf");
        let profile = &scope["profiles"][0];
        assert_eq!(profile["sample_type"], json!(["cpu", "nanoseconds"]));
        assert_eq!(profile["period_type"], json!(["cpu", "nanoseconds"]));
        assert_eq!(profile["period"], json!(1_000_000_000 / 19));
        assert!(profile["duration_nano"].as_u64().unwrap() > 0);
        let samples = otlp::samples(resource);
        for s in &samples {
            assert_eq!(s.attributes["thread.id"], json!(chain.pid()), "{s:?}");
            assert!(
                s.attributes["thread.name"]
                    .as_str()
                    .is_some_and(|n| !n.is_empty()),
                "{s:?}"
            );
            total += s.value;
            if s.frames == chain_frames() {
                exact += s.value;
            }
        }
        otlp_windows.push(otlp_stacks(&samples));
    }

    let pyroscope = pyroscope.lock().unwrap();
    let mut pprof_windows = Vec::new();
    for (n, (_, _, request)) in pyroscope.requests.iter().enumerate() {
        for series in &request.series {
            if label(series, "service_name") != Some("payments") {
                continue;
            }
            for sample in &series.samples {
                let profile = raw(save(&sample.raw_profile, 200 + n).to_str().unwrap());
                pprof_windows.push(pprof_stacks(&profile));
            }
        }
    }
    assert!(otlp_windows.len() >= 2, "{stderr}");
    assert_eq!(
        otlp_windows, pprof_windows,
        "every window, with the same samples per stack, in OTLP and in pprof"
    );
    // At 19 Hz over the CPU time the chain had while the agent ran; random subsampling.
    assert!(
        total as f64 >= 0.5 * 19.0 * cpu && total >= 10,
        "{total} samples for {cpu:.2} s of CPU"
    );
    assert!(
        exact * 100 >= total * 95,
        "{exact}/{total} exact chain stacks"
    );
}

/// SIGTERM sends the window in progress over OTLP too (a long interval never ends on its own).
#[test]
fn otlp_sigterm_sends_the_last_window() {
    let _serial = serial();
    let interp = &interpreters_logged()[0];
    let chain = Workload::start(interp, "chain.py", &[]);
    let collector = Receiver::start(&[]);
    let (running, addr) = agent(&["--interval", "600", "--otlp", &collector.url()]);
    watching(&addr);
    let cpu_before = cpu_seconds(chain.pid());
    std::thread::sleep(stretch(Duration::from_secs(4)));
    let samples = scrape(&addr)["pyebpf_samples_total"];
    let cpu = cpu_seconds(chain.pid()) - cpu_before;
    assert!(collector.requests().is_empty());
    running.signal("TERM");
    let (status, stderr) = running.finish(stretch(Duration::from_secs(30)));
    assert!(status.success(), "{stderr}");
    let requests = collector.requests();
    assert_eq!(requests.len(), 1, "one window, sent at SIGTERM: {stderr}");
    let request = &requests[0];
    let chain_resources = otlp::resources_with(request, "process.pid", &json!(chain.pid()));
    assert_eq!(chain_resources.len(), 1, "{request}");
    let sent: i64 = request["resources"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(otlp::samples)
        .map(|s| s.value)
        .sum();
    // Everything counted before the signal is in the window, and more since; the count is at
    // least half of what 19 Hz gives the CPU time the chain had.
    assert!(
        sent as f64 >= samples && samples >= 0.5 * 19.0 * cpu && sent > 0,
        "sent {sent}, counted {samples} before SIGTERM, for {cpu:.2} s of CPU"
    );
}

/// A 400 is not retried: the window is dropped and counted, the next one goes through; a
/// partial success is accepted, logged and counted.
#[test]
fn otlp_a_400_is_dropped_and_counted() {
    let _serial = serial();
    let interp = &interpreters_logged()[0];
    let _chain = Workload::start(interp, "chain.py", &[]);
    let collector = Receiver::start(&["400", "partial"]);
    let (running, addr) = agent(&["--interval", "2", "--otlp", &collector.url()]);
    let deadline = Instant::now() + stretch(Duration::from_secs(60));
    while collector.requests().len() < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let metrics = scrape(&addr);
    running.signal("TERM");
    let (status, stderr) = running.finish(stretch(Duration::from_secs(30)));
    assert!(status.success(), "{stderr}");
    let v = |k: &str| metrics.get(k).copied().unwrap_or(-1.0);
    assert_eq!(
        v("pyebpf_exports_total{backend=\"otlp\",result=\"rejected\"}"),
        1.0,
        "{metrics:#?}"
    );
    assert_eq!(
        v("pyebpf_export_partial_success_total{backend=\"otlp\"}"),
        1.0,
        "{metrics:#?}"
    );
    assert!(v("pyebpf_exports_total{backend=\"otlp\",result=\"ok\"}") >= 2.0);
    for cause in ["connect", "timeout", "server", "throttled"] {
        let key = format!("pyebpf_export_retries_total{{backend=\"otlp\",cause=\"{cause}\"}}");
        assert_eq!(v(&key), 0.0, "{metrics:#?}");
    }
    let requests = collector.requests();
    assert_eq!(requests[0]["status"], 400);
    // Not sent again: the next request is the next window.
    let start = |r: &Value| r["resources"][0]["scopes"][0]["profiles"][0]["time_unix_nano"].clone();
    assert_ne!(start(&requests[0]), start(&requests[1]));
    assert!(stderr.contains("refused"), "{stderr}");
    assert!(stderr.contains("one profile was too old"), "{stderr}");
}

/// A bad OTLP setting, from the flag or a standard variable, is one line naming it, exit 2.
#[test]
fn otlp_bad_configuration_is_one_line_exit_2() {
    for (args, env, expect) in [
        (vec!["--otlp", "ftp://collector"], vec![], "--otlp"),
        (
            vec!["--otlp", "http://u:secret@c:4318"],
            vec![],
            "OTEL_EXPORTER_OTLP_HEADERS",
        ),
        (
            vec!["--otlp"],
            vec![("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd")],
            "OTEL_EXPORTER_OTLP_COMPRESSION",
        ),
        (
            vec!["--otlp"],
            vec![("OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL", "grpc")],
            "http/protobuf",
        ),
        (
            vec!["--otlp"],
            vec![("OTEL_EXPORTER_OTLP_HEADERS", "novalue")],
            "OTEL_EXPORTER_OTLP_HEADERS",
        ),
        (
            vec!["--otlp"],
            vec![("OTEL_RESOURCE_ATTRIBUTES", "=x")],
            "OTEL_RESOURCE_ATTRIBUTES",
        ),
    ] {
        let out = Command::new(pyebpf_bin())
            .arg("agent")
            .args(&args)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?} {env:?}: {stderr}");
        let line = one_line_error(&stderr);
        assert!(line.contains(expect), "{args:?} {env:?}: {stderr}");
        assert!(!stderr.contains("secret"), "{stderr}");
    }
}
