//! The agent's labels for real Python processes: `identity::resolve` on the pids of
//! workloads started the ways services are started — named by their environment
//! (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `PYROSCOPE_APPLICATION_NAME`), run as a
//! module (`python -X dev -u -m pkg`), and run as console scripts (`#!/usr/bin/env python3`
//! files named `gunicorn` and `celery`, the way pip installs them).
//!
//! Userspace only: no BPF, so no root needed. Runs under every host interpreter (not the sid
//! chroot, whose processes would need the files copied in).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use profiler::identity::{self, OperatorLabels, ProcessLabels, ServiceSource};
use tests::{interpreters_logged, Interpreter, Workload};

/// A workload's body: says it is ready, then waits to be killed.
const READY_AND_WAIT: &str = "import time\nprint('ready', flush=True)\ntime.sleep(120)\n";

/// A directory removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("pyebpf-agent-labels-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }

    fn write(&self, relative: &str, text: &str) -> PathBuf {
        let path = self.0.join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    }

    fn executable(&self, relative: &str, text: &str) -> PathBuf {
        let path = self.write(relative, text);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn host_interpreters() -> Vec<Interpreter> {
    let found: Vec<Interpreter> = interpreters_logged()
        .into_iter()
        .filter(|i| i.root.is_none())
        .collect();
    assert!(!found.is_empty(), "no host CPython 3.11+ to run workloads");
    found
}

fn version(interp: &Interpreter) -> String {
    format!("{}.{}", interp.version.0, interp.version.1)
}

fn start(mut cmd: Command, what: &str) -> Workload {
    cmd.env("PYTHONDONTWRITEBYTECODE", "1");
    Workload::start_command(cmd, what)
}

fn resolve(workload: &Workload, interp: &Interpreter) -> ProcessLabels {
    identity::resolve(workload.pid(), &version(interp))
        .unwrap_or_else(|e| panic!("resolving pid {}: {e}", workload.pid()))
}

/// The name a process gets when it is named by its program, here: in a container (when the
/// tests themselves run in one) the container's short id comes first.
fn program_or_container(program: &str) -> (String, ServiceSource) {
    match identity::container_id(std::process::id()) {
        Some(id) => (
            identity::short_id(&id).to_string(),
            ServiceSource::Container,
        ),
        None => (program.to_string(), ServiceSource::Program),
    }
}

/// What the kernel shows as `comm` for an executable run by path: its file name, cut to 15
/// bytes.
fn comm_of(path: &Path) -> String {
    let name = path.file_name().unwrap().to_string_lossy();
    name.chars().take(15).collect()
}

#[test]
fn the_environment_names_a_service_first() {
    let scratch = Scratch::new("env");
    let app = scratch.write("app.py", READY_AND_WAIT);
    for interp in host_interpreters() {
        let what = format!("app.py under {}", interp.label);
        let cases = [
            (
                ("OTEL_SERVICE_NAME", "checkout"),
                "checkout",
                ServiceSource::OtelServiceName,
            ),
            (
                (
                    "OTEL_RESOURCE_ATTRIBUTES",
                    "deployment.environment=prod,service.name=cart%20api",
                ),
                "cart api",
                ServiceSource::OtelResourceAttributes,
            ),
            (
                ("PYROSCOPE_APPLICATION_NAME", "ride-sharing{region=eu}"),
                "ride-sharing",
                ServiceSource::PyroscopeApplicationName,
            ),
        ];
        for ((key, value), service, source) in cases {
            let mut cmd = interp.command(&app, &[]);
            cmd.env(key, value);
            let workload = start(cmd, &what);
            let found = resolve(&workload, &interp);
            assert_eq!(found.service_name, service, "{key}={value} ({what})");
            assert_eq!(found.service_source, source, "{what}");
            assert_eq!(found.pid, workload.pid());
            assert_eq!(found.comm, comm_of(&interp.exe), "{what}");
            assert_eq!(found.python_version, version(&interp));
            assert_eq!(
                found.container_id,
                identity::container_id(std::process::id())
            );
        }

        // Without them, the script names it.
        let workload = start(interp.command(&app, &[]), &what);
        let found = resolve(&workload, &interp);
        assert_eq!(
            (found.service_name, found.service_source),
            program_or_container("app"),
            "{what}"
        );
    }
}

#[test]
fn a_module_names_a_service() {
    let scratch = Scratch::new("module");
    scratch.write("mypkg/__init__.py", "");
    scratch.write("mypkg/__main__.py", READY_AND_WAIT);
    scratch.write("mypkg/server.py", READY_AND_WAIT);
    for interp in host_interpreters() {
        // Interpreter options before `-m` are skipped, with their values.
        for (args, module) in [
            (
                &["-u", "-X", "dev", "-W", "ignore", "-O", "-m", "mypkg"][..],
                "mypkg",
            ),
            (&["-uB", "-mmypkg.server"][..], "mypkg.server"),
        ] {
            let mut cmd = Command::new(&interp.exe);
            cmd.args(args).current_dir(&scratch.0);
            let what = format!("{args:?} under {}", interp.label);
            let workload = start(cmd, &what);
            let found = resolve(&workload, &interp);
            assert_eq!(
                (found.service_name, found.service_source),
                program_or_container(module),
                "{what}"
            );
        }
    }
}

#[test]
fn console_scripts_name_their_app_or_themselves() {
    let scratch = Scratch::new("scripts");
    let shebang = "#!/usr/bin/env python3\n";
    let gunicorn = scratch.executable("venv/bin/gunicorn", &format!("{shebang}{READY_AND_WAIT}"));
    let celery = scratch.executable("venv/bin/celery", &format!("{shebang}{READY_AND_WAIT}"));
    let mysvc = scratch.executable("venv/bin/mysvc", &format!("{shebang}{READY_AND_WAIT}"));
    for interp in host_interpreters() {
        // `/usr/bin/env python3` finds the interpreter under test first on PATH.
        let bin = scratch.0.join(format!("python-{}", version(&interp)));
        std::fs::create_dir_all(&bin).unwrap();
        let python3 = bin.join("python3");
        if !python3.exists() {
            std::os::unix::fs::symlink(&interp.exe, &python3).unwrap();
        }
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let cases: [(&Path, &[&str], &str); 5] = [
            (
                &gunicorn,
                &["-w", "2", "-k", "gevent.worker", "app:app"],
                "app",
            ),
            (
                &gunicorn,
                &["--bind=0.0.0.0:8000", "shop.wsgi:application"],
                "shop.wsgi",
            ),
            (&gunicorn, &[], "gunicorn"),
            (&celery, &["-A", "proj", "worker", "-l", "info"], "proj"),
            (&mysvc, &["--serve"], "mysvc"),
        ];
        for (script, args, service) in cases {
            let mut cmd = Command::new(script);
            cmd.args(args).env("PATH", &path);
            let what = format!("{} {args:?} under {}", script.display(), interp.label);
            let workload = start(cmd, &what);
            let found = resolve(&workload, &interp);
            assert_eq!(
                (found.service_name.clone(), found.service_source),
                program_or_container(service),
                "{what}"
            );
            // env ran `python3`: that is the process's name now.
            assert_eq!(found.comm, "python3", "{what}");

            // And the series Pyroscope gets for it.
            let operator = OperatorLabels::parse(&["env=test"]).unwrap();
            let host = identity::hostname().unwrap();
            let series = identity::series_labels(
                &found.service_name,
                &host,
                &operator,
                std::iter::once(&found),
            );
            let pairs: Vec<(&str, &str)> = series
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            assert_eq!(pairs[0], ("__name__", "process_cpu"));
            assert_eq!(pairs[1], ("service_name", found.service_name.as_str()));
            let pid = workload.pid().to_string();
            for expected in [
                ("comm", "python3"),
                ("env", "test"),
                ("hostname", host.as_str()),
                ("pid", pid.as_str()),
                ("python_version", version(&interp).as_str()),
            ] {
                assert!(pairs.contains(&expected), "{expected:?} in {pairs:?}");
            }
            // A process outside any container is in no pod.
            if found.container_id.is_none() {
                assert!(
                    found.kubernetes.is_empty(),
                    "{what}: {:?}",
                    found.kubernetes
                );
                for name in ["namespace", "pod", "container", "pod_uid", "container_id"] {
                    assert!(
                        !pairs.iter().any(|(k, _)| *k == name),
                        "{name} in {pairs:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_process_that_is_gone_is_an_error() {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    assert!(matches!(
        identity::resolve(pid, "3.12"),
        Err(identity::ResolveError::Gone { .. })
    ));
}
