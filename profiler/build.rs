//! Builds the BPF programs (`profiler-ebpf`) with the nightly toolchain and embeds the object.
use anyhow::{anyhow, Context as _};

fn main() -> anyhow::Result<()> {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?;
    let ebpf_dir = std::path::Path::new(&manifest_dir)
        .parent()
        .ok_or_else(|| anyhow!("no parent of {manifest_dir}"))?
        .join("profiler-ebpf");
    println!("cargo:rerun-if-changed={}", ebpf_dir.join("src").display());
    println!(
        "cargo:rerun-if-changed={}",
        ebpf_dir
            .parent()
            .unwrap()
            .join("profiler-common/src")
            .display()
    );
    let root_dir = ebpf_dir.to_str().ok_or_else(|| anyhow!("non-UTF-8 path"))?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "profiler-ebpf",
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
    .context(
        "building the BPF programs failed: run `cargo xtask setup` (nightly rust-src + bpf-linker)",
    )
}
