//! `cargo xtask setup`: install what building the BPF side needs, once.
//!
//! 1. the nightly toolchain and its `rust-src` (for `-Z build-std=core`);
//! 2. `bpf-linker`, built against the nightly toolchain's own `libLLVM` shared library so that
//!    both agree on the LLVM version.
//!
//! Every step first checks cheaply whether it is already done, so a second run takes
//! well under a second.
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{anyhow, bail, Context as _, Result};
use clap::Args;

use crate::util::{self, probe, probe_stdout};

#[derive(Args, Debug, Default)]
pub struct SetupArgs {
    /// Rebuild bpf-linker even if the installed one works.
    #[arg(long)]
    pub reinstall_bpf_linker: bool,
    /// Install bpf-linker under this root (`cargo install --root`) instead of ~/.cargo.
    #[arg(long, value_name = "DIR", hide = true)]
    pub install_root: Option<PathBuf>,
}

pub fn setup(args: &SetupArgs) -> Result<()> {
    util::step("setup: nightly toolchain, rust-src, bpf-linker");
    let started = std::time::Instant::now();
    check_rustup()?;
    ensure_nightly()?;
    let sysroot = nightly_sysroot()?;
    ensure_rust_src(&sysroot)?;
    let major = nightly_llvm_major()?;
    let prefix = ensure_llvm_prefix(&sysroot, major)?;
    ensure_bpf_linker(args, &prefix, major)?;
    check_kernel();
    eprintln!("setup done in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}

fn check_rustup() -> Result<()> {
    if probe_stdout(Command::new("rustup").arg("--version")).is_none() {
        bail!(
            "rustup not found on PATH\n  fix: install it from https://rustup.rs and make sure \
             $HOME/.cargo/bin is on PATH"
        );
    }
    Ok(())
}

pub(crate) fn ensure_nightly() -> Result<()> {
    let list = probe_stdout(Command::new("rustup").args(["toolchain", "list"]))
        .context("`rustup toolchain list` failed")?;
    if !list
        .lines()
        .any(|l| l.starts_with("nightly-") || l == "nightly")
    {
        eprintln!("installing the nightly toolchain ...");
        let r = util::run(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
        ]));
        util::with_fix(
            r,
            "could not install the nightly toolchain",
            "check network access, then run `rustup toolchain install nightly --profile minimal`",
        )?;
    }
    let version =
        probe_stdout(Command::new("rustc").args(["+nightly", "--version"])).ok_or_else(|| {
            anyhow!(
                "`rustc +nightly --version` fails although the toolchain is listed\n  fix: \
                 `rustup toolchain install nightly --profile minimal --force`"
            )
        })?;
    eprintln!("ok: nightly toolchain ({version})");
    Ok(())
}

fn nightly_sysroot() -> Result<PathBuf> {
    probe_stdout(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))
        .map(PathBuf::from)
        .context("`rustc +nightly --print sysroot` failed")
}

fn ensure_rust_src(sysroot: &Path) -> Result<()> {
    let library = sysroot.join("lib/rustlib/src/rust/library");
    if !library.is_dir() {
        eprintln!("installing rust-src for nightly ...");
        let r = util::run(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]));
        util::with_fix(
            r,
            "could not add rust-src",
            "check network access, then run `rustup component add rust-src --toolchain nightly`",
        )?;
        if !library.is_dir() {
            bail!("rust-src was added but {} is missing", library.display());
        }
    }
    eprintln!("ok: nightly rust-src ({})", library.display());
    Ok(())
}

/// The LLVM major version of the nightly compiler (`LLVM version: 22.1.4` -> 22).
fn nightly_llvm_major() -> Result<u32> {
    let info = probe_stdout(Command::new("rustc").args(["+nightly", "-vV"]))
        .context("`rustc +nightly -vV` failed")?;
    parse_llvm_major(&info).ok_or_else(|| {
        anyhow!("no `LLVM version: N.M` line in the output of `rustc +nightly -vV`:\n{info}")
    })
}

fn parse_llvm_major(rustc_vv: &str) -> Option<u32> {
    rustc_vv
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version:"))?
        .trim()
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// `$XDG_CACHE_HOME/pyebpf/llvm`, else `$HOME/.cache/pyebpf/llvm`.
fn llvm_prefix_dir() -> Result<PathBuf> {
    let cache = match std::env::var_os("XDG_CACHE_HOME") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(std::env::var_os("HOME").context("$HOME is not set")?).join(".cache"),
    };
    Ok(cache.join("pyebpf").join("llvm"))
}

/// Make `P/lib` hold the nightly toolchain's `libLLVM` under two names: `libLLVM.so` (what
/// bpf-linker's build links with `LLVM_PREFIX=P`) and its real file name (the soname the
/// built binary asks for at run time, found through its `RUNPATH` of `P/lib`).
fn ensure_llvm_prefix(sysroot: &Path, major: u32) -> Result<PathBuf> {
    let libdir = sysroot.join("lib");
    let wanted = format!("libLLVM.so.{major}.");
    let mut candidates: Vec<String> = std::fs::read_dir(&libdir)
        .with_context(|| format!("reading {}", libdir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&wanted) && n.contains("-rust-") && n.ends_with("-nightly"))
        .collect();
    candidates.sort();
    let Some(name) = candidates.pop() else {
        bail!(
            "no {wanted}*-rust-*-nightly in {}: this nightly does not ship a shared LLVM {major}\n  \
             fix: `rustup toolchain install nightly --profile minimal --force`",
            libdir.display()
        );
    };
    let target = libdir.join(&name);
    let prefix = llvm_prefix_dir()?;
    let plib = prefix.join("lib");
    std::fs::create_dir_all(&plib).with_context(|| format!("creating {}", plib.display()))?;
    for link in ["libLLVM.so", name.as_str()] {
        ensure_symlink(&plib.join(link), &target)?;
    }
    eprintln!(
        "ok: LLVM prefix {} (lib/libLLVM.so -> {})",
        prefix.display(),
        target.display()
    );
    Ok(prefix)
}

fn ensure_symlink(link: &Path, target: &Path) -> Result<()> {
    if std::fs::read_link(link).ok().as_deref() == Some(target) {
        return Ok(());
    }
    if link.symlink_metadata().is_ok() {
        std::fs::remove_file(link).with_context(|| format!("removing {}", link.display()))?;
    }
    std::os::unix::fs::symlink(target, link)
        .with_context(|| format!("symlinking {} -> {}", link.display(), target.display()))
}

fn ensure_bpf_linker(args: &SetupArgs, prefix: &Path, major: u32) -> Result<()> {
    let bin = match &args.install_root {
        Some(root) => root.join("bin/bpf-linker"),
        None => PathBuf::from("bpf-linker"),
    };
    let version = || probe_stdout(Command::new(&bin).arg("--version"));
    if !args.reinstall_bpf_linker {
        if let Some(v) = version() {
            eprintln!("ok: {v}");
            return Ok(());
        }
    }
    eprintln!("installing bpf-linker against the nightly LLVM {major} (about a minute) ...");
    let mut cmd = util::cargo();
    cmd.current_dir(prefix)
        .env("LLVM_PREFIX", prefix)
        .args(["install", "bpf-linker", "--locked", "--force"])
        .args(["--no-default-features", "--features"])
        .arg(format!("llvm-{major}"));
    if let Some(root) = &args.install_root {
        cmd.arg("--root").arg(root);
    }
    util::with_fix(
        util::run(&mut cmd),
        "building bpf-linker failed",
        format!(
            "read the compiler errors above; a C toolchain (`apt-get install build-essential`) \
             and network access to crates.io are needed. To retry by hand: `LLVM_PREFIX={} \
             cargo install bpf-linker --no-default-features --features llvm-{major}`",
            prefix.display()
        ),
    )?;
    match version() {
        Some(v) => {
            eprintln!("ok: {v} (installed)");
            Ok(())
        }
        None if args.install_root.is_none() && !util::on_path("bpf-linker") => bail!(
            "bpf-linker was installed but is not on PATH\n  fix: add $HOME/.cargo/bin to PATH"
        ),
        None => {
            let why = probe(Command::new(&bin).arg("--version"))
                .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_string())
                .unwrap_or_default();
            bail!(
                "bpf-linker was installed but `{} --version` fails: {why}\n  fix: check that {} \
                 links to the nightly libLLVM, then `cargo xtask setup --reinstall-bpf-linker`",
                bin.display(),
                prefix.join("lib").display()
            )
        }
    }
}

/// Not installable, only worth a warning: the profiler needs BTF and a recent kernel.
fn check_kernel() {
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        eprintln!(
            "warn: /sys/kernel/btf/vmlinux is missing; pyebpf needs a kernel built with \
             CONFIG_DEBUG_INFO_BTF (Linux 6.1 or newer)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::parse_llvm_major;

    #[test]
    fn llvm_major() {
        let vv =
            "rustc 1.97.0-nightly (e50aa6fba 2026-05-19)\nbinary: rustc\nLLVM version: 22.1.4\n";
        assert_eq!(parse_llvm_major(vv), Some(22));
        assert_eq!(parse_llvm_major("rustc 1.0"), None);
    }
}
