//! Debian packages the developer commands need, installed on first use: `dpkg-query` checks
//! first, so a second run starts no package manager at all.
use std::process::Command;

use anyhow::{bail, Result};

use crate::util::{self, probe_stdout};

/// Installs whichever of `packages` are not installed yet (nothing runs when all are).
pub fn ensure(packages: &[&str]) -> Result<()> {
    let missing: Vec<String> = packages
        .iter()
        .filter(|p| !dpkg_installed(p))
        .map(|p| p.to_string())
        .collect();
    if !missing.is_empty() {
        eprintln!("installing {} ...", missing.join(", "));
        apt_install(&missing, None)?;
    }
    Ok(())
}

/// Is `package` installed (dpkg's `ii` state)?
pub fn dpkg_installed(package: &str) -> bool {
    probe_stdout(Command::new("dpkg-query").args(["-W", "-f=${db:Status-Abbrev}", package]))
        .is_some_and(|s| s.starts_with("ii"))
}

/// `apt-get` that waits for the dpkg lock (another install may be running) instead of failing.
fn apt_get() -> Command {
    let mut cmd = Command::new("apt-get");
    cmd.env("DEBIAN_FRONTEND", "noninteractive")
        .args(["-o", "DPkg::Lock::Timeout=600"]);
    cmd
}

pub fn apt_update() -> Result<()> {
    util::with_fix(
        util::run(apt_get().arg("update")),
        "`apt-get update` failed",
        "check network access to the Debian mirror, then run `apt-get update` by hand",
    )
}

/// `apt-get install` without recommends, from `suite` if given; on failure the lists are
/// refreshed and the install retried once.
pub fn apt_install(packages: &[String], suite: Option<&str>) -> Result<()> {
    if !util::on_path("apt-get") {
        bail!(
            "{} missing and there is no apt-get to install it\n  fix: install it with your \
             package manager",
            packages.join(", ")
        );
    }
    let install = || {
        let mut cmd = apt_get();
        cmd.args(["install", "-y", "--no-install-recommends"]);
        if let Some(suite) = suite {
            cmd.args(["-t", suite]);
        }
        util::status(cmd.args(packages))
    };
    if install()?.success() {
        return Ok(());
    }
    eprintln!("apt-get install failed; refreshing the package lists and retrying ...");
    apt_update()?;
    if !install()?.success() {
        let target = suite.map(|s| format!("-t {s} ")).unwrap_or_default();
        bail!(
            "could not install {}\n  fix: read apt's errors above, then `apt-get install \
             --no-install-recommends {target}{}`",
            packages.join(", "),
            packages.join(" ")
        );
    }
    Ok(())
}
