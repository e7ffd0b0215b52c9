//! `/proc/PID/maps` lines.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // `read_maps` reads the file with `read_to_string`: non-UTF-8 never reaches the parser.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for line in text.lines() {
        let _ = profiler::fuzzing::parse_maps_line(line);
    }
});
