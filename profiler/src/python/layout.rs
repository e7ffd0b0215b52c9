//! One `PyLayout` describes everything pyebpf needs to know about a CPython build.
//!
//! Version differences are values in this struct, never `if version` branches elsewhere.
//! Sources: `debug_offsets` (3.13+, read from the target) and `tables` (3.11, 3.12 built in).

use profiler_common::PyOffsets;

/// `PY_VERSION_HEX` split into its parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PyVersion {
    pub major: u8,
    pub minor: u8,
    pub micro: u8,
    /// `PY_VERSION_HEX` as a whole (release level and serial in the low byte).
    pub hex: u64,
}

impl PyVersion {
    pub fn from_hex(hex: u64) -> Self {
        PyVersion {
            major: ((hex >> 24) & 0xff) as u8,
            minor: ((hex >> 16) & 0xff) as u8,
            micro: ((hex >> 8) & 0xff) as u8,
            hex,
        }
    }
}

impl std::fmt::Display for PyVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let level = match (self.hex >> 4) & 0xf {
            0xa => "a",
            0xb => "b",
            0xc => "rc",
            _ => "",
        };
        write!(f, "{}.{}.{}", self.major, self.minor, self.micro)?;
        if !level.is_empty() {
            write!(f, "{level}{}", self.hex & 0xf)?;
        }
        Ok(())
    }
}

/// Fields of `PyCodeObject` userspace reads when symbolizing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodeLayout {
    pub filename: u16,
    pub name: u16,
    pub qualname: u16,
    /// `co_linetable` (a bytes object holding the 3.11+ location table).
    pub linetable: u16,
    /// `co_firstlineno` (a C int).
    pub firstlineno: u16,
    /// `co_code_adaptive`: instruction offsets are measured from here.
    pub code_adaptive: u16,
    /// `co_tlbc` (free-threaded 3.14+: a `_PyCodeArray *` {size; entries[]} of per-thread
    /// copies of the bytecode, entry 0 being `co_code_adaptive`); 0 where every thread runs
    /// `co_code_adaptive`. A frame's instruction pointer then lies in one of the copies.
    pub tlbc: u16,
}

/// `PyBytesObject`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BytesLayout {
    /// `ob_size` (number of bytes).
    pub size: u16,
    /// `ob_sval` (the data).
    pub data: u16,
}

/// `PyUnicodeObject` (PEP 393 compact strings).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnicodeLayout {
    /// `length` in code points.
    pub length: u16,
    /// The `state` bit-field word (a 32-bit int).
    pub state: u16,
    /// `sizeof(PyASCIIObject)`: data of compact ASCII strings starts here.
    pub ascii_data: u16,
    /// `sizeof(PyCompactUnicodeObject)`: data of other compact strings starts here.
    pub compact_data: u16,
    /// Bit position of `state.kind` (3 bits: 1, 2 or 4 bytes per code point).
    pub kind_shift: u8,
    /// Bit position of `state.compact`.
    pub compact_bit: u8,
    /// Bit position of `state.ascii`.
    pub ascii_bit: u8,
}

/// `_PyStackChunk`: the per-thread arena that holds interpreter frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
/// (`previous`, `size` and `data` are in [`PyOffsets`]: the kernel walk uses them too.)
pub struct ChunkLayout {
    pub top: u16,
}

/// Thread-state fields userspace reads (beyond those the kernel walk uses).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadLayout {
    /// `PyThreadState.thread_id` (pthread id).
    pub thread_id: u16,
    /// `PyThreadState.interp`.
    pub interp: u16,
}

/// What `dump --locals` reads: how a frame's variables are named, and where the common
/// immutable types keep their values. Offsets of the object after its `PyObject` header are
/// from `ob_type`'s end in every build, but are listed, like everything else, as values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObjectLayout {
    /// `PyCodeObject.co_argcount` (a C int).
    pub code_argcount: u16,
    /// `PyCodeObject.co_localsplusnames` (a tuple of str).
    pub code_localsplusnames: u16,
    /// `PyCodeObject.co_localspluskinds` (bytes, one `CO_FAST_*` kind per name).
    pub code_localspluskinds: u16,
    /// `PyTupleObject.ob_size` and `ob_item`.
    pub tuple_size: u16,
    pub tuple_items: u16,
    /// `PyFloatObject.ob_fval`.
    pub float_value: u16,
    /// `PyLongObject`'s size word and its 30-bit digits.
    pub long_size: u16,
    pub long_digits: u16,
    /// The size word is `long_value.lv_tag` (3.12+: sign in bits 0–1, digit count from bit 3),
    /// not a signed digit count (`ob_size`).
    pub long_tagged: bool,
    /// `PyCellObject.ob_ref`: a cell variable's value.
    pub cell_ref: u16,
}

/// Coroutine, set, linked-list and int fields the async view (`--async`, `dump --async`)
/// reads, from `_Py_DebugOffsets` (3.14+). Builds whose struct lacks them (3.13) and the
/// built-in 3.11/3.12 tables have none: [`PyLayout::coroutines`] is `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoroutineLayout {
    /// `PyGenObject.gi_iframe`: the coroutine's embedded `_PyInterpreterFrame`.
    pub gi_iframe: u16,
    /// `PyGenObject.gi_frame_state` (an `int8_t`).
    pub gi_frame_state: u16,
    /// `FRAME_SUSPENDED_YIELD_FROM` of `enum _framestate`: the frame waits in a `yield from` /
    /// `await` on the object on top of its value stack (-1 in 3.14, 2 in 3.15).
    pub suspended_yield_from: i8,
    /// `_PyInterpreterFrame.stackpointer`.
    pub stackpointer: u16,
    /// `_PyStackRef` slots below `stackpointer` where a suspended `yield from` keeps the
    /// awaited object: 1 in 3.14 (`_PyFrame_StackPeek`), 2 in 3.15.
    pub yield_from_slot: u8,
    /// `PySetObject.used`, `.table` (`setentry *`: key, hash) and `.mask`.
    pub set_used: u16,
    pub set_table: u16,
    pub set_mask: u16,
    /// `struct llist_node.next`.
    pub llist_next: u16,
    /// `PyLongObject.long_value.lv_tag` and `.ob_digit`: a compact int's digit count is
    /// `lv_tag >> 3`, its sign `lv_tag & 3`, 30-bit digits.
    pub long_tag: u16,
    pub long_digit: u16,
}

/// `PyDictObject` and its keys and values, as the thread-name reader walks them
/// (`sys.modules`, a module's dict, `threading._active`, an instance's attributes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DictLayout {
    /// `PyDictObject.ma_keys` and `.ma_values` (non-NULL: a split table, values kept apart).
    pub ma_keys: u16,
    pub ma_values: u16,
    /// `PyDictKeysObject.dk_log2_size`, `.dk_log2_index_bytes` and `.dk_kind` (`uint8_t`s;
    /// kind 0 is `DICT_KEYS_GENERAL`, whose entries carry their hash).
    pub keys_log2_size: u16,
    pub keys_log2_index_bytes: u16,
    pub keys_kind: u16,
    /// `.dk_nentries` (entries in use, deleted ones included) and `.dk_indices` (the hash
    /// index, `1 << dk_log2_index_bytes` bytes; the entries follow it).
    pub keys_nentries: u16,
    pub keys_indices: u16,
    /// `PyDictValues.values`: where a split table's values start.
    pub values_items: u16,
}

/// Where a Python object keeps its instance attributes, and where a module keeps its globals:
/// what reading `threading.Thread` names out of `threading._active` needs. Each way CPython
/// has stored attributes is a value here: a values array behind a pointer before the object
/// (3.11), that pointer tagged in the managed dict's slot (3.12), values inline after the
/// object (3.13+), or a plain dict (always possible: the fallback of the others).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttrLayout {
    /// `PyInterpreterState.imports.modules`: `sys.modules`.
    pub interp_modules: u16,
    /// `PyModuleObject.md_dict`.
    pub module_dict: u16,
    /// `PyTypeObject.tp_flags` (an `unsigned long`), `.tp_basicsize` and `.tp_dictoffset`.
    pub type_flags: u16,
    pub type_basicsize: u16,
    pub type_dictoffset: u16,
    /// `PyHeapTypeObject.ht_cached_keys`: the keys the type's instances share (split tables).
    pub heap_type_cached_keys: u16,
    /// `Py_TPFLAGS_MANAGED_DICT`: the instance dict pointer is at [`AttrLayout::managed_dict`]
    /// from the object. 0 where instance dicts are at `tp_dictoffset`.
    pub managed_dict_flag: u64,
    /// Offset (negative: the pre-header) of the managed dict pointer from the object.
    pub managed_dict: i16,
    /// Offset of a `PyDictValues *` from the object (3.11: the word before the managed dict);
    /// 0 where there is none.
    pub values_pointer: i16,
    /// The managed dict slot holds either a dict or, with its low bit set, a `PyDictValues *`
    /// minus one (3.12).
    pub dict_tags_values: bool,
    /// `Py_TPFLAGS_INLINE_VALUES`: the values follow the object at `tp_basicsize` (3.13+);
    /// 0 where no type has that flag.
    pub inline_values_flag: u64,
    /// `PyDictValues.valid` (a `uint8_t`), with inline values: 0 once a dict took them over.
    pub values_valid: u16,
}

/// Where a [`PyLayout`] came from: shown by `pyebpf check`, so that a wrong layout can be
/// traced to its source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayoutSource {
    /// A table built into pyebpf from the CPython headers of that minor (`tables`).
    BuiltinTable,
    /// The target's own `_Py_DebugOffsets`, completed by a small per-minor table
    /// (`debug_offsets`).
    DebugOffsets,
}

impl std::fmt::Display for LayoutSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LayoutSource::BuiltinTable => "built-in table",
            LayoutSource::DebugOffsets => "the target's _Py_DebugOffsets",
        })
    }
}

/// Everything pyebpf knows about one CPython build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PyLayout {
    pub version: PyVersion,
    pub source: LayoutSource,
    /// Free-threaded (`Py_GIL_DISABLED`) build.
    pub free_threaded: bool,
    /// What the kernel walk needs (sent to the `LAYOUTS` map as is).
    pub kernel: PyOffsets,
    pub code: CodeLayout,
    pub bytes: BytesLayout,
    pub unicode: UnicodeLayout,
    pub chunk: ChunkLayout,
    pub thread: ThreadLayout,
    /// `PyObject.ob_type`.
    pub ob_type: u16,
    /// `PyTypeObject.tp_name` (a `const char *`).
    pub tp_name: u16,
    /// `sizeof(_PyInterpreterFrame)` up to `localsplus`: the fixed part of a frame.
    pub frame_localsplus: u16,
    pub objects: ObjectLayout,
    /// What the async view reads; `None` where the layout does not say (before 3.14).
    pub coroutines: Option<CoroutineLayout>,
    /// Dicts, modules and instance attributes (thread names from `threading`).
    pub dict: DictLayout,
    pub attrs: AttrLayout,
}
