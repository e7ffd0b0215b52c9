//! `.AsyncioDebug` (3.14+): the section lookup in an ELF file (`section_bytes_in`), the
//! parsing and checks of `_Py_AsyncioModuleDebugOffsets` (`AsyncOffsets::parse`), and their
//! combination with each interpreter layout (`AsyncLayout::new`).
//! The input is tried both as an ELF file and as the section's contents.
#![no_main]

use libfuzzer_sys::fuzz_target;
use profiler::python::asyncio::{section_bytes_in, AsyncLayout, AsyncOffsets};

fn offsets(bytes: &[u8]) {
    if let Ok(offsets) = AsyncOffsets::parse(bytes) {
        for layout in pyebpf_fuzz::layouts() {
            if let Ok(a) = AsyncLayout::new(offsets, layout) {
                let _ = a.coro_frame(pyebpf_fuzz::ARENA);
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    offsets(data);
    if let Ok(Some(section)) = section_bytes_in(data) {
        assert!(section.len() <= 4096, "the section read is capped");
        offsets(&section);
    }
});
