//! `cargo xtask sidroot`: a Debian sid root holding CPython 3.13, 3.14 and 3.15.
//!
//! Those interpreters exist only as sid packages that need a newer glibc than the host has,
//! so they run inside a chroot. A process started with `chroot DIR python3.15 ...` is an
//! ordinary host process whose binaries are reached through `/proc/PID/root`, exactly like a
//! container's, which is what the integration tests want to profile.
//!
//! The root is cached: a marker file is written only after a complete, verified build, and a
//! later run that finds the marker and a working `python3.15` returns at once. A partial or
//! broken root is removed and the build is retried once.
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context as _, Result};
use clap::Args;

use crate::util::{self, probe, probe_stdout};

pub const DEFAULT_ROOT: &str = "/var/cache/pyebpf/sid-root";
pub const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";
const MARKER: &str = ".pyebpf-sidroot-ok";
const MINORS: [&str; 3] = ["3.13", "3.14", "3.15"];

#[derive(Args, Debug, Default)]
pub struct SidrootArgs {
    /// Where the root lives [default: $PYEBPF_SID_ROOT, else /var/cache/pyebpf/sid-root]
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Debian mirror [default: $PYEBPF_DEBIAN_MIRROR, else http://deb.debian.org/debian]
    #[arg(long, value_name = "URL")]
    pub mirror: Option<String>,
    /// Remove the existing root and build it again.
    #[arg(long)]
    pub rebuild: bool,
}

/// The root directory `args` designate: `--root`, else `$PYEBPF_SID_ROOT`, else the default.
pub fn root_dir(args: &SidrootArgs) -> PathBuf {
    args.root
        .clone()
        .or_else(|| std::env::var_os("PYEBPF_SID_ROOT").map(PathBuf::from))
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_ROOT))
}

/// Make sure the root exists and works; returns its path.
pub fn sidroot(args: &SidrootArgs) -> Result<PathBuf> {
    let root = root_dir(args);
    let root = if root.is_absolute() {
        root
    } else {
        std::env::current_dir()?.join(root)
    };
    util::step(&format!(
        "sid root with CPython 3.13-3.15 at {}",
        root.display()
    ));
    if !args.rebuild {
        if let Some(versions) = cached(&root) {
            eprintln!("ok: sid root {} ({versions})", root.display());
            return Ok(root);
        }
    }

    if !util::is_root() {
        bail!(
            "building the sid root needs root (debootstrap, chroot)\n  fix: run `sudo -E cargo \
             xtask sidroot` once"
        );
    }
    let parent = root.parent().context("the sid root cannot be /")?;
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    // Several `cargo xtask test` may run at once: one builds, the others wait for it.
    let lock_path = parent.join(format!(
        "{}.lock",
        root.file_name().unwrap_or_default().to_string_lossy()
    ));
    let lock =
        File::create(&lock_path).with_context(|| format!("creating {}", lock_path.display()))?;
    if lock.try_lock().is_err() {
        eprintln!(
            "waiting for another build of the sid root ({}) ...",
            lock_path.display()
        );
        lock.lock()
            .with_context(|| format!("locking {}", lock_path.display()))?;
    }
    if !args.rebuild {
        if let Some(versions) = cached(&root) {
            eprintln!("ok: sid root {} ({versions})", root.display());
            return Ok(root);
        }
        // A root made by hand (or before markers existed) that has everything: adopt it.
        if root.exists() {
            match verify(&root) {
                Ok(versions) => {
                    write_marker(&root, &versions)?;
                    eprintln!(
                        "ok: sid root {} ({versions}; verified and marked)",
                        root.display()
                    );
                    return Ok(root);
                }
                Err(err) => eprintln!("the existing root is incomplete ({err:#}); rebuilding it"),
            }
        }
    }

    let mirror = args
        .mirror
        .clone()
        .or_else(|| std::env::var("PYEBPF_DEBIAN_MIRROR").ok())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| DEFAULT_MIRROR.to_string());
    check_ours(&root)?;
    ensure_debootstrap()?;
    let started = Instant::now();
    let mut attempt = 1;
    loop {
        match build(&root, &mirror) {
            Ok(versions) => {
                eprintln!(
                    "ok: sid root {} ({versions}; built in {:.0}s)",
                    root.display(),
                    started.elapsed().as_secs_f64()
                );
                return Ok(root);
            }
            Err(err) if attempt == 1 => {
                eprintln!("sid root attempt 1 failed: {err:#}");
                show_debootstrap_log(&root);
                eprintln!("removing the partial root and retrying once ...");
                attempt += 1;
            }
            Err(err) => {
                show_debootstrap_log(&root);
                let cleanup = match remove_root(&root) {
                    Ok(()) => String::new(),
                    Err(e) => format!(" (and removing it failed: {e:#})"),
                };
                bail!(
                    "building the sid root {} failed twice{cleanup}: {err:#}\n  fix: check \
                     network access to {mirror} (or set PYEBPF_DEBIAN_MIRROR), then run \
                     `cargo xtask sidroot --rebuild`",
                    root.display()
                );
            }
        }
    }
}

/// Fast path: the marker exists and `python3.15` runs. Returns the versions in the marker.
fn cached(root: &Path) -> Option<String> {
    let versions = std::fs::read_to_string(root.join(MARKER)).ok()?;
    let ok = probe(
        Command::new("chroot")
            .arg(root)
            .args(["python3.15", "-c", "pass"]),
    )?
    .status
    .success();
    ok.then(|| versions.trim().to_string())
}

/// Every interpreter runs; returns e.g. "Python 3.13.18, 3.14.10, 3.15.2".
fn verify(root: &Path) -> Result<String> {
    let mut versions = Vec::new();
    for minor in MINORS {
        let exe = format!("python{minor}");
        let v = probe_stdout(Command::new("chroot").arg(root).args([
            exe.as_str(),
            "-c",
            "import platform; print(platform.python_version())",
        ]))
        .with_context(|| format!("`chroot {} {exe}` does not run", root.display()))?;
        versions.push(v);
    }
    Ok(format!("Python {}", versions.join(", ")))
}

fn write_marker(root: &Path, versions: &str) -> Result<()> {
    let path = root.join(MARKER);
    let tmp = root.join(format!("{MARKER}.tmp"));
    let mut f = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    writeln!(f, "{versions}")?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
}

fn build(root: &Path, mirror: &str) -> Result<String> {
    remove_root(root)?;
    let t = Instant::now();
    eprintln!("debootstrap: downloading and unpacking a minimal Debian sid (a few minutes) ...");
    util::run(
        Command::new(debootstrap_path())
            .args(["--variant=minbase", "sid"])
            .arg(root)
            .arg(mirror),
    )
    .context("debootstrap failed")?;
    eprintln!("debootstrap done in {:.0}s", t.elapsed().as_secs_f64());

    let t = Instant::now();
    eprintln!(
        "installing CPython {} inside the root ...",
        MINORS.join(", ")
    );
    let install = || {
        let mut cmd = Command::new("chroot");
        cmd.env("DEBIAN_FRONTEND", "noninteractive")
            .arg(root)
            .args(["apt-get", "install", "-y", "--no-install-recommends"])
            .args(MINORS.map(|m| format!("python{m}")));
        util::status(&mut cmd)
    };
    if !install()?.success() {
        eprintln!("apt-get install failed; refreshing the package lists and retrying ...");
        util::run(Command::new("chroot").arg(root).args(["apt-get", "update"]))
            .context("`apt-get update` inside the sid root failed")?;
        if !install()?.success() {
            bail!("`apt-get install` of python3.13, python3.14, python3.15 inside the sid root failed");
        }
    }
    // Downloaded .debs are of no further use; drop them to keep the root small.
    let _ = util::status(Command::new("chroot").arg(root).args(["apt-get", "clean"]));
    eprintln!("CPython installed in {:.0}s", t.elapsed().as_secs_f64());

    let versions = verify(root)?;
    write_marker(root, &versions)?;
    Ok(versions)
}

fn debootstrap_path() -> PathBuf {
    if util::on_path("debootstrap") {
        PathBuf::from("debootstrap")
    } else {
        PathBuf::from("/usr/sbin/debootstrap")
    }
}

fn ensure_debootstrap() -> Result<()> {
    if util::on_path("debootstrap") || Path::new("/usr/sbin/debootstrap").is_file() {
        eprintln!("ok: debootstrap");
        return Ok(());
    }
    if !util::on_path("apt-get") {
        bail!("debootstrap is missing and there is no apt-get to install it\n  fix: install debootstrap with your package manager");
    }
    eprintln!("installing debootstrap ...");
    let install = || {
        util::status(
            Command::new("apt-get")
                .env("DEBIAN_FRONTEND", "noninteractive")
                .args(["install", "-y", "debootstrap"]),
        )
    };
    if !install()?.success() {
        util::run(Command::new("apt-get").args(["update"])).context("`apt-get update` failed")?;
        if !install()?.success() {
            bail!("could not install debootstrap\n  fix: `apt-get update && apt-get install -y debootstrap`");
        }
    }
    Ok(())
}

/// Remove a (partial) root, after unmounting anything debootstrap may have left mounted
/// inside it (`/proc`, `/sys`, ...). Refuses to delete a directory that does not look like
/// one of ours.
fn remove_root(root: &Path) -> Result<()> {
    if root.symlink_metadata().is_err() {
        return Ok(());
    }
    check_ours(root)?;
    for mount in util::mounts_under(root) {
        let _ = util::status(Command::new("umount").arg("-l").arg(&mount));
    }
    let left = util::mounts_under(root);
    if !left.is_empty() {
        bail!(
            "cannot remove {}: still mounted inside: {left:?}",
            root.display()
        );
    }
    util::run(
        Command::new("rm")
            .args(["-rf", "--one-file-system"])
            .arg(root),
    )
}

/// A missing or empty directory, or one that looks like a (partial) Debian root: safe to
/// replace. Anything else is someone's data.
fn check_ours(root: &Path) -> Result<()> {
    if root.symlink_metadata().is_err() {
        return Ok(());
    }
    if root.components().count() < 3 {
        bail!(
            "refusing to remove {}: path too short to be a sid root",
            root.display()
        );
    }
    let empty = std::fs::read_dir(root)
        .map(|mut d| d.next().is_none())
        .unwrap_or(false);
    let ours = empty
        || root.join(MARKER).exists()
        || root.join("debootstrap").is_dir()
        || root.join("etc/debian_version").is_file();
    if !ours {
        bail!(
            "{} exists and does not look like a Debian root; not touching it\n  fix: remove it \
             yourself or choose another --root / PYEBPF_SID_ROOT",
            root.display()
        );
    }
    Ok(())
}

fn show_debootstrap_log(root: &Path) {
    let log = root.join("debootstrap/debootstrap.log");
    if let Ok(text) = std::fs::read_to_string(&log) {
        let lines: Vec<&str> = text.lines().collect();
        eprintln!("--- last lines of {} ---", log.display());
        for l in &lines[lines.len().saturating_sub(15)..] {
            eprintln!("{l}");
        }
        eprintln!("---");
    }
}
