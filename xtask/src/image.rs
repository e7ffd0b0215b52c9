//! `cargo xtask image`: the OCI image `localhost/pyebpf:latest` that
//! `packaging/kubernetes/daemonset.yaml` runs, built with podman from Debian's packages.
//!
//! No registry image can be pulled here, so the base is made, not pulled: `mmdebstrap
//! --variant=extract` unpacks only what the binary links (`libc6`, `libgcc-s1`; TLS is
//! rustls with its own roots, so no CA bundle) into a tarball, without a shell, apt or dpkg.
//! `packaging/Containerfile` then adds that tarball and the stripped `pyebpf` `FROM scratch`;
//! no step runs a container, so the build needs no OCI runtime.
//!
//! The base tarball is cached in `/var/cache/pyebpf/image/` (built in a temporary file, then
//! renamed, under a lock: two runs may race), so a second image build only copies the binary.
//! `cargo xtask test` builds the same image from the debug binary as `localhost/pyebpf:test`
//! (see [`build`]), which spares the test run a release build.
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context as _, Result};
use clap::Args;

use crate::util::{self, probe_stdout};
use crate::{apt, run};

/// The image `cargo xtask image` builds.
pub const TAG: &str = "localhost/pyebpf:latest";
/// The image `cargo xtask test` builds from the debug binary.
pub const TEST_TAG: &str = "localhost/pyebpf:test";
const CACHE_DIR: &str = "/var/cache/pyebpf/image";
const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";
/// What the binary links (`ldd target/release/pyebpf`: libc, libgcc_s).
const BASE_PACKAGES: &str = "libc6,libgcc-s1";

#[derive(Args, Debug, Default)]
pub struct ImageArgs {
    /// The image's name.
    #[arg(long, default_value = TAG)]
    pub tag: String,
    /// Debian mirror for the base [default: $PYEBPF_DEBIAN_MIRROR, else http://deb.debian.org/debian]
    #[arg(long, value_name = "URL")]
    pub mirror: Option<String>,
}

pub fn image(args: &ImageArgs) -> Result<()> {
    let started = Instant::now();
    ensure_podman()?;
    let bin = run::build_release()?;
    let size = build(&bin, &args.tag, args.mirror.as_deref())?;
    eprintln!(
        "built {} ({:.1} MB) in {:.0}s\n  run it: podman run --rm {} --help",
        args.tag,
        size as f64 / 1e6,
        started.elapsed().as_secs_f64(),
        args.tag
    );
    Ok(())
}

/// podman, runc (Debian's crun refuses this machine's hybrid cgroups) and mmdebstrap.
pub fn ensure_podman() -> Result<()> {
    util::step("podman, runc, mmdebstrap");
    apt::ensure(&["podman", "runc", "mmdebstrap"])?;
    eprintln!("ok: podman, runc, mmdebstrap");
    Ok(())
}

/// The image the container tests run their Python workloads in: the sid root (CPython
/// 3.13-3.15) imported as it is (`podman import`, no registry). Imported once; `--rebuild` of
/// the sid root is not followed (remove the image to take the new root).
pub const PYTHON_IMAGE: &str = "localhost/pyebpf-test-python:sid";

/// Imports [`PYTHON_IMAGE`] from `sid_root` unless podman has it.
pub fn ensure_python_image(sid_root: &Path) -> Result<()> {
    util::step(&format!("image {PYTHON_IMAGE}"));
    let exists = Command::new("podman")
        .args(["image", "exists", PYTHON_IMAGE])
        .status()
        .is_ok_and(|s| s.success());
    if exists {
        eprintln!("ok: {PYTHON_IMAGE}");
        return Ok(());
    }
    let t = Instant::now();
    // A root that had /proc or /sys mounted must leave them out; /dev is the runtime's.
    let script = format!(
        "tar -C {} --exclude=./proc --exclude=./sys --exclude=./dev -c . | podman import - {PYTHON_IMAGE}",
        util::quote(sid_root.as_os_str())
    );
    util::run(Command::new("sh").args(["-c", &script]))
        .with_context(|| format!("importing {} as {PYTHON_IMAGE}", sid_root.display()))?;
    eprintln!(
        "imported {PYTHON_IMAGE} in {:.0}s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Builds the image `tag` holding `bin` (stripped); returns its size in bytes.
pub fn build(bin: &Path, tag: &str, mirror: Option<&str>) -> Result<u64> {
    util::step(&format!("image {tag}"));
    let base = base_rootfs(mirror)?;
    let context = util::target_dir().join("image-context");
    let _ = std::fs::remove_dir_all(&context);
    std::fs::create_dir_all(&context)?;
    // A hard link where the cache and the target share a file system, else a copy.
    let rootfs = context.join("rootfs.tar");
    if std::fs::hard_link(&base, &rootfs).is_err() {
        std::fs::copy(&base, &rootfs)
            .with_context(|| format!("copying {} into the build context", base.display()))?;
    }
    util::run(
        Command::new("strip")
            .arg("--strip-debug")
            .arg("-o")
            .arg(context.join("pyebpf"))
            .arg(bin),
    )
    .context("stripping the binary (binutils' strip)")?;
    let containerfile = util::workspace_root().join("packaging/Containerfile");
    let previous = image_id(tag);
    // One layer per build, not one image per step: nothing here is worth caching but the base.
    util::run(
        Command::new("podman")
            .args([
                "build",
                "--pull=never",
                "--layers=false",
                "--tag",
                tag,
                "--file",
            ])
            .arg(&containerfile)
            .arg(&context),
    )
    .context("podman build failed (errors above)")?;
    // The image this one replaced would stay behind untagged, one per build; a container
    // still using it keeps it.
    if let Some(old) = previous.filter(|old| image_id(tag).as_ref() != Some(old)) {
        let _ = util::probe(Command::new("podman").args(["rmi", &old]));
    }
    let size = probe_stdout(Command::new("podman").args([
        "image",
        "inspect",
        "--format",
        "{{.Size}}",
        tag,
    ]))
    .and_then(|s| s.parse().ok())
    .context("podman image inspect gave no size")?;
    let _ = std::fs::remove_dir_all(&context);
    Ok(size)
}

/// The id of the image `tag`, if podman has it.
fn image_id(tag: &str) -> Option<String> {
    probe_stdout(Command::new("podman").args(["image", "inspect", "--format", "{{.Id}}", tag]))
}

/// The cached base: a tarball of the Debian release this machine runs (the binary links its
/// glibc), with only [`BASE_PACKAGES`] unpacked.
fn base_rootfs(mirror: Option<&str>) -> Result<PathBuf> {
    let suite = host_suite()?;
    let arch = probe_stdout(Command::new("dpkg").arg("--print-architecture"))
        .context("`dpkg --print-architecture` failed")?;
    let dir = PathBuf::from(CACHE_DIR);
    let tarball = dir.join(format!("rootfs-{suite}-{arch}.tar"));
    if tarball.is_file() {
        eprintln!("ok: base {}", tarball.display());
        return Ok(tarball);
    }
    if !util::is_root() {
        bail!("building the image's base needs root (mmdebstrap)\n  fix: run `sudo -E cargo xtask image` once");
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let lock_path = dir.join("rootfs.lock");
    let lock =
        File::create(&lock_path).with_context(|| format!("creating {}", lock_path.display()))?;
    if lock.try_lock().is_err() {
        eprintln!("waiting for another build of the image base ...");
        lock.lock()?;
    }
    if tarball.is_file() {
        return Ok(tarball);
    }
    let mirror = mirror
        .map(str::to_string)
        .or_else(|| std::env::var("PYEBPF_DEBIAN_MIRROR").ok())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| DEFAULT_MIRROR.to_string());
    let tmp = dir.join(format!(
        "rootfs-{suite}-{arch}.{}.tmp.tar",
        std::process::id()
    ));
    let t = Instant::now();
    // Documentation, locales and iconv modules are of no use to one static program.
    let trim = "rm -rf \"$1\"/usr/share/doc \"$1\"/usr/share/locale \"$1\"/usr/share/lintian \
                \"$1\"/usr/lib/*/gconv \"$1\"/var/lib/dpkg \"$1\"/var/cache/apt";
    let built = util::run(
        Command::new("mmdebstrap")
            .args(["--variant=extract", "--include", BASE_PACKAGES])
            .arg(format!("--architectures={arch}"))
            .arg(format!("--customize-hook={trim}"))
            .arg(&suite)
            .arg(&tmp)
            .arg(&mirror),
    );
    if let Err(err) = built {
        let _ = std::fs::remove_file(&tmp);
        return Err(err).context(format!(
            "mmdebstrap failed\n  fix: check network access to {mirror} (or set PYEBPF_DEBIAN_MIRROR)"
        ));
    }
    std::fs::rename(&tmp, &tarball)
        .with_context(|| format!("renaming {} to {}", tmp.display(), tarball.display()))?;
    eprintln!(
        "base {} built in {:.0}s",
        tarball.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(tarball)
}

/// `bookworm` on Debian 12: the release whose glibc the binary was linked against.
fn host_suite() -> Result<String> {
    let text = std::fs::read_to_string("/etc/os-release").context("reading /etc/os-release")?;
    text.lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim_matches('"').to_string())
        .filter(|v| !v.is_empty())
        .context("/etc/os-release names no VERSION_CODENAME: the image's base is built from the Debian release this machine runs")
}
