//! `cargo xtask demo`: profile `examples/demo.py` for 5 s and write a flame graph.
use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::run::{build_release, privileged};
use crate::setup::{self, SetupArgs};
use crate::util;

const OUTPUT: &str = "pyebpf-demo.svg";

pub fn demo() -> Result<()> {
    setup::setup(&SetupArgs::default())?;
    let bin = build_release()?;
    let python = if util::on_path("python3") {
        PathBuf::from("python3")
    } else {
        PathBuf::from("/usr/bin/python3.11")
    };
    let root = util::workspace_root();
    let output = root.join(OUTPUT);
    let _ = std::fs::remove_file(&output);

    util::step("profile examples/demo.py for 5 s");
    let mut cmd = privileged(&bin);
    cmd.current_dir(&root)
        .args(["record", "-d", "5", "-o", OUTPUT, "--"])
        .arg(&python)
        .arg("examples/demo.py");
    let status = util::status(&mut cmd)?;
    if !status.success() {
        bail!(
            "`pyebpf record` failed ({status})\n  fix: pyebpf needs root (or CAP_BPF, CAP_PERFMON \
             and CAP_SYS_PTRACE) and Linux 6.1 or newer with BTF; see the message above"
        );
    }
    if !output.exists() {
        bail!(
            "`pyebpf record` succeeded but wrote no {}",
            output.display()
        );
    }
    eprintln!();
    eprintln!("flame graph: {}", output.display());
    eprintln!("open it in a browser; the widest towers are where the demo spends its CPU.");
    Ok(())
}
