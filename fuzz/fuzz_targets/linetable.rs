//! The 3.11+ location table decoder: `co_linetable` bytes as a target holds them.
//! Input: `co_firstlineno` (4 bytes, little-endian), then the table.
#![no_main]

use libfuzzer_sys::fuzz_target;
use profiler::python::linetable::LineTable;

fuzz_target!(|data: &[u8]| {
    let Some((first, table)) = data.split_first_chunk::<4>() else {
        return;
    };
    let table = LineTable::parse(table, u32::from_le_bytes(*first));
    let units = table.len_code_units();
    // Every instruction, the edges and past the end: lookups must be total.
    for lasti in (0..units.min(4096)).chain([units, units.saturating_add(1), u32::MAX]) {
        let _ = table.line_at(lasti);
    }
});
