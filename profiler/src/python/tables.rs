//! Built-in layouts for CPython 3.11 and 3.12, which carry no `_Py_DebugOffsets`.
//!
//! Every number below was derived from the headers of that minor (`pycore_frame.h`,
//! `cpython/code.h`, `cpython/pystate.h`, `pycore_interp.h`, `pycore_runtime.h`,
//! `cpython/unicodeobject.h`, `cpython/bytesobject.h`) for x86-64 / aarch64 LP64 builds with the
//! GIL, and is checked against live interpreters by `tests/tests/layouts.rs`.
//! Internal structs of a released minor do not change between micro versions.

use profiler_common::{
    PyOffsets, LAYOUT_CFRAME, LAYOUT_GIL_INDIRECT, LAYOUT_GIL_INTERP, LAYOUT_GIL_RUNTIME,
};

use super::layout::{
    AttrLayout, BytesLayout, ChunkLayout, CodeLayout, DictLayout, LayoutSource, ObjectLayout,
    PyLayout, PyVersion, ThreadLayout, UnicodeLayout,
};

/// `_PyInterpreterFrame.owner` values (`enum _frameowner`) for 3.11: THREAD=0, GENERATOR=1,
/// FRAME_OBJECT=2. 3.11 has no shim frames (entry frames are marked by a flag, `is_entry`), so
/// no owner is skipped.
const SKIP_OWNERS_311: u32 = 0;
/// 3.12 adds FRAME_OWNED_BY_CSTACK=3: the entry frame `_PyEval_EvalFrameDefault` keeps on the
/// C stack, whose `f_code` is the interpreter's trampoline code object, not Python code.
const SKIP_OWNERS_312: u32 = 1 << 3;
/// The same CSTACK frames mark where each eval-loop call's Python frames begin.
const ENTRY_OWNERS_312: u32 = 1 << 3;

/// `_PyStackChunk` { previous; size (bytes); top (in `PyObject *` slots); data[] } — the same
/// in 3.11 through 3.15.
pub(crate) const STACK_CHUNK: ChunkLayout = ChunkLayout { top: 16 };
/// `_PyStackChunk.previous`, `.size` and `.data`: the same in every version
/// (`pycore_pystate.h`).
pub(crate) const CHUNK_PREVIOUS: u16 = 0;
pub(crate) const CHUNK_SIZE: u16 = 8;
pub(crate) const CHUNK_DATA: u16 = 24;

/// `struct _gil_runtime_state` { interval (unsigned long, 0); last_holder (8); locked (int, 16);
/// switch_number; cond; mutex; ... } — the same in 3.11 and 3.12 GIL builds.
const GIL_LAST_HOLDER: u16 = 8;
const GIL_LOCKED: u16 = 16;

/// Start of the code-object span folded into a frame's tag: it ends with `co_linetable` and
/// reaches back over `co_filename`, `co_name`, `co_qualname` and, from 3.12 on, `co_version`
/// (a counter stamped on every code object created), so a new code object at a freed one's
/// address gets a new tag even when its strings reuse the old addresses too.
pub(crate) fn code_tag_offset(code: &CodeLayout) -> u16 {
    let fields = [code.filename, code.name, code.qualname, code.linetable];
    // Saturating: `_Py_DebugOffsets` from a target may put a field at 0xfff8 or above (found
    // by `cargo xtask fuzz debug_offsets`); such a layout reads garbage but must not panic.
    let hi = fields
        .iter()
        .copied()
        .max()
        .unwrap_or(code.filename)
        .saturating_add(8);
    // Never before the object header (refcount, type, size).
    hi.saturating_sub(profiler_common::CODE_TAG_BYTES as u16)
        .max(24)
}

/// The layout of a CPython 3.11 or 3.12 build, or `None` for any other minor.
/// Objects as 3.11 and 3.12 lay them out: `co_argcount` moved, the names and kinds sit just
/// before `co_filename` in both; 3.12 tagged the int's size word (`lv_tag`).
const OBJECTS_311: ObjectLayout = ObjectLayout {
    code_argcount: 56,
    code_localsplusnames: 96,
    code_localspluskinds: 104,
    tuple_size: 16,
    tuple_items: 24,
    float_value: 16,
    long_size: 16,
    long_digits: 24,
    long_tagged: false,
    cell_ref: 16,
};
const OBJECTS_312: ObjectLayout = ObjectLayout {
    code_argcount: 52,
    long_tagged: true,
    ..OBJECTS_311
};

/// `PyDictObject` { PyObject_HEAD; ma_used; ma_version_tag; ma_keys (32); ma_values (40) } and
/// `PyDictKeysObject` { dk_refcnt; dk_log2_size (8); dk_log2_index_bytes (9); dk_kind (10);
/// dk_version (12); dk_usable (16); dk_nentries (24); dk_indices (32) }, the same in 3.11 and
/// 3.12 (and, in GIL builds, 3.13 to 3.15: `debug_offsets` uses these keys offsets too).
/// `PyDictValues` is { PyObject *values[] } before 3.13.
pub(crate) const DICT_311: DictLayout = DictLayout {
    ma_keys: 32,
    ma_values: 40,
    keys_log2_size: 8,
    keys_log2_index_bytes: 9,
    keys_kind: 10,
    keys_nentries: 24,
    keys_indices: 32,
    values_items: 0,
};

/// `PyTypeObject`: tp_basicsize (32), tp_flags (168), tp_dictoffset (288), in every GIL build
/// of 3.11 to 3.15. `Py_TPFLAGS_MANAGED_DICT` is `1 << 4` from 3.11 on.
pub(crate) const TYPE_BASICSIZE: u16 = 32;
pub(crate) const TYPE_FLAGS: u16 = 168;
pub(crate) const TYPE_DICTOFFSET: u16 = 288;
pub(crate) const MANAGED_DICT_FLAG: u64 = 1 << 4;
/// `MANAGED_DICT_OFFSET`: `-3 * sizeof(PyObject *)` in GIL builds (3.11 to 3.15).
pub(crate) const MANAGED_DICT: i16 = -24;

/// Attributes as 3.11 keeps them: `_PyObject_ValuesPointer` is the word at -32 (a
/// `PyDictValues *`, NULL once a dict took over), `_PyObject_ManagedDictPointer` the one at
/// -24. `PyHeapTypeObject.ht_cached_keys` follows `PyTypeObject` (408 bytes) and the five
/// method suites and three pointers (464 bytes): 872. `sys.modules` is
/// `PyInterpreterState.modules` (888).
const ATTRS_311: AttrLayout = AttrLayout {
    interp_modules: 888,
    module_dict: 16,
    type_flags: TYPE_FLAGS,
    type_basicsize: TYPE_BASICSIZE,
    type_dictoffset: TYPE_DICTOFFSET,
    heap_type_cached_keys: 872,
    managed_dict_flag: MANAGED_DICT_FLAG,
    managed_dict: MANAGED_DICT,
    values_pointer: -32,
    dict_tags_values: false,
    inline_values_flag: 0,
    values_valid: 0,
};
/// 3.12: one slot at -24 holds the dict or, tagged with its low bit, the values
/// (`PyDictOrValues`); `PyTypeObject` grew `tp_watched` (416 bytes): `ht_cached_keys` at 880.
/// `sys.modules` is `PyInterpreterState.imports.modules` (944).
const ATTRS_312: AttrLayout = AttrLayout {
    interp_modules: 944,
    heap_type_cached_keys: 880,
    values_pointer: 0,
    dict_tags_values: true,
    ..ATTRS_311
};

pub fn builtin(version: PyVersion) -> Option<PyLayout> {
    match (version.major, version.minor) {
        (3, 11) => Some(layout_311(version)),
        (3, 12) => Some(layout_312(version)),
        _ => None,
    }
}

fn layout_311(version: PyVersion) -> PyLayout {
    // PyCodeObject: PyObject_VAR_HEAD (24), co_consts, co_names, co_exceptiontable (48),
    // co_flags, co_warmup, co_linearray_entry_size, co_argcount, co_posonlyargcount,
    // co_kwonlyargcount, co_stacksize, co_firstlineno (72), ...,
    // co_localsplusnames (96), co_localspluskinds, co_filename (112), co_name, co_qualname,
    // co_linetable (136), co_weakreflist, _co_code, _co_linearray, _co_firsttraceable,
    // co_extra, co_code_adaptive (184).
    let code = CodeLayout {
        filename: 112,
        name: 120,
        qualname: 128,
        linetable: 136,
        firstlineno: 72,
        code_adaptive: 184,
        tlbc: 0,
    };
    PyLayout {
        version,
        source: LayoutSource::BuiltinTable,
        free_threaded: false,
        kernel: PyOffsets {
            executable_mask: u64::MAX,
            // _PyRuntimeState: _initialized .. initialized (5 ints), _finalizing (24),
            // interpreters { mutex (32), head (40), main, next_id }
            runtime_interpreters_head: 40,
            // PyInterpreterState (struct _is): next (0), threads { next_unique_id (8), head (16) }
            interp_next: 0,
            interp_threads_head: 16,
            // PyThreadState: prev (0), next (8), interp (16), _initialized, _static,
            // recursion_remaining, recursion_limit, recursion_headroom, tracing, tracing_what
            // (7 ints), cframe (56), ..., thread_id (152), native_thread_id (160), ...,
            // trace_info, datastack_chunk (296)
            tstate_next: 8,
            tstate_native_thread_id: 160,
            tstate_current_frame: 56,
            // _PyCFrame: use_tracing (uint8_t, 0), current_frame (8), previous (16)
            cframe_current_frame: 8,
            tstate_datastack_chunk: 296,
            // _PyInterpreterFrame: f_func (0), f_globals, f_builtins, f_locals, f_code (32),
            // frame_obj (40), previous (48), prev_instr (56), stacktop (int, 64),
            // is_entry (bool, 68), owner (char, 69), localsplus (72)
            frame_previous: 48,
            frame_executable: 32,
            frame_instr_ptr: 56,
            frame_owner: 69,
            code_tag_offset: code_tag_offset(&code),
            // 3.11 code objects carry no creation counter: fold in co_qualname's hash
            // (PyASCIIObject.hash at 24).
            tag_deref_ptr: code.qualname,
            flags: LAYOUT_CFRAME | LAYOUT_GIL_RUNTIME,
            skip_owner_mask: SKIP_OWNERS_311,
            tag_deref_field: 24,
            tstate_interp: 16,
            // One GIL per process, embedded in the runtime: _PyRuntimeState.ceval
            // (struct _ceval_runtime_state { signals_pending; gil }) .gil at 360.
            gil_offset: 360,
            gil_locked: GIL_LOCKED,
            gil_last_holder: GIL_LAST_HOLDER,
            chunk_previous: CHUNK_PREVIOUS,
            chunk_data: CHUNK_DATA,
            chunk_size: CHUNK_SIZE,
            // is_entry (bool, 68) marks the first frame of each eval-loop call.
            frame_is_entry: 68,
            _pad1: 0,
            entry_owner_mask: 0,
            _pad2: 0,
        },
        code,
        // PyBytesObject: PyObject_VAR_HEAD (ob_size at 16), ob_shash (24), ob_sval (32)
        bytes: BytesLayout { size: 16, data: 32 },
        // PyASCIIObject: PyObject_HEAD, length (16), hash (24), state (32), wstr (40): 48 bytes;
        // PyCompactUnicodeObject adds utf8_length, utf8, wstr_length: 72 bytes.
        // state: interned:2, kind:3, compact:1, ascii:1, ready:1.
        unicode: UnicodeLayout {
            length: 16,
            state: 32,
            ascii_data: 48,
            compact_data: 72,
            kind_shift: 2,
            compact_bit: 5,
            ascii_bit: 6,
        },
        chunk: STACK_CHUNK,
        thread: ThreadLayout {
            thread_id: 152,
            interp: 16,
        },
        ob_type: 8,
        tp_name: 24,
        frame_localsplus: 72,
        objects: OBJECTS_311,
        coroutines: None,
        dict: DICT_311,
        attrs: ATTRS_311,
    }
}

fn layout_312(version: PyVersion) -> PyLayout {
    // PyCodeObject: PyObject_VAR_HEAD, co_consts, co_names, co_exceptiontable, co_flags,
    // co_argcount, co_posonlyargcount, co_kwonlyargcount, co_stacksize, co_firstlineno (68),
    // co_localsplusnames (96), co_localspluskinds (104), co_filename (112), co_name,
    // co_qualname, co_linetable (136), co_weakreflist, _co_cached,
    // _co_instrumentation_version, _co_monitoring, _co_firsttraceable, co_extra,
    // co_code_adaptive (192).
    let code = CodeLayout {
        filename: 112,
        name: 120,
        qualname: 128,
        linetable: 136,
        firstlineno: 68,
        code_adaptive: 192,
        tlbc: 0,
    };
    PyLayout {
        version,
        source: LayoutSource::BuiltinTable,
        free_threaded: false,
        kernel: PyOffsets {
            executable_mask: u64::MAX,
            // _PyRuntimeState: as in 3.11, interpreters.head at 40
            runtime_interpreters_head: 40,
            // PyInterpreterState: next (0), id, id_refcount, requires_idref, id_mutex,
            // _initialized, finalizing, monitoring_version, last_restart_version,
            // threads { next_unique_id (64), head (72), count, stacksize }
            interp_next: 0,
            interp_threads_head: 72,
            // PyThreadState: prev, next (8), interp (16), _status (bit-field word),
            // py_recursion_remaining, py_recursion_limit, c_recursion_remaining,
            // recursion_headroom, tracing, what_event, cframe (56), ..., thread_id (136),
            // native_thread_id (144), ..., datastack_chunk (232)
            tstate_next: 8,
            tstate_native_thread_id: 144,
            tstate_current_frame: 56,
            // _PyCFrame: current_frame (0), previous (8)
            cframe_current_frame: 0,
            tstate_datastack_chunk: 232,
            // _PyInterpreterFrame: f_code (0), previous (8), f_funcobj, f_globals, f_builtins,
            // f_locals, frame_obj (48), prev_instr (56), stacktop (int, 64),
            // return_offset (uint16_t, 68), owner (char, 70), localsplus (72)
            frame_previous: 8,
            frame_executable: 0,
            frame_instr_ptr: 56,
            frame_owner: 70,
            code_tag_offset: code_tag_offset(&code),
            tag_deref_ptr: 0,
            // PyInterpreterState.ceval (struct _ceval_state) .gil: a pointer to the GIL in use,
            // the interpreter's own `_gil` (at 1040) or, for a subinterpreter sharing it, the
            // main interpreter's.
            flags: LAYOUT_CFRAME | LAYOUT_GIL_INTERP | LAYOUT_GIL_INDIRECT,
            skip_owner_mask: SKIP_OWNERS_312,
            tag_deref_field: 0,
            tstate_interp: 16,
            gil_offset: 384,
            gil_locked: GIL_LOCKED,
            gil_last_holder: GIL_LAST_HOLDER,
            chunk_previous: CHUNK_PREVIOUS,
            chunk_data: CHUNK_DATA,
            chunk_size: CHUNK_SIZE,
            frame_is_entry: 0,
            _pad1: 0,
            entry_owner_mask: ENTRY_OWNERS_312,
            _pad2: 0,
        },
        code,
        bytes: BytesLayout { size: 16, data: 32 },
        // PyASCIIObject lost `wstr` in 3.12: length (16), hash (24), state (32): 40 bytes;
        // PyCompactUnicodeObject adds utf8_length, utf8: 56 bytes.
        // state: interned:2, kind:3, compact:1, ascii:1, statically_allocated:1.
        unicode: UnicodeLayout {
            length: 16,
            state: 32,
            ascii_data: 40,
            compact_data: 56,
            kind_shift: 2,
            compact_bit: 5,
            ascii_bit: 6,
        },
        chunk: STACK_CHUNK,
        thread: ThreadLayout {
            thread_id: 136,
            interp: 16,
        },
        ob_type: 8,
        tp_name: 24,
        frame_localsplus: 72,
        objects: OBJECTS_312,
        coroutines: None,
        dict: DICT_311,
        attrs: ATTRS_312,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::FRAME_HEADER_BYTES;

    #[test]
    fn only_311_and_312() {
        for (hex, some) in [
            (0x030b02f0, true),
            (0x030b07f0, true),
            (0x030c01f0, true),
            (0x030a0df0, false),
            (0x030d00f0, false),
        ] {
            assert_eq!(
                builtin(PyVersion::from_hex(hex)).is_some(),
                some,
                "{hex:#x}"
            );
        }
    }

    #[test]
    fn frame_fields_fit_one_header_read() {
        for hex in [0x030b07f0, 0x030c01f0] {
            let k = builtin(PyVersion::from_hex(hex)).unwrap().kernel;
            for off in [k.frame_previous, k.frame_executable, k.frame_instr_ptr] {
                assert!(usize::from(off) + 8 <= FRAME_HEADER_BYTES);
            }
            assert!(usize::from(k.frame_owner) < FRAME_HEADER_BYTES);
            // The kernel reads `is_entry` out of the owner's word.
            if k.frame_is_entry != 0 {
                assert_eq!(k.frame_is_entry / 8, k.frame_owner / 8);
            }
            assert_eq!(k.code_tag_offset, 88);
        }
    }
}
