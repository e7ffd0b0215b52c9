//! pyebpf: a system-wide sampling profiler for CPython built on BPF.
//!
//! Modules follow one sample's path: `bpf` (kernel programs, maps, ring buffers) → `decode`
//! (records) → `resolve` (`complete` finishes deep stacks, `symbolize` names code objects via
//! `python::code` and `python::linetable`, `native` unwinds and merges native frames,
//! `awaiters` adds asyncio `<task>` frames from `python::asyncio`) → `aggregate` →
//! `output::*` (flame graph, speedscope, collapsed, pprof; `output::destination` keeps the
//! file safe). Processes: `discovery` (which are interpreters: `elf`, `python::*`
//! layouts, `procfs` facts), `registry` and `lifecycle` (exec and exit), `identity` (service
//! and container labels). `session` holds the BPF side and the resolver; `driver` is the one
//! sampling loop, and each command is a sink on it: `record`, `top`, `agent`. `idle` samples
//! off-CPU threads from the thread lists (`python::threads`), which `dump` also reads, without
//! BPF. `check` says whether the host can run all this, and holds the preflight checks.
//! `fuzzing` (hidden) lets the fuzz targets in `fuzz/` reach private parsers.
//!
//! Only what the binary, the tests and the fuzz targets use is public (the parsers of foreign
//! data, `agent::push`, `cli`); everything else is `pub(crate)`, so the compiler reports dead
//! code, and `unreachable_pub` keeps it that way.

#![warn(unreachable_pub)]

pub mod agent;
mod aggregate;
mod awaiters;
mod bpf;
mod check;
pub mod cli;
pub mod complete;
mod decode;
mod discovery;
mod driver;
mod dump;
pub mod elf;
#[doc(hidden)]
pub mod fuzzing;
pub mod identity;
mod idle;
mod lifecycle;
pub mod memory;
mod native;
mod output;
mod privileges;
mod procfs;
pub mod proto;
pub mod python;
mod record;
mod registry;
mod resolve;
mod session;
mod symbolize;
mod top;

/// Runs one command to its end; the exit code on success.
pub fn run(command: cli::Command) -> anyhow::Result<i32> {
    match command {
        cli::Command::Record(args) => record::run(args),
        cli::Command::Top(args) => top::run(args),
        cli::Command::Check(args) => check::run(args),
        cli::Command::Agent(args) => agent::run(args),
        cli::Command::Dump(args) => dump::run(args),
    }
}

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
