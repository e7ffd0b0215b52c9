//! Who a process is: the labels the agent puts on its profiles.
//!
//! A profiling backend groups profiles by `service_name`, so the agent has to name every Python
//! process on the host without help from it. It takes the first of:
//!
//! 1. **What the process was told.** Its environment as it was at exec (`/proc/PID/environ`;
//!    later `os.environ` changes are not visible there): `OTEL_SERVICE_NAME`, then
//!    `service.name` in `OTEL_RESOURCE_ATTRIBUTES` (the OTel SDK's own precedence), then
//!    `PYROSCOPE_APPLICATION_NAME` (what Pyroscope's Python SDK reads). An operator who set
//!    these for tracing gets the same name on profiles.
//! 2. **The container it runs in**, from `/proc/PID/cgroup`: docker (`/docker/<id>`,
//!    `docker-<id>.scope`), containerd/CRI (`cri-containerd-<id>.scope`, `…:cri-containerd:<id>`,
//!    kubepods paths), CRI-O (`crio-<id>.scope`) and podman (`libpod-<id>.scope`). The path
//!    carries the 64-hex container id and, under Kubernetes, the pod's QoS class and UID, but
//!    never a name: names live in the runtime's API (dockerd, the kubelet), which the agent does
//!    not call. So the service is the short id (12 hex digits, as `docker ps` shows it) and
//!    `container_id` carries the full one. Paths are as the agent's cgroup namespace shows them:
//!    run the agent in the host's (`--cgroupns=host`, `hostPID`) or it sees none.
//! 3. **The program**, from `/proc/PID/cmdline` (see [`program_from_argv`]): the script
//!    (`python app.py` → `app`), the module (`python -m mypkg.server` → `mypkg.server`), or for a
//!    known launcher the application it serves, else the launcher's name
//!    (`gunicorn app:app` → `app`, `celery -A proj worker` → `proj`, `gunicorn` alone →
//!    `gunicorn`). Any other console script is named by its file (`/venv/bin/mysvc` → `mysvc`).
//! 4. `comm`, when the command line is empty.
//!
//! Operator labels (`--label k=v`) come last and override any of these, including
//! `service_name`.
//!
//! Bounds: `environ` and `cmdline` reads stop at [`PROC_READ_CAP`] bytes (both can be megabytes;
//! a truncated last entry is dropped), at most [`MAX_ARGS`] arguments are looked at, and a
//! value taken from another process is cut to [`MAX_DERIVED_VALUE`] bytes. Everything read from
//! the target is untrusted: no parser here panics on it, and bytes that are not UTF-8 are
//! replaced, never passed on as label values.

use std::collections::BTreeMap;
use std::io::Read;

/// Bytes read from `/proc/PID/environ` and `/proc/PID/cmdline`. Environments in containers
/// are a few KiB; the variables that matter are usually set by the orchestrator and come early.
pub(crate) const PROC_READ_CAP: usize = 64 * 1024;
/// Bytes read from `/proc/PID/cgroup` (one line per hierarchy, a few hundred bytes each).
const CGROUP_READ_CAP: usize = 16 * 1024;
/// Command-line arguments looked at when naming a program.
pub(crate) const MAX_ARGS: usize = 256;
/// A service name derived from another process's data is cut to this many bytes (at a
/// character boundary): a name is for people to read, and the backend keeps it per series.
pub(crate) const MAX_DERIVED_VALUE: usize = 256;
/// Pyroscope's default `validation.max-label-name-length`.
pub(crate) const MAX_LABEL_NAME: usize = 1024;
/// Pyroscope's default `validation.max-label-value-length`.
pub(crate) const MAX_LABEL_VALUE: usize = 2048;
/// Pyroscope's default `validation.max-label-names-per-series`; a series with more is refused.
pub(crate) const MAX_LABELS_PER_SERIES: usize = 30;
/// The series name Pyroscope files CPU profiles of processes under.
pub(crate) const PROFILE_NAME: &str = "process_cpu";
/// Labels the agent sets itself on every series: `__name__`, `service_name`, `hostname`,
/// `pid`, `comm`, `python_version`, `container_id`.
const BUILTIN_LABELS: usize = 7;
/// `--label`s an operator may add without the series going over [`MAX_LABELS_PER_SERIES`].
pub(crate) const MAX_OPERATOR_LABELS: usize = MAX_LABELS_PER_SERIES - BUILTIN_LABELS;

/// Where a process's `service_name` came from; worth a log line, since a surprising name is
/// the first thing an operator asks about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceSource {
    OtelServiceName,
    OtelResourceAttributes,
    PyroscopeApplicationName,
    Container,
    Program,
    Comm,
}

/// What the agent knows about one process, before operator labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessLabels {
    pub pid: u32,
    /// `/proc/PID/comm`: at most 15 bytes, set by the kernel from the executable's name or by
    /// the process itself (`prctl`, `setproctitle`).
    pub comm: String,
    pub service_name: String,
    pub service_source: ServiceSource,
    /// Full (64 hex digits, lower case) container id, when the process runs in one.
    pub container_id: Option<String>,
    /// `3.12`, as the caller's layout says; passed through.
    pub python_version: String,
}

impl ProcessLabels {
    /// What a short command line alone says: for a process whose `/proc` entries are gone.
    pub(crate) fn from_command(pid: u32, python_version: &str, command: &str) -> ProcessLabels {
        let comm = cap(
            basename(command.split_whitespace().next().unwrap_or("python")),
            MAX_DERIVED_VALUE,
        );
        ProcessLabels {
            pid,
            service_name: comm.clone(),
            service_source: ServiceSource::Comm,
            comm,
            container_id: None,
            python_version: python_version.to_string(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("process {pid} is gone")]
    Gone { pid: u32 },
    #[error("cannot read /proc/{pid}/comm: {source}")]
    Unreadable {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
}

/// Resolves `pid`'s labels from `/proc`. Only a process that is gone (or whose `comm` cannot be
/// read at all) is an error; a source that cannot be read (an `environ` hidden by the kernel's
/// ptrace check, say) is skipped and the next one decides.
pub fn resolve(pid: u32, python_version: &str) -> Result<ProcessLabels, ResolveError> {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).map_err(|source| {
        if crate::procfs::is_absent(&source) {
            ResolveError::Gone { pid }
        } else {
            ResolveError::Unreadable { pid, source }
        }
    })?;
    let comm = cap(comm.trim_end_matches('\n'), MAX_DERIVED_VALUE);
    let environ = read_capped(&format!("/proc/{pid}/environ"), PROC_READ_CAP).unwrap_or_default();
    let cmdline = read_capped(&format!("/proc/{pid}/cmdline"), PROC_READ_CAP).unwrap_or_default();
    let container_id = container_id(pid);
    let env = Environ::parse(&environ.bytes, environ.truncated);
    let argv = split_cmdline(&cmdline.bytes, cmdline.truncated);
    let argv: Vec<&str> = argv.iter().map(|a| a.as_ref()).collect();
    let (service_name, service_source) = service_name(&env, container_id.as_deref(), &argv)
        .unwrap_or((comm.clone(), ServiceSource::Comm));
    Ok(ProcessLabels {
        pid,
        comm,
        service_name,
        service_source,
        container_id,
        python_version: python_version.to_string(),
    })
}

/// The container id in `pid`'s cgroup path, if it has one (see [`container_id_from_cgroup`]).
pub fn container_id(pid: u32) -> Option<String> {
    let cgroup = read_capped(&format!("/proc/{pid}/cgroup"), CGROUP_READ_CAP).ok()?;
    container_id_from_cgroup(&String::from_utf8_lossy(&cgroup.bytes))
}

/// This host's name (the agent's UTS namespace: in a container that is the container's, so a
/// DaemonSet runs with `hostNetwork`, or the operator sets `--label hostname=…`). Read once.
pub fn hostname() -> std::io::Result<String> {
    let name = nix::unistd::gethostname()?;
    Ok(cap(&name.to_string_lossy(), MAX_DERIVED_VALUE))
}

/// The service name of a process from its environment, container and command line, in that
/// order; `None` when none of them names it.
pub fn service_name(
    env: &Environ,
    container_id: Option<&str>,
    argv: &[&str],
) -> Option<(String, ServiceSource)> {
    if let Some(found) = env.service_name() {
        return Some(found);
    }
    if let Some(id) = container_id {
        return Some((short_id(id).to_string(), ServiceSource::Container));
    }
    let program = program_from_argv(argv, env)?;
    Some((
        cap(&program.name, MAX_DERIVED_VALUE),
        ServiceSource::Program,
    ))
}

/// The first 12 characters of a container id: what `docker ps`, `crictl ps` and `podman ps`
/// show, and unique in practice on one host.
pub fn short_id(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

// ---------------------------------------------------------------------------------------------
// /proc reads

#[derive(Default)]
struct Capped {
    bytes: Vec<u8>,
    /// The file had more than the cap: its last entry may be cut.
    truncated: bool,
}

fn read_capped(path: &str, cap: usize) -> std::io::Result<Capped> {
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    // One byte more than the cap tells a file of exactly `cap` bytes from a longer one.
    file.take(cap as u64 + 1).read_to_end(&mut bytes)?;
    let truncated = bytes.len() > cap;
    bytes.truncate(cap);
    Ok(Capped { bytes, truncated })
}

/// NUL-separated entries; when the read stopped early, the last one is dropped: it may be cut,
/// and a prefix must not pass for a whole value. (A complete file's last entry may lack its
/// NUL: a process that rewrote its command line.)
fn entries(bytes: &[u8], truncated: bool) -> impl Iterator<Item = &[u8]> {
    let mut parts: Vec<&[u8]> = bytes.split(|&b| b == 0).collect();
    if truncated {
        parts.pop();
    }
    parts.into_iter().filter(|p| !p.is_empty())
}

fn split_cmdline(bytes: &[u8], truncated: bool) -> Vec<std::borrow::Cow<'_, str>> {
    entries(bytes, truncated)
        .take(MAX_ARGS)
        .map(String::from_utf8_lossy)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// 1. The environment

/// The variables of a process's environment that name it. Others are not kept.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Environ {
    pub otel_service_name: Option<String>,
    pub otel_resource_attributes: Option<String>,
    pub pyroscope_application_name: Option<String>,
    /// Flask's app, for `flask run` without `--app`.
    pub flask_app: Option<String>,
    /// Django's settings module, for `manage.py` and `django-admin` without `--settings`.
    pub django_settings_module: Option<String>,
}

impl Environ {
    /// Parses `/proc/PID/environ` bytes (`KEY=value\0…`). Like `getenv`, the first of
    /// duplicate keys wins; entries that are not UTF-8 are skipped.
    pub fn parse(bytes: &[u8], truncated: bool) -> Environ {
        let mut env = Environ::default();
        for entry in entries(bytes, truncated) {
            let Ok(entry) = std::str::from_utf8(entry) else {
                continue;
            };
            let Some((key, value)) = entry.split_once('=') else {
                continue;
            };
            let slot = match key {
                "OTEL_SERVICE_NAME" => &mut env.otel_service_name,
                "OTEL_RESOURCE_ATTRIBUTES" => &mut env.otel_resource_attributes,
                "PYROSCOPE_APPLICATION_NAME" => &mut env.pyroscope_application_name,
                "FLASK_APP" => &mut env.flask_app,
                "DJANGO_SETTINGS_MODULE" => &mut env.django_settings_module,
                _ => continue,
            };
            if slot.is_none() {
                *slot = Some(value.to_string());
            }
        }
        env
    }

    pub(crate) fn service_name(&self) -> Option<(String, ServiceSource)> {
        let named = |v: &Option<String>| {
            v.as_deref()
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(|v| cap(v, MAX_DERIVED_VALUE))
        };
        if let Some(name) = named(&self.otel_service_name) {
            return Some((name, ServiceSource::OtelServiceName));
        }
        if let Some(name) = self
            .otel_resource_attributes
            .as_deref()
            .and_then(|attrs| resource_attribute(attrs, "service.name"))
            .filter(|name| !name.is_empty())
        {
            return Some((
                cap(&name, MAX_DERIVED_VALUE),
                ServiceSource::OtelResourceAttributes,
            ));
        }
        // Pyroscope's SDKs accept `app{tag=value,…}`; the tags are not part of the name.
        let pyroscope = self
            .pyroscope_application_name
            .as_deref()
            .map(|v| v.split('{').next().unwrap_or(v).to_string());
        named(&pyroscope).map(|name| (name, ServiceSource::PyroscopeApplicationName))
    }
}

/// The value of `key` in an `OTEL_RESOURCE_ATTRIBUTES` value.
///
/// The OTel resource SDK spec: a W3C-Baggage-like list `key1=value1,key2=value2` without
/// `;` metadata, surrounding whitespace trimmed, `,` and `=` inside keys and values
/// percent-encoded, and "in case of any error, e.g. failure during the decoding process, the
/// entire environment variable value SHOULD be discarded". So a malformed list yields `None`
/// even when `key` itself is well-formed; the process is then named by the next source, as
/// its own SDK would name it `unknown_service`.
pub(crate) fn resource_attribute(attrs: &str, key: &str) -> Option<String> {
    let mut found = None;
    for member in attrs.split(',') {
        let member = member.trim();
        if member.is_empty() {
            continue;
        }
        let (k, v) = member.split_once('=')?;
        let k = percent_decode(k.trim())?;
        let v = percent_decode(v.trim())?;
        if k.is_empty() {
            return None;
        }
        // Later members override earlier ones, as a map built in order would.
        if k == key {
            found = Some(v);
        }
    }
    found
}

/// Percent-decodes `s`, refusing a `%` that does not start a valid escape and a result that
/// is not UTF-8 (the spec's decoding failures).
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
        }
    }
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(|d| d.into_owned())
}

// ---------------------------------------------------------------------------------------------
// 2. The container

/// The container id in a `/proc/PID/cgroup` text: the innermost path component that is (or
/// wraps, as `docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`,
/// `libpod-<id>.scope` or the systemd-driver `…:cri-containerd:<id>`) 64 hex digits.
///
/// Innermost, because nested runtimes (docker in docker, a pod inside a VM's container) put the
/// container that really holds the process last. The first line that has one wins: under
/// cgroup v1 every hierarchy repeats the same path; under v2 there is one line (`0::/…`).
/// Kubernetes pod directories (`pod<uid>`, `kubepods-besteffort-pod<uid>.slice`) are not
/// 64 hex digits and are never taken for a container.
pub fn container_id_from_cgroup(cgroup: &str) -> Option<String> {
    cgroup
        .lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .find_map(|path| path.split('/').rev().find_map(container_component))
}

fn container_component(component: &str) -> Option<String> {
    let name = component.strip_suffix(".scope").unwrap_or(component);
    let id = name.rsplit(['-', ':']).next().unwrap_or(name);
    // `libpod-conmon-<id>.scope` and `crio-conmon-<id>.scope` hold the runtime's monitor,
    // not the container; no Python runs there, but say so rather than mislabel.
    if name.contains("conmon-") {
        return None;
    }
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_ascii_lowercase())
}

// ---------------------------------------------------------------------------------------------
// 3. The program

/// What a command line says the program is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Program {
    /// The service name it gives: the application, else the launcher, script or module.
    pub name: String,
    /// The launcher that runs the application (`gunicorn`, `celery`, …), when it is a known one.
    pub launcher: Option<&'static str>,
}

impl Program {
    fn named(name: &str) -> Program {
        Program {
            name: cap(name, MAX_DERIVED_VALUE),
            launcher: None,
        }
    }
}

/// How a known launcher names the application it runs.
struct Launcher {
    /// The service name when no application is found.
    name: &'static str,
    /// Its console-script names and `python -m` module names.
    commands: &'static [&'static str],
    /// Options whose value is the application (`-A proj`, `--app=proj`, `-Aproj`).
    app_options: &'static [&'static str],
    /// Whether a positional argument is the application (`gunicorn app:app`). Launchers
    /// whose positionals are subcommands (`celery … worker`, `flask run`) say no.
    positional_app: bool,
    /// Options that take a separate value which is not the application (`-k
    /// uvicorn.workers.UvicornWorker`), so that value is not mistaken for one. Only the common
    /// ones: an unlisted option's value can only win when no `module:attr` argument is there.
    value_options: &'static [&'static str],
    /// An environment variable the launcher reads the application from.
    app_env: Option<fn(&Environ) -> Option<&str>>,
    /// Keep only the top-level package of the application (`mysite.settings` → `mysite`).
    top_package: bool,
}

const LAUNCHERS: &[Launcher] = &[
    Launcher {
        name: "gunicorn",
        commands: &["gunicorn"],
        app_options: &[],
        positional_app: true,
        value_options: &[
            "-b",
            "--bind",
            "-w",
            "--workers",
            "-k",
            "--worker-class",
            "-c",
            "--config",
            "-t",
            "--timeout",
            "--threads",
            "-n",
            "--name",
            "--chdir",
            "--pythonpath",
            "-e",
            "--env",
            "-u",
            "--user",
            "-g",
            "--group",
            "-p",
            "--pid",
            "-m",
            "--umask",
            "--log-level",
            "--log-file",
            "--log-config",
            "--access-logfile",
            "--error-logfile",
            "--max-requests",
            "--max-requests-jitter",
            "--graceful-timeout",
            "--keep-alive",
            "--worker-connections",
            "--backlog",
            "--certfile",
            "--keyfile",
            "--paste",
            "--worker-tmp-dir",
            "--forwarded-allow-ips",
            "--statsd-host",
        ],
        app_env: None,
        top_package: false,
    },
    Launcher {
        name: "uvicorn",
        commands: &["uvicorn"],
        app_options: &[],
        positional_app: true,
        value_options: &[
            "--host",
            "--port",
            "--uds",
            "--fd",
            "--workers",
            "--loop",
            "--http",
            "--ws",
            "--lifespan",
            "--interface",
            "--env-file",
            "--log-config",
            "--log-level",
            "--root-path",
            "--app-dir",
            "--limit-concurrency",
            "--limit-max-requests",
            "--backlog",
            "--timeout-keep-alive",
            "--ssl-keyfile",
            "--ssl-certfile",
            "--forwarded-allow-ips",
            "--reload-dir",
            "--header",
        ],
        app_env: None,
        top_package: false,
    },
    Launcher {
        name: "hypercorn",
        commands: &["hypercorn"],
        app_options: &[],
        positional_app: true,
        value_options: &[
            "-b",
            "--bind",
            "-w",
            "--workers",
            "-k",
            "--worker-class",
            "-c",
            "--config",
            "--root-path",
            "--certfile",
            "--keyfile",
            "--log-level",
            "--access-logfile",
            "--error-logfile",
            "--log-config",
            "-m",
            "--umask",
            "-u",
            "--user",
            "-g",
            "--group",
            "--backlog",
            "--graceful-timeout",
            "--keep-alive",
        ],
        app_env: None,
        top_package: false,
    },
    Launcher {
        name: "daphne",
        commands: &["daphne"],
        app_options: &[],
        positional_app: true,
        value_options: &[
            "-b",
            "--bind",
            "-p",
            "--port",
            "-u",
            "--unix-socket",
            "--fd",
            "-e",
            "--endpoint",
            "-v",
            "--verbosity",
            "--access-log",
            "--root-path",
            "-t",
            "--http-timeout",
            "--websocket-timeout",
            "--application-close-timeout",
        ],
        app_env: None,
        top_package: false,
    },
    Launcher {
        name: "waitress",
        commands: &["waitress-serve", "waitress"],
        app_options: &[],
        positional_app: true,
        value_options: &[
            "--host",
            "--port",
            "--listen",
            "--threads",
            "--url-scheme",
            "--ident",
        ],
        app_env: None,
        top_package: false,
    },
    Launcher {
        name: "granian",
        commands: &["granian"],
        app_options: &[],
        positional_app: true,
        value_options: &[
            "--interface",
            "--host",
            "--port",
            "--workers",
            "--threads",
            "--blocking-threads",
            "--loop",
            "--http",
            "--log-level",
            "--log-config",
            "--ssl-keyfile",
            "--ssl-certificate",
            "--url-path-prefix",
            "--working-dir",
        ],
        app_env: None,
        top_package: false,
    },
    Launcher {
        name: "celery",
        commands: &["celery"],
        app_options: &["-A", "--app"],
        positional_app: false,
        value_options: &[],
        app_env: None,
        top_package: false,
    },
    Launcher {
        name: "flask",
        commands: &["flask"],
        app_options: &["-A", "--app"],
        positional_app: false,
        value_options: &[],
        app_env: Some(|env| env.flask_app.as_deref()),
        top_package: false,
    },
    Launcher {
        // `manage.py` is matched by its file name; see `program_from_argv`.
        name: "django",
        commands: &["django-admin", "django-admin.py"],
        app_options: &["--settings"],
        positional_app: false,
        value_options: &[],
        app_env: Some(|env| env.django_settings_module.as_deref()),
        top_package: true,
    },
];

fn launcher(command: &str) -> Option<&'static Launcher> {
    LAUNCHERS.iter().find(|l| l.commands.contains(&command))
}

/// The program a command line runs, named for a service.
///
/// `argv[0]` is the interpreter for scripts, modules and console scripts alike: the kernel
/// runs a script's `#!` interpreter with the script's path as `argv[1]`, so
/// `/venv/bin/gunicorn app:app` is `[/venv/bin/python3, /venv/bin/gunicorn, app:app]`.
/// CPython's options are skipped as CPython parses them: flags may be grouped (`-uB`), and
/// `-W`, `-X`, `-c`, `-m` take a value, attached (`-Wignore`) or next (`-X dev`); `-c` and `-m`
/// end the options, as does the first non-option, the script. Then:
///
/// * `-c …`, `-` (stdin) and no script at all (a REPL) → `python`.
/// * `-m module` → the module, unless it is a launcher (`python -m celery -A proj worker`).
/// * a script → its file name without `.py`/`.pyz`, unless that is a launcher
///   (`/venv/bin/gunicorn`) or Django's `manage.py`.
/// * a launcher → its application when given (`--app`/`-A`, a positional `module:attr`, or
///   the launcher's own environment variable: `FLASK_APP`, `DJANGO_SETTINGS_MODULE`), reduced to
///   a module (`app:create_app()` → `app`, `hello.py` → `hello`, Django's `mysite.settings` →
///   `mysite`), else the launcher's name.
///
/// When `argv[0]` is not a Python interpreter, the process is an embedding (`uwsgi`), a frozen
/// program, or one that rewrote its command line (`setproctitle`, as gunicorn does: `gunicorn:
/// worker [app:app]`); its first word names it, and is read as a launcher if it is one.
pub(crate) fn program_from_argv(argv: &[&str], env: &Environ) -> Option<Program> {
    let argv = &argv[..argv.len().min(MAX_ARGS)];
    let (&argv0, rest) = argv.split_first()?;
    if !is_python(basename(argv0)) {
        return Some(not_python(argv0, rest, env));
    }
    let mut i = 0;
    while let Some(&arg) = rest.get(i) {
        i += 1;
        if arg == "--" {
            break;
        }
        if arg == "-" {
            return Some(Program::named("python"));
        }
        if let Some(long) = arg.strip_prefix("--") {
            // CPython's only long option with a separate value.
            if long == "check-hash-based-pycs" {
                i += 1;
            }
            continue;
        }
        let Some(flags) = arg.strip_prefix('-') else {
            return Some(script(arg, &rest[i..], env));
        };
        for (at, flag) in flags.char_indices() {
            if !matches!(flag, 'c' | 'm' | 'W' | 'X') {
                continue;
            }
            let attached = &flags[at + flag.len_utf8()..];
            let value = if attached.is_empty() {
                i += 1;
                rest.get(i - 1).copied()
            } else {
                Some(attached)
            };
            match flag {
                'c' => return Some(Program::named("python")),
                'm' => return Some(module(value?, &rest[i.min(rest.len())..], env)),
                _ => break,
            }
        }
    }
    match rest.get(i) {
        Some(&"-") | None => Some(Program::named("python")),
        Some(&path) => Some(script(path, &rest[i + 1..], env)),
    }
}

fn module(name: &str, args: &[&str], env: &Environ) -> Program {
    match launcher(name) {
        Some(l) => run_by(l, args, env),
        None => Program::named(name),
    }
}

fn script(path: &str, args: &[&str], env: &Environ) -> Program {
    let file = basename(path);
    // Django's per-project script runs Django's launcher.
    let command = if file == "manage.py" {
        "django-admin"
    } else {
        file
    };
    if let Some(l) = launcher(command) {
        return run_by(l, args, env);
    }
    let stem = file
        .strip_suffix(".py")
        .or_else(|| file.strip_suffix(".pyz"))
        .unwrap_or(file);
    Program::named(if stem.is_empty() { file } else { stem })
}

fn not_python(argv0: &str, rest: &[&str], env: &Environ) -> Program {
    // A rewritten title is one argument with spaces; split it like a command line. Its
    // bracketed words are what the program put there to say what it runs (`[app:app]`).
    let words: Vec<&str> = if rest.is_empty() {
        argv0.split_whitespace().take(MAX_ARGS).collect()
    } else {
        std::iter::once(argv0).chain(rest.iter().copied()).collect()
    };
    let (first, args) = words.split_first().unwrap_or((&argv0, &[]));
    let name = basename(first.trim_start_matches('[').trim_end_matches([':', ']']));
    let bracketed: Vec<&str> = args
        .iter()
        .filter_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
        .collect();
    let args = if bracketed.is_empty() {
        args
    } else {
        &bracketed[..]
    };
    match launcher(name) {
        Some(l) => run_by(l, args, env),
        None => Program::named(name),
    }
}

fn run_by(launcher: &'static Launcher, args: &[&str], env: &Environ) -> Program {
    let app = app_argument(launcher, args).or_else(|| {
        launcher
            .app_env
            .and_then(|get| get(env))
            .and_then(app_module)
    });
    let name = match app {
        Some(app) if launcher.top_package => app.split('.').next().unwrap_or(&app).to_string(),
        Some(app) => app,
        None => launcher.name.to_string(),
    };
    Program {
        name,
        launcher: Some(launcher.name),
    }
}

/// The application named in a launcher's arguments: an app option's value, else the first
/// positional `module:attr`, else the first positional module name.
fn app_argument(launcher: &Launcher, args: &[&str]) -> Option<String> {
    let mut bare = None;
    let mut with_attr = None;
    let mut i = 0;
    while let Some(&arg) = args.get(i) {
        i += 1;
        if arg == "--" {
            break;
        }
        if arg.starts_with('-') && arg.len() > 1 {
            for &opt in launcher.app_options {
                let value = if arg == opt {
                    i += 1;
                    args.get(i - 1).copied()
                } else if let Some(v) = arg.strip_prefix(opt) {
                    // `--app=proj`; a short option may also be glued on: `-Aproj`. A longer
                    // option that merely starts alike (`--app-dir`) is not this one.
                    if opt.starts_with("--") {
                        v.strip_prefix('=')
                    } else {
                        Some(v.strip_prefix('=').unwrap_or(v))
                    }
                } else {
                    None
                };
                if let Some(module) = value.and_then(app_module) {
                    return Some(module);
                }
            }
            if !arg.contains('=') && launcher.value_options.contains(&arg) {
                i += 1;
            }
            continue;
        }
        if !launcher.positional_app {
            continue;
        }
        let Some(module) = app_module(arg) else {
            continue;
        };
        if arg.contains(':') {
            with_attr.get_or_insert(module);
        } else {
            bare.get_or_insert(module);
        }
    }
    with_attr.or(bare)
}

/// The module an application spec names: `pkg.mod:attr` and `pkg.mod:factory()` → `pkg.mod`,
/// `path/to/hello.py` → `hello`; `None` for anything else (`0.0.0.0:8000`, `4`).
fn app_module(spec: &str) -> Option<String> {
    let spec = spec.trim();
    if spec.ends_with(".py") || spec.contains('/') {
        let file = basename(spec.split(':').next().unwrap_or(spec));
        let stem = file.strip_suffix(".py").unwrap_or(file);
        return is_dotted_identifier(stem).then(|| cap(stem, MAX_DERIVED_VALUE));
    }
    let module = spec.split(':').next().unwrap_or(spec);
    is_dotted_identifier(module).then(|| cap(module, MAX_DERIVED_VALUE))
}

fn is_dotted_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// `python`, `python3`, `python3.12`, `python3.13t`, `python3.12d`, `python3-dbg`, …
fn is_python(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("python") else {
        return false;
    };
    let rest = rest
        .strip_suffix("-dbg")
        .or_else(|| rest.strip_suffix("-debug"))
        .unwrap_or(rest);
    rest.chars()
        .all(|c| c.is_ascii_digit() || matches!(c, '.' | 't' | 'd' | 'm' | 'u'))
}

fn basename(path: &str) -> &str {
    let trimmed = path.trim_end_matches('/');
    trimmed.rsplit('/').next().unwrap_or(trimmed)
}

/// `s` cut to at most `max` bytes at a character boundary.
fn cap(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

// ---------------------------------------------------------------------------------------------
// Operator labels and the series

/// A `--label` the operator gave that cannot be a Pyroscope/Prometheus label. Bad usage: the
/// CLI reports it on one line and exits 2.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("--label {arg:?}: expected NAME=VALUE, e.g. --label env=prod")]
    NoEquals { arg: String },
    #[error("--label {arg:?}: label name {name:?} must match [a-zA-Z_][a-zA-Z0-9_]*")]
    BadName { arg: String, name: String },
    #[error("--label {arg:?}: names starting with `__` are reserved for the backend")]
    Reserved { arg: String },
    #[error("--label {arg:?}: empty value; leave the flag out to not set {name}")]
    EmptyValue { arg: String, name: String },
    #[error("--label {name}=…: {what} is longer than {max} bytes, which Pyroscope refuses")]
    TooLong {
        name: String,
        what: &'static str,
        max: usize,
    },
    #[error("--label {name} is given twice (={first:?} and ={second:?}): keep one")]
    Duplicate {
        name: String,
        first: String,
        second: String,
    },
    #[error("{count} --label flags: at most {max} fit in a series beside the agent's own {BUILTIN_LABELS} labels (Pyroscope refuses more than {MAX_LABELS_PER_SERIES})")]
    TooMany { count: usize, max: usize },
}

impl From<LabelError> for crate::UsageError {
    fn from(err: LabelError) -> Self {
        crate::UsageError(err.to_string())
    }
}

/// Parses one `--label NAME=VALUE`; usable as a clap `value_parser`, whose errors exit 2.
pub fn parse_label(arg: &str) -> Result<(String, String), LabelError> {
    let Some((name, value)) = arg.split_once('=') else {
        return Err(LabelError::NoEquals { arg: arg.into() });
    };
    if name.starts_with("__") {
        return Err(LabelError::Reserved { arg: arg.into() });
    }
    if !is_label_name(name) {
        return Err(LabelError::BadName {
            arg: arg.into(),
            name: name.into(),
        });
    }
    if value.is_empty() {
        return Err(LabelError::EmptyValue {
            arg: arg.into(),
            name: name.into(),
        });
    }
    for (what, len, max) in [
        ("the name", name.len(), MAX_LABEL_NAME),
        ("the value", value.len(), MAX_LABEL_VALUE),
    ] {
        if len > max {
            return Err(LabelError::TooLong {
                name: cap(name, 64),
                what,
                max,
            });
        }
    }
    Ok((name.into(), value.into()))
}

fn is_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The operator's `--label`s, checked: valid names, no name twice, few enough to fit a series.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OperatorLabels(BTreeMap<String, String>);

impl OperatorLabels {
    /// From parsed pairs (see [`parse_label`]).
    pub fn new(pairs: impl IntoIterator<Item = (String, String)>) -> Result<Self, LabelError> {
        let mut labels = BTreeMap::new();
        for (name, value) in pairs {
            if let Some(first) = labels.get(&name) {
                return Err(LabelError::Duplicate {
                    name,
                    first: String::clone(first),
                    second: value,
                });
            }
            labels.insert(name, value);
        }
        if labels.len() > MAX_OPERATOR_LABELS {
            return Err(LabelError::TooMany {
                count: labels.len(),
                max: MAX_OPERATOR_LABELS,
            });
        }
        Ok(OperatorLabels(labels))
    }

    /// From raw `NAME=VALUE` arguments.
    pub fn parse<S: AsRef<str>>(args: &[S]) -> Result<Self, LabelError> {
        let pairs = args
            .iter()
            .map(|a| parse_label(a.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        OperatorLabels::new(pairs)
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// By name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// The labels of one process's profiles: one value per name, sorted by name, operator labels
/// over the agent's own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Labels(BTreeMap<String, String>);

impl Labels {
    pub fn new(process: &ProcessLabels, hostname: &str, operator: &OperatorLabels) -> Labels {
        let mut labels = BTreeMap::new();
        let mut set = |name: &str, value: &str| {
            // An empty value means "not set" to Prometheus-style backends; leave it out.
            if !value.is_empty() {
                labels.insert(name.to_string(), value.to_string());
            }
        };
        set("service_name", &process.service_name);
        set("hostname", hostname);
        set("pid", &process.pid.to_string());
        set("comm", &process.comm);
        set("python_version", &process.python_version);
        if let Some(id) = &process.container_id {
            set("container_id", id);
        }
        for (name, value) in &operator.0 {
            set(name, value);
        }
        Labels(labels)
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// `service_name`. [`resolve`] never leaves it empty and an operator value is never empty,
    /// so the fallback (the name OTel SDKs use) only shows for hand-made [`ProcessLabels`].
    pub fn service_name(&self) -> &str {
        self.get("service_name").unwrap_or("unknown_service")
    }

    /// All labels, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The labels of a Pyroscope series: `__name__=process_cpu`, `service_name`, then the rest
    /// by name.
    pub fn series(&self) -> Vec<(&str, &str)> {
        let mut series = Vec::with_capacity(self.0.len() + 1);
        series.push(("__name__", PROFILE_NAME));
        series.push(("service_name", self.service_name()));
        series.extend(self.iter().filter(|(k, _)| *k != "service_name"));
        series
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn env(pairs: &[(&str, &str)]) -> Environ {
        let mut bytes = Vec::new();
        for (k, v) in pairs {
            bytes.extend_from_slice(format!("{k}={v}\0").as_bytes());
        }
        Environ::parse(&bytes, false)
    }

    fn program(cmd: &str) -> String {
        program_with(cmd, &Environ::default())
    }

    fn program_with(cmd: &str, env: &Environ) -> String {
        let argv: Vec<&str> = cmd.split(' ').collect();
        program_from_argv(&argv, env).unwrap().name
    }

    #[test]
    fn container_ids() {
        for path in [
            format!("0::/system.slice/docker-{ID}.scope"),
            format!("0::/docker/{ID}"),
            format!("0::/kubepods/besteffort/pod1/cri-containerd-{ID}.scope"),
            format!("12:pids:/kubepods/pod1/{ID}\n0::/"),
            format!("0::/machine.slice/libpod-{ID}.scope/container"),
            format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1f2e_3d4c.slice/crio-{ID}.scope"),
            format!("0::/system.slice/containerd.service/kubepods-besteffort-pod7.slice:cri-containerd:{ID}"),
            format!("0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{}.scope", ID.to_uppercase()),
        ] {
            assert_eq!(container_id_from_cgroup(&path).as_deref(), Some(ID), "{path}");
        }
        assert_eq!(
            container_id_from_cgroup("0::/user.slice/session-2.scope"),
            None
        );
        assert_eq!(container_id_from_cgroup("0::/"), None);
        assert_eq!(container_id_from_cgroup(""), None);
        assert_eq!(container_id_from_cgroup("garbage\n::\n:::"), None);
        // A pod UID (32 hex digits with dashes or underscores) is not a container.
        assert_eq!(
            container_id_from_cgroup(
                "0::/kubepods/burstable/pod0a1b2c3d-0a1b-0a1b-0a1b-0a1b2c3d4e5f"
            ),
            None
        );
        // The runtime's monitor is not the container.
        assert_eq!(
            container_id_from_cgroup(&format!("0::/machine.slice/libpod-conmon-{ID}.scope")),
            None
        );
    }

    #[test]
    fn nested_containers_give_the_innermost() {
        let inner = "f".repeat(64);
        let path = format!("0::/docker/{ID}/docker/{inner}");
        assert_eq!(container_id_from_cgroup(&path), Some(inner));
    }

    #[test]
    fn environment_names_first() {
        let all = env(&[
            ("PYROSCOPE_APPLICATION_NAME", "pyro"),
            ("OTEL_RESOURCE_ATTRIBUTES", "service.name=attrs"),
            ("OTEL_SERVICE_NAME", "checkout"),
        ]);
        let found = service_name(&all, Some(ID), &["python3", "app.py"]).unwrap();
        assert_eq!(found, ("checkout".into(), ServiceSource::OtelServiceName));

        let attrs = env(&[
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment=prod, service.name = cart%20api ",
            ),
            ("PYROSCOPE_APPLICATION_NAME", "pyro"),
        ]);
        assert_eq!(
            attrs.service_name(),
            Some(("cart api".into(), ServiceSource::OtelResourceAttributes))
        );

        let pyro = env(&[("PYROSCOPE_APPLICATION_NAME", "ride-sharing-app{region=eu}")]);
        assert_eq!(
            pyro.service_name(),
            Some((
                "ride-sharing-app".into(),
                ServiceSource::PyroscopeApplicationName
            ))
        );

        // Empty or blank values name nothing.
        let blank = env(&[
            ("OTEL_SERVICE_NAME", "  "),
            ("PYROSCOPE_APPLICATION_NAME", ""),
        ]);
        assert_eq!(blank.service_name(), None);
    }

    #[test]
    fn then_container_then_program() {
        let none = Environ::default();
        assert_eq!(
            service_name(&none, Some(ID), &["python3", "app.py"]),
            Some(("0123456789ab".into(), ServiceSource::Container))
        );
        assert_eq!(
            service_name(&none, None, &["python3", "app.py"]),
            Some(("app".into(), ServiceSource::Program))
        );
        assert_eq!(service_name(&none, None, &[]), None);
    }

    #[test]
    fn resource_attributes_follow_the_spec() {
        assert_eq!(
            resource_attribute("service.name=a,service.name=b", "service.name").as_deref(),
            Some("b")
        );
        assert_eq!(
            resource_attribute("k=a%2Cb%3Dc,service.name=x%2Fy", "service.name").as_deref(),
            Some("x/y")
        );
        assert_eq!(
            resource_attribute("service.version=1", "service.name"),
            None
        );
        assert_eq!(resource_attribute("", "service.name"), None);
        // Any error discards the whole value.
        assert_eq!(
            resource_attribute("service.name=a,broken", "service.name"),
            None
        );
        assert_eq!(
            resource_attribute("service.name=a,k=%zz", "service.name"),
            None
        );
        assert_eq!(resource_attribute("service.name=%ff", "service.name"), None);
        assert_eq!(
            resource_attribute("service.name=a,=v", "service.name"),
            None
        );
        assert_eq!(
            resource_attribute("service.name=100%", "service.name"),
            None
        );
    }

    #[test]
    fn environ_parsing_is_bounded_and_forgiving() {
        let bytes =
            b"A=1\0OTEL_SERVICE_NAME=first\0\xff\xfe=x\0OTEL_SERVICE_NAME=second\0noequals\0";
        let env = Environ::parse(bytes, false);
        assert_eq!(env.otel_service_name.as_deref(), Some("first"));
        // A read cut inside the last entry drops it rather than take a prefix for the value.
        let cut = b"A=1\0OTEL_SERVICE_NAME=check";
        assert_eq!(Environ::parse(cut, true).otel_service_name, None);
        assert_eq!(
            Environ::parse(cut, false).otel_service_name.as_deref(),
            Some("check")
        );
        assert_eq!(Environ::parse(b"", false), Environ::default());
        assert_eq!(Environ::parse(b"\0\0\0", true), Environ::default());
    }

    #[test]
    fn long_values_are_cut_at_a_character() {
        let long = "é".repeat(MAX_DERIVED_VALUE);
        let found = env(&[("OTEL_SERVICE_NAME", &long)])
            .service_name()
            .unwrap()
            .0;
        assert!(found.len() <= MAX_DERIVED_VALUE && found.chars().all(|c| c == 'é'));
    }

    #[test]
    fn scripts_and_modules() {
        assert_eq!(program("python app.py"), "app");
        assert_eq!(
            program("/usr/bin/python3.12 /srv/shop/server.py --port 80"),
            "server"
        );
        assert_eq!(program("python3 -m mypkg.server"), "mypkg.server");
        assert_eq!(program("python3 -mhttp.server 8000"), "http.server");
        assert_eq!(program("python -c print(1)"), "python");
        assert_eq!(program("python3.13t"), "python");
        assert_eq!(program("python3 -"), "python");
        assert_eq!(program("python3 -i"), "python");
        assert_eq!(program("python3 app.pyz"), "app");
        assert_eq!(program("python3 /srv/mydir/"), "mydir");
    }

    #[test]
    fn interpreter_options_are_skipped() {
        assert_eq!(program("python3 -u app.py"), "app");
        assert_eq!(program("python3 -X dev -W ignore -O app.py"), "app");
        assert_eq!(program("python3 -Xdev -Wignore -OO -uB app.py"), "app");
        assert_eq!(program("python3 -uX importtime app.py"), "app");
        assert_eq!(program("python3 -I -s -S -E -b -q -v app.py"), "app");
        assert_eq!(program("python3 -u -m mypkg"), "mypkg");
        assert_eq!(program("python3 -um mypkg"), "mypkg");
        assert_eq!(
            program("python3 --check-hash-based-pycs always app.py"),
            "app"
        );
        assert_eq!(program("python3 -- -weird.py"), "-weird");
        // -c ends the options: what follows is the command's, not a script.
        assert_eq!(program("python3 -c import(x) app.py"), "python");
        // A missing value is not a panic.
        assert_eq!(
            program_from_argv(&["python3", "-m"], &Environ::default()),
            None
        );
        assert_eq!(program("python3 -W"), "python");
    }

    #[test]
    fn launchers() {
        assert_eq!(
            program("/venv/bin/python3 /venv/bin/gunicorn app:app"),
            "app"
        );
        assert_eq!(
            program("python3 /venv/bin/gunicorn -w 4 -k uvicorn.workers.UvicornWorker -b 0.0.0.0:8000 shop.main:app"),
            "shop.main"
        );
        assert_eq!(
            program("python3 /venv/bin/gunicorn -k gevent mysite.wsgi"),
            "mysite.wsgi"
        );
        assert_eq!(
            program("python3 /venv/bin/gunicorn --bind=:80 app:create_app()"),
            "app"
        );
        assert_eq!(program("python3 /venv/bin/gunicorn"), "gunicorn");
        assert_eq!(
            program("python3 /venv/bin/uvicorn main:app --host 0.0.0.0 --port 80"),
            "main"
        );
        assert_eq!(
            program("python3 -m uvicorn --port 80 api.main:app"),
            "api.main"
        );
        assert_eq!(
            program("python3 /usr/bin/hypercorn -b :80 module:app"),
            "module"
        );
        assert_eq!(
            program("python3 /usr/bin/daphne -b 0.0.0.0 -p 8001 myproject.asgi:application"),
            "myproject.asgi"
        );
        assert_eq!(
            program("python3 /usr/bin/waitress-serve --listen=*:8080 myapp:wsgifunc"),
            "myapp"
        );
        assert_eq!(
            program("python3 -m waitress --port=8080 myapp:wsgifunc"),
            "myapp"
        );
        assert_eq!(
            program("python3 /venv/bin/granian --interface asgi main:app"),
            "main"
        );
        assert_eq!(
            program("python3 /venv/bin/celery -A proj worker -l info"),
            "proj"
        );
        assert_eq!(
            program("python3 /venv/bin/celery --app=proj.celery:app beat"),
            "proj.celery"
        );
        assert_eq!(program("python3 /venv/bin/celery -Aproj worker"), "proj");
        assert_eq!(program("python3 -m celery worker --app proj"), "proj");
        assert_eq!(program("python3 /venv/bin/celery worker"), "celery");
        assert_eq!(program("python3 /venv/bin/flask run"), "flask");
        assert_eq!(program("python3 /venv/bin/flask --app hello run"), "hello");
        assert_eq!(program("python3 -m flask --app src/hello.py run"), "hello");
        let flask_env = env(&[("FLASK_APP", "shop:create_app()")]);
        assert_eq!(
            program_with("python3 /venv/bin/flask run", &flask_env),
            "shop"
        );
        assert_eq!(program("python3 manage.py runserver"), "django");
        assert_eq!(
            program("python3 /srv/manage.py runserver --settings=mysite.settings.prod"),
            "mysite"
        );
        let django_env = env(&[("DJANGO_SETTINGS_MODULE", "mysite.settings")]);
        assert_eq!(
            program_with("python3 manage.py runserver", &django_env),
            "mysite"
        );
        assert_eq!(
            program("python3 /venv/bin/django-admin runserver --settings mysite.settings"),
            "mysite"
        );
        // Any other console script is named by its file.
        assert_eq!(program("/venv/bin/python /venv/bin/mysvc --serve"), "mysvc");
        let found = program_from_argv(
            &["python3", "/venv/bin/gunicorn", "app:app"],
            &Environ::default(),
        );
        assert_eq!(found.unwrap().launcher, Some("gunicorn"));
    }

    #[test]
    fn non_python_argv0() {
        // setproctitle: one argument with spaces.
        assert_eq!(program_with_one("gunicorn: worker [app:app]"), "app");
        assert_eq!(
            program_with_one("gunicorn: master [shop.wsgi:application]"),
            "shop.wsgi"
        );
        assert_eq!(program("/usr/local/bin/uwsgi --ini app.ini"), "uwsgi");
        assert_eq!(program("/opt/frozen/myapp"), "myapp");
        assert_eq!(
            program_with_one("[celeryd: celery@host:MainProcess] -active- (worker -A proj)"),
            "celeryd"
        );
        assert_eq!(
            program_with_one("gunicorn: worker [mysite.wsgi]"),
            "mysite.wsgi"
        );
    }

    fn program_with_one(title: &str) -> String {
        program_from_argv(&[title], &Environ::default())
            .unwrap()
            .name
    }

    #[test]
    fn hostile_command_lines_never_panic() {
        let mut rng = fastrand::Rng::with_seed(7);
        let alphabet: Vec<char> = "-=:/.aAmcWX_0 é\u{0}[]".chars().collect();
        for _ in 0..5000 {
            let argc = rng.usize(0..6);
            let args: Vec<String> = (0..argc)
                .map(|_| {
                    (0..rng.usize(0..8))
                        .map(|_| alphabet[rng.usize(..alphabet.len())])
                        .collect()
                })
                .collect();
            let mut argv: Vec<&str> = args.iter().map(String::as_str).collect();
            if rng.bool() {
                argv.insert(0, "python3");
            }
            let env = Environ::default();
            if let Some(p) = program_from_argv(&argv, &env) {
                assert!(p.name.len() <= MAX_DERIVED_VALUE.max(64));
            }
            let _ = service_name(&env, None, &argv);
        }
        let many = vec!["-u"; 10 * MAX_ARGS];
        let mut argv = vec!["python3"];
        argv.extend(many);
        assert_eq!(
            program_from_argv(&argv, &Environ::default()).unwrap().name,
            "python"
        );
    }

    #[test]
    fn operator_labels() {
        assert_eq!(parse_label("env=prod"), Ok(("env".into(), "prod".into())));
        assert_eq!(parse_label("_x=a=b"), Ok(("_x".into(), "a=b".into())));
        assert!(matches!(
            parse_label("env"),
            Err(LabelError::NoEquals { .. })
        ));
        assert!(matches!(parse_label("=x"), Err(LabelError::BadName { .. })));
        assert!(matches!(
            parse_label("1env=x"),
            Err(LabelError::BadName { .. })
        ));
        assert!(matches!(
            parse_label("my-env=x"),
            Err(LabelError::BadName { .. })
        ));
        assert!(matches!(
            parse_label("k8s.ns=x"),
            Err(LabelError::BadName { .. })
        ));
        assert!(matches!(
            parse_label("__name__=x"),
            Err(LabelError::Reserved { .. })
        ));
        assert!(matches!(
            parse_label("env="),
            Err(LabelError::EmptyValue { .. })
        ));
        let long = format!("env={}", "x".repeat(MAX_LABEL_VALUE + 1));
        assert!(matches!(
            parse_label(&long),
            Err(LabelError::TooLong { .. })
        ));
        assert!(matches!(
            OperatorLabels::parse(&["env=a", "env=b"]),
            Err(LabelError::Duplicate { .. })
        ));
        let many: Vec<String> = (0..=MAX_OPERATOR_LABELS)
            .map(|i| format!("l{i}=v"))
            .collect();
        assert!(matches!(
            OperatorLabels::parse(&many),
            Err(LabelError::TooMany { .. })
        ));
        let err = parse_label("bad-name=x").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"--label "bad-name=x": label name "bad-name" must match [a-zA-Z_][a-zA-Z0-9_]*"#
        );
        let usage: crate::UsageError = err.into();
        assert!(usage.0.contains("bad-name"));
    }

    fn process() -> ProcessLabels {
        ProcessLabels {
            pid: 42,
            comm: "gunicorn".into(),
            service_name: "shop".into(),
            service_source: ServiceSource::Program,
            container_id: Some(ID.into()),
            python_version: "3.12".into(),
        }
    }

    #[test]
    fn series_labels() {
        let operator = OperatorLabels::parse(&["env=prod", "zone=a"]).unwrap();
        let labels = Labels::new(&process(), "host1", &operator);
        assert_eq!(
            labels.series(),
            vec![
                ("__name__", "process_cpu"),
                ("service_name", "shop"),
                ("comm", "gunicorn"),
                ("container_id", ID),
                ("env", "prod"),
                ("hostname", "host1"),
                ("pid", "42"),
                ("python_version", "3.12"),
                ("zone", "a"),
            ]
        );
        assert!(labels.series().len() <= MAX_LABELS_PER_SERIES);
    }

    #[test]
    fn operator_labels_override() {
        let operator = OperatorLabels::parse(&["service_name=billing", "hostname=node-7"]).unwrap();
        let mut p = process();
        p.container_id = None;
        let labels = Labels::new(&p, "", &operator);
        assert_eq!(labels.service_name(), "billing");
        assert_eq!(labels.get("hostname"), Some("node-7"));
        assert_eq!(labels.get("container_id"), None);
        let names: Vec<&str> = labels.series().iter().map(|(k, _)| *k).collect();
        assert_eq!(
            names,
            [
                "__name__",
                "service_name",
                "comm",
                "hostname",
                "pid",
                "python_version"
            ]
        );
    }

    #[test]
    fn resolves_this_process() {
        let me = std::process::id();
        let found = resolve(me, "3.12").unwrap();
        assert_eq!(found.pid, me);
        assert!(!found.comm.is_empty());
        assert!(!found.service_name.is_empty());
        assert!(matches!(
            resolve(u32::MAX - 1, "3.12"),
            Err(ResolveError::Gone { .. })
        ));
    }
}
