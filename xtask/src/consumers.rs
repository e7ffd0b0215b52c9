//! The programs people read pyebpf's output with, installed for tests/tests/consumers.rs:
//! Debian's `chromium` (headless) and the speedscope web app from npm.
//!
//! A writer's unit tests only show that we wrote what we meant; these consumers show that the
//! file opens where users open it. Everything comes from a registry the project can reach
//! (Debian's archive, npm), into places this command owns, so a fresh machine needs nothing
//! installed by hand:
//! - `chromium` through apt when it is not on `PATH`;
//! - `node`/`npm` through apt (`nodejs npm`) only when `npm` is missing, since they serve only
//!   to fetch speedscope;
//! - speedscope [`SPEEDSCOPE_VERSION`] with `npm install --prefix` into
//!   [`DEFAULT_SPEEDSCOPE_DIR`] (pinned: the tests read its DOM, which a release may change),
//!   skipped when that version is already there.
//!
//! The paths reach the tests as `PYEBPF_CHROMIUM` and `PYEBPF_SPEEDSCOPE`. An install that
//! fails does not stop the other tests: its reason goes to the tests as
//! `PYEBPF_CONSUMERS_ERROR`, and the consumer tests fail with it instead of skipping.
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _, Result};

use crate::apt;
use crate::util;

/// Where `npm install --prefix` puts speedscope.
pub const DEFAULT_SPEEDSCOPE_DIR: &str = "/var/cache/pyebpf/speedscope";
/// The speedscope release the tests were written against.
pub const SPEEDSCOPE_VERSION: &str = "1.25.0";

/// What the consumer tests get: a path for each tool, or why it could not be installed.
pub struct Consumers {
    pub chromium: Result<PathBuf>,
    pub speedscope: Result<PathBuf>,
}

impl Consumers {
    /// The environment variables to set on `cargo test`.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        let mut errors = Vec::new();
        for (var, tool) in [
            ("PYEBPF_CHROMIUM", &self.chromium),
            ("PYEBPF_SPEEDSCOPE", &self.speedscope),
        ] {
            match tool {
                Ok(path) => env.push((var, path.display().to_string())),
                Err(err) => errors.push(format!("{err:#}")),
            }
        }
        if !errors.is_empty() {
            env.push(("PYEBPF_CONSUMERS_ERROR", errors.join("; ")));
        }
        env
    }
}

/// Installs what is missing; never fails (see the module doc).
pub fn ensure() -> Consumers {
    let chromium = ensure_chromium();
    let speedscope = ensure_speedscope(Path::new(DEFAULT_SPEEDSCOPE_DIR));
    for err in [&chromium, &speedscope]
        .into_iter()
        .filter_map(|r| r.as_ref().err())
    {
        eprintln!("{err:#}\n  the consumer tests (tests/tests/consumers.rs) will fail");
    }
    Consumers {
        chromium,
        speedscope,
    }
}

fn ensure_chromium() -> Result<PathBuf> {
    if !util::on_path("chromium") {
        apt::ensure(&["chromium"]).context("could not install chromium")?;
    }
    let path = which("chromium").context("chromium was installed but is not on PATH")?;
    let version = util::probe_stdout(Command::new(&path).arg("--version"))
        .with_context(|| format!("`{} --version` failed", path.display()))?;
    eprintln!("ok: {version}");
    Ok(path)
}

/// Installs speedscope under `prefix` unless [`SPEEDSCOPE_VERSION`] is there already; returns
/// the app's directory (the one holding `index.html`).
fn ensure_speedscope(prefix: &Path) -> Result<PathBuf> {
    let package = prefix.join("node_modules/speedscope");
    let app = package.join("dist/release");
    if installed_version(&package).as_deref() == Some(SPEEDSCOPE_VERSION)
        && app.join("index.html").is_file()
    {
        eprintln!(
            "ok: speedscope {SPEEDSCOPE_VERSION} in {}",
            prefix.display()
        );
        return Ok(app);
    }
    if !util::on_path("npm") {
        apt::ensure(&["nodejs", "npm"]).context("could not install npm (for speedscope)")?;
    }
    std::fs::create_dir_all(prefix)
        .with_context(|| format!("could not create {}", prefix.display()))?;
    // --ignore-scripts: we want the app's files, not to run anything of the package's.
    util::with_fix(
        util::run(
            Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--ignore-scripts"])
                .arg("--prefix")
                .arg(prefix)
                .arg(format!("speedscope@{SPEEDSCOPE_VERSION}")),
        ),
        "could not install speedscope from npm",
        "check access to registry.npmjs.org and read npm's errors above",
    )?;
    let got = installed_version(&package);
    if got.as_deref() != Some(SPEEDSCOPE_VERSION) || !app.join("index.html").is_file() {
        bail!(
            "npm installed speedscope {got:?}, expected {SPEEDSCOPE_VERSION} with {}",
            app.join("index.html").display()
        );
    }
    Ok(app)
}

/// The `version` of `package/package.json`.
fn installed_version(package: &Path) -> Option<String> {
    let text = std::fs::read_to_string(package.join("package.json")).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    Some(json.get("version")?.as_str()?.to_string())
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_install_reaches_the_tests_as_its_reason() {
        let consumers = Consumers {
            chromium: Ok(PathBuf::from("/usr/bin/chromium")),
            speedscope: Err(anyhow::anyhow!("npm failed")),
        };
        let env = consumers.env();
        assert!(env.contains(&("PYEBPF_CHROMIUM", "/usr/bin/chromium".into())));
        assert!(!env.iter().any(|(var, _)| *var == "PYEBPF_SPEEDSCOPE"));
        assert!(env.contains(&("PYEBPF_CONSUMERS_ERROR", "npm failed".into())));
    }

    #[test]
    fn reads_the_installed_version() {
        let dir = std::env::temp_dir().join(format!("xtask-consumers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(installed_version(&dir), None);
        std::fs::write(
            dir.join("package.json"),
            r#"{"name":"speedscope","version":"1.25.0"}"#,
        )
        .unwrap();
        assert_eq!(installed_version(&dir).as_deref(), Some("1.25.0"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
