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
pub fn render(cmd: &Command) -> String {
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

/// Quote one word for a POSIX shell (left bare when that is safe).
pub fn quote(s: &OsStr) -> String {
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

/// Echo `cmd`, run it with stderr inherited and return its stdout; fail unless it exits
/// successfully.
pub fn stdout_of(cmd: &mut Command) -> Result<String> {
    let line = render(cmd);
    eprintln!("$ {line}");
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("could not start `{line}`"))?;
    if !out.status.success() {
        bail!("`{line}` failed ({})", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Are we root? (apt, debootstrap, chroot and the BPF tests need it.)
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The mount table of this process's mount namespace: (mount point, filesystem type).
pub fn mounts() -> Vec<(PathBuf, String)> {
    let Ok(table) = std::fs::read_to_string("/proc/self/mounts") else {
        return Vec::new();
    };
    table
        .lines()
        .filter_map(|l| {
            let mut fields = l.split_whitespace();
            let point = fields.nth(1)?;
            let fstype = fields.next()?;
            Some((PathBuf::from(unescape_mount(point)), fstype.to_string()))
        })
        .collect()
}

/// `/proc/mounts` escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mount(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(c) => {
                out.push(c as char);
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Mount points at or below `dir`, deepest first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = mounts()
        .into_iter()
        .map(|(point, _)| point)
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// Turn a failure into `what: cause` plus a `fix:` line for the reader.
pub fn with_fix<T>(result: Result<T>, what: &str, fix: impl std::fmt::Display) -> Result<T> {
    result.map_err(|e| anyhow::anyhow!("{what}: {e:#}\n  fix: {fix}"))
}

#[cfg(test)]
mod tests {
    use super::unescape_mount;

    #[test]
    fn mount_escapes() {
        assert_eq!(unescape_mount(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape_mount("/plain"), "/plain");
    }
}
