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

/// The symbol information of one code object.
#[derive(Debug)]
pub struct CodeInfo {
    pub qualname: String,
    pub filename: String,
    pub firstlineno: u32,
    pub linetable: LineTable,
}

impl CodeInfo {
    /// Line executing at `instr` (the frame's instruction pointer), given the code's address.
    pub fn line_at_instr(&self, layout: &PyLayout, code: u64, instr: u64) -> u32 {
        let start = code.wrapping_add(layout.code.code_adaptive as u64);
        if instr < start {
            // A frame that has not started executing points before its first instruction.
            return self.firstlineno;
        }
        let lasti = ((instr - start) / 2).min(u32::MAX as u64) as u32;
        self.linetable.line_at(lasti).unwrap_or(self.firstlineno)
    }
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
    .chain([tag_end])
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
    Ok(CodeInfo {
        qualname,
        filename,
        firstlineno,
        linetable: LineTable::parse(&table, firstlineno),
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
