//! `_Py_DebugOffsets` parsing and validation: the first bytes of a target's `_PyRuntime`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = profiler::python::debug_offsets::parse(data);
});
