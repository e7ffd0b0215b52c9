//! pyebpf: a system-wide sampling profiler for CPython built on BPF.
//!
//! Modules follow one sample's path: `bpf` (kernel programs, maps, ring buffer) →
//! `discovery` (which processes are interpreters, `elf` + `python::*` layouts, `procfs` facts)
//! → `symbolize` (code objects → function/file/line via `python::code` and `python::linetable`)
//! → `aggregate` → `output::*` (flame graph, speedscope, collapsed; `output::destination`
//! keeps the file safe), driven by `record`. `check` says whether the host can run all this,
//! and holds the preflight `record` and `top` run.

pub mod agent;
pub mod aggregate;
pub mod awaiters;
pub mod bpf;
pub mod check;
pub mod cli;
pub mod complete;
pub mod decode;
pub mod discovery;
pub mod driver;
pub mod elf;
pub mod identity;
pub mod idle;
pub mod lifecycle;
pub mod memory;
pub mod native;
pub mod output;
pub mod privileges;
pub mod procfs;
pub mod proto;
pub mod python;
pub mod record;
pub mod registry;
pub mod resolve;
pub mod session;
pub mod symbolize;
pub mod top;

#[cfg(test)]
mod hostile_memory;

/// Bad usage or input: reported as one line, exit code 2.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Exit code for an error: 2 for bad usage/input, 1 for runtime failures.
pub fn exit_code(err: &anyhow::Error) -> i32 {
    let usage = err.chain().any(|e| {
        e.downcast_ref::<UsageError>().is_some()
            || e.downcast_ref::<discovery::DiscoveryError>().is_some()
            || e.downcast_ref::<output::destination::Unwritable>()
                .is_some()
    });
    if usage {
        2
    } else {
        1
    }
}
