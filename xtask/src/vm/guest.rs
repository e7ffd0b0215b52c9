//! The smoke rows of `cargo xtask vm-test` and the runner that executes them where the kernel
//! under test runs: inside the qemu guest, or, for `--kernel host`, on this machine inside a
//! private mount namespace. It is the hidden command `cargo xtask vm-guest`.
//!
//! The runner needs no cargo, only the host's files (a guest sees them read-only): the test
//! executables built on the host run through their own harness, one exact test each, with
//! `$PYEBPF_BIN`, `$PYEBPF_TEST_INTERPRETERS` and `$PYEBPF_TEST_SLOWDOWN` set. It talks to the host through marker
//! lines on stdout (see [`Event`]); everything a row prints goes to stdout as well, where the
//! host logs it.
//!
//! Bounds: a row runs at most `--row-timeout` seconds. The runner is a child subreaper, so
//! after every row (finished or timed out) it kills whatever the row left behind (a
//! `pyebpf record`, Python workloads) before the next one starts.
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use clap::Args;

use crate::util;

/// Interpreters of the smoke rows: Debian's static 3.11 and one pyenv shared build. (The sid
/// root's interpreters would work in a guest too, but the smoke subset is about kernels.)
const SMOKE_INTERPRETERS: &str = "debian,pyenv 3.12";

/// What one row runs.
pub enum What {
    /// One test of the `tests` crate: executable `bin` (a file in `tests/tests/`), `--exact`
    /// test name, and the value of `$PYEBPF_TEST_INTERPRETERS`.
    Test {
        bin: &'static str,
        test: &'static str,
        interpreters: &'static str,
    },
    /// `pyebpf ARGS`, passing when it exits 0.
    Pyebpf { args: &'static [&'static str] },
}

pub struct Row {
    /// Names the row in marker lines, progress and the summary (no spaces).
    pub id: &'static str,
    pub what: What,
}

/// The smoke subset, in the order it runs. Adding a row is adding a line.
pub const ROWS: &[Row] = &[
    Row {
        id: "check",
        what: What::Pyebpf { args: &["check"] },
    },
    Row {
        id: "chain-debian-3.11",
        what: What::Test {
            bin: "record",
            test: "chain_has_exact_frames_and_lines",
            interpreters: "debian",
        },
    },
    Row {
        id: "chain-pyenv-3.12",
        what: What::Test {
            bin: "record",
            test: "chain_has_exact_frames_and_lines",
            interpreters: "pyenv 3.12",
        },
    },
    Row {
        id: "exec-pickup",
        what: What::Test {
            bin: "lifecycle",
            test: "exec_pickup_within_one_second",
            interpreters: SMOKE_INTERPRETERS,
        },
    },
    Row {
        id: "no-tracefs",
        what: What::Test {
            bin: "lifecycle",
            test: "no_tracefs_system_wide_catches_a_late_process",
            interpreters: "debian",
        },
    },
    Row {
        id: "debug-bpf-loads",
        what: What::Pyebpf {
            args: &[
                "record",
                "--debug-bpf",
                "-d",
                "2",
                "-f",
                "collapsed",
                "-o",
                "/tmp/pyebpf-vm-debug-bpf.txt",
            ],
        },
    },
    Row {
        // `--native`: the stack copy and the user registers (bpf_task_pt_regs), which no
        // other row loads or runs.
        id: "native",
        what: What::Test {
            bin: "native",
            test: "zlib_frames_sit_under_their_python_line",
            interpreters: "debian",
        },
    },
    Row {
        // The agent's sampler runs with random subsampling (bpf_get_prandom_u32), which no
        // other row loads; its last window reaches a push receiver.
        id: "agent-push",
        what: What::Test {
            bin: "agent",
            test: "sigterm_pushes_the_last_window",
            interpreters: "debian",
        },
    },
    Row {
        // `--async`: the task-chain capture (a second `bpf_loop`, reads at task-given
        // offsets, the task part after the native part), which no other row runs; on the
        // sid root's 3.14, the first CPython with a task layout.
        id: "async-tree",
        what: What::Test {
            bin: "async_tasks",
            test: "a_task_tree_folds_into_its_coroutines",
            interpreters: "sid 3.14",
        },
    },
    Row {
        id: "exit-cleanup",
        what: What::Test {
            bin: "lifecycle",
            test: "exit_cleanup_after_100_processes",
            interpreters: SMOKE_INTERPRETERS,
        },
    },
];

/// The test executables the rows need (e.g. `record`, `lifecycle`), each once.
pub fn test_bins() -> Vec<&'static str> {
    let mut bins: Vec<&str> = ROWS
        .iter()
        .filter_map(|r| match r.what {
            What::Test { bin, .. } => Some(bin),
            What::Pyebpf { .. } => None,
        })
        .collect();
    bins.sort();
    bins.dedup();
    bins
}

/// How a row ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Fail,
    Timeout,
}

impl Outcome {
    const WORDS: [(Outcome, &'static str); 3] = [
        (Outcome::Pass, "pass"),
        (Outcome::Fail, "FAIL"),
        (Outcome::Timeout, "TIMEOUT"),
    ];

    pub fn word(self) -> &'static str {
        Self::WORDS.iter().find(|(o, _)| *o == self).unwrap().1
    }

    fn from_word(w: &str) -> Option<Outcome> {
        Self::WORDS.iter().find(|(_, s)| *s == w).map(|(o, _)| *o)
    }

    pub fn failed(self) -> bool {
        matches!(self, Outcome::Fail | Outcome::Timeout)
    }
}

/// Prefix of the lines the runner writes for the host. Found anywhere in a line, so that a
/// kernel message interleaved on the console does not hide one.
const MARK: &str = "@@pyebpf-vm-test";

/// What a marker line says.
#[derive(Debug, PartialEq)]
pub enum Event {
    /// The runner is up; `uname -r` of the kernel it runs on.
    Kernel(String),
    Start(String),
    End {
        id: String,
        outcome: Outcome,
        secs: f64,
        note: String,
    },
    Done,
}

impl Event {
    fn line(&self) -> String {
        match self {
            Event::Kernel(release) => format!("{MARK} kernel {release}"),
            Event::Start(id) => format!("{MARK} start {id}"),
            Event::End {
                id,
                outcome,
                secs,
                note,
            } => format!("{MARK} end {id} {} {secs:.1} {note}", outcome.word())
                .trim_end()
                .to_string(),
            Event::Done => format!("{MARK} done"),
        }
    }

    /// The event in a line of guest output, if it holds one.
    pub fn parse(line: &str) -> Option<Event> {
        let rest = &line[line.find(MARK)? + MARK.len()..];
        let mut words = rest.split_whitespace();
        let event = match words.next()? {
            "kernel" => Event::Kernel(words.next()?.to_string()),
            "start" => Event::Start(words.next()?.to_string()),
            "end" => Event::End {
                id: words.next()?.to_string(),
                outcome: Outcome::from_word(words.next()?)?,
                secs: words.next()?.parse().ok()?,
                note: words.collect::<Vec<_>>().join(" "),
            },
            "done" => Event::Done,
            _ => return None,
        };
        Some(event)
    }
}

fn emit(event: Event) {
    println!("{}", event.line());
}

#[derive(Args, Debug)]
pub struct GuestArgs {
    /// The `pyebpf` binary to test.
    #[arg(long, value_name = "PATH")]
    pub pyebpf: PathBuf,
    /// A test executable of the `tests` crate, as NAME=PATH (e.g. record=target/debug/deps/record-…).
    #[arg(long = "test-bin", value_name = "NAME=PATH", value_parser = parse_test_bin)]
    pub test_bins: Vec<(String, PathBuf)>,
    /// Unmount tracefs and debugfs first (only inside a private mount namespace, which the
    /// runner checks): the `--kernel host` run, like a fresh machine.
    #[arg(long)]
    pub private_mounts: bool,
    /// The rows' `$TMPDIR` and working directory (shared with the host).
    #[arg(long, value_name = "DIR")]
    pub tmp: PathBuf,
    /// `$PYEBPF_TEST_SLOWDOWN` for the tests: how much slower than a normal host this runs.
    #[arg(long, value_name = "K", default_value_t = 1.0)]
    pub slowdown: f64,
    /// Kill a row after this many seconds.
    #[arg(long, value_name = "SECS")]
    pub row_timeout: u64,
    /// Run only these rows (empty: every row).
    #[arg(long = "row", value_name = "ROW")]
    pub rows: Vec<String>,
}

/// Whether `row` is among `only` (an empty filter selects every row).
pub fn selected(row: &Row, only: &[String]) -> bool {
    only.is_empty() || only.iter().any(|id| id == row.id)
}

fn parse_test_bin(s: &str) -> Result<(String, PathBuf), String> {
    let (name, path) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=PATH, got {s:?}"))?;
    Ok((name.to_string(), PathBuf::from(path)))
}

/// `cargo xtask vm-guest`: run every row, reporting through marker lines. Fails only when it
/// cannot start; failed rows are the host's business.
pub fn guest(args: &GuestArgs) -> Result<()> {
    if args.private_mounts {
        hide_tracing()?;
    }
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) only changes who adopts our orphans.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .context("reading /proc/sys/kernel/osrelease")?;
    emit(Event::Kernel(release.trim().to_string()));
    for row in ROWS.iter().filter(|r| selected(r, &args.rows)) {
        emit(Event::Start(row.id.to_string()));
        let started = Instant::now();
        let (outcome, note) = match run_row(row, args) {
            Ok(result) => result,
            Err(err) => {
                println!("{}: {err:#}", row.id);
                (Outcome::Fail, "could not run".to_string())
            }
        };
        emit(Event::End {
            id: row.id.to_string(),
            outcome,
            secs: started.elapsed().as_secs_f64(),
            note,
        });
    }
    emit(Event::Done);
    Ok(())
}

fn run_row(row: &Row, args: &GuestArgs) -> Result<(Outcome, String)> {
    let cmd = match &row.what {
        What::Test {
            bin,
            test,
            interpreters,
        } => {
            let exe = args
                .test_bins
                .iter()
                .find(|(name, _)| name == bin)
                .map(|(_, path)| path)
                .with_context(|| format!("no --test-bin {bin}=PATH given"))?;
            let mut cmd = Command::new(exe);
            cmd.args([test, "--exact", "--test-threads=1", "--nocapture"])
                .env("PYEBPF_BIN", &args.pyebpf)
                .env("PYEBPF_TEST_INTERPRETERS", interpreters)
                .env("PYEBPF_TEST_SLOWDOWN", args.slowdown.to_string())
                .env("RUST_BACKTRACE", "0");
            cmd
        }
        What::Pyebpf { args: pyebpf_args } => {
            let mut cmd = Command::new(&args.pyebpf);
            cmd.args(*pyebpf_args);
            cmd
        }
    };
    execute(cmd, &args.tmp, Duration::from_secs(args.row_timeout))
}

/// Run `cmd` to its end or until `timeout`, then clean up after it.
fn execute(mut cmd: Command, tmp: &Path, timeout: Duration) -> Result<(Outcome, String)> {
    cmd.env("TMPDIR", tmp).current_dir(tmp);
    println!("$ {}", util::render(&cmd));
    let (mut child, forwarded) = spawn_merged(&mut cmd)?;
    // `cmd` holds copies of the pipe's write end: drop them, so the reader sees EOF once the
    // row's processes are gone.
    drop(cmd);
    let deadline = Instant::now() + timeout;
    let result = loop {
        if let Some(status) = child.try_wait()? {
            let outcome = if status.success() {
                Outcome::Pass
            } else {
                Outcome::Fail
            };
            break (outcome, format!("({status})"));
        }
        if Instant::now() >= deadline {
            kill_tree(child.id());
            let _ = child.wait();
            break (
                Outcome::Timeout,
                format!("(killed after {} s)", timeout.as_secs()),
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    kill_leftovers();
    // Let the row's last lines out before its end marker.
    let _ = forwarded.recv_timeout(Duration::from_secs(5));
    Ok(result)
}

/// Start `cmd` with stdout and stderr merged into our stdout, line by line, in order. The
/// receiver hears when the output has ended.
fn spawn_merged(cmd: &mut Command) -> Result<(Child, mpsc::Receiver<()>)> {
    let (reader, writer) = std::io::pipe().context("creating a pipe")?;
    cmd.stdin(Stdio::null())
        .stdout(writer.try_clone().context("duplicating a pipe")?)
        .stderr(writer);
    let child = cmd
        .spawn()
        .with_context(|| format!("could not start {}", util::quote(cmd.get_program())))?;
    let (done, forwarded) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(reader);
        let mut line = Vec::new();
        let stdout = std::io::stdout();
        while reader.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
            let mut out = stdout.lock();
            let _ = out.write_all(&line);
            let _ = out.flush();
            line.clear();
        }
        let _ = done.send(());
    });
    Ok((child, forwarded))
}

/// SIGKILL `pid` and all its descendants. The whole tree is read before anything is killed,
/// so that no process is reparented away from it in between.
pub fn kill_tree(pid: u32) {
    let mut tree = descendants(pid);
    tree.push(pid);
    for p in tree {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(p as i32, libc::SIGKILL) };
    }
}

/// Kill whatever a row left behind (orphans were adopted by us, the subreaper) and reap it.
fn kill_leftovers() {
    let me = std::process::id();
    for p in descendants(me) {
        // SAFETY: as in kill_tree.
        unsafe { libc::kill(p as i32, libc::SIGKILL) };
    }
    // SAFETY: waitpid on any child with WNOHANG; status is a valid out pointer.
    let mut status = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        match unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) } {
            0 => std::thread::sleep(Duration::from_millis(20)),
            -1 => break, // no children left
            _ => {}
        }
    }
}

/// Every process below `pid`, from the parent pids in `/proc/*/stat`.
fn descendants(pid: u32) -> Vec<u32> {
    let mut parent_of: Vec<(u32, u32)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.filter_map(|e| e.ok()) {
            let Some(p) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|pp| pp.parse().ok());
            if let Some(ppid) = ppid {
                parent_of.push((p, ppid));
            }
        }
    }
    let mut found = Vec::new();
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for &(p, pp) in &parent_of {
            if pp == parent && !found.contains(&p) {
                found.push(p);
                frontier.push(p);
            }
        }
    }
    found
}

/// The places tracefs and debugfs are mounted on a normal machine.
const TRACING_DIRS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug"];

/// Make this mount namespace look like a fresh machine's: no tracefs, no debugfs. Refuses to
/// run in the namespace of pid 1, so that it can never unmount the machine's own.
fn hide_tracing() -> Result<()> {
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
    if ns("self").is_none() || ns("self") == ns("1") {
        bail!(
            "refusing to unmount tracefs/debugfs: this is not a private mount namespace\n  fix: \
             let `cargo xtask vm-test --kernel host` start the runner (it uses `unshare -m`)"
        );
    }
    for dir in TRACING_DIRS {
        for point in util::mounts_under(Path::new(dir)) {
            util::run(Command::new("umount").arg(&point))?;
        }
    }
    let left: Vec<String> = util::mounts()
        .into_iter()
        .filter(|(_, fstype)| fstype == "tracefs" || fstype == "debugfs")
        .map(|(point, fstype)| format!("{fstype} on {}", point.display()))
        .collect();
    if !left.is_empty() {
        bail!(
            "still mounted in the private namespace: {}",
            left.join(", ")
        );
    }
    println!("private mount namespace: tracefs and debugfs are not mounted");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip() {
        let events = [
            Event::Kernel("6.1.0-56-amd64".into()),
            Event::Start("exit-cleanup".into()),
            Event::End {
                id: "check".into(),
                outcome: Outcome::Pass,
                secs: 0.5,
                note: String::new(),
            },
            Event::End {
                id: "chain-debian-3.11".into(),
                outcome: Outcome::Fail,
                secs: 44.0,
                note: String::new(),
            },
            Event::Done,
        ];
        for e in events {
            // A kernel message may precede the marker on the same console line.
            let line = format!("[   12.3] virtio: x{}\r", e.line());
            assert_eq!(Event::parse(&line), Some(e));
        }
        assert_eq!(Event::parse("test result: FAILED"), None);
    }

    #[test]
    fn rows_are_well_formed() {
        for (i, row) in ROWS.iter().enumerate() {
            assert!(!row.id.contains(char::is_whitespace), "{}", row.id);
            assert!(ROWS[..i].iter().all(|r| r.id != row.id), "{}", row.id);
        }
        assert_eq!(
            test_bins(),
            ["agent", "async_tasks", "lifecycle", "native", "record"]
        );
    }
}
