//! Pod identity from the node alone, on real containers, and the image run as the DaemonSet
//! runs it.
//!
//! - A CPython 3.14 process in a podman container carrying the Kubernetes annotations a kubelet
//!   gives (CRI-O and podman write them into the OCI bundle): `record -f pprof` names its pod,
//!   namespace, container and container id, and its service `shop/api`, on its samples, and
//!   nothing of the kind on a host process's, read back with `go tool pprof`.
//! - The image `cargo xtask test` builds (`localhost/pyebpf:test`, the `cargo xtask image`
//!   recipe with the debug binary) run with the flags `packaging/kubernetes/daemonset.yaml`
//!   translates to (`tests/src/daemonset.rs`): from inside its container it profiles the
//!   annotated container and a host process, serves them on `/debug/pprof/profile` (fetched by
//!   `go tool pprof` in the agent's network namespace, as a scraper reaches a pod), answers its
//!   probes, and exits 0 on SIGTERM.
//! - A process moved into a cgroup v2 `kubepods…/cri-containerd-<id>.scope` directory (a
//!   private cgroup2 mount) gets its pod UID and container id from that path.
//! - The manifest is a DaemonSet the Kubernetes API's types read whole, and every setting in
//!   it is one the image test translates.
//!
//! podman here runs only with `--runtime runc` (crun refuses this machine's hybrid cgroups)
//! and ulimits no higher than the current ones (no CAP_SYS_RESOURCE): [`podman_run`] adds
//! those. Sample floors are half of what the rate gives over the CPU time each workload got
//! during the recording.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use tests::pprof::{Pprof, Raw};
use tests::{daemonset, pyebpf_bin, temp_path, Workload};

/// The annotations a kubelet puts on a container (CRI-O copies them into the bundle).
const POD: &str = "web-7d9f";
const NAMESPACE: &str = "shop";
const CONTAINER: &str = "api";
/// Label names that place a sample in a container or a pod.
const PLACE: [&str; 5] = ["container_id", "namespace", "pod", "container", "pod_uid"];

/// A script written to a directory of this test run, named `name` (its program name).
fn script(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("pyebpf-test-{}-k8s", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// The busy loop of the annotated container: its function is the marker of its samples.
const IN_POD: &str = "
def in_pod():
    n = 0
    for i in range(20000):
        n += i * i
    return n
print('ready', flush=True)
while True:
    in_pod()
";
/// The host process's.
const ON_HOST: &str = "
def on_host():
    n = 0
    for i in range(20000):
        n += i * i
    return n
print('ready', flush=True)
while True:
    on_host()
";

/// The tests take turns: each keeps CPUs busy, which would starve the others' workloads.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn image(var: &str) -> String {
    let image = std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: run the tests with `cargo xtask test`, which builds the images")
    });
    let exists = Command::new("podman")
        .args(["image", "exists", &image])
        .status()
        .unwrap_or_else(|e| panic!("podman: {e} (`cargo xtask test` installs it)"));
    assert!(
        exists.success(),
        "{image} does not exist: `cargo xtask test` builds it"
    );
    image
}

/// `podman run --detach --name=NAME` as this machine allows it; append flags, image and
/// command, and start it with [`Running::start`].
fn podman_run(name: &str) -> Command {
    let _ = Command::new("podman").args(["rm", "-f", name]).output();
    let mut cmd = Command::new("podman");
    cmd.args([
        "run",
        "--detach",
        &format!("--name={name}"),
        "--runtime",
        "runc",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=4096:4096",
    ]);
    cmd
}

fn podman(args: &[&str]) -> String {
    let out = Command::new("podman")
        .args(args)
        .output()
        .expect("running podman");
    assert!(
        out.status.success(),
        "podman {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A container started with `podman run -d`, removed when dropped.
struct Running {
    name: String,
}

impl Running {
    fn start(name: &str, mut cmd: Command) -> Running {
        let out = cmd.output().expect("running podman run");
        assert!(
            out.status.success(),
            "podman run {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Running { name: name.into() }
    }

    fn inspect(&self, format: &str) -> String {
        podman(&["inspect", "--format", format, &self.name])
    }

    fn pid(&self) -> u32 {
        self.inspect("{{.State.Pid}}").parse().expect("a pid")
    }

    fn id(&self) -> String {
        self.inspect("{{.Id}}")
    }

    fn logs(&self) -> String {
        let out = Command::new("podman")
            .args(["logs", &self.name])
            .output()
            .expect("podman logs");
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// Waits until the container printed `text`.
    fn wait_for(&self, text: &str, timeout: Duration) {
        let start = Instant::now();
        while !self.logs().contains(text) {
            assert!(
                start.elapsed() < timeout,
                "{} did not print {text:?} in {timeout:?}:\n{}",
                self.name,
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rm", "-f", "--time", "2", &self.name])
            .output();
    }
}

/// The annotated container running [`IN_POD`] under CPython 3.14.
fn annotated_container(tag: &str) -> Running {
    let name = format!("pyebpf-test-{}-{tag}", std::process::id());
    let mut cmd = podman_run(&name);
    let script = script("in_pod.py", IN_POD);
    cmd.args([
        "--network=none",
        &format!("--volume={}:/work/in_pod.py:ro", script.display()),
        "--annotation",
        &format!("io.kubernetes.pod.name={POD}"),
        "--annotation",
        &format!("io.kubernetes.pod.namespace={NAMESPACE}"),
        "--annotation",
        &format!("io.kubernetes.container.name={CONTAINER}"),
        &image("PYEBPF_TEST_PYTHON_IMAGE"),
        "python3.14",
        "/work/in_pod.py",
    ]);
    let running = Running::start(&name, cmd);
    running.wait_for("ready", Duration::from_secs(60));
    running
}

/// Debian's python3 on the host running [`ON_HOST`] as `on_host.py`.
fn host_process() -> Workload {
    let mut cmd = Command::new("/usr/bin/python3");
    cmd.arg(script("on_host.py", ON_HOST));
    Workload::start_command(cmd, "a host python3")
}

/// user + system CPU seconds `pid` has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("reading stat");
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

/// CPU seconds `pids` got while `sampled` seconds of sampling ran within `f`: the CPU they had
/// over all of `f` (start-up included, which can take seconds on a loaded machine), scaled to
/// the sampled part.
fn cpu_while<T>(pids: &[u32], sampled: f64, f: impl FnOnce() -> T) -> (T, Vec<f64>) {
    let before: Vec<f64> = pids.iter().map(|&p| cpu_seconds(p)).collect();
    let start = Instant::now();
    let result = f();
    let wall = start.elapsed().as_secs_f64().max(sampled);
    let cpu = pids
        .iter()
        .zip(before)
        .map(|(&p, b)| (cpu_seconds(p) - b) * sampled / wall)
        .collect();
    (result, cpu)
}

/// Samples of `pid` in `raw`, with their labels, and their count.
fn samples_of(raw: &Raw, pid: u32) -> (Vec<&BTreeMap<String, String>>, i64) {
    let pid = pid.to_string();
    let of: Vec<_> = raw
        .samples
        .iter()
        .filter(|s| s.labels.get("pid") == Some(&pid))
        .collect();
    let count = of.iter().map(|s| s.values[0]).sum();
    (of.iter().map(|s| &s.labels).collect(), count)
}

/// Checks the labels of the container's and the host process's samples, and the floors.
fn check_labels(raw: &Raw, container: (u32, &str, f64), host: (u32, f64), rate: f64, what: &str) {
    let (pid, id, cpu) = container;
    let (labels, count) = samples_of(raw, pid);
    let floor = (0.5 * rate * cpu).floor() as i64;
    assert!(
        count >= floor.max(1),
        "{what}: {count} samples of the container's process (pid {pid}), expected at least {floor} (half of {rate} Hz × {cpu:.2} CPU s)"
    );
    let in_pod = raw
        .samples
        .iter()
        .filter(|s| s.labels.get("pid") == Some(&pid.to_string()))
        .any(|s| raw.frames(s).iter().any(|f| f.function == "in_pod"));
    assert!(in_pod, "{what}: no sample of the container in in_pod()");
    for l in &labels {
        let get = |k: &str| l.get(k).map(String::as_str);
        assert_eq!(get("pod"), Some(POD), "{what}: {l:?}");
        assert_eq!(get("namespace"), Some(NAMESPACE), "{what}: {l:?}");
        assert_eq!(get("container"), Some(CONTAINER), "{what}: {l:?}");
        assert_eq!(get("container_id"), Some(id), "{what}: {l:?}");
        assert_eq!(get("service_name"), Some("shop/api"), "{what}: {l:?}");
        // podman's cgroup path is no kubepods path, and the annotations gave no UID.
        assert_eq!(get("pod_uid"), None, "{what}: {l:?}");
    }

    let (pid, cpu) = host;
    let (labels, count) = samples_of(raw, pid);
    let floor = (0.5 * rate * cpu).floor() as i64;
    assert!(
        count >= floor.max(1),
        "{what}: {count} samples of the host process (pid {pid}), expected at least {floor}"
    );
    for l in &labels {
        for name in PLACE {
            assert!(
                !l.contains_key(name),
                "{what}: host sample with {name}: {l:?}"
            );
        }
        // Named by its script, as before pods were known.
        assert_eq!(
            l.get("service_name").map(String::as_str),
            Some("on_host"),
            "{what}: {l:?}"
        );
    }
}

#[test]
fn annotated_container_names_its_pod_on_its_samples_only() {
    let _turn = one_at_a_time();
    let container = annotated_container("record");
    let host = host_process();
    let (cpid, id) = (container.pid(), container.id());
    assert_eq!(id.len(), 64, "podman's id: {id}");
    let out = temp_path("k8s-record", "pb.gz");
    let rate = 99.0;
    let (recorded, cpu) = cpu_while(&[cpid, host.pid()], 3.0, || {
        Command::new(pyebpf_bin())
            .args(["record", "-f", "pprof", "-r", "99", "-d", "3", "-o"])
            .arg(&out)
            .args(["-p", &cpid.to_string(), "-p", &host.pid().to_string()])
            .output()
            .expect("running pyebpf record")
    });
    assert!(
        recorded.status.success(),
        "pyebpf record: {}",
        String::from_utf8_lossy(&recorded.stderr)
    );
    let raw = Pprof::new().raw(&out);
    let _ = std::fs::remove_file(&out);
    check_labels(
        &raw,
        (cpid, &id, cpu[0]),
        (host.pid(), cpu[1]),
        rate,
        "record -f pprof",
    );
}

/// `GET http://127.0.0.1:PORT/PATH` inside the network namespace of `pid`; the status.
fn http_status_in(pid: u32, port: &str, path: &str) -> Option<u16> {
    let code = format!(
        "import urllib.request\ntry:\n print(urllib.request.urlopen('http://127.0.0.1:{port}{path}', timeout=5).status)\nexcept Exception as e:\n print(0)"
    );
    let out = Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .args(["--", "/usr/bin/python3", "-c", &code])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

fn http_body_in(pid: u32, port: &str, path: &str) -> String {
    let code = format!(
        "import urllib.request,sys\nsys.stdout.write(urllib.request.urlopen('http://127.0.0.1:{port}{path}', timeout=10).read().decode())"
    );
    let out = Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .args(["--", "/usr/bin/python3", "-c", &code])
        .output()
        .expect("nsenter python3");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn hostname() -> String {
    profiler::identity::hostname().expect("this host's name")
}

#[test]
fn the_image_runs_as_the_daemonset_runs_it() {
    let _turn = one_at_a_time();
    let node = hostname();
    let run = daemonset::podman_run(&daemonset::load(), &node)
        .unwrap_or_else(|e| panic!("daemonset.yaml: {e}"));
    let container = annotated_container("ds-target");
    let host = host_process();
    let (cpid, id) = (container.pid(), container.id());

    let name = format!("pyebpf-test-{}-agent", std::process::id());
    let mut cmd = podman_run(&name);
    cmd.args(&run.flags)
        .arg(image("PYEBPF_TEST_IMAGE"))
        .args(&run.args);
    let agent = Running::start(&name, cmd);
    let apid = agent.pid();
    // The probes the kubelet would send, until they pass.
    let start = Instant::now();
    for (path, port) in &run.probes {
        while http_status_in(apid, port, path) != Some(200) {
            assert!(
                start.elapsed() < Duration::from_secs(90),
                "probe {path} on :{port} never answered 200; the agent says:\n{}",
                agent.logs()
            );
            assert!(
                agent.inspect("{{.State.Running}}") == "true",
                "the agent exited:\n{}",
                agent.logs()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    let port = &run.probes[0].1;

    // A scraper's pull, as Parca or Alloy would fetch it, in the pod's network namespace.
    let seconds = 5.0;
    let url = format!("http://127.0.0.1:{port}/debug/pprof/profile?seconds={seconds}");
    let (raw, cpu) = cpu_while(&[cpid, host.pid()], seconds, || {
        Pprof::in_netns(format!("/proc/{apid}/ns/net")).raw(Path::new(&url))
    });
    // The agent samples at 19 Hz on average (one CPU-clock tick in four at 76 Hz).
    check_labels(
        &raw,
        (cpid, &id, cpu[0]),
        (host.pid(), cpu[1]),
        19.0,
        "the DaemonSet's image, /debug/pprof/profile",
    );

    // The container's identity was looked up once, from its bundle.
    let metrics = http_body_in(apid, port, "/metrics");
    let value = |line: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(line)?.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {line} in /metrics:\n{metrics}"))
    };
    assert!(value("pyebpf_identity_containers_total ") >= 1.0);
    assert_eq!(
        value("pyebpf_identity_sources_missing_total{source=\"bundle\",reason=\"not_found\"} "),
        0.0
    );

    // It stays within the memory limit the manifest gives it.
    let limit = run
        .flags
        .iter()
        .find_map(|f| f.strip_prefix("--memory="))
        .and_then(|m| m.parse::<u64>().ok())
        .expect("the manifest sets a memory limit");
    let status = std::fs::read_to_string(format!("/proc/{apid}/status")).unwrap();
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    assert!(
        peak_kib * 1024 < limit,
        "the agent peaked at {peak_kib} KiB, over the manifest's limit of {limit} bytes"
    );

    // SIGTERM, as the kubelet stops a pod: the window is flushed and the agent exits 0.
    podman(&["kill", "--signal", "TERM", &agent.name]);
    let code = podman(&["wait", &agent.name]);
    assert_eq!(
        code,
        "0",
        "exit code after SIGTERM; logs:\n{}",
        agent.logs()
    );
    assert!(
        agent.logs().contains("stopped (Signal(SIGTERM))"),
        "{}",
        agent.logs()
    );
}

/// A private cgroup2 mount (the machine's unified hierarchy, empty in this hybrid setup).
fn in_cgroup2(script: &str) {
    let status = Command::new("unshare")
        .args(["-m", "sh", "-ec"])
        .arg(format!(
            "d=$(mktemp -d); mount -t cgroup2 none \"$d\"; cd \"$d\"; {script}; cd /; umount \"$d\"; rmdir \"$d\""
        ))
        .status()
        .expect("unshare");
    assert!(status.success(), "in a private cgroup2 mount: {script}");
}

#[test]
fn a_cgroup_v2_kubepods_path_gives_pod_uid_and_container_id() {
    let _turn = one_at_a_time();
    // Unique per run: two test runs may race.
    let nonce = format!("{:08x}", std::process::id());
    let uid = format!("1f2e3d4c-5b6a-4978-8695-a4b3{nonce}");
    let id = format!("{nonce}{}", "c0ffee".repeat(10))
        .chars()
        .take(64)
        .collect::<String>();
    let dir = format!(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{id}.scope",
        uid.replace('-', "_")
    );
    let mut cmd = Command::new("/usr/bin/python3");
    cmd.arg(script("on_host.py", ON_HOST))
        // What a container runtime sets: the pod's name, when nothing better says it.
        .env("HOSTNAME", "web-6b7c-xk2lp");
    let workload = Workload::start_command(cmd, "python3 in a kubepods cgroup");
    let pid = workload.pid();
    in_cgroup2(&format!("mkdir -p {dir}; echo {pid} > {dir}/cgroup.procs"));
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(
        cgroup.contains(&format!("0::/{dir}")),
        "the kernel shows the process in {dir}:\n{cgroup}"
    );

    let found = profiler::identity::resolve(pid, "3.11").unwrap();
    let out = temp_path("k8s-cgroup2", "pb.gz");
    let (recorded, cpu) = cpu_while(&[pid], 2.0, || {
        Command::new(pyebpf_bin())
            .args(["record", "-f", "pprof", "-r", "99", "-d", "2", "-o"])
            .arg(&out)
            .args(["-p", &pid.to_string()])
            .output()
            .expect("running pyebpf record")
    });
    let cpu = cpu[0];
    drop(workload);
    // The process is gone: its cgroups can go, innermost first (a parent another run still
    // uses stays).
    std::thread::sleep(Duration::from_millis(200));
    let parts: Vec<&str> = dir.split('/').collect();
    let rm: Vec<String> = (1..=parts.len())
        .rev()
        .map(|n| format!("rmdir {} 2>/dev/null || true", parts[..n].join("/")))
        .collect();
    in_cgroup2(&rm.join("; "));

    assert_eq!(found.container_id.as_deref(), Some(id.as_str()));
    assert_eq!(found.kubernetes.pod_uid.as_deref(), Some(uid.as_str()));
    assert_eq!(
        found.container_runtime,
        Some(profiler::identity::Runtime::Containerd)
    );
    // No bundle (no runtime made this container), no service-account file: the UID from the
    // path, the pod's name from HOSTNAME.
    assert_eq!(found.kubernetes.pod.as_deref(), Some("web-6b7c-xk2lp"));
    assert_eq!(found.kubernetes.namespace, None);
    assert_eq!(found.kubernetes.container, None);
    assert_eq!(found.service_name, &id[..12]);

    assert!(
        recorded.status.success(),
        "pyebpf record: {}",
        String::from_utf8_lossy(&recorded.stderr)
    );
    let raw = Pprof::new().raw(&out);
    let _ = std::fs::remove_file(&out);
    let (labels, count) = samples_of(&raw, pid);
    let floor = (0.5 * 99.0 * cpu).floor() as i64;
    assert!(
        count >= floor.max(1),
        "{count} samples, expected at least {floor}"
    );
    for l in labels {
        assert_eq!(l.get("pod_uid"), Some(&uid), "{l:?}");
        assert_eq!(l.get("container_id"), Some(&id), "{l:?}");
        assert_eq!(l.get("pod").map(String::as_str), Some("web-6b7c-xk2lp"));
        assert_eq!(l.get("namespace"), None);
    }
}

#[test]
fn the_manifest_is_what_the_image_test_runs() {
    // Kubernetes' own types read the whole file: nothing in it is unknown or misspelled
    // (read untyped and read typed, the two agree).
    let text = daemonset::text();
    let untyped: serde_json::Value = serde_norway::from_str(&text).expect("YAML");
    let ds = daemonset::load();
    let typed = serde_json::to_value(&ds).unwrap();
    assert_eq!(
        typed, untyped,
        "daemonset.yaml has fields the Kubernetes API does not know"
    );

    // Every setting is one the image test translates (or knows not to apply).
    let run = daemonset::podman_run(&ds, "node-1").unwrap_or_else(|e| panic!("{e}"));
    for expected in [
        "--pid=host",
        "--network=none",
        "--cap-drop=all",
        "--cap-add=CAP_BPF",
        "--cap-add=CAP_PERFMON",
        "--cap-add=CAP_SYS_PTRACE",
        "--cap-add=CAP_DAC_READ_SEARCH",
        "--security-opt=no-new-privileges",
        "--read-only",
        "--user=0",
        "--env=NODE_NAME=node-1",
        "--env=PYEBPF_LABELS=node=node-1,hostname=node-1",
        "--env=PYEBPF_LISTEN=0.0.0.0:7071",
    ] {
        assert!(
            run.flags.iter().any(|f| f == expected),
            "{expected} not in {:?}",
            run.flags
        );
    }
    let caps: Vec<&String> = run
        .flags
        .iter()
        .filter(|f| f.starts_with("--cap-add="))
        .collect();
    assert_eq!(caps.len(), 4, "exactly four capabilities: {caps:?}");
    assert!(!run.flags.iter().any(|f| f == "--privileged"));
    assert!(run.flags.iter().any(|f| f.starts_with("--memory=")));
    assert!(run.flags.iter().any(|f| f.starts_with("--cpus=")));
    assert_eq!(run.image, "localhost/pyebpf:latest");
    assert_eq!(run.args, ["agent"]);
    assert_eq!(
        run.probes,
        [
            ("/healthz".to_string(), "7071".to_string()),
            ("/healthz".to_string(), "7071".to_string())
        ]
    );

    // What a cluster reads off the pod: scrape annotations, requests and limits.
    let template = &ds.spec.as_ref().unwrap().template;
    let annotations = template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default();
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/port"], "7071");
    assert_eq!(annotations["prometheus.io/path"], "/metrics");
    let pod = template.spec.as_ref().unwrap();
    assert_eq!(pod.host_pid, Some(true));
    let resources = pod.containers[0].resources.as_ref().unwrap();
    for part in [&resources.requests, &resources.limits] {
        let part = part.as_ref().expect("requests and limits");
        assert!(part.contains_key("cpu") && part.contains_key("memory"));
    }
}
