//! `dump --async`: the asyncio task tree of a process (CPython 3.14+), the information
//! `python -m asyncio pstree PID` shows: every task, its name, its coroutine stack and the
//! tasks that await it. Read from the target's task lists with the offsets of its
//! `.AsyncioDebug` section (`python::asyncio`); bounded and safe against cycles there.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

use crate::discovery::PythonProcess;
use crate::memory::ProcessMemory;
use crate::python::asyncio::{all_tasks, locate, read_task, AsyncError};
use crate::symbolize::Symbolizer;

use super::snapshot::{frame, FrameDump};

/// Nesting shown in the text tree (deeper tasks are listed flat at this depth).
const MAX_TREE_DEPTH: usize = 64;

#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct TaskDump {
    /// The task object's address (`0x…`), as `asyncio ps` shows it.
    pub id: String,
    pub name: String,
    /// The ids of the tasks awaiting this one; empty for a root task.
    pub awaited_by: Vec<String>,
    /// The coroutine chain the task is suspended in, most recent first.
    pub coroutine_stack: Vec<FrameDump>,
    /// The chain was cut (too deep, or a cycle).
    pub truncated: bool,
    /// Why the task could not be read, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Every task of `proc`, or why there are none to show.
pub(crate) fn tasks(
    proc: &PythonProcess,
    symbols: &mut Symbolizer,
    locals: bool,
) -> Result<Vec<TaskDump>, AsyncError> {
    let (layout_a, _found) = locate(proc)?;
    let mem = ProcessMemory::new(proc.pid);
    let addrs = all_tasks(&mem, proc, &layout_a)?;
    // Every task first, symbols after: the program keeps running, and a task that finishes
    // while the reads of the others wait on symbolization is freed before it is read.
    let read: Vec<_> = addrs
        .iter()
        .map(|&addr| (addr, read_task(&mem, &proc.layout, &layout_a, addr)))
        .collect();
    let mut out = Vec::with_capacity(read.len());
    for (addr, task) in read {
        let id = format!("{addr:#x}");
        match task {
            Ok(task) => out.push(TaskDump {
                id,
                name: task.name,
                awaited_by: task.awaited_by.iter().map(|a| format!("{a:#x}")).collect(),
                coroutine_stack: task
                    .coro_frames
                    .iter()
                    .map(|rec| frame(&mem, proc, symbols, rec, locals))
                    .collect(),
                truncated: task.coro_truncated,
                error: None,
            }),
            Err(e) => out.push(TaskDump {
                id,
                name: String::new(),
                awaited_by: Vec::new(),
                coroutine_stack: Vec::new(),
                truncated: false,
                error: Some(e.to_string()),
            }),
        }
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
            }],
            truncated: false,
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
