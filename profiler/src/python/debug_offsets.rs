//! Layouts of CPython ≥ 3.13, read from the `_Py_DebugOffsets` struct the interpreter keeps at
//! the start of `_PyRuntime`.
//!
//! The struct is a cookie (`xdebugpy`), `version` (`PY_VERSION_HEX`), `free_threaded`, then a
//! flat run of little-endian `uint64_t` values grouped in sections (`runtime_state`,
//! `interpreter_state`, `thread_state`, …). Nothing in it says how long a section is, so the
//! position of every value follows from the ordered field list of that CPython version: that
//! list is the data [`KNOWN`] holds per minor (and per pre-release where it changed inside one).
//! Every offset the struct provides is taken from it; what it lacks (frame-owner codes, the
//! `_PyStackRef` tag bits, the unicode `state` bit positions, `_PyStackChunk`) comes from the
//! small per-minor [`Facts`] next to the field list.
//!
//! Free-threaded (`Py_GIL_DISABLED`) builds keep the same field list with other values: their
//! object header is 32 bytes (`ob_tid`, `ob_mutex`, `ob_gc_bits`, `ob_ref_local`,
//! `ob_ref_shared` before `ob_type`), which moves every object field, and their thread states
//! are `_PyThreadStateImpl`s that begin with a `PyThreadState`: the struct's offsets already say
//! all of that. What differs beyond the struct is a fact per build kind (the unicode `state`
//! bits, 3.14+), the absence of a GIL to test, and from 3.14 on the per-thread copies of the
//! bytecode (`co_tlbc`) a frame's instruction pointer may point into.

use profiler_common::{PyOffsets, FRAME_HEADER_BYTES, LAYOUT_GIL_INDIRECT, LAYOUT_GIL_INTERP};

use super::layout::{
    AttrLayout, BytesLayout, ChunkLayout, CodeLayout, CoroutineLayout, DictLayout, LayoutSource,
    ObjectLayout, PyLayout, PyVersion, ThreadLayout, UnicodeLayout,
};
use super::tables::{
    code_tag_offset, CHUNK_DATA, CHUNK_PREVIOUS, CHUNK_SIZE, DICT_311, MANAGED_DICT,
    MANAGED_DICT_FLAG, STACK_CHUNK, TYPE_BASICSIZE, TYPE_DICTOFFSET, TYPE_FLAGS,
};

/// The first eight bytes of `_PyRuntime` in CPython ≥ 3.13.
pub const COOKIE: &[u8; 8] = b"xdebugpy";
/// Bytes of the start of `_PyRuntime` to read: covers the largest known struct (3.15: 888
/// bytes) with room for a grown successor.
pub const READ_SIZE: usize = 1024;

/// cookie, version, free_threaded.
const HEADER_BYTES: usize = 24;

#[derive(Debug, thiserror::Error)]
pub enum DebugOffsetsError {
    #[error("_PyRuntime does not start with the \"xdebugpy\" cookie (found {found:02x?})")]
    BadCookie { found: Vec<u8> },
    #[error("_Py_DebugOffsets needs {need} bytes, only {got} were read")]
    TooShort { need: usize, got: usize },
    /// `version` is `PY_VERSION_HEX`.
    #[error(
        "CPython {} (PY_VERSION_HEX {version:#x}): the layout of its _Py_DebugOffsets is not known \
         (supported: 3.13, 3.14 and 3.15 from their first beta; 3.11 and 3.12 use built-in tables)",
        PyVersion::from_hex(*version)
    )]
    UnsupportedVersion { version: u64 },
    /// The struct does not describe memory pyebpf could walk safely: the process is left alone.
    #[error(
        "CPython {}{} (PY_VERSION_HEX {version:#x}): implausible _Py_DebugOffsets: {what}; pyebpf \
         does not walk an interpreter whose offsets it cannot trust (if this is a CPython release, \
         report it with the output of `pyebpf check --json`)",
        PyVersion::from_hex(*version),
        if *free_threaded { " free-threaded" } else { "" }
    )]
    Implausible {
        version: u64,
        free_threaded: bool,
        what: String,
    },
}

/// One section of the struct: its name and its fields, in declaration order.
type Section = (&'static str, &'static [&'static str]);

/// What the struct does not say, per minor.
#[derive(Clone, Copy, Debug)]
struct Facts {
    /// Bits `1 << owner` of `enum _frameowner` values that are not Python code.
    skip_owner_mask: u32,
    /// Bits `1 << owner` of the entry frames each `_PyEval_EvalFrameDefault` call pushes.
    entry_owner_mask: u32,
    /// Clears the `_PyStackRef` tag bits (`Py_TAG_BITS`) of `f_executable`.
    executable_mask: u64,
    /// `PyASCIIObject.state` bits of a build with the GIL.
    state_bits: StateBits,
    /// `PyASCIIObject.state` bits of a free-threaded build.
    state_bits_free_threaded: StateBits,
    chunk: ChunkLayout,
    /// `FRAME_SUSPENDED_YIELD_FROM` (see [`CoroutineLayout::suspended_yield_from`]).
    suspended_yield_from: i8,
    /// See [`CoroutineLayout::yield_from_slot`].
    yield_from_slot: u8,
    /// Dict internals the struct lacks (`PyDictKeysObject`, `PyDictValues`); its
    /// `dict_object.ma_keys` and `.ma_values` replace the ones here.
    dict: DictLayout,
    /// Attribute storage; the struct's `interpreter_state.imports_modules`,
    /// `type_object.tp_flags` and, where it has them (3.15), `type_object.tp_basicsize`,
    /// `.tp_dictoffset` and `heap_type_object.ht_cached_keys` replace the ones here.
    attrs: AttrLayout,
}

/// Bit positions in `PyASCIIObject.state`.
#[derive(Clone, Copy, Debug)]
struct StateBits {
    kind_shift: u8,
    compact_bit: u8,
    ascii_bit: u8,
}

/// `unsigned int interned:2; kind:3; compact:1; ascii:1; ...`
const STATE_BITS_INTERNED_2: StateBits = StateBits {
    kind_shift: 2,
    compact_bit: 5,
    ascii_bit: 6,
};
/// Free-threaded 3.14+: `unsigned char interned;` (read atomically, so not a bit-field), then
/// the same bit-fields from bit 8.
const STATE_BITS_INTERNED_BYTE: StateBits = StateBits {
    kind_shift: 8,
    compact_bit: 11,
    ascii_bit: 12,
};

/// `PyCompactUnicodeObject` is `PyASCIIObject` followed by `utf8_length` and `utf8`, in every
/// build; used where the struct has no `compactunicodeobject_size` (before 3.15).
const COMPACT_UNICODE_EXTRA: u64 = 16;
/// `PyObject_HEAD` of a GIL build: `ob_refcnt`, `ob_type`.
const GIL_OBJECT_HEADER: u16 = 16;
/// A free-threaded object header puts `ob_tid` and the split reference counts before
/// `ob_type`: at least this far into the object.
const FREE_THREADED_OB_TYPE_MIN: u64 = 24;

/// One known `_Py_DebugOffsets` shape.
struct Known {
    minor: u8,
    /// Lowest `PY_VERSION_HEX` (inclusive) it describes; it holds up to the next entry of the
    /// same minor. Alphas change the struct freely and are refused.
    from_hex: u64,
    sections: &'static [Section],
    facts: Facts,
}

const RUNTIME_STATE: Section = (
    "runtime_state",
    &["size", "finalizing", "interpreters_head"],
);
const INTERPRETER_STATE_313: Section = (
    "interpreter_state",
    &[
        "size",
        "id",
        "next",
        "threads_head",
        "gc",
        "imports_modules",
        "sysdict",
        "builtins",
        "ceval_gil",
        "gil_runtime_state",
        "gil_runtime_state_enabled",
        "gil_runtime_state_locked",
        "gil_runtime_state_holder",
    ],
);
/// 3.14 adds `threads_main`, `code_object_generation`, `tlbc_generation`.
const INTERPRETER_STATE_314: Section = (
    "interpreter_state",
    &[
        "size",
        "id",
        "next",
        "threads_head",
        "threads_main",
        "gc",
        "imports_modules",
        "sysdict",
        "builtins",
        "ceval_gil",
        "gil_runtime_state",
        "gil_runtime_state_enabled",
        "gil_runtime_state_locked",
        "gil_runtime_state_holder",
        "code_object_generation",
        "tlbc_generation",
    ],
);
const THREAD_STATE_313: Section = (
    "thread_state",
    &[
        "size",
        "prev",
        "next",
        "interp",
        "current_frame",
        "thread_id",
        "native_thread_id",
        "datastack_chunk",
        "status",
    ],
);
/// 3.15 up to 3.15.0b3.
const THREAD_STATE_315_PRE_B4: Section = (
    "thread_state",
    &[
        "size",
        "prev",
        "next",
        "interp",
        "current_frame",
        "base_frame",
        "last_profiled_frame",
        "thread_id",
        "native_thread_id",
        "datastack_chunk",
        "status",
        "holds_gil",
        "gil_requested",
        "current_exception",
        "exc_state",
    ],
);
/// 3.15.0b4 inserted `last_profiled_frame_seq`.
const THREAD_STATE_315: Section = (
    "thread_state",
    &[
        "size",
        "prev",
        "next",
        "interp",
        "current_frame",
        "base_frame",
        "last_profiled_frame",
        "last_profiled_frame_seq",
        "thread_id",
        "native_thread_id",
        "datastack_chunk",
        "status",
        "holds_gil",
        "gil_requested",
        "current_exception",
        "exc_state",
    ],
);
const ERR_STACKITEM: Section = ("err_stackitem", &["exc_value"]);
const INTERPRETER_FRAME_313: Section = (
    "interpreter_frame",
    &[
        "size",
        "previous",
        "executable",
        "instr_ptr",
        "localsplus",
        "owner",
    ],
);
const INTERPRETER_FRAME_314: Section = (
    "interpreter_frame",
    &[
        "size",
        "previous",
        "executable",
        "instr_ptr",
        "localsplus",
        "owner",
        "stackpointer",
        "tlbc_index",
    ],
);
const CODE_OBJECT_313: Section = (
    "code_object",
    &[
        "size",
        "filename",
        "name",
        "qualname",
        "linetable",
        "firstlineno",
        "argcount",
        "localsplusnames",
        "localspluskinds",
        "co_code_adaptive",
    ],
);
const CODE_OBJECT_314: Section = (
    "code_object",
    &[
        "size",
        "filename",
        "name",
        "qualname",
        "linetable",
        "firstlineno",
        "argcount",
        "localsplusnames",
        "localspluskinds",
        "co_code_adaptive",
        "co_tlbc",
    ],
);
const PYOBJECT: Section = ("pyobject", &["size", "ob_type"]);
const TYPE_OBJECT_313: Section = ("type_object", &["size", "tp_name", "tp_repr", "tp_flags"]);
const TYPE_OBJECT_315: Section = (
    "type_object",
    &[
        "size",
        "tp_name",
        "tp_repr",
        "tp_flags",
        "tp_basicsize",
        "tp_dictoffset",
    ],
);
const HEAP_TYPE_OBJECT: Section = ("heap_type_object", &["size", "ht_cached_keys"]);
const TUPLE_OBJECT: Section = ("tuple_object", &["size", "ob_item", "ob_size"]);
const LIST_OBJECT: Section = ("list_object", &["size", "ob_item", "ob_size"]);
const SET_OBJECT: Section = ("set_object", &["size", "used", "table", "mask"]);
const DICT_OBJECT: Section = ("dict_object", &["size", "ma_keys", "ma_values"]);
const FLOAT_OBJECT: Section = ("float_object", &["size", "ob_fval"]);
const LONG_OBJECT: Section = ("long_object", &["size", "lv_tag", "ob_digit"]);
const BYTES_OBJECT: Section = ("bytes_object", &["size", "ob_size", "ob_sval"]);
const UNICODE_OBJECT_313: Section = (
    "unicode_object",
    &["size", "state", "length", "asciiobject_size"],
);
const UNICODE_OBJECT_315: Section = (
    "unicode_object",
    &[
        "size",
        "state",
        "length",
        "asciiobject_size",
        "compactunicodeobject_size",
    ],
);
const GC_313: Section = ("gc", &["size", "collecting"]);
const GC_315: Section = (
    "gc",
    &[
        "size",
        "collecting",
        "frame",
        "generation_stats_size",
        "generation_stats",
    ],
);
const GEN_OBJECT: Section = (
    "gen_object",
    &["size", "gi_name", "gi_iframe", "gi_frame_state"],
);
const LLIST_NODE: Section = ("llist_node", &["next", "prev"]);
const DEBUGGER_SUPPORT: Section = (
    "debugger_support",
    &[
        "eval_breaker",
        "remote_debugger_support",
        "remote_debugging_enabled",
        "debugger_pending_call",
        "debugger_script_path",
        "debugger_script_path_size",
    ],
);

const SECTIONS_313: &[Section] = &[
    RUNTIME_STATE,
    INTERPRETER_STATE_313,
    THREAD_STATE_313,
    INTERPRETER_FRAME_313,
    CODE_OBJECT_313,
    PYOBJECT,
    TYPE_OBJECT_313,
    TUPLE_OBJECT,
    LIST_OBJECT,
    DICT_OBJECT,
    FLOAT_OBJECT,
    LONG_OBJECT,
    BYTES_OBJECT,
    UNICODE_OBJECT_313,
    GC_313,
];

const SECTIONS_314: &[Section] = &[
    RUNTIME_STATE,
    INTERPRETER_STATE_314,
    THREAD_STATE_313,
    INTERPRETER_FRAME_314,
    CODE_OBJECT_314,
    PYOBJECT,
    TYPE_OBJECT_313,
    TUPLE_OBJECT,
    LIST_OBJECT,
    SET_OBJECT,
    DICT_OBJECT,
    FLOAT_OBJECT,
    LONG_OBJECT,
    BYTES_OBJECT,
    UNICODE_OBJECT_313,
    GC_313,
    GEN_OBJECT,
    LLIST_NODE,
    DEBUGGER_SUPPORT,
];

macro_rules! sections_315 {
    ($thread_state:expr) => {
        &[
            RUNTIME_STATE,
            INTERPRETER_STATE_314,
            $thread_state,
            ERR_STACKITEM,
            INTERPRETER_FRAME_314,
            CODE_OBJECT_314,
            PYOBJECT,
            TYPE_OBJECT_315,
            HEAP_TYPE_OBJECT,
            TUPLE_OBJECT,
            LIST_OBJECT,
            SET_OBJECT,
            DICT_OBJECT,
            FLOAT_OBJECT,
            LONG_OBJECT,
            BYTES_OBJECT,
            UNICODE_OBJECT_315,
            GC_315,
            GEN_OBJECT,
            LLIST_NODE,
            DEBUGGER_SUPPORT,
        ]
    };
}
const SECTIONS_315_PRE_B4: &[Section] = sections_315!(THREAD_STATE_315_PRE_B4);
const SECTIONS_315: &[Section] = sections_315!(THREAD_STATE_315);

/// 3.13 gave `PyDictValues` a header { capacity; size; embedded; valid } before `values[]`.
const DICT_3_13: DictLayout = DictLayout {
    values_items: 8,
    ..DICT_311
};
/// 3.13 to 3.15 (GIL builds): attribute values inline after the object
/// (`Py_TPFLAGS_INLINE_VALUES`, `1 << 2`; `PyDictValues.valid` at 3), the managed dict at -24;
/// `ht_cached_keys` at 880 (`PyTypeObject` is 416 bytes as in 3.12). `PyModuleObject.md_dict`
/// follows the object header.
const ATTRS_313: AttrLayout = AttrLayout {
    interp_modules: 0,
    module_dict: 16,
    type_flags: TYPE_FLAGS,
    type_basicsize: TYPE_BASICSIZE,
    type_dictoffset: TYPE_DICTOFFSET,
    heap_type_cached_keys: 880,
    managed_dict_flag: MANAGED_DICT_FLAG,
    managed_dict: MANAGED_DICT,
    values_pointer: 0,
    dict_tags_values: false,
    inline_values_flag: 1 << 2,
    values_valid: 3,
};

/// `enum _frameowner` of 3.13: THREAD=0, GENERATOR=1, FRAME_OBJECT=2, CSTACK=3 (the entry frame
/// of each `_PyEval_EvalFrameDefault`, `f_executable` = `None`).
/// The unicode `state` bits are those of the GIL build in 3.13t too.
const FACTS_313: Facts = Facts {
    skip_owner_mask: 1 << 3,
    entry_owner_mask: 1 << 3,
    executable_mask: u64::MAX,
    state_bits: STATE_BITS_INTERNED_2,
    state_bits_free_threaded: STATE_BITS_INTERNED_2,
    chunk: STACK_CHUNK,
    suspended_yield_from: -1,
    yield_from_slot: 1,
    dict: DICT_3_13,
    attrs: ATTRS_313,
};
/// 3.14: THREAD=0, GENERATOR=1, FRAME_OBJECT=2, INTERPRETER=3 (entry frames), CSTACK=4.
/// `f_executable` is a `_PyStackRef`: `Py_TAG_BITS` = 3 (`Py_TAG_REFCNT` = 1, `Py_INT_TAG` = 3)
/// with the GIL; free-threaded builds tag deferred references with bit 0 (`Py_TAG_DEFERRED`)
/// and ints with 3, so the same mask clears both (objects are at least 8-aligned).
const FACTS_314: Facts = Facts {
    skip_owner_mask: (1 << 3) | (1 << 4),
    entry_owner_mask: 1 << 3,
    executable_mask: !0b11,
    state_bits_free_threaded: STATE_BITS_INTERNED_BYTE,
    ..FACTS_313
};
/// 3.15: FRAME_OWNED_BY_CSTACK is gone; INTERPRETER=3 marks entry frames and the thread's base
/// frame. `Py_TAG_BITS` is still 3. `enum _framestate` was renumbered from 0
/// (CREATED, SUSPENDED, SUSPENDED_YIELD_FROM = 2, SUSPENDED_YIELD_FROM_LOCKED, EXECUTING, CLEARED),
/// and a frame suspended in `yield from` keeps the awaited object at `stackpointer[-2]`
/// (measured on sid's 3.15.2: `stackpointer[-1]` is not the awaited coroutine there).
const FACTS_315: Facts = Facts {
    skip_owner_mask: 1 << 3,
    entry_owner_mask: 1 << 3,
    executable_mask: !0b11,
    suspended_yield_from: 2,
    yield_from_slot: 2,
    ..FACTS_314
};

/// Known shapes; within a minor, ordered by `from_hex`.
const KNOWN: &[Known] = &[
    Known {
        minor: 13,
        from_hex: 0x030d_00b1,
        sections: SECTIONS_313,
        facts: FACTS_313,
    },
    Known {
        minor: 14,
        from_hex: 0x030e_00b1,
        sections: SECTIONS_314,
        facts: FACTS_314,
    },
    Known {
        minor: 15,
        from_hex: 0x030f_00b1,
        sections: SECTIONS_315_PRE_B4,
        facts: FACTS_315,
    },
    Known {
        minor: 15,
        from_hex: 0x030f_00b4,
        sections: SECTIONS_315,
        facts: FACTS_315,
    },
];

fn known_for(hex: u64) -> Option<&'static Known> {
    let version = PyVersion::from_hex(hex);
    if version.major != 3 {
        return None;
    }
    KNOWN
        .iter()
        .filter(|k| k.minor == version.minor && k.from_hex <= hex)
        .max_by_key(|k| k.from_hex)
}

/// Bytes of the struct for a known shape.
fn struct_size(known: &Known) -> usize {
    HEADER_BYTES + 8 * known.sections.iter().map(|(_, f)| f.len()).sum::<usize>()
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// The decoded struct: (section, field) → value.
struct Values {
    version: u64,
    free_threaded: bool,
    entries: Vec<(&'static str, &'static str, u64)>,
}

impl Values {
    fn get(&self, section: &str, field: &str) -> Result<u64, DebugOffsetsError> {
        self.entries
            .iter()
            .find(|(s, f, _)| *s == section && *f == field)
            .map(|&(_, _, v)| v)
            .ok_or_else(|| {
                self.implausible(format!("no {section}.{field} in this version's struct"))
            })
    }

    /// An offset that must fit the 16-bit fields of `PyLayout`.
    fn offset(&self, section: &str, field: &str) -> Result<u16, DebugOffsetsError> {
        let value = self.get(section, field)?;
        u16::try_from(value)
            .map_err(|_| self.implausible(format!("{section}.{field} = {value:#x}")))
    }

    fn implausible(&self, what: String) -> DebugOffsetsError {
        DebugOffsetsError::Implausible {
            version: self.version,
            free_threaded: self.free_threaded,
            what,
        }
    }

    /// `section.field` plus `width` bytes must lie inside `section.size` (and `limit`, if any).
    fn check_inside(
        &self,
        section: &str,
        fields: &[(&str, u64)],
        limit: Option<u64>,
    ) -> Result<(), DebugOffsetsError> {
        let size = self.get(section, "size")?;
        let bound = limit.map_or(size, |l| l.min(size));
        for &(field, width) in fields {
            let at = self.get(section, field)?;
            if at.checked_add(width).is_none_or(|end| end > bound) {
                return Err(self.implausible(format!(
                    "{section}.{field} = {at} does not fit a {width}-byte field into {bound} bytes"
                )));
            }
        }
        Ok(())
    }
}

/// Decodes `_Py_DebugOffsets` from the first bytes of `_PyRuntime` (at least up to the end of
/// the struct; [`READ_SIZE`] bytes always suffice) into a layout.
pub fn parse(bytes: &[u8]) -> Result<PyLayout, DebugOffsetsError> {
    if bytes.len() < HEADER_BYTES {
        return Err(DebugOffsetsError::TooShort {
            need: HEADER_BYTES,
            got: bytes.len(),
        });
    }
    if &bytes[..8] != COOKIE {
        return Err(DebugOffsetsError::BadCookie {
            found: bytes[..8].to_vec(),
        });
    }
    let hex = u64_at(bytes, 8);
    let free_threaded = u64_at(bytes, 16);
    let known = known_for(hex).ok_or(DebugOffsetsError::UnsupportedVersion { version: hex })?;
    let free_threaded = match free_threaded {
        0 => false,
        1 => true,
        other => {
            return Err(DebugOffsetsError::Implausible {
                version: hex,
                free_threaded: false,
                what: format!("free_threaded = {other}"),
            })
        }
    };
    let need = struct_size(known);
    if bytes.len() < need {
        return Err(DebugOffsetsError::TooShort {
            need,
            got: bytes.len(),
        });
    }
    let mut entries = Vec::with_capacity((need - HEADER_BYTES) / 8);
    let mut at = HEADER_BYTES;
    for &(section, fields) in known.sections {
        for &field in fields {
            entries.push((section, field, u64_at(bytes, at)));
            at += 8;
        }
    }
    let values = Values {
        version: hex,
        free_threaded,
        entries,
    };
    validate(&values, free_threaded)?;
    build(
        PyVersion::from_hex(hex),
        &values,
        &known.facts,
        free_threaded,
    )
}

/// Cheap consistency checks: a struct decoded with the wrong field list (or garbage) fails
/// them instead of yielding offsets that read plausible nonsense.
fn validate(v: &Values, free_threaded: bool) -> Result<(), DebugOffsetsError> {
    v.check_inside("runtime_state", &[("interpreters_head", 8)], None)?;
    v.check_inside(
        "interpreter_state",
        &[("next", 8), ("threads_head", 8)],
        None,
    )?;
    v.check_inside(
        "thread_state",
        &[
            ("next", 8),
            ("interp", 8),
            ("current_frame", 8),
            ("thread_id", 8),
            ("native_thread_id", 8),
            ("datastack_chunk", 8),
        ],
        None,
    )?;
    // The kernel takes all of these from one FRAME_HEADER_BYTES read of the frame.
    v.check_inside(
        "interpreter_frame",
        &[
            ("previous", 8),
            ("executable", 8),
            ("instr_ptr", 8),
            ("owner", 1),
        ],
        Some(FRAME_HEADER_BYTES as u64),
    )?;
    v.check_inside("interpreter_frame", &[("localsplus", 0)], None)?;
    let frame: Vec<u64> = ["previous", "executable", "instr_ptr", "owner"]
        .iter()
        .map(|f| v.get("interpreter_frame", f))
        .collect::<Result<_, _>>()?;
    if (1..frame.len()).any(|i| frame[..i].contains(&frame[i])) {
        return Err(v.implausible(format!("interpreter_frame fields overlap: {frame:?}")));
    }
    v.check_inside(
        "code_object",
        &[
            ("filename", 8),
            ("name", 8),
            ("qualname", 8),
            ("linetable", 8),
            ("firstlineno", 4),
            ("co_code_adaptive", 1),
        ],
        None,
    )?;
    v.check_inside("pyobject", &[("ob_type", 8)], None)?;
    // The flag and the object header must agree: a struct claiming to be free-threaded with a
    // GIL build's header (or garbage) would have every object read at the wrong place.
    let ob_type = v.get("pyobject", "ob_type")?;
    if free_threaded && ob_type < FREE_THREADED_OB_TYPE_MIN {
        return Err(v.implausible(format!(
            "free_threaded = 1, but pyobject.ob_type = {ob_type} leaves no room for a free-threaded object header"
        )));
    }
    if let Ok(tlbc) = v.get("code_object", "co_tlbc") {
        if tlbc != 0 {
            v.check_inside("code_object", &[("co_tlbc", 8)], None)?;
        }
    }
    v.check_inside("type_object", &[("tp_name", 8)], None)?;
    v.check_inside("bytes_object", &[("ob_size", 8), ("ob_sval", 1)], None)?;
    v.check_inside(
        "unicode_object",
        &[("state", 4), ("length", 8), ("asciiobject_size", 0)],
        None,
    )?;
    Ok(())
}

/// Where the GIL is: `interp->ceval.gil` points at the GIL state in use (the interpreter's own
/// `_gil`, or the main interpreter's when shared); the struct gives `locked` and `last_holder`
/// as offsets in the interpreter state, i.e. inside its embedded `_gil` at
/// `gil_runtime_state`, from which their offsets inside any `_gil_runtime_state` follow.
/// Returns (flags, gil_offset, locked, last_holder); no flags when the fields do not describe
/// a GIL inside the interpreter state.
fn gil(v: &Values) -> Result<(u32, u16, u16, u16), DebugOffsetsError> {
    let size = v.get("interpreter_state", "size")?;
    let pointer = v.get("interpreter_state", "ceval_gil")?;
    let base = v.get("interpreter_state", "gil_runtime_state")?;
    let locked = v.get("interpreter_state", "gil_runtime_state_locked")?;
    let holder = v.get("interpreter_state", "gil_runtime_state_holder")?;
    let fits = |at: u64, width: u64| at.checked_add(width).is_some_and(|end| end <= size);
    let inside = |at: u64, width: u64| at >= base && fits(at, width) && at - base < 256;
    if !fits(pointer, 8) || !inside(locked, 4) || !inside(holder, 8) || locked == holder {
        return Ok((0, 0, 0, 0));
    }
    Ok((
        LAYOUT_GIL_INTERP | LAYOUT_GIL_INDIRECT,
        v.offset("interpreter_state", "ceval_gil")?,
        (locked - base) as u16,
        (holder - base) as u16,
    ))
}

fn build(
    version: PyVersion,
    v: &Values,
    facts: &Facts,
    free_threaded: bool,
) -> Result<PyLayout, DebugOffsetsError> {
    let code = CodeLayout {
        filename: v.offset("code_object", "filename")?,
        name: v.offset("code_object", "name")?,
        qualname: v.offset("code_object", "qualname")?,
        linetable: v.offset("code_object", "linetable")?,
        firstlineno: v.offset("code_object", "firstlineno")?,
        code_adaptive: v.offset("code_object", "co_code_adaptive")?,
        // 3.14+ lists `co_tlbc` in every build; only free-threaded ones set it.
        tlbc: match v.get("code_object", "co_tlbc") {
            Ok(_) => v.offset("code_object", "co_tlbc")?,
            Err(_) => 0,
        },
    };
    let ascii_data = v.offset("unicode_object", "asciiobject_size")?;
    let compact_data = match v.get("unicode_object", "compactunicodeobject_size") {
        Ok(_) => v.offset("unicode_object", "compactunicodeobject_size")?,
        Err(_) => {
            let size = u64::from(ascii_data) + COMPACT_UNICODE_EXTRA;
            u16::try_from(size).map_err(|_| {
                v.implausible(format!("unicode_object.asciiobject_size = {ascii_data}"))
            })?
        }
    };
    let state_bits = if free_threaded {
        facts.state_bits_free_threaded
    } else {
        facts.state_bits
    };
    // A free-threaded build has no GIL to test: `--gil` keeps all of its samples (userspace
    // decides that from `free_threaded`; the kernel locates nothing).
    let (gil_flags, gil_offset, gil_locked, gil_last_holder) =
        if free_threaded { (0, 0, 0, 0) } else { gil(v)? };
    let kernel = PyOffsets {
        executable_mask: facts.executable_mask,
        runtime_interpreters_head: v.offset("runtime_state", "interpreters_head")?,
        interp_next: v.offset("interpreter_state", "next")?,
        interp_threads_head: v.offset("interpreter_state", "threads_head")?,
        tstate_next: v.offset("thread_state", "next")?,
        tstate_native_thread_id: v.offset("thread_state", "native_thread_id")?,
        tstate_current_frame: v.offset("thread_state", "current_frame")?,
        cframe_current_frame: 0,
        tstate_datastack_chunk: v.offset("thread_state", "datastack_chunk")?,
        frame_previous: v.offset("interpreter_frame", "previous")?,
        frame_executable: v.offset("interpreter_frame", "executable")?,
        frame_instr_ptr: v.offset("interpreter_frame", "instr_ptr")?,
        frame_owner: v.offset("interpreter_frame", "owner")?,
        code_tag_offset: code_tag_offset(&code),
        tag_deref_ptr: 0,
        flags: gil_flags,
        skip_owner_mask: facts.skip_owner_mask,
        tag_deref_field: 0,
        tstate_interp: v.offset("thread_state", "interp")?,
        gil_offset,
        gil_locked,
        gil_last_holder,
        chunk_previous: CHUNK_PREVIOUS,
        chunk_data: CHUNK_DATA,
        chunk_size: CHUNK_SIZE,
        frame_is_entry: 0,
        _pad1: 0,
        entry_owner_mask: facts.entry_owner_mask,
        _pad2: 0,
    };
    Ok(PyLayout {
        version,
        source: LayoutSource::DebugOffsets,
        free_threaded,
        kernel,
        code,
        bytes: BytesLayout {
            size: v.offset("bytes_object", "ob_size")?,
            data: v.offset("bytes_object", "ob_sval")?,
        },
        unicode: UnicodeLayout {
            length: v.offset("unicode_object", "length")?,
            state: v.offset("unicode_object", "state")?,
            ascii_data,
            compact_data,
            kind_shift: state_bits.kind_shift,
            compact_bit: state_bits.compact_bit,
            ascii_bit: state_bits.ascii_bit,
        },
        chunk: facts.chunk,
        thread: ThreadLayout {
            thread_id: v.offset("thread_state", "thread_id")?,
            interp: v.offset("thread_state", "interp")?,
        },
        ob_type: v.offset("pyobject", "ob_type")?,
        tp_name: v.offset("type_object", "tp_name")?,
        frame_localsplus: v.offset("interpreter_frame", "localsplus")?,
        objects: ObjectLayout {
            code_argcount: v.offset("code_object", "argcount")?,
            code_localsplusnames: v.offset("code_object", "localsplusnames")?,
            code_localspluskinds: v.offset("code_object", "localspluskinds")?,
            tuple_size: v.offset("tuple_object", "ob_size")?,
            tuple_items: v.offset("tuple_object", "ob_item")?,
            float_value: v.offset("float_object", "ob_fval")?,
            long_size: v.offset("long_object", "lv_tag")?,
            long_digits: v.offset("long_object", "ob_digit")?,
            // Every CPython with `_Py_DebugOffsets` (3.13+) tags the size word.
            long_tagged: true,
            // PyCellObject { PyObject_HEAD; ob_ref }.
            cell_ref: v.offset("pyobject", "size")?,
        },
        coroutines: coroutines(v, facts),
        dict: DictLayout {
            ma_keys: v.offset("dict_object", "ma_keys")?,
            ma_values: v.offset("dict_object", "ma_values")?,
            ..facts.dict
        },
        attrs: attrs(v, facts),
    })
}

/// Attribute storage: the struct's offsets where it has them, the minor's facts elsewhere.
/// A struct without `sys.modules` gives `interp_modules` 0: no thread names, sampling as usual.
/// The facts are those of a GIL build's 16-byte object header; a free-threaded build's larger
/// header (`pyobject.size`) moves every field after it by the difference.
fn attrs(v: &Values, facts: &Facts) -> AttrLayout {
    let header = v.offset("pyobject", "size").unwrap_or(GIL_OBJECT_HEADER);
    let moved = |fact: u16| fact.saturating_add(header.saturating_sub(GIL_OBJECT_HEADER));
    let or = |section, field, fact: u16| match v.get(section, field) {
        Ok(_) => v.offset(section, field).unwrap_or(0),
        Err(_) => moved(fact),
    };
    AttrLayout {
        interp_modules: or("interpreter_state", "imports_modules", 0),
        // `PyModuleObject.md_dict` follows the object header.
        module_dict: header,
        type_flags: or("type_object", "tp_flags", facts.attrs.type_flags),
        type_basicsize: or("type_object", "tp_basicsize", facts.attrs.type_basicsize),
        type_dictoffset: or("type_object", "tp_dictoffset", facts.attrs.type_dictoffset),
        heap_type_cached_keys: or(
            "heap_type_object",
            "ht_cached_keys",
            facts.attrs.heap_type_cached_keys,
        ),
        ..facts.attrs
    }
}

/// The async view's fields, when this version's struct has them all and they fit their
/// structs (else `None`: the async view is off, sampling is not affected).
fn coroutines(v: &Values, facts: &Facts) -> Option<CoroutineLayout> {
    v.check_inside(
        "gen_object",
        &[("gi_iframe", 8), ("gi_frame_state", 1)],
        None,
    )
    .ok()?;
    v.check_inside(
        "set_object",
        &[("used", 8), ("table", 8), ("mask", 8)],
        None,
    )
    .ok()?;
    v.check_inside("interpreter_frame", &[("stackpointer", 8)], None)
        .ok()?;
    // `llist_node` has no size: {next, prev}, two pointers.
    if v.get("llist_node", "next").ok()? > 8 {
        return None;
    }
    v.check_inside("long_object", &[("lv_tag", 8), ("ob_digit", 4)], None)
        .ok()?;
    let at = |s, f| v.offset(s, f).ok();
    Some(CoroutineLayout {
        gi_iframe: at("gen_object", "gi_iframe")?,
        gi_frame_state: at("gen_object", "gi_frame_state")?,
        suspended_yield_from: facts.suspended_yield_from,
        stackpointer: at("interpreter_frame", "stackpointer")?,
        yield_from_slot: facts.yield_from_slot,
        set_used: at("set_object", "used")?,
        set_table: at("set_object", "table")?,
        set_mask: at("set_object", "mask")?,
        llist_next: at("llist_node", "next")?,
        long_tag: at("long_object", "lv_tag")?,
        long_digit: at("long_object", "ob_digit")?,
    })
}

/// Synthetic `_Py_DebugOffsets` structs, for tests here and of code fed by these layouts.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    /// A struct of the given shape whose every value is its own index (offset-like, small).
    pub(crate) fn synthetic(
        hex: u64,
        sections: &[Section],
        fill: impl Fn(&str, &str) -> u64,
    ) -> Vec<u8> {
        let mut out = COOKIE.to_vec();
        out.extend_from_slice(&hex.to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes());
        for &(section, fields) in sections {
            for &field in fields {
                out.extend_from_slice(&fill(section, field).to_le_bytes());
            }
        }
        out.resize(READ_SIZE, 0);
        out
    }

    /// Plausible values: sizes large, fields spread out.
    pub(crate) fn plausible(section: &str, field: &str) -> u64 {
        if field == "size" {
            return if section == "interpreter_frame" {
                88
            } else {
                4096
            };
        }
        match (section, field) {
            ("interpreter_frame", "previous") => 8,
            ("interpreter_frame", "executable") => 0,
            ("interpreter_frame", "instr_ptr") => 56,
            ("interpreter_frame", "owner") => 74,
            ("interpreter_frame", _) => 80,
            (_, f) => 8 * (f.len() as u64),
        }
    }

    /// A 3.14 struct as a free-threaded build would fill it: 32-byte object header, `co_tlbc`
    /// set, `tlbc_index` in the frame (3.14t cannot be built here: its values are made up,
    /// its shape and its facts are 3.14's).
    pub(crate) fn free_threaded_314(section: &str, field: &str) -> u64 {
        match (section, field) {
            ("pyobject", "size") => 32,
            ("pyobject", "ob_type") => 24,
            ("code_object", "co_tlbc") => 200,
            ("interpreter_frame", "tlbc_index") => 72,
            _ => plausible(section, field),
        }
    }

    /// The layout of [`free_threaded_314`].
    pub(crate) fn free_threaded_314_layout() -> PyLayout {
        let mut bytes = synthetic(0x030e_0af0, SECTIONS_314, free_threaded_314);
        bytes[16] = 1;
        parse(&bytes).expect("a free-threaded 3.14 struct parses")
    }

    /// `_Py_DebugOffsets` words (version, free_threaded, sections…) as found in the Debian sid
    /// builds of CPython 3.13.18, 3.14.10 and 3.15.2 (x86-64).
    pub(crate) const SID_3_13_18: &[u64] = &[
        0x30d12f0, 0, 283408, 608, 632, 194984, 7272, 7264, 7344, 7400, 7656, 7640, 7648, 16, 7752,
        0, 7768, 7760, 312, 0, 8, 16, 72, 152, 160, 232, 32, 80, 8, 0, 56, 72, 70, 208, 112, 120,
        128, 136, 68, 52, 96, 104, 200, 16, 8, 416, 24, 88, 168, 32, 24, 16, 40, 24, 16, 48, 32,
        40, 24, 16, 32, 16, 24, 40, 16, 32, 64, 32, 16, 40, 240, 200,
    ];
    pub(crate) const SID_3_14_10: &[u64] = &[
        0x30e0af0, 0, 316616, 784, 808, 225864, 7280, 7272, 7344, 7360, 7408, 7688, 7672, 7680, 16,
        7784, 0, 7800, 7792, 7992, 0, 832, 0, 8, 16, 72, 152, 160, 232, 32, 88, 8, 0, 56, 80, 74,
        64, 0, 216, 112, 120, 128, 136, 68, 52, 96, 104, 208, 0, 16, 8, 416, 24, 88, 168, 40, 32,
        16, 40, 24, 16, 200, 24, 40, 32, 48, 32, 40, 24, 16, 32, 16, 24, 40, 16, 32, 64, 32, 16,
        40, 264, 192, 160, 24, 72, 67, 0, 8, 24, 304, 8076, 0, 4, 512,
    ];
    pub(crate) const SID_3_15_2: &[u64] = &[
        0x30f02f0, 0, 346568, 912, 936, 226240, 7272, 7264, 7336, 7352, 7400, 7592, 7576, 7584, 16,
        7736, 0, 7752, 7744, 7944, 0, 888, 0, 8, 16, 72, 80, 88, 96, 176, 184, 256, 32, 36, 40,
        136, 288, 0, 88, 8, 0, 56, 80, 74, 64, 0, 216, 112, 120, 128, 136, 68, 52, 96, 104, 208, 0,
        16, 8, 424, 24, 88, 168, 32, 288, 944, 888, 40, 32, 16, 40, 24, 16, 200, 24, 40, 32, 48,
        32, 40, 24, 16, 32, 16, 24, 40, 16, 32, 64, 32, 16, 40, 56, 176, 112, 120, 1120, 104, 160,
        24, 72, 67, 0, 8, 24, 344, 8028, 0, 4, 512,
    ];

    /// The free-threaded 3.13.15 that `cargo xtask freethreaded` builds (x86-64): the same
    /// shape as 3.13.18's, with a 32-byte object header (`pyobject` {32, 24}) moving every
    /// object field by 16.
    pub(crate) const FT_3_13_15: &[u64] = &[
        0x30d0ff0, 1, 328384, 608, 632, 215616, 7272, 7264, 7344, 7400, 7664, 7648, 7656, 16, 7760,
        0, 7784, 7776, 312, 0, 8, 16, 72, 152, 160, 232, 32, 80, 8, 0, 56, 72, 70, 224, 128, 136,
        144, 152, 84, 68, 112, 120, 216, 32, 24, 432, 40, 104, 184, 48, 40, 32, 56, 40, 32, 64, 48,
        56, 40, 32, 48, 32, 40, 56, 32, 48, 80, 48, 32, 56, 248, 200,
    ];

    pub(crate) fn real(words: &[u64]) -> Vec<u8> {
        let mut out = COOKIE.to_vec();
        for w in words {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.resize(READ_SIZE, 0);
        out
    }

    /// The layouts of the real 3.13–3.15 structs above (the free-threaded 3.13t included),
    /// and of the made-up free-threaded 3.14.
    pub(crate) fn layouts() -> Vec<PyLayout> {
        let mut all: Vec<PyLayout> = [SID_3_13_18, SID_3_14_10, SID_3_15_2, FT_3_13_15]
            .into_iter()
            .map(|words| parse(&real(words)).expect("a real struct parses"))
            .collect();
        all.push(free_threaded_314_layout());
        all
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;

    #[test]
    fn code_field_at_the_top_of_u16_does_not_overflow() {
        // Found by `cargo xtask fuzz debug_offsets`: a 3.15 struct with a `code_object` field
        // at 0xfff8 or above (inside a code object claimed that large) made the end of the
        // tag span, `offset + 8`, overflow u16.
        let input = include_bytes!("../../tests/fixtures/fuzz/debug_offsets-code-field-at-u16-max");
        let _ = parse(input);
    }

    #[test]
    fn every_known_shape_fits_read_size() {
        for k in KNOWN {
            assert!(
                struct_size(k) <= READ_SIZE,
                "3.{} {:#x}",
                k.minor,
                k.from_hex
            );
        }
    }

    #[test]
    fn version_selects_shape() {
        assert!(known_for(0x030d_00a6).is_none());
        assert_eq!(known_for(0x030d_12f0).unwrap().minor, 13);
        assert_eq!(known_for(0x030e_0af0).unwrap().minor, 14);
        assert_eq!(known_for(0x030f_00b3).unwrap().from_hex, 0x030f_00b1);
        assert_eq!(known_for(0x030f_00b4).unwrap().from_hex, 0x030f_00b4);
        assert_eq!(known_for(0x030f_02f0).unwrap().from_hex, 0x030f_00b4);
        assert!(known_for(0x0310_00f0).is_none());
        assert!(known_for(0x030c_01f0).is_none());
    }

    #[test]
    fn errors() {
        assert!(matches!(
            parse(b"short"),
            Err(DebugOffsetsError::TooShort { .. })
        ));
        let mut bytes = synthetic(0x030e_0af0, SECTIONS_314, plausible);
        assert!(parse(&bytes[..100]).is_err());
        bytes[0] = b'X';
        assert!(matches!(
            parse(&bytes),
            Err(DebugOffsetsError::BadCookie { .. })
        ));
        let bytes = synthetic(0x0310_00f0, SECTIONS_315, plausible);
        let err = parse(&bytes).unwrap_err();
        assert!(err.to_string().contains("3.16.0"), "{err}");
        let mut bytes = synthetic(0x030e_0af0, SECTIONS_314, plausible);
        bytes[16] = 2;
        assert!(matches!(
            parse(&bytes),
            Err(DebugOffsetsError::Implausible { .. })
        ));
    }

    #[test]
    fn real_free_threaded_313() {
        let known = known_for(FT_3_13_15[0]).unwrap();
        assert_eq!(known.sections, SECTIONS_313);
        assert_eq!(struct_size(known), COOKIE.len() + 8 * FT_3_13_15.len());
        let l = parse(&real(FT_3_13_15)).unwrap();
        let gil = parse(&real(SID_3_13_18)).unwrap();
        assert!(l.free_threaded && !gil.free_threaded);
        assert_eq!(l.version.to_string(), "3.13.15");
        // The object header is 16 bytes larger: every object field moves by 16 ...
        assert_eq!((l.ob_type, gil.ob_type), (24, 8));
        assert_eq!(l.code.filename, gil.code.filename + 16);
        assert_eq!(l.code.code_adaptive, gil.code.code_adaptive + 16);
        assert_eq!(l.objects.cell_ref, 32);
        assert_eq!((l.unicode.ascii_data, l.unicode.compact_data), (56, 72));
        assert_eq!(l.kernel.code_tag_offset, gil.kernel.code_tag_offset + 16);
        // ... while the thread state and frame offsets are the GIL build's (a
        // `_PyThreadStateImpl` begins with its `PyThreadState`).
        let (k, g) = (l.kernel, gil.kernel);
        assert_eq!(
            (
                k.tstate_next,
                k.tstate_native_thread_id,
                k.tstate_current_frame
            ),
            (
                g.tstate_next,
                g.tstate_native_thread_id,
                g.tstate_current_frame
            )
        );
        assert_eq!(
            (k.frame_previous, k.frame_owner),
            (g.frame_previous, g.frame_owner)
        );
        // No GIL to test, no per-thread bytecode before 3.14, the GIL build's unicode bits.
        assert_eq!(k.flags & profiler_common::LAYOUT_GIL_MASK, 0);
        assert_eq!(l.code.tlbc, 0);
        assert_eq!(l.unicode.kind_shift, 2);
    }

    #[test]
    fn free_threaded_builds() {
        for (hex, sections) in [(0x030e_0af0u64, SECTIONS_314), (0x030f_02f0, SECTIONS_315)] {
            let mut bytes = synthetic(hex, sections, free_threaded_314);
            bytes[16] = 1;
            let l = parse(&bytes).unwrap();
            assert!(l.free_threaded);
            assert_eq!(l.code.tlbc, 200);
            assert_eq!(l.objects.cell_ref, 32);
            // `interned` is a byte of its own: the bit-fields start at bit 8.
            let u = l.unicode;
            assert_eq!((u.kind_shift, u.compact_bit, u.ascii_bit), (8, 11, 12));
            // No GIL to test.
            assert_eq!(l.kernel.flags & profiler_common::LAYOUT_GIL_MASK, 0);
            // The same values announced as a GIL build keep the GIL build's facts.
            bytes[16] = 0;
            let l = parse(&bytes).unwrap();
            assert!(!l.free_threaded);
            assert_eq!(l.unicode.kind_shift, 2);
        }
        // A struct claiming to be free-threaded with a GIL build's object header is refused.
        let mut bytes = synthetic(0x030e_0af0, SECTIONS_314, |s, f| match (s, f) {
            ("pyobject", "size") => 16,
            ("pyobject", "ob_type") => 8,
            _ => free_threaded_314(s, f),
        });
        bytes[16] = 1;
        let err = parse(&bytes).unwrap_err();
        assert!(
            err.to_string().contains("free-threaded object header"),
            "{err}"
        );
        // `co_tlbc` outside the code object.
        let mut bytes = synthetic(0x030e_0af0, SECTIONS_314, |s, f| match (s, f) {
            ("code_object", "co_tlbc") => 5000,
            _ => free_threaded_314(s, f),
        });
        bytes[16] = 1;
        assert!(matches!(
            parse(&bytes),
            Err(DebugOffsetsError::Implausible { .. })
        ));
    }

    #[test]
    fn picks_fields_by_name() {
        for (hex, sections) in [
            (0x030d_12f0u64, SECTIONS_313),
            (0x030e_0af0, SECTIONS_314),
            (0x030f_00b2, SECTIONS_315_PRE_B4),
            (0x030f_02f0, SECTIONS_315),
        ] {
            let bytes = synthetic(hex, sections, |s, f| match (s, f) {
                ("thread_state", "native_thread_id") => 184,
                ("runtime_state", "interpreters_head") => 936,
                _ => plausible(s, f),
            });
            let layout = parse(&bytes).unwrap();
            assert_eq!(layout.kernel.tstate_native_thread_id, 184);
            assert_eq!(layout.kernel.runtime_interpreters_head, 936);
            assert_eq!(layout.kernel.frame_owner, 74);
        }
    }

    #[test]
    fn wrong_shape_is_implausible() {
        // A 3.15.0b4+ struct announced as 3.15.0b3: every later field is read 8 bytes early.
        let bytes = synthetic(0x030f_00b3, SECTIONS_315, |s, f| match (s, f) {
            ("interpreter_frame", "size") => 88,
            (_, "size") => 900,
            ("interpreter_frame", "previous") => 8,
            ("interpreter_frame", "executable") => 0,
            ("interpreter_frame", "instr_ptr") => 56,
            ("interpreter_frame", "owner") => 74,
            ("interpreter_frame", _) => 80,
            _ => 200,
        });
        assert!(matches!(
            parse(&bytes),
            Err(DebugOffsetsError::Implausible { .. })
        ));
    }

    #[test]
    fn async_objects_come_from_314_on() {
        assert_eq!(parse(&real(SID_3_13_18)).unwrap().coroutines, None);
        let o = parse(&real(SID_3_14_10)).unwrap().coroutines.unwrap();
        assert_eq!((o.suspended_yield_from, o.yield_from_slot), (-1, 1));
        assert!(o.gi_iframe > o.gi_frame_state && o.stackpointer > 0);
        let o = parse(&real(SID_3_15_2)).unwrap().coroutines.unwrap();
        assert_eq!((o.suspended_yield_from, o.yield_from_slot), (2, 2));
    }

    /// What finding `threading` thread names reads: `sys.modules` and the type flags from the
    /// struct, and from 3.15 the type sizes and shared keys too (the facts of 3.13 and 3.14
    /// say the same for those builds; `ht_cached_keys` moved in 3.15, as measured in sid's
    /// 3.13.18, 3.14.10 and 3.15.2).
    #[test]
    fn attribute_layouts_from_the_struct_and_the_facts() {
        for (words, modules, cached_keys) in [
            (SID_3_13_18, 7656, 880),
            (SID_3_14_10, 7688, 880),
            (SID_3_15_2, 7592, 888),
        ] {
            let l = parse(&real(words)).unwrap();
            let a = l.attrs;
            assert_eq!(a.interp_modules, modules, "{}", l.version);
            assert_eq!(a.heap_type_cached_keys, cached_keys, "{}", l.version);
            assert_eq!((a.type_flags, a.type_basicsize), (168, 32), "{}", l.version);
            assert_eq!((a.inline_values_flag, a.managed_dict), (1 << 2, -24));
            assert_eq!(
                (l.dict.ma_keys, l.dict.ma_values, l.dict.values_items),
                (32, 40, 8)
            );
        }
    }

    #[test]
    fn real_structs() {
        for (words, shape) in [
            (SID_3_13_18, SECTIONS_313),
            (SID_3_14_10, SECTIONS_314),
            (SID_3_15_2, SECTIONS_315),
        ] {
            let known = known_for(words[0]).unwrap();
            assert_eq!(known.sections, shape);
            // The field list accounts for every word of the struct, no more, no less.
            assert_eq!(struct_size(known), COOKIE.len() + 8 * words.len());
        }
        // What the struct does not list comes out as the headers say for GIL builds:
        // PyCellObject.ob_ref after a 16-byte header, PyCompactUnicodeObject 56 bytes.
        for words in [SID_3_13_18, SID_3_14_10, SID_3_15_2] {
            let l = parse(&real(words)).unwrap();
            assert!(!l.free_threaded);
            assert_eq!((l.objects.cell_ref, l.unicode.compact_data), (16, 56));
            assert_eq!(l.code.tlbc, 0);
        }
        let l = parse(&real(SID_3_14_10)).unwrap();
        assert_eq!(l.version.to_string(), "3.14.10");
        let k = l.kernel;
        assert_eq!(
            (
                k.runtime_interpreters_head,
                k.interp_next,
                k.interp_threads_head
            ),
            (808, 7272, 7344)
        );
        assert_eq!(
            (
                k.tstate_next,
                k.tstate_native_thread_id,
                k.tstate_current_frame,
                k.tstate_datastack_chunk
            ),
            (8, 160, 72, 232)
        );
        assert_eq!(
            (
                k.frame_previous,
                k.frame_executable,
                k.frame_instr_ptr,
                k.frame_owner
            ),
            (8, 0, 56, 74)
        );
        assert_eq!((k.skip_owner_mask, k.executable_mask), (0b11000, !3));
        assert_eq!(
            (
                l.code.code_adaptive,
                l.frame_localsplus,
                l.unicode.compact_data
            ),
            (208, 80, 56)
        );

        assert_eq!(
            (
                k.flags,
                k.gil_offset,
                k.gil_locked,
                k.gil_last_holder,
                k.tstate_interp
            ),
            (LAYOUT_GIL_INTERP | LAYOUT_GIL_INDIRECT, 16, 16, 8, 16)
        );

        let l = parse(&real(SID_3_15_2)).unwrap();
        assert_eq!(l.version.to_string(), "3.15.2");
        let k = l.kernel;
        assert_eq!(
            (
                k.runtime_interpreters_head,
                k.interp_next,
                k.interp_threads_head
            ),
            (936, 7264, 7336)
        );
        assert_eq!(
            (
                k.tstate_next,
                k.tstate_native_thread_id,
                k.tstate_current_frame,
                k.tstate_datastack_chunk
            ),
            (8, 184, 72, 256)
        );
        assert_eq!((l.thread.thread_id, l.thread.interp), (176, 16));
        assert_eq!(
            (k.frame_owner, k.skip_owner_mask, k.code_tag_offset),
            (74, 0b1000, 88)
        );
        assert_eq!((k.gil_offset, k.gil_locked, k.gil_last_holder), (16, 16, 8));
        assert_eq!(
            (l.tp_name, l.unicode.ascii_data, l.unicode.compact_data),
            (24, 40, 56)
        );

        // The same bytes announced as a pre-b4 3.15 are misread by one word and refused.
        let mut pre_b4 = SID_3_15_2.to_vec();
        pre_b4[0] = 0x030f_00b3;
        assert!(matches!(
            parse(&real(&pre_b4)),
            Err(DebugOffsetsError::Implausible { .. })
        ));
    }

    /// Words that break arithmetic on offsets and sizes.
    fn hostile_word(rng: &mut fastrand::Rng, honest: u64) -> u64 {
        match rng.u8(0..6) {
            0 => honest,
            1 => u64::MAX - rng.u64(0..16),
            2 => rng.u64(..),
            3 => rng.u64(0..512),
            4 => 1 << rng.u32(0..64),
            _ => 0,
        }
    }

    #[test]
    fn hostile_structs_never_panic() {
        let mut rng = fastrand::Rng::with_seed(0x5eed);
        for k in KNOWN {
            let honest = synthetic(k.from_hex, k.sections, plausible);
            for _ in 0..5000 {
                let mut bytes = honest.clone();
                for word in bytes[HEADER_BYTES..].chunks_exact_mut(8) {
                    if rng.u8(0..8) == 0 {
                        let was = u64::from_le_bytes(word.try_into().unwrap());
                        word.copy_from_slice(&hostile_word(&mut rng, was).to_le_bytes());
                    }
                }
                let cut = rng.usize(0..=bytes.len());
                let _ = parse(&bytes);
                let _ = parse(&bytes[..cut]);
            }
        }
    }
}
