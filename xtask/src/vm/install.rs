//! The host side's ingredients for `cargo xtask vm-test`, installed on first use from the
//! registries:
//!
//! - `qemu-system-x86` and `busybox-static` (apt): the emulator and the guest's tiny userland;
//! - Debian kernels, `linux-image-*` (apt). Installed, not unpacked: virtme-ng needs the
//!   package's modules under `/lib/modules` to mount the host's filesystem in the guest. The
//!   generic `-amd64` flavour, since `-cloud-amd64` has no 9p. 6.12 comes from
//!   bookworm-backports, whose sources file is added when missing;
//! - virtme-ng (PyPI, pinned to the version verified here) in a venv under
//!   `/var/cache/pyebpf`.
//!
//! Each step checks cheaply first (`dpkg-query`, files in `/boot` and `/lib/modules`,
//! `vng --version`), so a second run starts no package manager at all.
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{anyhow, bail, Context as _, Result};

use crate::apt::{apt_install, apt_update, dpkg_installed};
use crate::util::{self, probe, probe_stdout};

/// Where virtme-ng's venv lives.
pub const VNG_VENV: &str = "/var/cache/pyebpf/virtme-ng";
/// The virtme-ng release whose recipe was verified on this kind of machine.
const VNG_VERSION: &str = "1.42";
const APT_PACKAGES: [&str; 2] = ["qemu-system-x86", "busybox-static"];
const BACKPORTS_SOURCES: &str = "/etc/apt/sources.list.d/pyebpf-bookworm-backports.sources";
const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";

/// A family of Debian kernel packages, `linux-image-{prefix}N{suffix}`, of which the highest
/// N is wanted.
pub struct DebianKernel {
    /// What `--kernel` calls it.
    pub label: &'static str,
    prefix: &'static str,
    suffix: &'static str,
    /// The apt suite it comes from when that is not one of the default ones.
    suite: Option<&'static str>,
}

pub const DEBIAN_KERNELS: [DebianKernel; 2] = [
    // Debian 12's own kernel, the LTS fleets run (Amazon Linux 2023 too).
    DebianKernel {
        label: "6.1",
        prefix: "6.1.0-",
        suffix: "-amd64",
        suite: None,
    },
    DebianKernel {
        label: "6.12",
        prefix: "6.12.",
        suffix: "+deb12-amd64",
        suite: Some("bookworm-backports"),
    },
];

impl DebianKernel {
    /// N of a release string `{prefix}N{suffix}`, if it is one of ours.
    fn number(&self, release: &str) -> Option<u32> {
        let n = release
            .strip_prefix(self.prefix)?
            .strip_suffix(self.suffix)?;
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        n.parse().ok()
    }

    /// `apt-cache search` pattern for the package names.
    fn pattern(&self) -> String {
        let escape = |s: &str| s.replace('.', r"\.").replace('+', r"\+");
        format!(
            "^linux-image-{}[0-9]+{}$",
            escape(self.prefix),
            escape(self.suffix)
        )
    }

    /// The newest installed release: image in `/boot`, modules in `/lib/modules`, package
    /// installed.
    fn installed(&self) -> Option<String> {
        let mut found: Vec<(u32, String)> = std::fs::read_dir("/boot")
            .ok()?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let release = name.strip_prefix("vmlinuz-")?.to_string();
                Some((self.number(&release)?, release))
            })
            .filter(|(_, r)| Path::new("/lib/modules").join(r).is_dir())
            .filter(|(_, r)| dpkg_installed(&format!("linux-image-{r}")))
            .collect();
        found.sort();
        found.pop().map(|(_, r)| r)
    }
}

/// qemu, busybox and virtme-ng; returns the venv's `bin` directory (it must be on `PATH`
/// for `vng`, which runs `virtme-run` from there).
pub fn vm_tools() -> Result<PathBuf> {
    crate::apt::ensure(&APT_PACKAGES)?;
    eprintln!("ok: {}", APT_PACKAGES.join(", "));
    virtme_ng()
}

/// The vmlinuz of `kernel`, installing its newest package when none is installed.
pub fn debian_kernel(kernel: &DebianKernel) -> Result<PathBuf> {
    let release = match kernel.installed() {
        Some(release) => release,
        None => {
            if let Some(suite) = kernel.suite {
                add_suite(suite)?;
            }
            let package = newest_package(kernel)?;
            eprintln!("installing {package} (a minute or two: it builds an initramfs) ...");
            apt_install(std::slice::from_ref(&package), kernel.suite)?;
            kernel.installed().ok_or_else(|| {
                anyhow!(
                    "{package} was installed but its /boot/vmlinuz-* or /lib/modules/* is \
                     missing\n  fix: `apt-get install --reinstall {package}`"
                )
            })?
        }
    };
    let vmlinuz = PathBuf::from(format!("/boot/vmlinuz-{release}"));
    eprintln!("ok: kernel {} ({})", kernel.label, vmlinuz.display());
    Ok(vmlinuz)
}

/// The highest-numbered package of the family that apt knows, refreshing apt's lists once
/// if it knows none.
fn newest_package(kernel: &DebianKernel) -> Result<String> {
    let search = || -> Result<Option<String>> {
        let out =
            probe(Command::new("apt-cache").args(["search", "--names-only", &kernel.pattern()]))
                .context("could not run apt-cache")?;
        let text = String::from_utf8_lossy(&out.stdout);
        Ok(text
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter_map(|name| {
                let release = name.strip_prefix("linux-image-")?;
                Some((kernel.number(release)?, name.to_string()))
            })
            .max()
            .map(|(_, name)| name))
    };
    if let Some(name) = search()? {
        return Ok(name);
    }
    apt_update()?;
    search()?.ok_or_else(|| {
        anyhow!(
            "apt knows no package matching {} even after `apt-get update`\n  fix: this needs a \
             Debian bookworm host; elsewhere pass `--kernel /path/to/vmlinuz` of an installed \
             kernel",
            kernel.pattern()
        )
    })
}

/// Add `suite` of the Debian mirror to apt's sources (a file of our own) and refresh the
/// lists, unless that file exists already.
fn add_suite(suite: &str) -> Result<()> {
    let path = Path::new(BACKPORTS_SOURCES);
    if path.exists() {
        return Ok(());
    }
    let mirror = std::env::var("PYEBPF_DEBIAN_MIRROR")
        .ok()
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| DEFAULT_MIRROR.to_string());
    let text = format!(
        "# Added by `cargo xtask vm-test` (pyebpf) for its 6.12 kernel.\nTypes: deb\nURIs: \
         {mirror}\nSuites: {suite}\nComponents: main\nSigned-By: \
         /usr/share/keyrings/debian-archive-keyring.gpg\n"
    );
    eprintln!("adding {suite} to apt's sources: {}", path.display());
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    apt_update()
}

/// virtme-ng in its venv; returns the venv's `bin`.
fn virtme_ng() -> Result<PathBuf> {
    let venv = Path::new(VNG_VENV);
    let bin = venv.join("bin");
    let version = || probe_stdout(Command::new(bin.join("vng")).arg("--version"));
    let wanted = |v: &str| v.split_whitespace().last() == Some(VNG_VERSION);
    if let Some(v) = version().filter(|v| wanted(v)) {
        eprintln!("ok: {v} ({})", venv.display());
        return Ok(bin);
    }
    let python = venv_python()?;
    eprintln!(
        "installing virtme-ng {VNG_VERSION} into {} ...",
        venv.display()
    );
    std::fs::create_dir_all(venv.parent().unwrap())
        .with_context(|| format!("creating {}", venv.parent().unwrap().display()))?;
    let made = util::run(
        Command::new(&python)
            .args(["-m", "venv", "--clear"])
            .arg(venv),
    )
    .and_then(|()| {
        util::run(
            Command::new(bin.join("pip"))
                .args(["install", "--quiet", "--disable-pip-version-check"])
                .arg(format!("virtme-ng=={VNG_VERSION}")),
        )
    });
    util::with_fix(
        made,
        "could not install virtme-ng",
        format!(
            "check network access to PyPI, then run `{} -m venv {} && {}/pip install \
             virtme-ng=={VNG_VERSION}`",
            python.display(),
            venv.display(),
            bin.display()
        ),
    )?;
    match version() {
        Some(v) if wanted(&v) => {
            eprintln!("ok: {v} (installed)");
            Ok(bin)
        }
        other => bail!(
            "virtme-ng was installed but `{}/vng --version` says {other:?}\n  fix: remove {} \
             and run again",
            bin.display(),
            venv.display()
        ),
    }
}

/// A Python that can make a venv with pip: `python3` on PATH, else Debian's, for which
/// `python3-venv` is installed if need be.
fn venv_python() -> Result<PathBuf> {
    let works = |py: &Path| {
        probe(Command::new(py).args(["-c", "import venv, ensurepip"]))
            .is_some_and(|o| o.status.success())
    };
    for py in ["python3", "/usr/bin/python3"] {
        if works(Path::new(py)) {
            return Ok(PathBuf::from(py));
        }
    }
    eprintln!("no python3 with venv and ensurepip; installing python3-venv ...");
    apt_install(&["python3-venv".to_string()], None)?;
    let debian = PathBuf::from("/usr/bin/python3");
    if works(&debian) {
        return Ok(debian);
    }
    bail!(
        "{} cannot make a venv even with python3-venv installed\n  fix: install a Python 3 \
         with the venv module and put it first on PATH as python3",
        debian.display()
    )
}

#[cfg(test)]
mod tests {
    use super::DEBIAN_KERNELS;

    #[test]
    fn kernel_release_numbers() {
        let [k61, k612] = &DEBIAN_KERNELS;
        assert_eq!(k61.number("6.1.0-56-amd64"), Some(56));
        assert_eq!(k61.number("6.1.0-56-cloud-amd64"), None);
        assert_eq!(k61.number("6.1.0-56-amd64-unsigned"), None);
        assert_eq!(k612.number("6.12.43+deb12-amd64"), Some(43));
        assert_eq!(k612.number("6.12.43+deb12-rt-amd64"), None);
        assert_eq!(k612.number("6.1.0-56-amd64"), None);
        assert_eq!(k612.pattern(), r"^linux-image-6\.12\.[0-9]+\+deb12-amd64$");
    }
}
