//! The tests' Python venv: `/var/cache/pyebpf/venv`, holding exactly the packages pinned in
//! `tests/requirements.txt` (Python's `protobuf`, which decodes what pyebpf sends with the
//! upstream definitions instead of pyebpf's own generated code, and `opentelemetry-proto`).
//!
//! Made once from PyPI with pip; a later run compares the requirements file with the copy kept
//! inside the venv and does nothing when they are equal. Two runs may race: each builds into a
//! directory of its own and renames it into place, so nobody ever sees a half-made venv (a
//! venv runs from anywhere through its `bin/python`, which finds `pyvenv.cfg` beside it).
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _, Result};

use crate::apt::apt_install;
use crate::util::{self, probe};

/// Where the venv lives.
pub const VENV: &str = "/var/cache/pyebpf/venv";
/// The pins, relative to the workspace root.
pub const REQUIREMENTS: &str = "tests/requirements.txt";
/// The copy of the requirements the venv was made from, inside it.
const STAMP: &str = "pyebpf-requirements.txt";

/// Makes (or finds up to date) the venv of `requirements`; returns the venv directory.
pub fn ensure() -> Result<PathBuf> {
    let requirements = util::workspace_root().join(REQUIREMENTS);
    ensure_at(Path::new(VENV), &requirements)
}

fn ensure_at(venv: &Path, requirements: &Path) -> Result<PathBuf> {
    let wanted = std::fs::read_to_string(requirements)
        .with_context(|| format!("reading {}", requirements.display()))?;
    if up_to_date(venv, &wanted) {
        eprintln!("ok: venv {} ({})", venv.display(), pins(&wanted));
        return Ok(venv.to_path_buf());
    }
    let python = venv_python()?;
    let parent = venv.parent().context("the venv needs a parent directory")?;
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let tmp = parent.join(format!(
        ".{}.tmp-{}",
        venv.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    eprintln!("making the venv {} ({}) ...", venv.display(), pins(&wanted));
    let made = util::run(Command::new(&python).args(["-m", "venv"]).arg(&tmp)).and_then(|()| {
        util::run(
            Command::new(tmp.join("bin/python"))
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--no-input",
                    "-r",
                ])
                .arg(requirements),
        )
    });
    if let Err(e) = made {
        let _ = std::fs::remove_dir_all(&tmp);
        return util::with_fix(
            Err(e),
            "could not make the tests' venv",
            format!(
                "check network access to PyPI, then run `cargo xtask test` again (the pins are \
                 in {})",
                requirements.display()
            ),
        );
    }
    std::fs::write(tmp.join(STAMP), &wanted)
        .with_context(|| format!("writing {}", tmp.join(STAMP).display()))?;
    // An out-of-date venv is moved aside first; if another run put an up-to-date one in place
    // meanwhile, ours is the one thrown away.
    if venv.exists() && !up_to_date(venv, &wanted) {
        let old = parent.join(format!(".venv.old-{}", std::process::id()));
        if std::fs::rename(venv, &old).is_ok() {
            let _ = std::fs::remove_dir_all(&old);
        }
    }
    if std::fs::rename(&tmp, venv).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
        if !up_to_date(venv, &wanted) {
            bail!(
                "could not put the new venv in place at {}\n  fix: remove it and run again",
                venv.display()
            );
        }
    }
    eprintln!("ok: venv {} (made)", venv.display());
    Ok(venv.to_path_buf())
}

/// Was `venv` made from exactly `wanted`, and does its Python still run?
fn up_to_date(venv: &Path, wanted: &str) -> bool {
    std::fs::read_to_string(venv.join(STAMP)).is_ok_and(|s| s == wanted)
        && probe(Command::new(venv.join("bin/python")).args(["-c", "pass"]))
            .is_some_and(|o| o.status.success())
}

/// The pins of a requirements file, for messages: `a==1, b==2`.
fn pins(requirements: &str) -> String {
    requirements
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A Python that can make a venv with pip: Debian's `python3` (the same on every machine of
/// ours), else `python3` on PATH; `python3-venv` is installed if neither can.
pub fn venv_python() -> Result<PathBuf> {
    let works = |py: &Path| {
        probe(Command::new(py).args(["-c", "import venv, ensurepip"]))
            .is_some_and(|o| o.status.success())
    };
    for py in ["/usr/bin/python3", "python3"] {
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
    use super::*;

    #[test]
    fn the_pins_are_exact_and_include_what_the_tests_import() {
        let text = std::fs::read_to_string(util::workspace_root().join(REQUIREMENTS)).unwrap();
        let pins = pins(&text);
        for line in pins.split(", ") {
            assert!(line.contains("=="), "not pinned: {line}");
        }
        assert!(pins.contains("protobuf=="), "{pins}");
        assert!(pins.contains("opentelemetry-proto==1.45.2"), "{pins}");
    }
}
