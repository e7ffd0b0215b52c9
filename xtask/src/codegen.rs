//! `cargo xtask codegen`: Rust types for the vendored `.proto` files, checked in under
//! `profiler/src/proto/`.
//!
//! The files are compiled by protox (a protobuf compiler in Rust) and turned into Rust by
//! prost-build, so neither building pyebpf nor regenerating its types needs `protoc`. The
//! profiler crate depends on `prost` alone. `--check` (and this module's test, which
//! `cargo xtask test` runs) fails when the checked-in code differs from what the vendored
//! files produce.
use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context as _, Result};
use clap::Args;

use crate::util;

#[derive(Args, Debug, Default)]
pub struct CodegenArgs {
    /// Write nothing; fail if the checked-in code is not what codegen produces.
    #[arg(long)]
    pub check: bool,
}

/// Include directories under `profiler/proto/`, each the root that its files' import paths
/// are relative to (as upstream lays them out).
const INCLUDES: [&str; 3] = ["google-pprof", "grafana-pyroscope", "stand-in"];

/// The files to generate Rust for (their imports are compiled, not generated).
const FILES: [&str; 3] = [
    "google-pprof/proto/profile.proto",
    "grafana-pyroscope/push/v1/push.proto",
    "grafana-pyroscope/types/v1/types.proto",
];

fn proto_dir() -> PathBuf {
    util::workspace_root().join("profiler/proto")
}

fn out_dir() -> PathBuf {
    util::workspace_root().join("profiler/src/proto")
}

/// Generated files by name (`perftools.profiles.rs`, ...) and their contents.
pub fn generate() -> Result<BTreeMap<String, String>> {
    let dir = proto_dir();
    let mut compiler = protox::Compiler::new(INCLUDES.iter().map(|i| dir.join(i)))
        .context("setting up the protobuf compiler")?;
    // Source info carries the upstream comments into the generated docs.
    compiler.include_source_info(true);
    for file in FILES {
        compiler
            .open_file(dir.join(file))
            .map_err(|e| anyhow::anyhow!("compiling {file}: {e}"))?;
    }
    let requests = compiler
        .file_descriptor_set()
        .file
        .into_iter()
        .map(|file| {
            let module = prost_build::Module::from_protobuf_package_name(file.package());
            (module, file)
        })
        .collect();
    let modules = prost_build::Config::new()
        .generate(requests)
        .context("generating Rust from the descriptors")?;
    Ok(modules
        .into_iter()
        .map(|(module, code)| (module.to_file_name_or("_"), code))
        .collect())
}

/// Generated files whose checked-in copy is missing or different, and checked-in `.rs` files
/// that codegen no longer produces (`mod.rs` is ours, not generated).
fn stale(generated: &BTreeMap<String, String>) -> Result<Vec<String>> {
    let out = out_dir();
    let mut stale: Vec<String> = generated
        .iter()
        .filter(|(name, code)| std::fs::read_to_string(out.join(name)).ok().as_ref() != Some(*code))
        .map(|(name, _)| name.clone())
        .collect();
    if let Ok(entries) = std::fs::read_dir(&out) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".rs") && name != "mod.rs" && !generated.contains_key(&name) {
                stale.push(name);
            }
        }
    }
    stale.sort();
    Ok(stale)
}

pub fn codegen(args: &CodegenArgs) -> Result<()> {
    let generated = generate()?;
    let out = out_dir();
    if args.check {
        let stale = stale(&generated)?;
        if !stale.is_empty() {
            bail!(
                "{} out of date with profiler/proto: {}\n  fix: run `cargo xtask codegen` and \
                 commit the result",
                out.display(),
                stale.join(", ")
            );
        }
        eprintln!("ok: {} matches profiler/proto", out.display());
        return Ok(());
    }
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    for (name, code) in &generated {
        let path = out.join(name);
        std::fs::write(&path, code).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    for name in stale(&generated)? {
        // Only files codegen no longer produces are left in the stale list now.
        let path = out.join(&name);
        std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        eprintln!("removed {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checked-in code is what the vendored files produce: editing a `.proto` (or a
    /// generated file) without running `cargo xtask codegen` fails here.
    #[test]
    fn checked_in_code_is_current() {
        let generated = generate().expect("codegen");
        for name in ["perftools.profiles.rs", "push.v1.rs", "types.v1.rs"] {
            assert!(generated.contains_key(name), "{name} not generated");
        }
        assert!(
            !generated.keys().any(|n| n.starts_with("gnostic")),
            "the stand-in's package must not be generated"
        );
        let stale = stale(&generated).unwrap();
        assert!(
            stale.is_empty(),
            "out of date: {stale:?}; run `cargo xtask codegen`"
        );
    }
}
