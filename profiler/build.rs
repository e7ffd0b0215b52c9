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
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR").context("OUT_DIR")?);
    // `AYA_BUILD_SKIP=1` (aya-build's own switch): builds that never load BPF, such as the
    // fuzz targets (`cargo xtask fuzz`), skip the nightly BPF build and embed empty objects.
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    if std::env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
        for object in ["profiler-ebpf-log", "profiler-ebpf"] {
            std::fs::write(out_dir.join(object), [])
                .with_context(|| format!("writing the empty {object}"))?;
        }
        return Ok(());
    }
    // Two objects: `profiler-ebpf-log` has the `--debug-bpf` diagnostics compiled in, the
    // default one has no log code at all. aya-build writes both to `OUT_DIR/profiler-ebpf`,
    // so the first is renamed before the second is built.
    for (features, object) in [
        (&["log"][..], "profiler-ebpf-log"),
        (&[][..], "profiler-ebpf"),
    ] {
        aya_build::build_ebpf(
            [aya_build::Package {
                name: "profiler-ebpf",
                root_dir,
                features,
                ..Default::default()
            }],
            aya_build::Toolchain::default(),
        )
        .context(
            "building the BPF programs failed: run `cargo xtask setup` (nightly rust-src + \
             bpf-linker)",
        )?;
        if object != "profiler-ebpf" {
            std::fs::rename(out_dir.join("profiler-ebpf"), out_dir.join(object))
                .with_context(|| format!("renaming the BPF object to {object}"))?;
        }
    }
    Ok(())
}
