//! `cargo xtask vm-test`: the smoke rows of [`guest::ROWS`] (real tests, real BPF programs) on
//! other kernels.
//!
//! Why: the verifier, BTF and tracepoints differ between kernels, and fleets run older ones
//! than this machine's. Each Debian kernel is booted under qemu with virtme-ng, which shows
//! the guest the host's filesystem (read-only, `/tmp` writable), so the binaries built here
//! run there unchanged; `cargo xtask vm-guest` runs the rows inside and reports through marker
//! lines on the console. `host` (the running kernel, which cannot be booted: it has no image
//! in `/boot` and no modules) runs the same rows on this machine in a private mount namespace
//! without tracefs and debugfs, as on a fresh machine.
//!
//! Order: install what is missing ([`install`]) -> `cargo xtask setup` -> build pyebpf and the
//! test executables -> one kernel at a time -> summary. There is no KVM here (the CPU has no
//! vmx/svm), so qemu emulates (TCG): a boot takes 20-50 s and everything runs several times
//! slower than on the host.
//!
//! Bounds: a row is killed after `--row-timeout`, a whole kernel (boot included) after
//! `--timeout`, process tree and all, so a hung guest cannot hang CI. Measured on this 2-CPU
//! machine: boot 25-50 s, a whole 6.12 run 440 s of which exit cleanup (100 interpreters
//! started under emulation) takes 250 s; the defaults, 600 s per row and 1500 s per kernel,
//! leave 2.5-3x of that. Each kernel's full
//! console goes to `target/vm-test/<kernel>.log`; progress and the summary go to stderr.
use std::fs::File;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use clap::Args;

use crate::setup::{self, SetupArgs};
use crate::util;

pub mod guest;
mod install;

use guest::{Event, Outcome, ROWS};

const DEFAULT_KERNELS: [&str; 3] = ["6.1", "6.12", "host"];
/// Guest size: what the recipe was verified with; the rows need far less.
const GUEST_MEMORY: &str = "2G";
const GUEST_CPUS: &str = "2";
/// How much slower than the host the guest runs under TCG, for the tests' wall-clock waits
/// (`$PYEBPF_TEST_SLOWDOWN`). Measured here: a Python loop runs 13x slower, `python3 -c pass`
/// takes ~1 s, and the debug pyebpf needs 6-9 s to load and attach instead of ~0.3 s.
const TCG_SLOWDOWN: f64 = 10.0;
/// How much of a failed row's output the terminal shows (all of it is in the log): its
/// command line, the start of its first panic message and its last lines.
const PANIC_LINES: usize = 3;
const TAIL_LINES: usize = 15;
const BOOT_FAILED: &str = "the guest never came up";

#[derive(Args, Debug)]
pub struct VmTestArgs {
    /// A kernel to test: `6.1` (Debian bookworm), `6.12` (bookworm-backports), `host` (the
    /// running kernel: not booted, the rows run on this machine in a private mount namespace
    /// with tracefs and debugfs unmounted), or the path of a vmlinuz whose modules are in
    /// /lib/modules. Repeat for several [default: 6.1, 6.12, host]
    #[arg(long = "kernel", value_name = "K")]
    pub kernels: Vec<String>,
    /// Give up on one kernel (boot and every row) after this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 1500)]
    pub timeout: u64,
    /// Give up on one row after this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 600)]
    pub row_timeout: u64,
    /// Run only this row (repeat for several) [default: every row]; the ids are the first
    /// column of the summary table, e.g. `--row exit-cleanup`.
    #[arg(long = "row", value_name = "ROW")]
    pub rows: Vec<String>,
}

/// Where one kernel's rows run.
enum Target {
    /// Boot `vmlinuz` with the `vng` in `tools` (virtme-ng's venv `bin`).
    Vm {
        vmlinuz: PathBuf,
        tools: PathBuf,
    },
    Host,
}

/// What happened on one kernel.
struct KernelRun {
    label: String,
    /// `uname -r` reported by the runner.
    release: Option<String>,
    /// Seconds until the runner reported in (the boot, for a VM).
    boot: Option<f64>,
    rows: Vec<(String, Outcome, f64, String)>,
    wall: f64,
    /// Why the kernel did not run to the end, with a `fix:` where there is one.
    problem: Option<String>,
    files: Option<KernelFiles>,
}

/// Where one kernel's output goes, under `target/vm-test/`.
struct KernelFiles {
    /// Everything the guest (or the host runner) printed.
    log: PathBuf,
    /// The rows' `$TMPDIR`, shared with the guest (read-write), so that what they leave there
    /// (a verifier log, say) outlives the guest. Emptied before each run.
    tmp: PathBuf,
}

impl KernelRun {
    fn new(label: &str) -> KernelRun {
        KernelRun {
            label: label.to_string(),
            release: None,
            boot: None,
            rows: Vec::new(),
            wall: 0.0,
            problem: None,
            files: None,
        }
    }

    fn not_run(label: &str, problem: String) -> KernelRun {
        KernelRun {
            problem: Some(problem),
            ..KernelRun::new(label)
        }
    }

    /// A VM that exited before its runner reported in, without timing out.
    fn boot_failed(&self) -> bool {
        self.release.is_none()
            && self.rows.is_empty()
            && self
                .problem
                .as_deref()
                .is_some_and(|p| p.starts_with(BOOT_FAILED))
    }

    fn ok(&self) -> bool {
        self.problem.is_none() && self.rows.iter().all(|(_, o, _, _)| !o.failed())
    }
}

pub fn vm_test(args: &VmTestArgs) -> Result<()> {
    let started = Instant::now();
    let labels: Vec<String> = if args.kernels.is_empty() {
        DEFAULT_KERNELS.map(String::from).to_vec()
    } else {
        args.kernels.clone()
    };
    if let Some(unknown) = args
        .rows
        .iter()
        .find(|id| !ROWS.iter().any(|r| r.id == *id))
    {
        let ids: Vec<&str> = ROWS.iter().map(|r| r.id).collect();
        bail!("no row {unknown:?}\n  fix: pick from {}", ids.join(", "));
    }
    util::step(&format!("vm-test: kernels {}", labels.join(", ")));
    if !util::is_root() {
        bail!(
            "vm-test needs root (apt, BPF, mount namespaces)\n  fix: run `sudo -E cargo xtask \
             vm-test`"
        );
    }

    // 1. What each kernel needs. A kernel that cannot be had is reported, the others run.
    let needs_vm = labels.iter().any(|l| l != "host");
    let tools = if needs_vm {
        util::step("vm-test: qemu, busybox, virtme-ng, kernels");
        install::vm_tools().map_err(|e| format!("{e:#}"))
    } else {
        Ok(PathBuf::new())
    };
    let targets: Vec<(String, Result<Target, String>)> = labels
        .iter()
        .map(|label| {
            let target = match (label.as_str(), &tools) {
                ("host", _) => Ok(Target::Host),
                (_, Err(e)) => Err(e.clone()),
                (_, Ok(tools)) => kernel_image(label).map(|vmlinuz| Target::Vm {
                    vmlinuz,
                    tools: tools.clone(),
                }),
            };
            if let Err(problem) = &target {
                eprintln!("[{label}] cannot run: {problem}");
            }
            (label.clone(), target)
        })
        .collect();

    // 2. Build on the host; guests run these files.
    setup::setup(&SetupArgs::default())?;
    util::step("vm-test: build pyebpf (debug) and the test executables");
    util::run(util::cargo().args(["build", "-p", "profiler"]))
        .context("building pyebpf failed (errors above)")?;
    // virtme-ng's init mounts a tmpfs over the guest's /var/cache, which hides the sid root
    // the `sid 3.x` rows run; the guest gets it back as a shared directory (read-write: the
    // tests stage their workloads into it, as on the host).
    let needs_sid = ROWS.iter().any(|row| {
        guest::selected(row, &args.rows)
            && matches!(row.what, guest::What::Test { interpreters, .. } if interpreters.contains("sid"))
    });
    let shared = if needs_vm && needs_sid {
        vec![crate::sidroot::sidroot(
            &crate::sidroot::SidrootArgs::default(),
        )?]
    } else {
        Vec::new()
    };
    let runner = Runner {
        shared,
        xtask: std::env::current_exe().context("locating the xtask binary")?,
        pyebpf: util::target_dir().join("debug/pyebpf"),
        test_bins: test_executables()?,
        row_timeout: args.row_timeout,
        rows: args.rows.clone(),
    };
    let out_dir = util::target_dir().join("vm-test");
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;

    // 3. One kernel at a time: the machine has 2 CPUs, and TCG wants both.
    let mut runs = Vec::new();
    for (label, target) in targets {
        let run = match target {
            Err(problem) => KernelRun::not_run(&label, problem),
            Ok(target) => {
                let name = file_label(&label);
                let files = KernelFiles {
                    log: out_dir.join(format!("{name}.log")),
                    tmp: out_dir.join(format!("{name}.tmp")),
                };
                let mut run = run_kernel(&label, &target, &runner, args.timeout, &files, false)?;
                // A guest that dies before its runner reports in (vng's 255: a kernel panic
                // or a qemu failure, seen once in CI on 6.12 after 14 s, never here in dozens
                // of boots) is booted once more, with the kernel console in the log.
                if run.boot_failed() {
                    let first = files.log.with_extension("boot1.log");
                    std::fs::rename(&files.log, &first).ok();
                    eprintln!(
                        "[{label}] the guest died while booting; booting it once more with \
                         the kernel console in the log (first attempt: {})",
                        first.display()
                    );
                    run = run_kernel(&label, &target, &runner, args.timeout, &files, true)?;
                }
                run
            }
        };
        runs.push(run);
    }

    let table = summary(&runs, &args.rows);
    eprintln!("\n{table}");
    let summary_path = out_dir.join("summary.txt");
    std::fs::write(&summary_path, &table)
        .with_context(|| format!("writing {}", summary_path.display()))?;
    for run in runs.iter().filter(|r| !r.ok()) {
        if let Some(problem) = &run.problem {
            eprintln!("{}: {problem}", run.label);
        }
        if let Some(files) = &run.files {
            eprintln!("{}: full output in {}", run.label, files.log.display());
            let kept = std::fs::read_dir(&files.tmp).is_ok_and(|mut d| d.next().is_some());
            if kept {
                eprintln!(
                    "{}: files the rows left in their temp directory: {}",
                    run.label,
                    files.tmp.display()
                );
            }
        }
    }
    eprintln!(
        "vm-test took {:.0}s (summary in {})",
        started.elapsed().as_secs_f64(),
        summary_path.display()
    );
    if runs.iter().any(|r| !r.ok()) {
        bail!("vm-test failed (see the table above)");
    }
    eprintln!("vm-test passed");
    Ok(())
}

/// The vmlinuz `label` designates: a Debian kernel (installed if need be) or a path.
fn kernel_image(label: &str) -> Result<PathBuf, String> {
    if let Some(kernel) = install::DEBIAN_KERNELS.iter().find(|k| k.label == label) {
        return install::debian_kernel(kernel).map_err(|e| format!("{e:#}"));
    }
    let path = Path::new(label);
    if path.is_file() {
        return Ok(path.to_path_buf());
    }
    let known: Vec<&str> = install::DEBIAN_KERNELS.iter().map(|k| k.label).collect();
    Err(format!(
        "`{label}` is neither a known kernel ({}, host) nor a vmlinuz file\n  fix: pass one of \
         those, or the path of a kernel image",
        known.join(", ")
    ))
}

/// `6.1` stays `6.1`; a path becomes its file name.
fn file_label(label: &str) -> String {
    Path::new(label)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| label.replace('/', "_"))
}

/// Build the `tests` crate's test executables; (name, path) of those the rows use.
fn test_executables() -> Result<Vec<(String, PathBuf)>> {
    let json = util::stdout_of(util::cargo().args([
        "test",
        "-p",
        "tests",
        "--no-run",
        "--message-format=json",
    ]))
    .context("building the integration tests failed (errors above)")?;
    let mut found = Vec::new();
    for line in json.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(name), Some(exe)) = (msg["target"]["name"].as_str(), msg["executable"].as_str())
        else {
            continue;
        };
        let is_test = msg["target"]["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == "test"));
        if msg["reason"] == "compiler-artifact" && is_test {
            found.push((name.to_string(), PathBuf::from(exe)));
        }
    }
    let mut wanted = Vec::new();
    for bin in guest::test_bins() {
        let exe = found
            .iter()
            .find(|(name, _)| name == bin)
            .with_context(|| {
                format!("cargo built no test executable `{bin}` (tests/tests/{bin}.rs)")
            })?;
        wanted.push(exe.clone());
    }
    Ok(wanted)
}

/// The runner's command line and what it needs.
struct Runner {
    /// Host directories the guest sees at the same path, read-write (besides the temp dir).
    shared: Vec<PathBuf>,
    xtask: PathBuf,
    pyebpf: PathBuf,
    test_bins: Vec<(String, PathBuf)>,
    row_timeout: u64,
    /// `--row` filter (empty: every row).
    rows: Vec<String>,
}

impl Runner {
    fn command(&self, tmp: &Path, in_vm: bool) -> Command {
        let mut cmd = Command::new(&self.xtask);
        cmd.arg("vm-guest")
            .arg("--tmp")
            .arg(tmp)
            .arg("--pyebpf")
            .arg(&self.pyebpf)
            .arg("--row-timeout")
            .arg(self.row_timeout.to_string());
        for row in &self.rows {
            cmd.arg("--row").arg(row);
        }
        for (name, path) in &self.test_bins {
            cmd.arg("--test-bin")
                .arg(format!("{name}={}", path.display()));
        }
        if in_vm {
            cmd.arg("--slowdown").arg(TCG_SLOWDOWN.to_string());
        } else {
            cmd.arg("--private-mounts");
        }
        cmd
    }

    /// The runner as one shell line, for `vng --exec`.
    fn shell_line(&self, tmp: &Path) -> String {
        util::render(&self.command(tmp, true))
    }
}

/// Boot (or enter) one kernel, stream its rows, bound it by `timeout` seconds.
fn run_kernel(
    label: &str,
    target: &Target,
    runner: &Runner,
    timeout: u64,
    files: &KernelFiles,
    console: bool,
) -> Result<KernelRun> {
    if files.tmp.exists() {
        std::fs::remove_dir_all(&files.tmp)
            .with_context(|| format!("emptying {}", files.tmp.display()))?;
    }
    std::fs::create_dir_all(&files.tmp)
        .with_context(|| format!("creating {}", files.tmp.display()))?;
    let mut cmd = match target {
        Target::Vm { vmlinuz, tools } => {
            util::step(&format!(
                "[{label}] booting {} under qemu (TCG, no KVM; 20-50 s)",
                vmlinuz.display()
            ));
            let path = std::env::var_os("PATH").unwrap_or_default();
            let mut paths = vec![tools.clone()];
            paths.extend(std::env::split_paths(&path));
            let mut cmd = Command::new(tools.join("vng"));
            cmd.env("PATH", std::env::join_paths(paths)?)
                .arg("--run")
                .arg(vmlinuz)
                .args([
                    "--disable-kvm",
                    "--memory",
                    GUEST_MEMORY,
                    "--cpus",
                    GUEST_CPUS,
                ])
                .arg(format!("--rwdir={}", files.tmp.display()));
            for dir in &runner.shared {
                cmd.arg(format!("--rwdir={}", dir.display()));
            }
            if console {
                cmd.arg("--verbose");
            }
            cmd.arg("--exec").arg(runner.shell_line(&files.tmp));
            cmd
        }
        Target::Host => {
            util::step(&format!(
                "[{label}] this machine's kernel, in a private mount namespace without tracefs \
                 and debugfs"
            ));
            let mut cmd = Command::new("unshare");
            cmd.args(["--mount", "--propagation", "private", "--"]);
            let inner = runner.command(&files.tmp, false);
            cmd.arg(inner.get_program()).args(inner.get_args());
            cmd
        }
    };
    cmd.current_dir(util::workspace_root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let log_path = &files.log;
    let mut log =
        File::create(log_path).with_context(|| format!("creating {}", log_path.display()))?;
    writeln!(log, "$ {}", util::render(&cmd))?;
    eprintln!("[{label}] log: {}", log_path.display());

    let started = Instant::now();
    let mut child = cmd.spawn().context("could not start the kernel's runner")?;
    let (lines_tx, lines) = mpsc::channel::<String>();
    for stream in [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let tx = lines_tx.clone();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stream);
            let mut buf = Vec::new();
            while reader.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
                let line = String::from_utf8_lossy(&buf);
                let _ = tx.send(line.trim_end_matches(['\n', '\r']).to_string());
                buf.clear();
            }
        });
    }
    drop(lines_tx);

    let mut run = KernelRun::new(label);
    run.files = Some(KernelFiles {
        log: files.log.clone(),
        tmp: files.tmp.clone(),
    });
    let mut done = false;
    // Output of the current row (or of the boot), for the excerpt of a failure.
    let mut output: Vec<String> = Vec::new();
    let deadline = started + Duration::from_secs(timeout);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = match lines.recv_timeout(left) {
            Ok(line) => line,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                guest::kill_tree(child.id());
                run.problem = Some(format!(
                    "timed out after {timeout} s (killed)\n  fix: look at the end of the log; \
                     if the kernel is merely slow, raise --timeout"
                ));
                eprintln!("[{label}] TIMEOUT after {timeout} s");
                break;
            }
        };
        writeln!(log, "{line}")?;
        let Some(event) = Event::parse(&line) else {
            output.push(line);
            continue;
        };
        let now = started.elapsed().as_secs_f64();
        match event {
            Event::Kernel(release) => {
                eprintln!("[{label}] up after {now:.1}s: kernel {release}");
                run.boot = Some(now);
                run.release = Some(release);
            }
            Event::Start(id) => {
                eprintln!("[{label}] {id} ...");
                output.clear();
            }
            Event::End {
                id,
                outcome,
                secs,
                note,
            } => {
                eprintln!("[{label}] {id}: {} {secs:.1}s {note}", outcome.word());
                if outcome.failed() {
                    show_excerpt(&output);
                }
                run.rows.push((id, outcome, secs, note));
                output.clear();
            }
            Event::Done => done = true,
        }
    }
    let status = child.wait().context("waiting for the kernel's runner")?;
    run.wall = started.elapsed().as_secs_f64();
    writeln!(log, "# runner exited: {status}; {:.1}s", run.wall)?;
    if run.problem.is_none() && !done {
        show_excerpt(&output);
        let what = match (target, run.release.is_some()) {
            (Target::Vm { .. }, false) => BOOT_FAILED,
            (Target::Host, false) => "the runner did not start",
            (_, true) => "the runner stopped before the last row",
        };
        run.problem = Some(format!(
            "{what} ({status})\n  fix: read the lines above or the log; for a VM, check that \
             the kernel's modules are in /lib/modules (9p, virtio)"
        ));
    }
    eprintln!("[{label}] finished in {:.0}s", run.wall);
    Ok(run)
}

/// The lines of `output` that usually say why: the command line (first), the first panic
/// message, the verifier's verdict, the last lines.
fn show_excerpt(output: &[String]) {
    let mut shown: Vec<usize> = Vec::new();
    if output.first().is_some_and(|l| l.starts_with("$ ")) {
        shown.push(0);
    }
    if let Some(panic) = output.iter().position(|l| l.contains("panicked at")) {
        shown.extend(panic..(panic + PANIC_LINES).min(output.len()));
    }
    // A verifier log ends with its verdict, then "verification time ...".
    if let Some(end) = output
        .iter()
        .position(|l| l.starts_with("verification time"))
    {
        shown.extend(end.checked_sub(1));
    }
    shown.extend(output.len().saturating_sub(TAIL_LINES)..output.len());
    shown.sort();
    shown.dedup();
    let mut last = None;
    for i in shown {
        if last.is_some_and(|l: usize| l + 1 != i) {
            eprintln!("    | ...");
        }
        eprintln!("    | {}", output[i]);
        last = Some(i);
    }
}

/// One column per kernel, one line per row.
fn summary(runs: &[KernelRun], only: &[String]) -> String {
    let mut lines: Vec<Vec<String>> = Vec::new();
    lines.push(
        std::iter::once("kernel".to_string())
            .chain(runs.iter().map(|r| r.label.clone()))
            .collect(),
    );
    let cell = |f: &dyn Fn(&KernelRun) -> String| -> Vec<String> { runs.iter().map(f).collect() };
    let mut push = |name: &str, cells: Vec<String>| {
        lines.push(std::iter::once(name.to_string()).chain(cells).collect());
    };
    push(
        "uname -r",
        cell(&|r| r.release.clone().unwrap_or_else(|| "-".into())),
    );
    push(
        "boot",
        cell(&|r| {
            r.boot
                .map(|b| format!("{b:.1}s"))
                .unwrap_or_else(|| "-".into())
        }),
    );
    for row in ROWS.iter().filter(|r| guest::selected(r, only)) {
        push(
            row.id,
            cell(&|r| match r.rows.iter().find(|(id, ..)| id == row.id) {
                Some((_, outcome, secs, _)) => format!("{} {secs:.1}s", outcome.word()),
                None => "not run".into(),
            }),
        );
    }
    push("wall", cell(&|r| format!("{:.0}s", r.wall)));
    push(
        "result",
        cell(&|r| if r.ok() { "ok".into() } else { "FAILED".into() }),
    );
    let widths: Vec<usize> = (0..lines[0].len())
        .map(|c| {
            lines
                .iter()
                .map(|l| l[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for line in &lines {
        let cells: Vec<String> = line
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}
