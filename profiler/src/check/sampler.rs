//! Whether the real BPF programs load and attach here: found out by starting the sampler
//! `record` uses, letting it run for a moment and dropping it. Kernel versions, configs and
//! verifiers differ too much for anything short of that to be the truth.

use std::time::{Duration, Instant};

use super::{one_line, Fact};
use crate::bpf::Sampler;

/// Fast enough that every CPU's perf event fires within the wait below (the first sample of a
/// frequency-based event comes one period after it is enabled), cheap for so short a time.
const PROBE_RATE_HZ: u64 = 100;
/// How long to wait for the first sample before calling the sampler dead.
const PROBE_WAIT: Duration = Duration::from_secs(1);

const ID: &str = "bpf_programs";

/// The one call into the loader, so that a change to `Sampler::start` touches one line here.
fn start_sampler() -> anyhow::Result<Sampler> {
    Sampler::start(PROBE_RATE_HZ)
}

pub(super) fn load_and_attach() -> Fact {
    let started = Instant::now();
    let sampler = match start_sampler() {
        Ok(s) => s,
        Err(err) => {
            return Fact::fail(
                ID,
                format!(
                    "the BPF programs do not load and attach here: {}",
                    one_line(&err)
                ),
                fix_for(&err),
            )
        }
    };
    let loaded = started.elapsed();
    // The programs are attached; proof that the kernel runs them is a sample counted.
    let waited = Instant::now();
    let mut events = 0;
    while waited.elapsed() < PROBE_WAIT {
        std::thread::sleep(Duration::from_millis(20));
        events = sampler.stats().events;
        if events > 0 {
            break;
        }
    }
    drop(sampler);
    if events == 0 {
        return Fact::fail(
            ID,
            format!(
                "the BPF programs loaded and attached, but the sampler did not run once in {} ms",
                PROBE_WAIT.as_millis()
            ),
            "the kernel delivers no cpu-clock perf events: check `perf stat -e cpu-clock -a sleep 1`",
        );
    }
    Fact::ok(
        ID,
        format!(
            "the BPF programs load, attach and run here (loaded in {} ms, first samples after {} ms)",
            loaded.as_millis(),
            waited.elapsed().as_millis()
        ),
    )
}

/// What to do about a sampler that did not start, from the error itself.
fn fix_for(err: &anyhow::Error) -> String {
    let denied = err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .and_then(|io| io.raw_os_error())
            .is_some_and(|code| code == libc::EPERM || code == libc::EACCES)
    }) || one_line(err).contains("Operation not permitted");
    if denied {
        let missing = crate::privileges::missing();
        if !missing.is_empty() {
            return format!(
                "grant the missing capabilities ({}): {}",
                missing.join(", "),
                crate::privileges::fix()
            );
        }
        return "the kernel refused although pyebpf has its capabilities: see the lockdown line, \
                and whether a security module (SELinux, AppArmor) or a container denies bpf()"
            .to_string();
    }
    if let Some(refused) = err
        .chain()
        .find_map(|e| e.downcast_ref::<crate::bpf::LoadError>())
    {
        return match &refused.log_file {
            Some(path) => format!(
                "the verifier refused it on this kernel: please report it with the full verifier \
                 log ({}) and `uname -r`",
                path.display()
            ),
            None => "the verifier refused it on this kernel: please report it with `uname -r`"
                .to_string(),
        };
    }
    "the error names the program the kernel refused: please report it with the output of \
     `uname -r` and of `pyebpf record -v -d 1`"
        .to_string()
}
