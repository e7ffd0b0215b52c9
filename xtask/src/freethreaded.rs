//! `cargo xtask freethreaded`: a free-threaded (`--disable-gil`) CPython 3.13 for the tests.
//!
//! No registry reachable here ships a free-threaded binary, so it is built from the one
//! CPython source this machine can fetch: Debian's `python3.13_3.13.15.orig.tar.xz` from the
//! pool, checked against the sha256 that sid's `Sources` index lists for it. Unoptimised
//! (`./configure --disable-gil --without-ensurepip`, and `--disable-test-modules`: CPython's
//! own test suite is neither compiled nor installed, which saves minutes), statically linked:
//! about 4 min of CPU (3.5 min user + 0.4 min system measured here), so a few minutes on 2 idle
//! CPUs; 32 min of wall time on this VM while other builds shared it.
//!
//! The build lands beside the sid root (`/var/cache/pyebpf/python3.13t`). It is made in a
//! temporary directory next to it and renamed into place, under a lock, and a marker is
//! written last: a second run that finds the marker and a working interpreter without a GIL
//! returns in well under a second, two runs racing build it once, and an interrupted build
//! leaves nothing that looks finished.
use std::fs::File;
use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use clap::Args;

use crate::apt;
use crate::util::{self, probe_stdout};

/// `eprintln!` with a prefix: `cargo xtask test` runs the build beside its other steps, whose
/// output interleaves with this.
macro_rules! say {
    ($($arg:tt)*) => {
        eprintln!("[3.13t] {}", format!($($arg)*))
    };
}

pub const DEFAULT_DIR: &str = "/var/cache/pyebpf/python3.13t";
/// The executable inside the build (`make install` names it after its ABI flag `t`).
pub const EXE: &str = "bin/python3.13t";
const TARBALL: &str = "python3.13_3.13.15.orig.tar.xz";
/// From sid's `dists/sid/main/source/Sources.xz`, package `python3.13` 3.13.15-1.
const TARBALL_SHA256: &str = "1e66a7945a48390ee4c2a4268a0e4185884059a13c4aab6d148aa208deea4a76";
const POOL_DIR: &str = "pool/main/p/python3.13";
/// The directory the tarball unpacks to.
const SOURCE_DIR: &str = "Python-3.13.15";
const VERSION: &str = "3.13.15";
const MARKER: &str = ".pyebpf-freethreaded-ok";
/// What the build needs beyond a C toolchain: `_ssl`/`_hashlib`, `zlib`, `_ctypes` (the
/// tests' workloads use all three), and the tools that fetch and unpack the source.
const BUILD_DEPS: &[&str] = &[
    "build-essential",
    "pkg-config",
    "libssl-dev",
    "zlib1g-dev",
    "libffi-dev",
    "curl",
    "ca-certificates",
    "xz-utils",
];
/// How often a long step says it is still working.
const HEARTBEAT: Duration = Duration::from_secs(30);

#[derive(Args, Debug, Default)]
pub struct FreethreadedArgs {
    /// Where the build lives [default: $PYEBPF_FREETHREADED, else /var/cache/pyebpf/python3.13t]
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Debian mirror [default: $PYEBPF_DEBIAN_MIRROR, else http://deb.debian.org/debian]
    #[arg(long, value_name = "URL")]
    pub mirror: Option<String>,
    /// Remove the existing build and build it again.
    #[arg(long)]
    pub rebuild: bool,
}

/// The directory `args` designate: `--dir`, else `$PYEBPF_FREETHREADED`, else the default.
pub fn build_dir(args: &FreethreadedArgs) -> PathBuf {
    let dir = args
        .dir
        .clone()
        .or_else(|| std::env::var_os("PYEBPF_FREETHREADED").map(PathBuf::from))
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DIR));
    if dir.is_absolute() {
        dir
    } else {
        util::workspace_root().join(dir)
    }
}

/// Makes sure the build exists and runs without a GIL; returns its directory.
pub fn freethreaded(args: &FreethreadedArgs) -> Result<PathBuf> {
    let dir = build_dir(args);
    util::step(&format!(
        "free-threaded CPython {VERSION} at {}",
        dir.display()
    ));
    if !args.rebuild {
        if let Some(version) = cached(&dir) {
            say!("ok: {} ({version})", dir.join(EXE).display());
            return Ok(dir);
        }
    }
    if !util::is_root() {
        bail!(
            "building the free-threaded CPython in {} needs root (apt-get, /var/cache)\n  fix: \
             run `sudo -E cargo xtask freethreaded` once",
            dir.display()
        );
    }
    let parent = dir
        .parent()
        .context("the free-threaded build's directory cannot be /")?;
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let name = dir
        .file_name()
        .context("the build directory has no name")?
        .to_string_lossy()
        .into_owned();
    // Several `cargo xtask test` may run at once: one builds, the others wait for it.
    let lock_path = parent.join(format!("{name}.lock"));
    let lock =
        File::create(&lock_path).with_context(|| format!("creating {}", lock_path.display()))?;
    if lock.try_lock().is_err() {
        say!(
            "waiting for another build of the free-threaded CPython ({}) ...",
            lock_path.display()
        );
        lock.lock()
            .with_context(|| format!("locking {}", lock_path.display()))?;
    }
    if !args.rebuild {
        if let Some(version) = cached(&dir) {
            say!("ok: {} ({version})", dir.join(EXE).display());
            return Ok(dir);
        }
    }

    let mirror = args
        .mirror
        .clone()
        .or_else(|| std::env::var("PYEBPF_DEBIAN_MIRROR").ok())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| crate::sidroot::DEFAULT_MIRROR.to_string());
    let started = Instant::now();
    apt::ensure(BUILD_DEPS).context("installing the free-threaded build's dependencies")?;
    let tarball = fetch_source(parent, &mirror)?;
    // Leftovers of an interrupted build: only this build makes `.NAME.build-*`.
    remove_leftovers(parent, &name);
    let work = parent.join(format!(".{name}.build-{}", std::process::id()));
    let result = build(&tarball, &work, &dir);
    let _ = std::fs::remove_dir_all(&work);
    let version = result.with_context(|| {
        format!(
            "building the free-threaded CPython {VERSION} into {} failed\n  fix: read the \
             errors above, then run `cargo xtask freethreaded --rebuild`",
            dir.display()
        )
    })?;
    say!(
        "ok: {} ({version}; built in {:.0}s)",
        dir.join(EXE).display(),
        started.elapsed().as_secs_f64()
    );
    Ok(dir)
}

/// Fast path: the marker exists and the interpreter runs with the GIL disabled. Returns what
/// it says about itself.
fn cached(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join(MARKER)).ok()?;
    verify(dir).ok()
}

/// The interpreter runs, is 3.13 and has no GIL; returns e.g. "3.13.15, GIL disabled".
fn verify(dir: &Path) -> Result<String> {
    let exe = dir.join(EXE);
    let out = probe_stdout(Command::new(&exe).args([
        "-c",
        "import sys, sysconfig; print(sys.version.split()[0], sys._is_gil_enabled(), \
         sysconfig.get_config_var('Py_GIL_DISABLED'))",
    ]))
    .with_context(|| format!("{} does not run", exe.display()))?;
    match out.split_whitespace().collect::<Vec<_>>()[..] {
        [version, "False", "1"] if version == VERSION => Ok(format!("{version}, GIL disabled")),
        _ => bail!(
            "{} is not a free-threaded {VERSION} with its GIL disabled: it says {out:?} \
             (version, sys._is_gil_enabled(), Py_GIL_DISABLED)",
            exe.display()
        ),
    }
}

/// The source tarball, downloaded once into `cache` and checked against its pinned sha256.
fn fetch_source(cache: &Path, mirror: &str) -> Result<PathBuf> {
    let path = cache.join(TARBALL);
    if path.is_file() {
        if sha256(&path)? == TARBALL_SHA256 {
            say!("ok: {} (sha256 matches)", path.display());
            return Ok(path);
        }
        say!(
            "{} does not match its sha256; downloading it again",
            path.display()
        );
    }
    let url = format!("{}/{POOL_DIR}/{TARBALL}", mirror.trim_end_matches('/'));
    let tmp = cache.join(format!(".{TARBALL}.{}", std::process::id()));
    say!("downloading the CPython source (23 MB) from {url} ...");
    let fetched = util::run(
        Command::new("curl")
            .args(["-fsSL", "--retry", "3", "-o"])
            .arg(&tmp)
            .arg(&url),
    );
    if let Err(err) = fetched {
        let _ = std::fs::remove_file(&tmp);
        return util::with_fix(
            Err(err),
            "downloading the CPython source failed",
            format!("check network access to {mirror} (or set PYEBPF_DEBIAN_MIRROR)"),
        );
    }
    let sum = sha256(&tmp)?;
    if sum != TARBALL_SHA256 {
        let _ = std::fs::remove_file(&tmp);
        bail!(
            "{url} has sha256 {sum}, not the {TARBALL_SHA256} that Debian's Sources index lists\n  \
             fix: try another mirror (PYEBPF_DEBIAN_MIRROR)"
        );
    }
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

fn sha256(path: &Path) -> Result<String> {
    let out = util::probe(Command::new("sha256sum").arg(path))
        .filter(|o| o.status.success())
        .with_context(|| format!("`sha256sum {}` failed", path.display()))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
}

/// Unpacks, configures, compiles and installs into `work`, then renames the result to `dir`.
/// The prefix is `dir` itself (`make install DESTDIR=...`), so the interpreter finds its
/// standard library once moved there.
fn build(tarball: &Path, work: &Path, dir: &Path) -> Result<String> {
    std::fs::create_dir_all(work).with_context(|| format!("creating {}", work.display()))?;
    let log_path = work.join("build.log");
    say!(
        "building the free-threaded CPython {VERSION} (unpack, configure, compile with {} \
         jobs, install; about 4 min of CPU: a few minutes on 2 idle CPUs, longer on a busy machine); log: {}",
        jobs(),
        log_path.display()
    );
    let log = File::create(&log_path)?;
    let t = Instant::now();
    logged(
        "unpacking the source",
        Command::new("tar")
            .arg("-xJf")
            .arg(tarball)
            .arg("-C")
            .arg(work),
        &log,
        &log_path,
        None,
    )?;
    let src = work.join(SOURCE_DIR);
    logged(
        "configuring (--disable-gil --without-ensurepip --disable-test-modules)",
        Command::new("./configure")
            .current_dir(&src)
            .arg(format!("--prefix={}", dir.display()))
            .args([
                "--disable-gil",
                "--without-ensurepip",
                "--disable-test-modules",
            ]),
        &log,
        &log_path,
        None,
    )?;
    logged(
        "compiling",
        Command::new("make")
            .current_dir(&src)
            .arg(format!("-j{}", jobs())),
        &log,
        &log_path,
        Some(&src),
    )?;
    let dest = work.join("dest");
    logged(
        "installing (and compiling the standard library's .pyc)",
        Command::new("make")
            .current_dir(&src)
            .arg(format!("-j{}", jobs()))
            .arg("install")
            .arg(format!("DESTDIR={}", dest.display())),
        &log,
        &log_path,
        None,
    )?;
    say!(
        "compiled and installed in {:.0}s",
        t.elapsed().as_secs_f64()
    );
    let staged = dest.join(dir.strip_prefix("/").unwrap_or(dir));
    let version = verify(&staged).or_else(|_| {
        // Run from its staging place, it still looks for its library under the final prefix
        // (not there yet): point it at the staged copy.
        verify_staged(&staged)
    })?;
    if dir.symlink_metadata().is_ok() {
        // A previous build without its marker (interrupted, or --rebuild): replaced.
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::rename(&staged, dir)
        .with_context(|| format!("moving {} to {}", staged.display(), dir.display()))?;
    let version = verify(dir).unwrap_or(version);
    write_marker(dir, &version)?;
    Ok(version)
}

/// [`verify`] for an install still under its `DESTDIR`.
fn verify_staged(staged: &Path) -> Result<String> {
    let exe = staged.join(EXE);
    let home = staged.as_os_str().to_owned();
    let out = probe_stdout(Command::new(&exe).env("PYTHONHOME", &home).args([
        "-c",
        "import sys; print(sys.version.split()[0], sys._is_gil_enabled())",
    ]))
    .with_context(|| format!("{} does not run", exe.display()))?;
    match out.split_whitespace().collect::<Vec<_>>()[..] {
        [version, "False"] if version == VERSION => Ok(format!("{version}, GIL disabled")),
        _ => bail!("the staged build says {out:?}: not a free-threaded {VERSION}"),
    }
}

/// Runs `cmd` with its output in the build log, printing `what` and, every [`HEARTBEAT`],
/// that it is still at it (with the objects compiled so far under `count_objects`). On
/// failure the log's last lines are shown.
fn logged(
    what: &str,
    cmd: &mut Command,
    log: &File,
    log_path: &Path,
    count_objects: Option<&Path>,
) -> Result<()> {
    say!("  {what} ...");
    let t = Instant::now();
    // Killed with us: `cargo xtask test` may stop on another step's error while this runs in
    // its thread, and a `make` left running would still write into the work directory.
    // SAFETY: prctl is async-signal-safe and touches nothing of the parent's.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log.try_clone()?)
        .spawn()
        .with_context(|| format!("could not start `{}`", util::render(cmd)))?;
    let mut next = HEARTBEAT;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if t.elapsed() >= next {
            next += HEARTBEAT;
            let objects = count_objects
                .map(|d| format!(", {} object files so far", count_files(d, "o")))
                .unwrap_or_default();
            say!(
                "  ... still {what} ({:.0}s{objects})",
                t.elapsed().as_secs_f64()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    if !status.success() {
        show_tail(log_path);
        bail!(
            "{what} failed ({status}); the whole log is {}",
            log_path.display()
        );
    }
    say!("  {what}: done in {:.0}s", t.elapsed().as_secs_f64());
    Ok(())
}

/// Files named `*.ext` under `dir` (bounded by the source tree's size).
fn count_files(dir: &Path, ext: &str) -> usize {
    let mut n = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(path),
                Ok(_) if path.extension().is_some_and(|x| x == ext) => n += 1,
                _ => {}
            }
        }
    }
    n
}

fn show_tail(log_path: &Path) {
    if let Ok(text) = std::fs::read_to_string(log_path) {
        let lines: Vec<&str> = text.lines().collect();
        say!("--- last lines of {} ---", log_path.display());
        for l in &lines[lines.len().saturating_sub(25)..] {
            say!("{l}");
        }
        say!("---");
    }
}

fn jobs() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// Work directories of builds that did not finish (killed, power loss): only their pid
/// differs, and the lock we hold says none is running.
fn remove_leftovers(parent: &Path, name: &str) {
    let prefix = format!(".{name}.build-");
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            say!("removing {} (an interrupted build)", e.path().display());
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

fn write_marker(dir: &Path, version: &str) -> Result<()> {
    let path = dir.join(MARKER);
    let tmp = dir.join(format!("{MARKER}.tmp"));
    let mut f = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    writeln!(f, "{version}")?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
}
