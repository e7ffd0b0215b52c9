//! pyebpf: a system-wide sampling profiler for CPython built on BPF.
//!
//! Modules follow one sample's path: `bpf` (kernel programs, maps, ring buffer) →
//! `discovery` (which processes are interpreters, `elf` + `python::*` layouts) →
//! `symbolize` (code objects → function/file/line via `python::code` and `python::linetable`)
//! → `aggregate` → `output::*` (flame graph, speedscope, collapsed), driven by `record`.

pub mod aggregate;
pub mod output;
pub mod python;
