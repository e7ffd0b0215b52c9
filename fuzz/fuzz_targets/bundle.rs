//! An OCI bundle's `config.json`: the annotations that place a container in a pod (CRI-O and
//! podman's `io.kubernetes.pod.*`, containerd's `io.kubernetes.cri.*`), parsed with serde.
#![no_main]

use libfuzzer_sys::fuzz_target;
use profiler::fuzzing::{bundle_kubernetes, MAX_IDENTITY_VALUE};

fuzz_target!(|data: &[u8]| {
    let Some(k) = bundle_kubernetes(data) else {
        return;
    };
    for value in [&k.namespace, &k.pod, &k.pod_uid, &k.container].into_iter().flatten() {
        assert!(!value.is_empty(), "an empty annotation is no value");
        assert!(value.len() <= MAX_IDENTITY_VALUE, "values are cut");
        assert_eq!(value.trim(), value, "values are trimmed");
    }
});
