//! Shared helpers for pyebpf's integration tests: which CPython interpreters exist on this
//! machine, how to run a script under each, and where the `pyebpf` binary is.

use std::path::{Path, PathBuf};
use std::process::Command;

pub mod browser;
pub mod daemonset;
pub mod otlp;
pub mod pprof;

/// Default location of the Debian sid root holding CPython 3.13–3.15 (`cargo xtask sidroot`).
pub const DEFAULT_SID_ROOT: &str = "/var/cache/pyebpf/sid-root";
/// Default location of the free-threaded CPython 3.13 build (`cargo xtask freethreaded`);
/// `$PYEBPF_FREETHREADED` overrides it.
pub const DEFAULT_FREETHREADED: &str = "/var/cache/pyebpf/python3.13t";
/// The label of that build among [`interpreters`].
pub const FREETHREADED_LABEL: &str = "free-threaded 3.13t";

/// One CPython interpreter the tests can run.
#[derive(Clone, Debug)]
pub struct Interpreter {
    /// Human-readable name, e.g. `pyenv 3.12.1` or `sid 3.15`.
    pub label: String,
    /// (major, minor)
    pub version: (u32, u32),
    /// Path of the executable as seen from inside `root` (or the host when `root` is None).
    pub exe: PathBuf,
    /// A chroot the interpreter runs in (the sid root), seen from the host.
    pub root: Option<PathBuf>,
    /// A free-threaded (`Py_GIL_DISABLED`) build, as the interpreter says of itself.
    pub free_threaded: bool,
}

impl Interpreter {
    /// A command running `script` (a host path) with `args`. Under a chroot the script is
    /// copied into `<root>/tmp/pyebpf-tests/` first, and that in-root path is what Python sees.
    pub fn command(&self, script: &Path, args: &[&str]) -> Command {
        self.note_run();
        let mut cmd = self.python();
        cmd.arg(self.stage(script)).args(args);
        cmd.env("PYTHONDONTWRITEBYTECODE", "1");
        cmd
    }

    /// A command running `python -c code`.
    pub fn command_c(&self, code: &str) -> Command {
        let mut cmd = self.python();
        cmd.arg("-c").arg(code);
        cmd
    }

    /// The interpreter itself, entered through its chroot when it has one.
    fn python(&self) -> Command {
        match &self.root {
            Some(root) => {
                let mut cmd = Command::new("chroot");
                cmd.arg(root).arg(&self.exe);
                cmd
            }
            None => Command::new(&self.exe),
        }
    }

    /// Makes `script` reachable by the interpreter; returns the path it should be given.
    pub fn stage(&self, script: &Path) -> PathBuf {
        let Some(root) = &self.root else {
            return script.to_path_buf();
        };
        let inside =
            Path::new("/tmp/pyebpf-tests").join(script.file_name().expect("script file name"));
        let host = root.join(inside.strip_prefix("/").unwrap());
        std::fs::create_dir_all(host.parent().unwrap()).expect("create dir in sid root");
        std::fs::copy(script, &host).expect("copy script into sid root");
        inside
    }

    /// Appends "test binary, test, interpreter" to [`RUNS_ENV`]'s file when it is set, so that
    /// `cargo xtask test` can say how many tests ran a workload under each interpreter: the
    /// harness hides the output of passing tests.
    fn note_run(&self) {
        let Some(path) = std::env::var_os(RUNS_ENV) else {
            return;
        };
        let binary = std::env::current_exe()
            .ok()
            .and_then(|p| Some(p.file_stem()?.to_string_lossy().into_owned()))
            .unwrap_or_default();
        // Test binaries are `NAME-HASH`; libtest names each test's thread after the test.
        let binary = binary.rsplit_once('-').map_or(&*binary, |(name, _)| name);
        let test = std::thread::current().name().unwrap_or("?").to_string();
        let line = format!("{binary}\t{test}\t{}\n", self.label);
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
        if let Err(e) = appended {
            panic!("{RUNS_ENV}: appending to {}: {e}", path.to_string_lossy());
        }
    }

    pub fn minor(&self) -> u32 {
        self.version.1
    }

    /// The command line running `script` (a host path, staged) with `args`, for a launcher
    /// that execs it (`pyebpf record --`, `unshare`): through the chroot when there is one.
    pub fn argv(&self, script: &Path, args: &[&str]) -> Vec<String> {
        self.note_run();
        let mut argv = Vec::new();
        if let Some(root) = &self.root {
            argv.push("chroot".to_string());
            argv.push(root.to_str().unwrap().to_string());
        }
        argv.push(self.exe.to_str().unwrap().to_string());
        argv.push(self.stage(script).to_str().unwrap().to_string());
        argv.extend(args.iter().map(|a| a.to_string()));
        argv
    }
}

/// (major, minor, free-threaded) as the interpreter reports them.
fn probe_version(interp: &Interpreter) -> Option<(u32, u32, bool)> {
    let out = interp
        .command_c(
            "import sys, sysconfig; print(sys.version_info[0], sys.version_info[1], \
             sysconfig.get_config_var('Py_GIL_DISABLED') or 0)",
        )
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut parts = text.split_whitespace().map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??, parts.next()?? == 1))
}

/// Where the free-threaded build lives: `$PYEBPF_FREETHREADED`, else [`DEFAULT_FREETHREADED`].
pub fn freethreaded_dir() -> PathBuf {
    std::env::var_os("PYEBPF_FREETHREADED")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_FREETHREADED))
}

/// Every supported interpreter (3.11+) found on this machine, and a reason for each candidate
/// that was skipped. Candidates: Debian's `/usr/bin/python3.11`, pyenv builds under
/// `/root/.pyenv/versions`, `python3.13`–`python3.15` in the sid root
/// (`$PYEBPF_SID_ROOT`, default [`DEFAULT_SID_ROOT`]), and the free-threaded 3.13t
/// ([`freethreaded_dir`]).
///
/// `$PYEBPF_TEST_INTERPRETERS` narrows the candidates to those whose label contains one of its
/// comma-separated substrings (e.g. `debian,pyenv 3.12`); unset or empty means all of them.
/// `cargo xtask vm-test` uses it to run a smoke subset on slow emulated kernels.
pub fn interpreters() -> (Vec<Interpreter>, Vec<String>) {
    let mut found = Vec::new();
    let mut skipped = Vec::new();
    let mut candidates = vec![Interpreter {
        label: "debian /usr/bin/python3.11".into(),
        version: (0, 0),
        exe: "/usr/bin/python3.11".into(),
        root: None,
        free_threaded: false,
    }];
    let pyenv = Path::new("/root/.pyenv/versions");
    if let Ok(entries) = std::fs::read_dir(pyenv) {
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("3.1"))
            .collect();
        names.sort();
        for name in names {
            let minor: u32 = name
                .split('.')
                .nth(1)
                .and_then(|m| m.parse().ok())
                .unwrap_or(0);
            if minor < 11 {
                continue;
            }
            let exe = pyenv
                .join(&name)
                .join("bin")
                .join(format!("python3.{minor}"));
            candidates.push(Interpreter {
                label: format!("pyenv {name}"),
                version: (0, 0),
                exe,
                root: None,
                free_threaded: false,
            });
        }
    } else {
        skipped.push(format!("{NO_PYENV} /root/.pyenv/versions does not exist"));
    }
    let sid = std::env::var_os("PYEBPF_SID_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SID_ROOT));
    // Listed whether or not the sid root exists: a missing one is reported below, after the
    // interpreters not wanted (PYEBPF_TEST_INTERPRETERS) are set aside.
    for minor in [13, 14, 15] {
        candidates.push(Interpreter {
            label: format!("sid 3.{minor}"),
            version: (0, 0),
            exe: PathBuf::from(format!("/usr/bin/python3.{minor}")),
            root: Some(sid.clone()),
            free_threaded: false,
        });
    }
    candidates.push(Interpreter {
        label: FREETHREADED_LABEL.into(),
        version: (0, 0),
        exe: freethreaded_dir().join("bin/python3.13t"),
        root: None,
        free_threaded: false,
    });
    let wanted = std::env::var(INTERPRETERS_ENV).unwrap_or_default();
    let (candidates, unwanted): (Vec<_>, Vec<_>) = candidates
        .into_iter()
        .partition(|c| label_wanted(&c.label, &wanted));
    for c in unwanted {
        skipped.push(format!("{}: not in {INTERPRETERS_ENV}={wanted:?}", c.label));
    }
    for mut c in candidates {
        let host_exe = match &c.root {
            Some(root) => root.join(c.exe.strip_prefix("/").unwrap()),
            None => c.exe.clone(),
        };
        if !host_exe.exists() {
            let fix = match c.root {
                Some(_) => " (run `cargo xtask sidroot`)",
                None if c.label == FREETHREADED_LABEL => " (run `cargo xtask freethreaded`)",
                None => "",
            };
            skipped.push(format!(
                "{}: {} not found{fix}",
                c.label,
                host_exe.display()
            ));
            continue;
        }
        match probe_version(&c) {
            Some((_, _, false)) if c.label == FREETHREADED_LABEL => skipped.push(format!(
                "{}: {} is not a free-threaded build (Py_GIL_DISABLED is not set)",
                c.label,
                host_exe.display()
            )),
            Some((major, minor, free_threaded)) if major == 3 && minor >= 11 => {
                c.version = (major, minor);
                c.free_threaded = free_threaded;
                found.push(c);
            }
            Some((major, minor, _)) => skipped.push(format!(
                "{}: version {major}.{minor} is not supported",
                c.label
            )),
            None => skipped.push(format!("{}: does not run", c.label)),
        }
    }
    (found, skipped)
}

/// The file (set by `cargo xtask test`) that each workload run under an interpreter is noted in.
pub const RUNS_ENV: &str = "PYEBPF_TEST_RUNS";

/// The variable that restricts [`interpreters`] to some labels.
pub const INTERPRETERS_ENV: &str = "PYEBPF_TEST_INTERPRETERS";

/// Does `label` contain one of the comma-separated substrings of `wanted` (empty: all)?
fn label_wanted(label: &str, wanted: &str) -> bool {
    let parts: Vec<&str> = wanted
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    parts.is_empty() || parts.iter().any(|p| label.contains(p))
}

/// How many times slower than a normal host this machine runs: `$PYEBPF_TEST_SLOWDOWN`,
/// default 1. `cargo xtask vm-test` sets it under qemu's emulation (TCG), where Python runs
/// ~10x slower and pyebpf needs seconds to load. Tests whose waits and windows are
/// wall-clock times stretch them by it ([`stretch`]); what they assert stays the same.
pub fn slowdown() -> f64 {
    std::env::var("PYEBPF_TEST_SLOWDOWN")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|k| k.is_finite() && *k >= 1.0)
        .unwrap_or(1.0)
}

/// `d` stretched by [`slowdown`].
pub fn stretch(d: std::time::Duration) -> std::time::Duration {
    d.mul_f64(slowdown())
}

/// `interpreters()`, printing what was found. Every interpreter this machine is set up with
/// is required (Debian's 3.11, each pyenv 3.11+ build present, sid 3.13–3.15): one that is
/// missing or does not run fails the test, with the reason, instead of silently taking its
/// versions out of the run. Only [`INTERPRETERS_ENV`], which names the interpreters wanted,
/// leaves some out.
pub fn interpreters_logged() -> Vec<Interpreter> {
    let (found, skipped) = interpreters();
    for i in &found {
        eprintln!("interpreter: {} ({}.{})", i.label, i.version.0, i.version.1);
    }
    let missing: Vec<&String> = skipped
        .iter()
        .filter(|s| !s.contains(INTERPRETERS_ENV) && !s.starts_with(NO_PYENV))
        .collect();
    assert!(
        missing.is_empty(),
        "required interpreters are missing: {missing:?} (`cargo xtask test` builds the sid root \
         and the free-threaded 3.13t; \
         to run a subset on purpose set {INTERPRETERS_ENV})"
    );
    found
}

/// [`interpreters`]' reason when the machine has no pyenv builds at all (nothing to require).
const NO_PYENV: &str = "pyenv builds:";

/// The variable naming the tests allowed to skip (comma-separated test function names), for a
/// machine that lacks what they need. Nothing else skips: a test whose prerequisite is
/// missing fails.
pub const ALLOW_SKIP_ENV: &str = "PYEBPF_ALLOW_SKIP";

/// A prerequisite of `test` is missing (`why`). Returns, and the caller returns, only when
/// `test` is named in [`ALLOW_SKIP_ENV`]; otherwise fails the test, saying how to allow it.
pub fn missing_prerequisite(test: &str, why: &str) {
    let allowed = std::env::var(ALLOW_SKIP_ENV).unwrap_or_default();
    if allowed.split(',').map(str::trim).any(|t| t == test) {
        eprintln!("skipped {test}: {why} (allowed by {ALLOW_SKIP_ENV})");
        return;
    }
    panic!("{why}: {test} needs it (to skip it on purpose, set {ALLOW_SKIP_ENV}={test})");
}

/// `unshare` giving the program appended to it new pid and mount namespaces with its own
/// /proc, as a container would, and killing it when `unshare` dies.
pub fn unshare_pid_and_mount() -> Command {
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--kill-child", "--mount", "--mount-proc"]);
    cmd
}

/// `pyebpf` run as `nobody` with every capability dropped, as an unprivileged user would run
/// it; append its arguments.
pub fn pyebpf_unprivileged() -> Command {
    pyebpf_via(&[
        "setpriv",
        "--reuid=nobody",
        "--regid=nogroup",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
    ])
}

/// `pyebpf` run by `launcher`, a command that ends by exec'ing its arguments (so the child's
/// pid stays pyebpf's); an empty `launcher` runs pyebpf itself. Append pyebpf's arguments.
pub fn pyebpf_via(launcher: &[&str]) -> Command {
    match launcher.split_first() {
        Some((program, rest)) => {
            let mut cmd = Command::new(program);
            cmd.args(rest).arg(pyebpf_bin());
            cmd
        }
        None => Command::new(pyebpf_bin()),
    }
}

/// The host pid of the program `unshare --pid --fork` (pid `unshare`) runs: unshare forks the
/// namespace's init, which execs the program, so it is unshare's child.
pub fn namespaced_child(unshare: u32) -> u32 {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                s.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                    .is_some_and(|ppid| ppid == unshare.to_string())
            })
        })
        .expect("the namespaced program")
}

/// The `pyebpf` binary under test: `$PYEBPF_BIN`, else `target/debug/pyebpf` of this workspace.
pub fn pyebpf_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("PYEBPF_BIN") {
        return PathBuf::from(bin);
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    let bin = target.join("debug").join("pyebpf");
    assert!(
        bin.exists(),
        "{} not found: build it first (`cargo build -p profiler`) or set PYEBPF_BIN",
        bin.display()
    );
    bin
}

/// Directory of the Python workloads used by the tests.
pub fn workloads_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads")
}

/// A workload process, killed when dropped.
pub struct Workload {
    pub child: std::process::Child,
    /// Lines it printed up to and including `ready`.
    pub lines: Vec<String>,
}

impl Workload {
    /// Starts `script` (in [`workloads_dir`]) under `interp` and waits until it prints `ready`.
    pub fn start(interp: &Interpreter, script: &str, args: &[&str]) -> Workload {
        let path = workloads_dir().join(script);
        Workload::start_command(
            interp.command(&path, args),
            &format!("{script} under {}", interp.label),
        )
    }

    /// Starts `cmd` (a workload, possibly behind a wrapper such as `unshare`) and waits until
    /// it prints `ready`. `what` names it in panics.
    pub fn start_command(mut cmd: Command, what: &str) -> Workload {
        use std::io::BufRead;
        let mut child = cmd
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {what}: {e}"));
        let stdout = child.stdout.take().unwrap();
        let mut reader = std::io::BufReader::new(stdout);
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            let n = reader
                .read_line(&mut line)
                .expect("reading workload output");
            assert!(n > 0, "{what} exited before printing ready");
            let line = line.trim().to_string();
            let done = line == "ready";
            lines.push(line);
            if done {
                break;
            }
        }
        // Keep the pipe open (and drained) so the workload never blocks or gets SIGPIPE.
        std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
        Workload { child, lines }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The value of a `<name> <value>` line the workload printed before `ready` (for
    /// example a thread id).
    pub fn printed(&self, name: &str) -> String {
        self.lines
            .iter()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("the workload did not print `{name} ...`"))
            .to_string()
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The result of one `pyebpf record` run with collapsed output.
#[derive(Debug)]
pub struct Recording {
    pub status: std::process::ExitStatus,
    pub stderr: String,
    /// What a launched command (`-- CMD`) printed.
    pub stdout: String,
    /// Root-first stacks with their sample counts.
    pub stacks: Vec<(Vec<String>, u64)>,
}

impl Recording {
    pub fn total(&self) -> u64 {
        self.stacks.iter().map(|(_, c)| c).sum()
    }

    /// Samples whose stack holds a Python frame of `function`.
    pub fn samples_in(&self, function: &str) -> u64 {
        self.stacks
            .iter()
            .filter(|(s, _)| {
                s.iter()
                    .any(|f| parse_label(f).is_some_and(|l| l.function == function))
            })
            .map(|(_, c)| c)
            .sum()
    }
}

fn unique_path(stem: &str, ext: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!(
        "pyebpf-test-{}-{stem}-{n}.{ext}",
        std::process::id()
    ))
}

/// Runs `pyebpf record -f collapsed -o <tmp> <args>` and parses what it wrote.
pub fn record(args: &[&str]) -> Recording {
    let out = unique_path("record", "txt");
    let output = Command::new(pyebpf_bin())
        .arg("record")
        .args(["-f", "collapsed", "-o"])
        .arg(&out)
        .args(args)
        .output()
        .expect("running pyebpf");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    Recording {
        status: output.status,
        stderr,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stacks: parse_collapsed(&text),
    }
}

/// Runs `pyebpf record -f collapsed -o <tmp> OPTS -- <script ARGS under interp>` (the workload
/// in [`workloads_dir`]): pyebpf launches the program and profiles it from its start.
pub fn record_command(
    interp: &Interpreter,
    script: &str,
    args: &[&str],
    opts: &[&str],
) -> Recording {
    let argv = interp.argv(&workloads_dir().join(script), args);
    let mut cmd: Vec<&str> = opts.to_vec();
    cmd.push("--");
    cmd.extend(argv.iter().map(String::as_str));
    record(&cmd)
}

/// Parses collapsed stacks (`a;b;c 12` per line).
pub fn parse_collapsed(text: &str) -> Vec<(Vec<String>, u64)> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (stack, count) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad collapsed line {l:?}"));
            let count = count
                .parse()
                .unwrap_or_else(|_| panic!("bad count in {l:?}"));
            (stack.split(';').map(str::to_string).collect(), count)
        })
        .collect()
}

/// A Python frame label `function (file:line)` split into its parts (file reduced to its name).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PyLabel {
    pub function: String,
    pub file: String,
    pub line: u32,
}

pub fn parse_label(label: &str) -> Option<PyLabel> {
    let (function, rest) = label.rsplit_once(" (")?;
    let inner = rest.strip_suffix(')')?;
    let (file, line) = inner.rsplit_once(':')?;
    Some(PyLabel {
        function: function.to_string(),
        file: file.rsplit('/').next().unwrap_or(file).to_string(),
        line: line.parse().ok()?,
    })
}

/// Line numbers of `# LINE:<name>` markers in a workload script.
pub fn marker_lines(script: &str) -> std::collections::HashMap<String, u32> {
    let text = std::fs::read_to_string(workloads_dir().join(script)).expect("reading workload");
    text.lines()
        .enumerate()
        .filter_map(|(i, l)| {
            let name = l.split("# LINE:").nth(1)?;
            Some((name.trim().to_string(), i as u32 + 1))
        })
        .collect()
}

/// The one `pyebpf: error:` line of `stderr`; panics when there are none or several.
pub fn one_line_error(stderr: &str) -> &str {
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("pyebpf: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "expected one error line, got: {stderr}");
    errors[0]
}

/// `pyebpf` running in the background, its stderr read line by line as it comes.
pub struct Running {
    pub child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    /// Every stderr line read so far.
    pub stderr: Vec<String>,
}

impl Running {
    /// Starts `pyebpf ARGS` with stderr piped (stdout is discarded).
    pub fn start(args: &[&str]) -> Running {
        Running::start_with_env(args, &[])
    }

    /// [`Running::start`] with variables added to pyebpf's environment.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Running {
        use std::io::BufRead;
        let mut child = Command::new(pyebpf_bin())
            .args(args)
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("running pyebpf");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Running {
            child,
            lines,
            stderr: Vec::new(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until a stderr line contains `text`; panics (with everything printed) after
    /// `timeout` or when pyebpf closes stderr first.
    pub fn wait_for(&mut self, text: &str, timeout: std::time::Duration) {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(text);
                    self.stderr.push(line);
                    if found {
                        return;
                    }
                }
                Err(e) => panic!(
                    "no stderr line with {text:?} ({e}); stderr so far:\n{}",
                    self.stderr.join("\n")
                ),
            }
        }
    }

    /// Sends `signal` (a `kill -s` name such as `TERM`) to pyebpf.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args(["-s", signal, &self.pid().to_string()])
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -s {signal} failed");
    }

    /// Waits for pyebpf to exit (killing it and panicking after `timeout`); returns its exit
    /// status and its whole stderr.
    pub fn finish(mut self, timeout: std::time::Duration) -> (std::process::ExitStatus, String) {
        let deadline = std::time::Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("waiting for pyebpf") {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "pyebpf did not exit within {timeout:?}; stderr:\n{}",
                    self.stderr.join("\n")
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        // The reader thread ends at EOF, after the last line.
        while let Ok(line) = self.lines.recv_timeout(std::time::Duration::from_secs(5)) {
            self.stderr.push(line);
        }
        (status, self.stderr.join("\n"))
    }
}

impl Drop for Running {
    /// A test that panics must not leave pyebpf sampling the host for the tests after it.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A fresh temporary path `pyebpf-test-<pid>-<stem>-<n>.<ext>` (not created).
pub fn temp_path(stem: &str, ext: &str) -> PathBuf {
    unique_path(stem, ext)
}

#[cfg(test)]
mod unit {
    use super::label_wanted;

    #[test]
    fn interpreter_filter() {
        assert!(label_wanted("sid 3.15", ""));
        assert!(label_wanted("sid 3.15", " , "));
        assert!(label_wanted("pyenv 3.12.1", "debian, pyenv 3.12"));
        assert!(label_wanted(
            "debian /usr/bin/python3.11",
            "debian,pyenv 3.12"
        ));
        assert!(!label_wanted("pyenv 3.11.7", "debian,pyenv 3.12"));
        assert!(!label_wanted("sid 3.15", "debian"));
    }
}
