//! What pyebpf needs from a CPython binary on disk: where `_PyRuntime` lives and which
//! version it is. Parsed once per distinct file (device + inode), however many processes map it.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{anyhow, Context, Result};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};

/// Facts about one ELF file that contains a CPython runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PythonElf {
    /// Virtual address of `_PyRuntime` (the `.PyRuntime` section, or the symbol).
    pub runtime_vaddr: u64,
    /// File offset of `_PyRuntime`, used to find it in the process's mappings.
    pub runtime_file_offset: u64,
    /// `Py_Version` (`PY_VERSION_HEX`) when the binary exports it.
    pub version_hex: Option<u64>,
}

/// Parses `path` (a path the profiler can open, e.g. under `/proc/PID/root`).
/// `Ok(None)`: a valid ELF file without a CPython runtime.
pub fn parse(path: &Path) -> Result<Option<PythonElf>> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let file =
        object::File::parse(&*data).with_context(|| format!("parsing ELF {}", path.display()))?;
    let runtime_vaddr = match file.section_by_name(".PyRuntime") {
        Some(section) => Some(section.address()),
        None => find_symbol(&file, "_PyRuntime").map(|(addr, _)| addr),
    };
    let Some(runtime_vaddr) = runtime_vaddr else {
        return Ok(None);
    };
    let runtime_file_offset = file
        .segments()
        .find_map(|seg| {
            let (offset, size) = seg.file_range();
            let start = seg.address();
            let inside = runtime_vaddr.checked_sub(start).filter(|&at| at < size)?;
            offset.checked_add(inside)
        })
        .ok_or_else(|| {
            anyhow!(
                "{}: _PyRuntime at {runtime_vaddr:#x} is in no loadable segment",
                path.display()
            )
        })?;
    let version_hex = find_symbol(&file, "Py_Version").and_then(|(addr, _)| {
        let bytes = file
            .sections()
            .find_map(|s| s.data_range(addr, 4).ok().flatten())?;
        Some(u32::from_le_bytes(bytes.try_into().ok()?) as u64)
    });
    Ok(Some(PythonElf {
        runtime_vaddr,
        runtime_file_offset,
        version_hex,
    }))
}

fn find_symbol(file: &object::File, name: &str) -> Option<(u64, u64)> {
    file.dynamic_symbols()
        .chain(file.symbols())
        .find(|s| s.name() == Ok(name) && s.address() != 0)
        .map(|s| (s.address(), s.size()))
}

/// (device, inode, size, mtime) of a file: a parse stays valid while these do.
type FileKey = (u64, u64, u64, i64);

/// Parse results by file: one parse per distinct binary.
#[derive(Default)]
pub struct ElfCache {
    entries: Mutex<HashMap<FileKey, Option<PythonElf>>>,
}

/// Distinct binaries kept; a host rarely has more than a few dozen Python builds.
const ELF_CACHE_LIMIT: usize = 1024;

impl ElfCache {
    pub fn get(&self, path: &PathBuf) -> Result<Option<PythonElf>> {
        let meta = std::fs::metadata(path).with_context(|| format!("stat {}", path.display()))?;
        let key = (meta.dev(), meta.ino(), meta.size(), meta.mtime());
        if let Some(hit) = self.entries.lock().unwrap().get(&key) {
            return Ok(hit.clone());
        }
        let parsed = parse(path)?;
        let mut entries = self.entries.lock().unwrap();
        if entries.len() >= ELF_CACHE_LIMIT {
            entries.clear();
        }
        entries.insert(key, parsed.clone());
        Ok(parsed)
    }
}
