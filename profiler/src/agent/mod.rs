//! `pyebpf agent`: continuous, system-wide profiling for a fleet.
//!
//! Parts the agent sink is built from, each usable and tested on its own:
//! `labels` names the processes (service, container, host) and checks the operator's
//! `--label`s; `push` ships encoded profiles to Grafana Pyroscope through a bounded, retrying
//! queue whose counters feed `/metrics`.

pub mod push;
