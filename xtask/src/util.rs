//! Small helpers shared by the commands: echoing and running subprocesses, paths.
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};

use anyhow::{bail, Context as _, Result};

/// The workspace root (the parent of `xtask/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

/// Cargo's target directory: `$CARGO_TARGET_DIR`, else `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                workspace_root().join(dir)
            }
        }
        None => workspace_root().join("target"),
    }
}

/// The cargo that runs us (`$CARGO`), else `cargo` from `PATH`.
pub fn cargo() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace_root());
    cmd
}

/// Print a step headline, e.g. `==> setup`.
pub fn step(what: &str) {
    eprintln!("==> {what}");
}

/// Render a command as a shell-like line, with the environment variables it sets.
fn render(cmd: &Command) -> String {
    let mut line = String::new();
    for (key, value) in cmd.get_envs() {
        if let Some(value) = value {
            line.push_str(&format!("{}={} ", key.to_string_lossy(), quote(value)));
        }
    }
    line.push_str(&quote(cmd.get_program()));
    for arg in cmd.get_args() {
        line.push(' ');
        line.push_str(&quote(arg));
    }
    line
}

fn quote(s: &OsStr) -> String {
    let s = s.to_string_lossy();
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:+@%,".contains(c));
    if plain {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Echo `cmd`, run it with inherited stdio and return its exit status.
pub fn status(cmd: &mut Command) -> Result<ExitStatus> {
    let line = render(cmd);
    eprintln!("$ {line}");
    cmd.stdin(Stdio::null())
        .status()
        .with_context(|| format!("could not start `{line}`"))
}

/// Echo `cmd`, run it and fail unless it exits successfully.
pub fn run(cmd: &mut Command) -> Result<()> {
    let st = status(cmd)?;
    if !st.success() {
        bail!("`{}` failed ({st})", render(cmd));
    }
    Ok(())
}

/// Run `cmd` quietly (no echo, output captured): for cheap probes such as `--version`.
/// `None` if it cannot be started.
pub fn probe(cmd: &mut Command) -> Option<Output> {
    cmd.stdin(Stdio::null()).output().ok()
}

/// Stdout of a quiet probe that succeeded, trimmed.
pub fn probe_stdout(cmd: &mut Command) -> Option<String> {
    let out = probe(cmd)?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Is `program` found on `PATH`?
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false)
}

/// Turn a failure into `what: cause` plus a `fix:` line for the reader.
pub fn with_fix<T>(result: Result<T>, what: &str, fix: impl std::fmt::Display) -> Result<T> {
    result.map_err(|e| anyhow::anyhow!("{what}: {e:#}\n  fix: {fix}"))
}
