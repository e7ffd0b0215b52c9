//! What pyebpf needs from a CPython binary on disk: where `_PyRuntime` lives and which
//! version it is. Parsed once per distinct file (device + inode), however many processes map it.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{anyhow, Context, Result};
use object::elf::{FileHeader64, PT_LOAD, SHT_DYNSYM, SHT_SYMTAB};
use object::read::elf::{FileHeader as _, ProgramHeader as _, SectionHeader as _, Sym as _};
use object::{Endianness, ReadCache, ReadRef};

/// Facts about one ELF file that contains a CPython runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PythonElf {
    /// Virtual address of `_PyRuntime` (the `.PyRuntime` section, or the symbol).
    pub runtime_vaddr: u64,
    /// File offset of `_PyRuntime`, used to find it in the process's mappings.
    pub runtime_file_offset: u64,
    /// `Py_Version` (`PY_VERSION_HEX`) when the binary exports it.
    pub version_hex: Option<u64>,
    /// Whether the binary is built with frame pointers, from the prologues of its eval loop
    /// and two small functions; `None` when the eval loop's symbol is not found.
    pub frame_pointers: Option<bool>,
}

/// Whether machine code starting a function sets up a frame pointer: `push %rbp; mov
/// %rsp,%rbp`, after an optional `endbr64`. A function built with `-fomit-frame-pointer`
/// (GCC's default at -O2 before PEP 831 asked CPython for `-fno-omit-frame-pointer`) starts
/// with anything else, typically pushes of callee-saved registers.
pub(crate) fn keeps_frame_pointer(code: &[u8]) -> bool {
    const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
    let code = code.strip_prefix(&ENDBR64[..]).unwrap_or(code);
    // push %rbp, then mov %rsp,%rbp in either encoding (48 89 e5 / 48 8b ec).
    matches!(
        code,
        [0x55, 0x48, 0x89, 0xe5, ..] | [0x55, 0x48, 0x8b, 0xec, ..]
    )
}

/// Parses `path` (a path the profiler can open, e.g. under `/proc/PID/root`).
/// `Ok(None)`: a valid ELF file without a CPython runtime.
///
/// Only what is needed is read: the headers, `.dynsym` and one word. A libpython with debug
/// info is tens of MB, mostly `.symtab` and DWARF, and a container's file may sit on a slow
/// or remote filesystem (`cargo xtask vm-test`'s 9p share took 40 s to read one whole under
/// emulation). `.symtab` is read only when `.dynsym` lacks a symbol.
pub fn parse(path: &Path) -> Result<Option<PythonElf>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let data = ReadCache::new(file);
    parse_data(&data, &path.display().to_string())
}

/// [`parse`] over a file already in memory (the fuzz targets feed it arbitrary bytes).
pub fn parse_bytes(data: &[u8]) -> Result<Option<PythonElf>> {
    parse_data(data, "(in memory)")
}

/// The one parser behind [`parse`] and [`parse_bytes`]; `name` is for messages.
fn parse_data<'data, R: ReadRef<'data>>(data: R, name: &str) -> Result<Option<PythonElf>> {
    let what = || format!("parsing ELF {name}");
    let header = FileHeader64::<Endianness>::parse(data).with_context(what)?;
    let endian = header.endian().with_context(what)?;
    let sections = header.sections(endian, data).with_context(what)?;
    let segments = header.program_headers(endian, data).with_context(what)?;
    let symbol = |name: &[u8]| -> Option<u64> {
        [SHT_DYNSYM, SHT_SYMTAB].into_iter().find_map(|kind| {
            let table = sections.symbols(endian, data, kind).ok()?;
            table
                .iter()
                .find(|s| s.st_value(endian) != 0 && s.name(endian, table.strings()) == Ok(name))
                .map(|s| s.st_value(endian))
        })
    };
    let runtime_vaddr = match sections.section_by_name(endian, b".PyRuntime") {
        Some((_, section)) => Some(section.sh_addr(endian)),
        None => symbol(b"_PyRuntime"),
    };
    let Some(runtime_vaddr) = runtime_vaddr else {
        return Ok(None);
    };
    let file_offset = |vaddr: u64| {
        segments
            .iter()
            .filter(|seg| seg.p_type(endian) == PT_LOAD)
            .find_map(|seg| {
                let inside = vaddr
                    .checked_sub(seg.p_vaddr(endian))
                    .filter(|&at| at < seg.p_filesz(endian))?;
                seg.p_offset(endian).checked_add(inside)
            })
    };
    let runtime_file_offset = file_offset(runtime_vaddr).ok_or_else(|| {
        anyhow!("{name}: _PyRuntime at {runtime_vaddr:#x} is in no loadable segment")
    })?;
    let version_hex = symbol(b"Py_Version").and_then(|addr| {
        let bytes = data.read_bytes_at(file_offset(addr)?, 4).ok()?;
        Some(u32::from_le_bytes(bytes.try_into().ok()?) as u64)
    });
    let keeps_fp = |name: &[u8]| -> Option<bool> {
        let code = data.read_bytes_at(file_offset(symbol(name)?)?, 16).ok()?;
        Some(keeps_frame_pointer(code))
    };
    // The eval loop alone is not proof: GCC keeps a frame pointer in a function whose frame
    // it must realign or size at run time even under -fomit-frame-pointer, as sid's 3.14
    // eval loop does in a build whose other functions have none. Two small exported
    // functions, which only -fno-omit-frame-pointer gives one, must agree.
    let frame_pointers = keeps_fp(b"_PyEval_EvalFrameDefault").map(|eval| {
        eval && [&b"_PyObject_MakeTpCall"[..], b"PyObject_Vectorcall"]
            .iter()
            .all(|name| keeps_fp(name) != Some(false))
    });
    Ok(Some(PythonElf {
        runtime_vaddr,
        runtime_file_offset,
        version_hex,
        frame_pointers,
    }))
}

/// (device, inode, size, mtime) of a file: a parse stays valid while these do.
type FileKey = (u64, u64, u64, i64);

/// Parse results by file: one parse per distinct binary.
#[derive(Default)]
pub(crate) struct ElfCache {
    entries: Mutex<HashMap<FileKey, Option<PythonElf>>>,
}

/// Distinct binaries kept; a host rarely has more than a few dozen Python builds.
const ELF_CACHE_LIMIT: usize = 1024;

impl ElfCache {
    pub(crate) fn get(&self, path: &PathBuf) -> Result<Option<PythonElf>> {
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

#[cfg(test)]
mod tests {
    use super::{keeps_frame_pointer, parse_bytes};

    #[test]
    fn bytes_entry_point_reads_a_trimmed_real_binary() {
        // sid's python3.15 cut to its headers and a few dynamic symbols by
        // `cargo xtask fuzz --seeds` (a seed of the `elf` fuzz target): `.PyRuntime` is found;
        // `Py_Version` and the prologues lie past the cut, and are unknown rather than errors.
        let seed = include_bytes!("../../fuzz/seeds/elf/sid-3.15");
        let elf = parse_bytes(seed).unwrap().expect("a CPython runtime");
        assert_eq!(elf.runtime_vaddr, 0xc4_08a0);
        assert_eq!((elf.version_hex, elf.frame_pointers), (None, None));
        assert!(
            parse_bytes(&seed[..40]).is_err(),
            "a cut header is an error"
        );
    }

    #[test]
    fn frame_pointer_prologues() {
        // -fno-omit-frame-pointer, with and without CET.
        assert!(keeps_frame_pointer(&[0x55, 0x48, 0x89, 0xe5, 0x41, 0x57]));
        assert!(keeps_frame_pointer(&[
            0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5
        ]));
        // -O2 without frame pointers: push %r15; push %r14 ...
        assert!(!keeps_frame_pointer(&[0x41, 0x57, 0x41, 0x56, 0x55, 0x53]));
        // push %rbp used as a plain callee-saved register.
        assert!(!keeps_frame_pointer(&[0x55, 0x53, 0x48, 0x83, 0xec, 0x28]));
        assert!(!keeps_frame_pointer(&[]));
    }
}
