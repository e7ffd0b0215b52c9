//! Dicts and instance attributes of a target, read from outside without running code: what
//! finding `threading._active` and a `Thread`'s `_name` takes (`thread_names`).
//!
//! A dict is its keys object (a hash index, then the entries in insertion order) and, for a
//! split table, a values array kept apart. Everything is decoded by the layout's
//! [`DictLayout`](super::layout::DictLayout) and
//! [`AttrLayout`](super::layout::AttrLayout), every count is capped before anything is
//! allocated, and garbage is an error, never a panic.

use std::collections::HashMap;

use super::layout::PyLayout;
use crate::memory::{Fields, ProcessMemory, ReadError};

/// `dk_kind` of a table whose entries carry their hash (`DICT_KEYS_GENERAL`): `PyDictKeyEntry`
/// { me_hash; me_key; me_value }. The other kinds (unicode keys, split tables) have
/// `PyDictUnicodeEntry` { me_key; me_value }.
const KIND_GENERAL: u8 = 0;
/// Largest hash table accepted (`1 << 30` slots).
const MAX_LOG2_SIZE: u8 = 30;
/// Bytes of a key string read to compare it with a name: its header and the name's bytes.
const MAX_NAME_BYTES: usize = 64;

#[derive(Debug, thiserror::Error)]
pub(crate) enum DictError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("implausible dict at {addr:#x}: {what}")]
    Implausible { addr: u64, what: String },
}

/// One live entry of a dict: its key, its value, and its hash where the table keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub key: u64,
    pub value: u64,
    pub hash: Option<u64>,
}

/// A keys object's live entries (key not NULL), at most `max`, with, for a split table, the
/// index of each in the values array. `values`: the split table's values array (`None`:
/// values are in the entries).
fn keys_entries(
    mem: &ProcessMemory,
    layout: &PyLayout,
    keys: u64,
    values: Option<u64>,
    max: usize,
) -> Result<Vec<(usize, Entry)>, DictError> {
    let d = &layout.dict;
    let bad = |what: String| DictError::Implausible { addr: keys, what };
    let head = mem.read_vec(keys, d.keys_indices as usize)?;
    let byte = |at: u16| head.get(at as usize).copied();
    let (log2_size, log2_index_bytes, kind) = match (
        byte(d.keys_log2_size),
        byte(d.keys_log2_index_bytes),
        byte(d.keys_kind),
    ) {
        (Some(a), Some(b), Some(c)) => (a, b, c),
        _ => return Err(bad("short keys header".into())),
    };
    // Indices are 1 to 8 bytes each, so the index takes `log2_size` to `log2_size + 3`.
    if log2_size > MAX_LOG2_SIZE || log2_index_bytes < log2_size || log2_index_bytes > log2_size + 3
    {
        return Err(bad(format!(
            "log2 size {log2_size}, log2 index bytes {log2_index_bytes}"
        )));
    }
    let nentries = head
        .u64_at(d.keys_nentries as usize)
        .ok_or_else(|| bad("short keys header".into()))? as i64;
    // At most two thirds of the slots hold entries (`USABLE_FRACTION`).
    if nentries < 0 || nentries as u64 > (1u64 << log2_size) {
        return Err(bad(format!(
            "{nentries} entries in {} slots",
            1u64 << log2_size
        )));
    }
    let n = (nentries as usize).min(max);
    let (size, key_at) = match kind {
        KIND_GENERAL => (24, 8),
        _ => (16, 0),
    };
    let first = keys
        .wrapping_add(d.keys_indices as u64)
        .wrapping_add(1u64 << log2_index_bytes);
    let bytes = mem.read_vec(first, n * size)?;
    let split = match values {
        Some(v) => Some(mem.read_vec(v.wrapping_add(d.values_items as u64), n * 8)?),
        None => None,
    };
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let at = i * size;
        let key = bytes.u64_at(at + key_at).unwrap_or(0);
        if key == 0 {
            // A deleted entry.
            continue;
        }
        let value = match &split {
            Some(v) => v.u64_at(i * 8).unwrap_or(0),
            None => bytes.u64_at(at + key_at + 8).unwrap_or(0),
        };
        let hash = (kind == KIND_GENERAL).then(|| bytes.u64_at(at).unwrap_or(0));
        out.push((i, Entry { key, value, hash }));
    }
    Ok(out)
}

/// The live entries of the dict at `dict` whose value is set, at most `max`.
pub(crate) fn dict_entries(
    mem: &ProcessMemory,
    layout: &PyLayout,
    dict: u64,
    max: usize,
) -> Result<Vec<Entry>, DictError> {
    let d = &layout.dict;
    let head_len = d.ma_keys.max(d.ma_values) as usize + 8;
    let head = mem.read_vec(dict, head_len)?;
    let word = |at: u16| head.u64_at(at as usize).unwrap_or(0);
    let (keys, values) = (word(d.ma_keys), word(d.ma_values));
    if keys == 0 {
        return Err(DictError::Implausible {
            addr: dict,
            what: "no keys".into(),
        });
    }
    let values = (values != 0).then_some(values);
    Ok(keys_entries(mem, layout, keys, values, max)?
        .into_iter()
        .map(|(_, e)| e)
        .filter(|e| e.value != 0)
        .collect())
}

/// Which of `strings` (addresses of `str` objects) hold exactly `name` (ASCII), read in one
/// batch: only their headers and `name.len()` bytes of data each.
pub(crate) fn str_matches(
    mem: &ProcessMemory,
    layout: &PyLayout,
    strings: &[u64],
    name: &str,
) -> Result<Vec<bool>, ReadError> {
    let u = &layout.unicode;
    let len = (u.ascii_data as usize + name.len())
        .max(u.length.max(u.state) as usize + 8)
        .min(u.ascii_data as usize + MAX_NAME_BYTES);
    let regions: Vec<(u64, usize)> = strings.iter().map(|&s| (s, len)).collect();
    let heads = mem.read_batch(&regions)?;
    Ok(heads
        .iter()
        .map(|head| {
            let Some(head) = head else { return false };
            let (Some(length), Some(state)) = (
                head.u64_at(u.length as usize),
                head.u32_at(u.state as usize),
            ) else {
                return false;
            };
            let compact_ascii =
                (state >> u.compact_bit) & 1 == 1 && (state >> u.ascii_bit) & 1 == 1;
            let data = head.get(u.ascii_data as usize..u.ascii_data as usize + name.len());
            compact_ascii && length == name.len() as u64 && data == Some(name.as_bytes())
        })
        .collect())
}

/// The entry of `entries` whose key is the string `name`.
pub(crate) fn find_str(
    mem: &ProcessMemory,
    layout: &PyLayout,
    entries: &[Entry],
    name: &str,
) -> Result<Option<Entry>, ReadError> {
    let keys: Vec<u64> = entries.iter().map(|e| e.key).collect();
    let found = str_matches(mem, layout, &keys, name)?;
    Ok(entries
        .iter()
        .zip(found)
        .find_map(|(e, yes)| yes.then_some(*e)))
}

/// What an instance attribute lookup learned about a type, to reuse for its other instances:
/// the index of the attribute in the type's shared keys `keys`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SharedKey {
    keys: u64,
    index: usize,
}

/// Instance attribute lookups by name, with what they learn about each type cached. Bounded:
/// emptied past [`MAX_TYPES`] types.
#[derive(Default)]
pub(crate) struct AttrReader {
    /// (type, attribute name) → its slot in the type's shared keys (`None`: not there).
    shared: HashMap<(u64, &'static str), Option<SharedKey>>,
}

/// Types whose shared keys an [`AttrReader`] remembers.
const MAX_TYPES: usize = 1024;
/// Attributes of an instance looked through.
const MAX_ATTRS: usize = 256;

impl AttrReader {
    /// The value (an object address) of attribute `name` of the object at `obj`, from its
    /// instance attributes only (not its type's); `None` when it has none of that name.
    pub(crate) fn get(
        &mut self,
        mem: &ProcessMemory,
        layout: &PyLayout,
        obj: u64,
        name: &'static str,
    ) -> Result<Option<u64>, DictError> {
        let a = &layout.attrs;
        let ty = mem.read_u64(obj.wrapping_add(layout.ob_type as u64))?;
        let head_len = [
            a.type_flags,
            a.type_basicsize,
            a.type_dictoffset,
            a.heap_type_cached_keys,
        ]
        .into_iter()
        .max()
        .unwrap_or(0) as usize
            + 8;
        let t = mem.read_vec(ty, head_len)?;
        let word = |at: u16| t.u64_at(at as usize).unwrap_or(0);
        let flags = word(a.type_flags);
        let at = |off: i16| obj.wrapping_add(off as i64 as u64);
        if a.managed_dict_flag == 0 || flags & a.managed_dict_flag == 0 {
            // A dict at `tp_dictoffset` (types without managed dicts, and every type before
            // 3.11); a negative offset counts from the end of a variable-size object: not
            // supported.
            let offset = word(a.type_dictoffset) as i64;
            if offset <= 0 {
                return Ok(None);
            }
            let dict = mem.read_u64(obj.wrapping_add(offset as u64))?;
            return self.in_dict(mem, layout, dict, name);
        }
        // Values shared-key instances keep apart from a dict, where this layout has them.
        let mut values = None;
        if a.inline_values_flag != 0 && flags & a.inline_values_flag != 0 {
            let inline = obj.wrapping_add(word(a.type_basicsize));
            let mut valid = [0u8; 1];
            mem.read(inline.wrapping_add(a.values_valid as u64), &mut valid)?;
            if valid[0] != 0 {
                values = Some(inline);
            }
        } else if a.values_pointer != 0 {
            values = Some(mem.read_u64(at(a.values_pointer))?).filter(|&v| v != 0);
        }
        let slot = mem.read_u64(at(a.managed_dict))?;
        let dict = match a.dict_tags_values && slot & 1 == 1 {
            // `_PyDictOrValues_SetValues` stores the values' address minus one.
            true => {
                values = Some(slot.wrapping_add(1));
                0
            }
            false => slot,
        };
        if let Some(values) = values {
            let keys = word(a.heap_type_cached_keys);
            let Some(shared) = self.shared_key(mem, layout, ty, keys, name)? else {
                return Ok(None);
            };
            let d = &layout.dict;
            let value = mem.read_u64(
                values
                    .wrapping_add(d.values_items as u64)
                    .wrapping_add(8 * shared.index as u64),
            )?;
            return Ok((value != 0).then_some(value));
        }
        self.in_dict(mem, layout, dict, name)
    }

    fn in_dict(
        &mut self,
        mem: &ProcessMemory,
        layout: &PyLayout,
        dict: u64,
        name: &str,
    ) -> Result<Option<u64>, DictError> {
        if dict == 0 {
            return Ok(None);
        }
        let entries = dict_entries(mem, layout, dict, MAX_ATTRS)?;
        Ok(find_str(mem, layout, &entries, name)?.map(|e| e.value))
    }

    /// Where `name` is in the shared keys `keys` of type `ty`.
    fn shared_key(
        &mut self,
        mem: &ProcessMemory,
        layout: &PyLayout,
        ty: u64,
        keys: u64,
        name: &'static str,
    ) -> Result<Option<SharedKey>, DictError> {
        if let Some(known) = self.shared.get(&(ty, name)) {
            if known.is_none_or(|k| k.keys == keys) {
                return Ok(*known);
            }
        }
        if keys == 0 {
            return Ok(None);
        }
        let entries = keys_entries(mem, layout, keys, None, MAX_ATTRS)?;
        let strings: Vec<u64> = entries.iter().map(|(_, e)| e.key).collect();
        let found = str_matches(mem, layout, &strings, name)?;
        let shared = entries
            .iter()
            .zip(found)
            .find_map(|(&(index, _), yes)| yes.then_some(SharedKey { keys, index }));
        if self.shared.len() >= MAX_TYPES {
            self.shared.clear();
        }
        self.shared.insert((ty, name), shared);
        Ok(shared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::test_support::{layouts, Arena};

    #[test]
    fn dict_readers_survive_hostile_memory() {
        let mut rng = fastrand::Rng::with_seed(19);
        let mem = ProcessMemory::new(std::process::id());
        let mut arena = Arena::new();
        let mut attrs = AttrReader::default();
        let mut read = 0;
        for layout in layouts() {
            for _ in 0..300 {
                arena.scramble(&mut rng);
                for _ in 0..10 {
                    read += dict_entries(&mem, &layout, arena.word(&mut rng), 64).is_ok() as usize;
                    let _ = attrs.get(&mem, &layout, arena.word(&mut rng), "_name");
                    let strings = [arena.word(&mut rng), arena.inside(&mut rng)];
                    let _ = str_matches(&mem, &layout, &strings, "_active");
                }
            }
        }
        assert!(read > 0, "no hostile dict was ever read through");
    }
}
