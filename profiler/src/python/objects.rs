//! Short reprs of objects read from a target, and a frame's variables, for `dump --locals`.
//!
//! Only the common immutable types are shown by value (int, float, bool, None, str, bytes);
//! anything else is `<type at 0x…>`. Nothing runs in the target: values are decoded from its
//! memory by the layout, every length is capped before anything is allocated, and garbage gives
//! `<unreadable at 0x…>`, never a panic.

use anyhow::{ensure, Context, Result};

use super::code::{read_bytes_prefix, read_str, read_str_prefix};
use super::layout::PyLayout;
use crate::memory::{Fields, ProcessMemory};

/// Characters of a `str` (bytes of a `bytes`) shown before `...`.
pub(crate) const MAX_VALUE_CHARS: u64 = 80;
/// Variables shown per frame.
pub const MAX_LOCALS: usize = 256;
/// Digits (30 bits each) of an int shown by value: 4 hold every 120-bit number.
const MAX_INT_DIGITS: u64 = 4;
/// `CO_FAST_HIDDEN`: a comprehension's variable inlined into its caller (3.12+), not the
/// caller's own.
const CO_FAST_HIDDEN: u8 = 0x10;

/// One variable of a frame.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Local {
    pub name: String,
    /// Short repr of its value.
    pub value: String,
    /// One of the code's positional arguments.
    pub arg: bool,
}

/// A code object's variables in frame-slot order: each one's name (`None` for a
/// comprehension's variable inlined into its caller, not the caller's own), and how many are
/// positional arguments. Code objects do not change: read once, used for any frame running
/// the code.
#[derive(Clone, Debug, PartialEq)]
pub struct CodeVars {
    pub names: Vec<Option<String>>,
    pub argcount: usize,
}

impl CodeVars {
    /// Bytes of a frame's variable slots, from `localsplus`.
    pub fn slots_len(&self) -> usize {
        self.names.len() * 8
    }
}

/// The variables of the code object at `code`.
pub fn code_vars(mem: &ProcessMemory, layout: &PyLayout, code: u64) -> Result<CodeVars> {
    let o = &layout.objects;
    let head_len = [
        o.code_argcount,
        o.code_localsplusnames,
        o.code_localspluskinds,
    ]
    .into_iter()
    .max()
    .unwrap_or(0) as usize
        + 8;
    let head = mem.read_vec(code, head_len)?;
    let argcount = head
        .i32_at(o.code_argcount as usize)
        .context("co_argcount")?
        .max(0) as usize;
    let names = head
        .u64_at(o.code_localsplusnames as usize)
        .context("co_localsplusnames")?;
    let kinds = head
        .u64_at(o.code_localspluskinds as usize)
        .context("co_localspluskinds")?;
    let names = tuple_items(mem, layout, names, MAX_LOCALS)?;
    let (kinds, _) = read_bytes_prefix(mem, layout, kinds, MAX_LOCALS as u64)?;
    let names = names
        .iter()
        .enumerate()
        .map(|(i, &name)| {
            if kinds.get(i).is_some_and(|k| k & CO_FAST_HIDDEN != 0) {
                return None;
            }
            Some(read_str(mem, layout, name).unwrap_or_else(|_| format!("<local {i}>")))
        })
        .collect();
    Ok(CodeVars { names, argcount })
}

/// The bound variables (unbound ones, not yet assigned, are left out) given a copy of a
/// frame's variable slots, in the code's order (arguments first).
pub fn locals_from_slots(
    mem: &ProcessMemory,
    layout: &PyLayout,
    vars: &CodeVars,
    slots: &[u8],
) -> Vec<Local> {
    let mut out = Vec::with_capacity(vars.names.len());
    for (i, name) in vars.names.iter().enumerate() {
        let Some(name) = name else { continue };
        let Some(bits) = slots.u64_at(i * 8) else {
            break;
        };
        let Some(value) = stack_ref_repr(mem, layout, bits) else {
            continue;
        };
        out.push(Local {
            name: name.clone(),
            value,
            arg: i < vars.argcount,
        });
    }
    out
}

/// The bound variables of the frame at `frame`, running the code object at `code`, in the
/// code's order (arguments first). Unbound ones (not yet assigned) are left out.
pub fn frame_locals(
    mem: &ProcessMemory,
    layout: &PyLayout,
    frame: u64,
    code: u64,
) -> Result<Vec<Local>> {
    let vars = code_vars(mem, layout, code)?;
    let slots = mem.read_vec(
        frame.wrapping_add(layout.frame_localsplus as u64),
        vars.slots_len(),
    )?;
    Ok(locals_from_slots(mem, layout, &vars, &slots))
}

/// Repr of a frame slot (a `PyObject *`, or a `_PyStackRef` whose tag bits the layout's
/// `executable_mask` clears); `None` for an empty slot.
fn stack_ref_repr(mem: &ProcessMemory, layout: &PyLayout, bits: u64) -> Option<String> {
    let mask = layout.kernel.executable_mask;
    let tag = bits & !mask;
    if tag != 0 && tag == !mask {
        // Every tag bit set: a tagged int (`Py_INT_TAG`), the value above the tag bits.
        return Some(((bits as i64) >> (!mask).count_ones()).to_string());
    }
    let addr = bits & mask;
    (addr != 0).then(|| short_repr(mem, layout, addr))
}

/// Short repr of the object at `addr`.
pub fn short_repr(mem: &ProcessMemory, layout: &PyLayout, addr: u64) -> String {
    repr(mem, layout, addr, true).unwrap_or_else(|_| format!("<unreadable at {addr:#x}>"))
}

fn repr(mem: &ProcessMemory, layout: &PyLayout, addr: u64, deref_cell: bool) -> Result<String> {
    let ty = mem.read_u64(addr.wrapping_add(layout.ob_type as u64))?;
    let name_ptr = mem.read_u64(ty.wrapping_add(layout.tp_name as u64))?;
    let type_name = c_string(mem, name_ptr)?;
    let o = &layout.objects;
    Ok(match type_name.as_str() {
        "NoneType" => "None".into(),
        "bool" => match int_value(mem, layout, addr)? {
            Some(0) => "False".into(),
            _ => "True".into(),
        },
        "int" => match int_value(mem, layout, addr)? {
            Some(v) => v.to_string(),
            None => format!("<int at {addr:#x}>"),
        },
        "float" => {
            let bits = mem.read_u64(addr.wrapping_add(o.float_value as u64))?;
            float_repr(f64::from_bits(bits))
        }
        "str" => {
            let (text, len) = read_str_prefix(mem, layout, addr, MAX_VALUE_CHARS)?;
            quote_str(&text, len > MAX_VALUE_CHARS)
        }
        "bytes" => {
            let (data, len) = read_bytes_prefix(mem, layout, addr, MAX_VALUE_CHARS)?;
            quote_bytes(&data, len > MAX_VALUE_CHARS)
        }
        "cell" if deref_cell => {
            let inner = mem.read_u64(addr.wrapping_add(o.cell_ref as u64))?;
            match inner {
                0 => "<empty cell>".into(),
                inner => repr(mem, layout, inner, false)?,
            }
        }
        _ => format!("<{type_name} at {addr:#x}>"),
    })
}

/// The value of an int object; `None` when it has more than [`MAX_INT_DIGITS`] digits.
fn int_value(mem: &ProcessMemory, layout: &PyLayout, addr: u64) -> Result<Option<i128>> {
    let o = &layout.objects;
    let word = mem.read_u64(addr.wrapping_add(o.long_size as u64))?;
    let (negative, digits) = if o.long_tagged {
        // lv_tag: sign in bits 0–1 (0 positive, 1 zero, 2 negative), digit count from bit 3.
        (word & 3 == 2, word >> 3)
    } else {
        let size = word as i64;
        (size < 0, size.unsigned_abs())
    };
    if digits > MAX_INT_DIGITS {
        return Ok(None);
    }
    let bytes = mem.read_vec(addr.wrapping_add(o.long_digits as u64), digits as usize * 4)?;
    Ok(Some(int_from_digits(&bytes, negative)))
}

/// An int from CPython's little-endian 30-bit digits (each in a `u32`).
fn int_from_digits(bytes: &[u8], negative: bool) -> i128 {
    let mut value: i128 = 0;
    for (i, d) in bytes.chunks_exact(4).enumerate() {
        let digit = (u32::from_le_bytes([d[0], d[1], d[2], d[3]]) & 0x3fff_ffff) as i128;
        value |= digit << (30 * i);
    }
    if negative {
        -value
    } else {
        value
    }
}

/// Items of a tuple (at most `max`).
fn tuple_items(mem: &ProcessMemory, layout: &PyLayout, addr: u64, max: usize) -> Result<Vec<u64>> {
    ensure!(addr != 0, "NULL tuple");
    let o = &layout.objects;
    let size = mem.read_u64(addr.wrapping_add(o.tuple_size as u64))? as i64;
    ensure!(size >= 0, "tuple of size {size}");
    let n = (size as u64).min(max as u64) as usize;
    let bytes = mem.read_vec(addr.wrapping_add(o.tuple_items as u64), n * 8)?;
    Ok((0..n).filter_map(|i| bytes.u64_at(i * 8)).collect())
}

/// A NUL-terminated C string of at most 128 bytes (a type's `tp_name`).
fn c_string(mem: &ProcessMemory, addr: u64) -> Result<String> {
    ensure!(addr != 0, "NULL type name");
    let bytes = mem.read_upto(addr, 128)?;
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
}

/// Python's repr of a float, for the finite cases that matter (`1.0`, `0.5`, `1e+20`).
fn float_repr(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.into();
    }
    let text = format!("{v}");
    if text.contains(['.', 'e', 'E']) {
        text
    } else {
        format!("{text}.0")
    }
}

fn quote_str(text: &str, cut: bool) -> String {
    let mut out = String::with_capacity(text.len() + 5);
    out.push('\'');
    for c in text.chars() {
        match c {
            '\'' => out.push_str("\\'"),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('\'');
    if cut {
        out.push_str("...");
    }
    out
}

fn quote_bytes(data: &[u8], cut: bool) -> String {
    let mut out = String::from("b'");
    for &b in data {
        match b {
            b'\'' => out.push_str("\\'"),
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            0x20..=0x7e => out.push(b as char),
            b => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out.push('\'');
    if cut {
        out.push_str("...");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_from_30_bit_digits() {
        let digits = |ds: &[u32]| ds.iter().flat_map(|d| d.to_le_bytes()).collect::<Vec<u8>>();
        assert_eq!(int_from_digits(&digits(&[]), false), 0);
        assert_eq!(int_from_digits(&digits(&[42]), true), -42);
        // 2**30 + 5
        assert_eq!(int_from_digits(&digits(&[5, 1]), false), (1 << 30) + 5);
        // 2**64: digits 0, 0, 16
        assert_eq!(int_from_digits(&digits(&[0, 0, 16]), false), 1i128 << 64);
        // High bits beyond 30 are not part of a digit.
        assert_eq!(int_from_digits(&digits(&[0xc000_0001]), false), 1);
    }

    #[test]
    fn reprs_read_like_python() {
        assert_eq!(float_repr(1.0), "1.0");
        assert_eq!(float_repr(0.25), "0.25");
        assert_eq!(float_repr(-3.5), "-3.5");
        assert_eq!(float_repr(f64::INFINITY), "inf");
        assert_eq!(quote_str("it's\n", false), "'it\\'s\\n'");
        assert_eq!(quote_str("abc", true), "'abc'...");
        assert_eq!(quote_bytes(b"a\x00'", false), "b'a\\x00\\''");
    }
}
