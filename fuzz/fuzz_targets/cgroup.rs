//! `/proc/PID/cgroup`: the container id.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Some(id) = profiler::identity::container_id_from_cgroup(&text) {
        assert_eq!(id.len(), 64, "a container id is 64 hex digits");
        let _ = profiler::identity::short_id(&id);
    }
});
