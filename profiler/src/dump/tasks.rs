//! `dump --async`: the asyncio task tree of a process (CPython 3.14+), the information
//! `python -m asyncio pstree PID` shows: every task, its name, its coroutine stack and the
//! tasks that await it. Read from the target's task lists with the offsets of its
//! `.AsyncioDebug` section (`python::asyncio`); bounded and safe against cycles there.
//!
//! Task stacks take the path thread stacks take (`window`). The task a thread was running when
//! the sampler caught it on a CPU gets its coroutine stack from that sample: the sample's
//! frames down to the task's coroutine frame. A suspended task changes only when its event
//! loop resumes it, so it is copied from userspace and kept if a second copy of its coroutine
//! chain (each coroutine's frame, code and instruction) agrees; one that moved is copied again,
//! at most [`MAX_ATTEMPTS`] times.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

use profiler_common::RawFrame;

use super::assemble::{later_locals, sampled_frame};
use super::snapshot::{frame, FrameDump, Source};
use super::window::{Sampled, MAX_ATTEMPTS};
use crate::discovery::PythonProcess;
use crate::memory::ProcessMemory;
use crate::python::asyncio::{all_tasks, coro_chain, locate, read_task, AsyncError, TaskInfo};
use crate::symbolize::Symbolizer;

/// Nesting shown in the text tree (deeper tasks are listed flat at this depth).
const MAX_TREE_DEPTH: usize = 64;

#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct TaskDump {
    /// The task object's address (`0x…`), as `asyncio ps` shows it.
    pub id: String,
    pub name: String,
    /// The ids of the tasks awaiting this one; empty for a root task.
    pub awaited_by: Vec<String>,
    /// The coroutine chain the task is suspended (or running) in, most recent first.
    pub coroutine_stack: Vec<FrameDump>,
    /// The chain was cut (too deep, or a cycle).
    pub truncated: bool,
    /// Where the coroutine stack came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<Source>,
    /// False when no two copies agreed: the stack is the last copy, unchecked.
    pub consistent: bool,
    /// Copies of the task made from userspace.
    pub attempts: u32,
    /// Why the task could not be read, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// (frame, code, instruction) of each frame: what two copies of a chain must agree on.
fn shape(frames: &[RawFrame]) -> Vec<(u64, u64, u64)> {
    frames.iter().map(|f| (f.frame, f.code, f.instr)).collect()
}

/// One task as read.
struct Read {
    info: TaskInfo,
    checked: bool,
    attempts: u32,
    /// `--locals` of a checked copy, read between its two copies.
    locals: Option<Vec<Vec<crate::python::objects::Local>>>,
}

/// Every task of `proc`, or why there are none to show. `samples`: the samples the window
/// took of `proc`'s threads (their running tasks come from them).
pub(super) fn tasks(
    proc: &PythonProcess,
    symbols: &mut Symbolizer,
    locals: bool,
    samples: &[&Sampled],
) -> Result<Vec<TaskDump>, AsyncError> {
    let (layout_a, _found) = locate(proc)?;
    let mem = ProcessMemory::new(proc.pid);
    let layout = &proc.layout;
    let mut order: Vec<u64> = Vec::new();
    let mut reads: HashMap<u64, Read> = HashMap::new();
    let mut errors: HashMap<u64, String> = HashMap::new();
    let mut list_error = None;
    let mut latest: Vec<u64> = Vec::new();
    // Every task first, symbols after: the program keeps running, and a task that finishes
    // while the reads of the others wait on symbolization is freed before it is read.
    for _ in 0..MAX_ATTEMPTS {
        let addrs = match all_tasks(&mem, proc, &layout_a) {
            Ok(a) => a,
            Err(e) if e.is_gone() => return Err(e),
            Err(e) => {
                // A list being changed under the walk: read it again.
                list_error = Some(e);
                continue;
            }
        };
        list_error = None;
        latest.clone_from(&addrs);
        for addr in addrs {
            if reads.get(&addr).is_some_and(|r| r.checked) {
                continue;
            }
            if !order.contains(&addr) {
                order.push(addr);
            }
            let attempts = reads.get(&addr).map_or(0, |r| r.attempts) + 1;
            match read_task(&mem, layout, &layout_a, addr) {
                Ok(info) => {
                    errors.remove(&addr);
                    let values = locals.then(|| {
                        info.coro_frames
                            .iter()
                            .map(|f| super::snapshot::read_locals(&mem, proc, f.frame, f.code))
                            .collect()
                    });
                    let again = coro_chain(&mem, layout, &layout_a, info.coro).ok();
                    let checked =
                        again.is_some_and(|(frames, _)| shape(&frames) == shape(&info.coro_frames));
                    reads.insert(
                        addr,
                        Read {
                            info,
                            checked,
                            attempts,
                            locals: values,
                        },
                    );
                }
                Err(e) => {
                    errors.insert(addr, e.to_string());
                    if let Some(r) = reads.get_mut(&addr) {
                        r.attempts = attempts;
                    }
                }
            }
        }
        if order
            .iter()
            .all(|a| reads.get(a).is_some_and(|r| r.checked))
        {
            break;
        }
    }
    if let (Some(e), true) = (list_error, order.is_empty()) {
        return Err(e);
    }
    let mut out = Vec::with_capacity(order.len());
    for addr in order {
        let id = format!("{addr:#x}");
        let Some(read) = reads.get(&addr) else {
            if !latest.contains(&addr) {
                // Never read, and gone from the lists since: it finished.
                continue;
            }
            out.push(TaskDump {
                id,
                name: String::new(),
                awaited_by: Vec::new(),
                coroutine_stack: Vec::new(),
                truncated: false,
                source: None,
                consistent: false,
                attempts: MAX_ATTEMPTS,
                error: errors.remove(&addr),
            });
            continue;
        };
        let info = &read.info;
        let mut task = TaskDump {
            id,
            name: info.name.clone(),
            awaited_by: info.awaited_by.iter().map(|a| format!("{a:#x}")).collect(),
            coroutine_stack: Vec::new(),
            truncated: info.coro_truncated,
            source: Some(Source::Userspace),
            consistent: read.checked,
            attempts: read.attempts,
            error: None,
        };
        // The task a thread was running when it was sampled: its stack from the interrupt.
        let coro_frame = layout_a.coro_frame(info.coro);
        let sampled = samples.iter().find_map(|s| {
            (s.running_task == addr)
                .then(|| {
                    s.frames
                        .iter()
                        .position(|f| f.frame == coro_frame)
                        .map(|k| (s, k))
                })
                .flatten()
        });
        match sampled {
            Some((s, k)) => {
                let frames = &s.frames[..=k];
                let mut values = later_locals(
                    &mem,
                    proc,
                    locals,
                    frames.iter().map(|f| (f.frame, f.code, f.instr)),
                )
                .into_iter();
                task.coroutine_stack = frames
                    .iter()
                    .map(|f| sampled_frame(f, values.next()))
                    .collect();
                task.truncated = false;
                task.source = Some(Source::Interrupt);
                task.consistent = true;
            }
            None => {
                task.coroutine_stack = info
                    .coro_frames
                    .iter()
                    .enumerate()
                    .map(|(i, rec)| {
                        let mut f = frame(&mem, proc, symbols, rec, false);
                        if let Some(values) = &read.locals {
                            f.locals = values.get(i).cloned();
                        }
                        f
                    })
                    .collect();
            }
        }
        out.push(task);
    }
    Ok(out)
}

/// The task tree as text: each root task, then the tasks awaiting nothing but it, indented,
/// each with its coroutine stack. A task awaited by several is shown under the first and
/// named under the others; tasks in a cycle (no root) are listed at the end.
pub(crate) fn render(out: &mut String, tasks: &[TaskDump]) {
    let by_id: HashMap<&str, &TaskDump> = tasks.iter().map(|t| (t.id.as_str(), t)).collect();
    let mut children: HashMap<&str, Vec<&TaskDump>> = HashMap::new();
    for t in tasks {
        for parent in &t.awaited_by {
            children.entry(parent.as_str()).or_default().push(t);
        }
    }
    let mut shown = HashSet::new();
    let roots = tasks
        .iter()
        .filter(|t| t.awaited_by.iter().all(|p| !by_id.contains_key(p.as_str())));
    for root in roots {
        node(out, root, &children, &mut shown, 0);
    }
    for t in tasks {
        if !shown.contains(t.id.as_str()) {
            node(out, t, &children, &mut shown, 0);
        }
    }
}

fn node<'a>(
    out: &mut String,
    task: &'a TaskDump,
    children: &HashMap<&str, Vec<&'a TaskDump>>,
    shown: &mut HashSet<&'a str>,
    depth: usize,
) {
    let pad = "    ".repeat(depth.min(MAX_TREE_DEPTH) + 1);
    if !shown.insert(task.id.as_str()) {
        let _ = writeln!(out, "{pad}(T) {} ({}), shown above", task.name, task.id);
        return;
    }
    let _ = writeln!(out, "{pad}(T) {} ({})", task.name, task.id);
    if !task.consistent && task.error.is_none() {
        let _ = writeln!(
            out,
            "{pad}    (changed while read in {} copies: this stack may mix two moments)",
            task.attempts
        );
    }
    if let Some(e) = &task.error {
        let _ = writeln!(out, "{pad}    <unreadable: {e}>");
    }
    for f in &task.coroutine_stack {
        let _ = writeln!(out, "{pad}    {} ({}:{})", f.function, f.file, f.line);
    }
    if task.truncated {
        let _ = writeln!(out, "{pad}    <coroutine chain cut>");
    }
    for child in children.get(task.id.as_str()).into_iter().flatten() {
        node(out, child, children, shown, depth + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: &str, name: &str, awaited_by: &[&str]) -> TaskDump {
        TaskDump {
            id: id.into(),
            name: name.into(),
            awaited_by: awaited_by.iter().map(|s| s.to_string()).collect(),
            coroutine_stack: vec![FrameDump {
                function: format!("{name}_coro"),
                file: "app.py".into(),
                line: 3,
                locals: None,
                locals_unavailable: None,
            }],
            truncated: false,
            source: Some(Source::Userspace),
            consistent: true,
            attempts: 1,
            error: None,
        }
    }

    #[test]
    fn tree_under_roots_and_cycles_end() {
        let tasks = [
            task("0x3", "leaf", &["0x2"]),
            task("0x2", "parent", &["0x1"]),
            task("0x1", "root", &[]),
            // A cycle: each awaits the other. Shown once each, at the end.
            task("0x8", "a", &["0x9"]),
            task("0x9", "b", &["0x8"]),
        ];
        let mut out = String::new();
        render(&mut out, &tasks);
        assert_eq!(
            out,
            "    (T) root (0x1)\n        root_coro (app.py:3)\n\
             \x20       (T) parent (0x2)\n            parent_coro (app.py:3)\n\
             \x20           (T) leaf (0x3)\n                leaf_coro (app.py:3)\n\
             \x20   (T) a (0x8)\n        a_coro (app.py:3)\n\
             \x20       (T) b (0x9)\n            b_coro (app.py:3)\n\
             \x20           (T) a (0x8), shown above\n"
        );
    }
}
