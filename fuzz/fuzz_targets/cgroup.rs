//! `/proc/PID/cgroup`: the container id, its runtime and the pod UID.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let found = profiler::identity::parse_cgroup(&text);
    if let Some(id) = &found.container_id {
        assert_eq!(id.len(), 64, "a container id is 64 hex digits");
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        let _ = profiler::identity::short_id(id);
    }
    if let Some(uid) = &found.pod_uid {
        assert!(uid.len() == 36 || uid.len() == 32, "a pod UID is a UUID or 32 hex digits");
        assert!(uid.bytes().all(|b| b == b'-' || (b.is_ascii_hexdigit() && !b.is_ascii_uppercase())));
    }
    if found.runtime.is_some() {
        assert!(found.container_id.is_some(), "a runtime only with a container");
    }
});
