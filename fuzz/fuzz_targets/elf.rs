//! ELF parsing for `_PyRuntime` (`.PyRuntime`, or the symbol), `Py_Version` and the
//! frame-pointer prologues: a binary found through `/proc/PID/root`, whatever it holds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = profiler::elf::parse_bytes(data);
});
