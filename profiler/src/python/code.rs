//! Reading code objects and the strings and bytes they point to out of a target process.
//!
//! Everything read here is untrusted: lengths are bounded, offsets checked, and garbage
//! produces an error, never a panic.

use anyhow::{bail, ensure, Context, Result};
use profiler_common::{fold_tag, CODE_TAG_BYTES};

use super::layout::PyLayout;
use super::linetable::LineTable;
use crate::memory::{Fields, ProcessMemory};

/// Longest name or file name accepted (code points).
const MAX_STRING_CHARS: u64 = 4096;
/// Largest line table accepted (bytes).
const MAX_LINETABLE_BYTES: u64 = 1 << 20;
/// First read of a string or bytes object: header plus short data in one go.
const FIRST_READ: usize = 256;
/// Per-thread bytecode copies of one code object read (free-threaded 3.14+: one per thread
/// that ran it, indexed by the thread's `tlbc_index`); an array claiming more is cut here.
pub(crate) const MAX_TLBC_COPIES: u64 = 4096;

/// The symbol information of one code object.
#[derive(Debug)]
pub struct CodeInfo {
    pub qualname: String,
    pub filename: String,
    pub firstlineno: u32,
    pub linetable: LineTable,
    /// Bytes of bytecode (`Py_SIZE(co)` code units of 2 bytes); read only where the layout has
    /// per-thread copies ([`super::layout::CodeLayout::tlbc`]), else 0.
    code_bytes: u64,
    /// Where the per-thread copies of the bytecode start, as last read (empty without
    /// `CodeLayout::tlbc`). A thread that runs the code for the first time adds a copy, so the
    /// list is read again when an instruction pointer lies in none of them
    /// ([`CodeInfo::refresh_tlbc`]).
    tlbc: std::sync::Mutex<Vec<u64>>,
}

impl CodeInfo {
    /// Line executing at `instr` (the frame's instruction pointer), given the code's address.
    pub fn line_at_instr(&self, layout: &PyLayout, code: u64, instr: u64) -> u32 {
        let start = self
            .bytecode_start(layout, code, instr)
            .unwrap_or_else(|| code.wrapping_add(layout.code.code_adaptive as u64));
        if instr < start {
            // A frame that has not started executing points before its first instruction.
            return self.firstlineno;
        }
        let lasti = ((instr - start) / 2).min(u32::MAX as u64) as u32;
        self.linetable.line_at(lasti).unwrap_or(self.firstlineno)
    }

    /// Where the bytecode `instr` points into starts: `co_code_adaptive`, or with per-thread
    /// bytecode the copy that holds `instr` (each copy is a separate allocation of
    /// `code_bytes`, so at most one does); `None` when no copy read so far holds it.
    pub(crate) fn bytecode_start(&self, layout: &PyLayout, code: u64, instr: u64) -> Option<u64> {
        let main = code.wrapping_add(layout.code.code_adaptive as u64);
        let holds = |start: u64| instr >= start && instr - start < self.code_bytes;
        if layout.code.tlbc == 0 || holds(main) {
            return Some(main);
        }
        let copies = self.tlbc.lock().ok()?;
        copies.iter().copied().find(|&c| holds(c))
    }

    /// Reads the code object's per-thread bytecode copies again (after an instruction pointer
    /// was found in none of those known).
    pub(crate) fn refresh_tlbc(
        &self,
        mem: &ProcessMemory,
        layout: &PyLayout,
        code: u64,
    ) -> Result<()> {
        let copies = read_tlbc(mem, layout, code)?;
        if let Ok(mut known) = self.tlbc.lock() {
            *known = copies;
        }
        Ok(())
    }
}

/// The starts of a code object's per-thread bytecode copies: `co_tlbc` points at a
/// `_PyCodeArray` { `Py_ssize_t size`; `char *entries[size]` }, unused entries NULL.
fn read_tlbc(mem: &ProcessMemory, layout: &PyLayout, code: u64) -> Result<Vec<u64>> {
    let array = mem.read_u64(code.wrapping_add(layout.code.tlbc as u64))?;
    ensure!(array != 0, "NULL co_tlbc");
    let size = mem.read_u64(array)?;
    ensure!(
        size <= i64::MAX as u64,
        "co_tlbc of {size} entries is implausible"
    );
    let n = size.min(MAX_TLBC_COPIES) as usize;
    let entries = mem.read_vec(array.wrapping_add(8), n * 8)?;
    Ok(entries
        .chunks_exact(8)
        .filter_map(|w| w.try_into().ok().map(u64::from_le_bytes))
        .filter(|&p| p != 0)
        .collect())
}

/// Bytes of the code object needed to reach every field we read.
fn code_read_len(layout: &PyLayout) -> usize {
    let c = &layout.code;
    let tag_end = layout.kernel.code_tag_offset as usize + CODE_TAG_BYTES;
    [
        c.filename,
        c.name,
        c.qualname,
        c.linetable,
        c.firstlineno,
        layout.ob_type,
    ]
    .iter()
    .map(|&o| o as usize + 8)
    // `ob_size` (after `ob_type`: a code object is a `PyVarObject`), for per-thread bytecode.
    .chain([layout.ob_type as usize + 16, tag_end])
    .max()
    .unwrap_or(0)
}

/// The tag the kernel computes for a code object, from a copy of its first bytes (which must
/// cover the tag span); reads the `tag_deref_ptr` word from the target when the layout has one.
pub(crate) fn code_tag(mem: &ProcessMemory, layout: &PyLayout, code_bytes: &[u8]) -> Result<u64> {
    let k = &layout.kernel;
    let start = k.code_tag_offset as usize;
    let mut words = [0u64; CODE_TAG_BYTES / 8];
    for (i, w) in words.iter_mut().enumerate() {
        *w = code_bytes
            .u64_at(start + i * 8)
            .context("code object too short")?;
    }
    let mut deref = 0;
    if k.tag_deref_ptr != 0 {
        let ptr = code_bytes
            .u64_at(k.tag_deref_ptr as usize)
            .context("code object too short")?;
        // The kernel folds 0 in when this read fails; so do we.
        deref = mem
            .read_u64(ptr.wrapping_add(k.tag_deref_field as u64))
            .unwrap_or(0);
    }
    Ok(fold_tag(&words, deref))
}

/// The current tag of the code object at `code` (reads its tag span).
pub fn read_tag(mem: &ProcessMemory, layout: &PyLayout, code: u64) -> Result<u64> {
    let end = layout.kernel.code_tag_offset as usize + CODE_TAG_BYTES;
    let end = end.max(layout.kernel.tag_deref_ptr as usize + 8);
    let bytes = mem.read_vec(code, end)?;
    code_tag(mem, layout, &bytes)
}

/// Reads the code object at `code`. `expected_tag` is what the kernel saw at sample time: a
/// mismatch means another object now lives at that address, and nothing is returned for it.
pub fn read_code(
    mem: &ProcessMemory,
    layout: &PyLayout,
    code: u64,
    expected_tag: u64,
) -> Result<CodeInfo> {
    let bytes = mem.read_vec(code, code_read_len(layout))?;
    let tag = code_tag(mem, layout, &bytes)?;
    ensure!(
        tag == expected_tag,
        "code object at {code:#x} changed since it was sampled"
    );
    let field = |off: u16| {
        bytes
            .u64_at(off as usize)
            .context("field outside code object")
    };
    let qualname = read_str(mem, layout, field(layout.code.qualname)?).context("co_qualname")?;
    let filename = read_str(mem, layout, field(layout.code.filename)?).context("co_filename")?;
    let firstlineno = bytes
        .i32_at(layout.code.firstlineno as usize)
        .context("co_firstlineno")?;
    let table = read_bytes(mem, layout, field(layout.code.linetable)?).context("co_linetable")?;
    let firstlineno = firstlineno.max(0) as u32;
    let (code_bytes, tlbc) = if layout.code.tlbc != 0 {
        let units = bytes
            .u64_at(layout.ob_type as usize + 8)
            .context("code object size")?;
        ensure!(
            units <= MAX_LINETABLE_BYTES,
            "code object of {units} code units is implausible"
        );
        // Unreadable copies leave lines to the refresh at the first frame in one.
        let copies = read_tlbc(mem, layout, code).unwrap_or_default();
        (units * 2, copies)
    } else {
        (0, Vec::new())
    };
    Ok(CodeInfo {
        qualname,
        filename,
        firstlineno,
        linetable: LineTable::parse(&table, firstlineno),
        code_bytes,
        tlbc: std::sync::Mutex::new(tlbc),
    })
}

/// Reads a `str` object (PEP 393 compact representation).
pub fn read_str(mem: &ProcessMemory, layout: &PyLayout, addr: u64) -> Result<String> {
    let (text, length) = read_str_prefix(mem, layout, addr, MAX_STRING_CHARS)?;
    ensure!(
        length <= MAX_STRING_CHARS,
        "string of {length} characters is implausible"
    );
    Ok(text)
}

/// Reads at most `max_chars` characters of a `str` object; also returns its whole length.
pub fn read_str_prefix(
    mem: &ProcessMemory,
    layout: &PyLayout,
    addr: u64,
    max_chars: u64,
) -> Result<(String, u64)> {
    ensure!(addr != 0, "NULL string");
    let head = mem.read_upto(addr, FIRST_READ)?;
    let shape = str_shape(&head, layout)?;
    let chars = shape.length.min(max_chars) as usize;
    let need = shape.data + chars * shape.width;
    let data = if need <= head.len() {
        head[shape.data..need].to_vec()
    } else {
        mem.read_vec(addr.wrapping_add(shape.data as u64), chars * shape.width)?
    };
    Ok((decode_chars(&data, shape.width), shape.length))
}

/// Where a compact `str`'s characters are, from the first bytes of the object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StrShape {
    /// Code points.
    pub length: u64,
    /// Offset of the first character in the object.
    pub data: usize,
    /// Bytes per code point (1, 2 or 4).
    pub width: usize,
}

/// The [`StrShape`] of the `str` whose first bytes are `head`; fails for anything that is not
/// a plausible compact string.
pub(crate) fn str_shape(head: &[u8], layout: &PyLayout) -> Result<StrShape> {
    let u = &layout.unicode;
    let length = head.u64_at(u.length as usize).context("string header")?;
    let state = head.u32_at(u.state as usize).context("string header")?;
    ensure!(
        length <= i64::MAX as u64,
        "string of {length} characters is implausible"
    );
    let kind = (state >> u.kind_shift) & 0b111;
    let compact = (state >> u.compact_bit) & 1 == 1;
    let ascii = (state >> u.ascii_bit) & 1 == 1;
    ensure!(compact, "non-compact string");
    let (data, width) = match (ascii, kind) {
        (true, 1) => (u.ascii_data as usize, 1),
        (false, 1 | 2 | 4) => (u.compact_data as usize, kind as usize),
        _ => bail!("string with unknown kind {kind}"),
    };
    Ok(StrShape {
        length,
        data,
        width,
    })
}

/// Characters stored `width` bytes each (a compact string's data).
pub(crate) fn decode_chars(data: &[u8], width: usize) -> String {
    match width {
        1 => data.iter().map(|&b| b as char).collect(),
        2 => data
            .chunks_exact(2)
            .map(|c| char::from_u32(u16::from_le_bytes([c[0], c[1]]) as u32).unwrap_or('\u{fffd}'))
            .collect(),
        _ => data
            .chunks_exact(4)
            .map(|c| {
                char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]])).unwrap_or('\u{fffd}')
            })
            .collect(),
    }
}

/// Reads a `bytes` object's contents.
pub fn read_bytes(mem: &ProcessMemory, layout: &PyLayout, addr: u64) -> Result<Vec<u8>> {
    let (data, size) = read_bytes_prefix(mem, layout, addr, MAX_LINETABLE_BYTES)?;
    ensure!(
        size <= MAX_LINETABLE_BYTES,
        "bytes object of {size} bytes is implausible"
    );
    Ok(data)
}

/// Reads at most `max` bytes of a `bytes` object; also returns its whole size.
pub fn read_bytes_prefix(
    mem: &ProcessMemory,
    layout: &PyLayout,
    addr: u64,
    max: u64,
) -> Result<(Vec<u8>, u64)> {
    ensure!(addr != 0, "NULL bytes object");
    let b = &layout.bytes;
    let head = mem.read_upto(addr, FIRST_READ)?;
    let size = head.u64_at(b.size as usize).context("bytes header")?;
    ensure!(
        size <= i64::MAX as u64,
        "bytes object of {size} bytes is implausible"
    );
    let start = b.data as usize;
    let end = start + size.min(max) as usize;
    if end <= head.len() {
        return Ok((head[start..end].to_vec(), size));
    }
    let data = mem.read_vec(addr.wrapping_add(start as u64), end - start)?;
    Ok((data, size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::test_support::{layouts, Arena};
    use crate::python::debug_offsets::fixtures::free_threaded_314_layout;

    /// A code object of a free-threaded 3.14 build whose bytecode is 8 code units on lines
    /// 10, 11, 12, 13 (two units each), and per-thread copies of it: the line of an
    /// instruction pointer is found in whichever copy holds it, copies made after the code
    /// object was read included.
    #[test]
    fn per_thread_bytecode() {
        let layout = free_threaded_314_layout();
        assert_ne!(layout.code.tlbc, 0);
        // CODE_NO_COLUMNS (13) entries of 2 units, line delta 0 then +1 three times
        // (signed varint: value << 1).
        let table = [0xe9, 0x00, 0xe9, 0x02, 0xe9, 0x02, 0xe9, 0x02];
        let mut code = vec![0u64; 64];
        let copies: Vec<Box<[u8; 16]>> = (0..3).map(|_| Box::new([0u8; 16])).collect();
        let at = |b: &[u8; 16]| b.as_ptr() as u64;
        // _PyCodeArray { size; entries[] } with entry 0 the code's own bytecode, 1 unused.
        let mut array = vec![3u64, 0, 0, at(&copies[0])];
        let code_addr = code.as_ptr() as u64;
        array[1] = code_addr + layout.code.code_adaptive as u64;
        code[layout.code.tlbc as usize / 8] = array.as_ptr() as u64;
        let mem = ProcessMemory::new(std::process::id());
        let info = CodeInfo {
            qualname: "f".into(),
            filename: "f.py".into(),
            firstlineno: 10,
            linetable: LineTable::parse(&table, 10),
            code_bytes: 16,
            tlbc: Default::default(),
        };
        info.refresh_tlbc(&mem, &layout, code_addr).unwrap();
        // The code's own bytecode, and copy 2.
        let own = array[1];
        assert_eq!(info.line_at_instr(&layout, code_addr, own + 12), 13);
        assert_eq!(
            info.line_at_instr(&layout, code_addr, at(&copies[0]) + 4),
            11
        );
        assert_eq!(
            info.bytecode_start(&layout, code_addr, at(&copies[0]) + 15),
            Some(at(&copies[0]))
        );
        // A copy made since: unknown until the array is read again, then found.
        let late = at(&copies[1]) + 8;
        assert_eq!(info.bytecode_start(&layout, code_addr, late), None);
        let grown = vec![4u64, own, 0, at(&copies[0]), at(&copies[1])];
        code[layout.code.tlbc as usize / 8] = grown.as_ptr() as u64;
        let mut symbols = crate::symbolize::Symbolizer::default();
        let line = symbols.line(std::process::id(), &layout, code_addr, &info, late);
        assert_eq!(line, 12);
        assert_eq!(
            (symbols.stats.tlbc_reads, symbols.stats.tlbc_unmatched),
            (1, 0)
        );
        // Past the end of every copy: the first line, counted.
        let nowhere = at(&copies[2]);
        assert_eq!(
            symbols.line(std::process::id(), &layout, code_addr, &info, nowhere),
            10
        );
        assert_eq!(symbols.stats.tlbc_unmatched, 1);
        // A negative size is garbage.
        let huge = vec![u64::MAX, own];
        code[layout.code.tlbc as usize / 8] = huge.as_ptr() as u64;
        assert!(info.refresh_tlbc(&mem, &layout, code_addr).is_err());
        drop((array, grown, huge));
    }

    #[test]
    fn code_object_readers_survive_hostile_memory() {
        let mut rng = fastrand::Rng::with_seed(7);
        let mem = ProcessMemory::new(std::process::id());
        let mut arena = Arena::new();
        let (mut tags, mut tries) = (0, 0);
        for layout in layouts() {
            for _ in 0..400 {
                arena.scramble(&mut rng);
                for _ in 0..20 {
                    tries += 1;
                    let code = arena.word(&mut rng);
                    if let Ok(tag) = read_tag(&mem, &layout, code) {
                        tags += 1;
                        if let Ok(info) = read_code(&mem, &layout, code, tag) {
                            info.line_at_instr(&layout, code, arena.word(&mut rng));
                        }
                    }
                    let _ = read_str(&mem, &layout, arena.word(&mut rng));
                    let _ = read_bytes(&mem, &layout, arena.word(&mut rng));
                }
            }
        }
        // Most tags come from readable arena memory: the readers really ran on hostile bytes.
        assert!(
            tags * 4 > tries,
            "only {tags} of {tries} tag reads succeeded"
        );
    }
}
