//! `cargo xtask build` and `cargo xtask run -- ARGS`: the release `pyebpf`.
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context as _, Result};
use clap::Args;

use crate::util;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Arguments for `pyebpf`, e.g. `cargo xtask run -- record -d 10 -o out.svg`.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    pub args: Vec<OsString>,
}

/// Build `pyebpf` in release (this also builds the BPF programs) and return its path.
pub fn build_release() -> Result<PathBuf> {
    util::step("build pyebpf (release)");
    util::run(util::cargo().args(["build", "-p", "profiler", "--release"])).context(
        "building pyebpf failed (errors above); if the BPF build failed, run `cargo xtask setup`",
    )?;
    let bin = util::target_dir().join("release/pyebpf");
    eprintln!("built {}", bin.display());
    Ok(bin)
}

/// Build, then run `pyebpf ARGS`; returns its exit code.
pub fn run(args: &RunArgs) -> Result<i32> {
    let bin = build_release()?;
    let mut cmd = privileged(&bin);
    cmd.args(&args.args);
    let status = util::status(&mut cmd)?;
    Ok(status.code().unwrap_or(1))
}

/// `bin` itself when we are root, else `sudo bin` (pyebpf needs CAP_BPF and friends).
pub fn privileged(bin: &std::path::Path) -> Command {
    let root = util::probe_stdout(Command::new("id").arg("-u")).as_deref() == Some("0");
    if root || !util::on_path("sudo") {
        Command::new(bin)
    } else {
        let mut cmd = Command::new("sudo");
        cmd.arg(bin);
        cmd
    }
}
