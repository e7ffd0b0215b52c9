//! `pyebpf dump`: one look at every thread of the named processes, then exit.
//!
//! The Python part needs no BPF: thread lists and stacks are read from outside
//! (`snapshot`). `--native` adds a short sampling window on the one driver (`native`), the
//! only way to see a thread's native frames without stopping it. `--async` adds the asyncio
//! task tree (`tasks`).

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::cli::DumpArgs;
use crate::discovery::{inspect_requested, Caches, PythonProcess};
use crate::python::asyncio::AsyncError;
use crate::symbolize::Symbolizer;

pub(crate) mod native;
pub(crate) mod snapshot;
pub(crate) mod tasks;
mod text;

use snapshot::ProcessDump;

pub(crate) fn run(args: DumpArgs) -> Result<i32> {
    if args.native.native {
        crate::privileges::check()?;
    }
    // Every pid is checked before anything is printed: a typo gets one line and exit 2.
    let caches = Caches::default();
    let mut procs: Vec<PythonProcess> = Vec::with_capacity(args.pids.len());
    for &pid in &args.pids {
        if procs.iter().any(|p| p.pid == pid) {
            continue;
        }
        procs.push(inspect_requested(pid, &caches)?);
    }
    let window = Duration::from_millis(args.native_window);
    let sampled = match args.native.options() {
        Some(native) => Some(native::sample_window(&args.pids, window, native)?),
        None => None,
    };
    let mut symbols = Symbolizer::default();
    let mut dumps: Vec<ProcessDump> = Vec::with_capacity(procs.len());
    let mut failed = 0;
    for proc in &procs {
        let at = Instant::now();
        match snapshot::snapshot(proc, &mut symbols, args.locals) {
            Ok(mut dump) => {
                if let Some(sampled) = &sampled {
                    for t in &mut dump.threads {
                        t.native = Some(native::for_thread(sampled, proc.pid, t.tid, at, window));
                    }
                }
                if args.asyncio {
                    match tasks::tasks(proc, &mut symbols, args.locals) {
                        Ok(tasks) => dump.tasks = Some(tasks),
                        Err(e) => {
                            let why = match e {
                                AsyncError::Unsupported { .. } => "--async needs CPython 3.14+ \
                                    (earlier versions publish no asyncio task layout)"
                                    .to_string(),
                                other => format!("no task tree: {other}"),
                            };
                            eprintln!(
                                "pyebpf: pid {} ({}, CPython {}): {why}; its threads are shown \
                                 without the task tree",
                                proc.pid, proc.command, proc.layout.version
                            );
                        }
                    }
                }
                dumps.push(dump);
            }
            Err(e) => {
                failed += 1;
                eprintln!(
                    "pyebpf: error: reading the threads of {} {}: {e:#}",
                    proc.command,
                    proc.id_label()
                );
            }
        }
    }
    if args.json {
        let doc = serde_json::json!({ "processes": dumps });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", text::render(&dumps));
    }
    Ok(if failed > 0 { 1 } else { 0 })
}
