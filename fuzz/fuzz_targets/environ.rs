//! `/proc/PID/environ`: the variables that name a service, and the service name derived
//! from them (`OTEL_RESOURCE_ATTRIBUTES` percent-decoding included).
//! Input: one byte (bit 0: the read was cut at the cap), then the file.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, environ)) = data.split_first() else {
        return;
    };
    let _ = profiler::fuzzing::environ_service_name(environ, flags & 1 != 0);
});
