//! One look at every thread of a process, from outside: the thread list, each thread's OS
//! state and GIL, and its Python frames (with `--locals`, their variables).
//!
//! Nothing stops the target. A thread's stack is copied in bulk (its stack chunks, as for
//! `--idle`) and kept only if the thread's current frame did not move while it was copied;
//! a thread that keeps moving is retried [`MAX_ATTEMPTS`] times and then shown as read, marked
//! not consistent.

use std::collections::HashMap;

use profiler_common::{RawFrame, LAYOUT_GIL_INDIRECT, LAYOUT_GIL_MASK, LAYOUT_GIL_RUNTIME};

use crate::complete::{tag_frames, ChunkCopy, StackError};
use crate::discovery::PythonProcess;
use crate::memory::{Fields, ProcessMemory};
use crate::python::objects::{frame_locals, Local};
use crate::python::threads::{thread_fields, thread_states, ThreadFields, ThreadsError};
use crate::symbolize::Symbolizer;

/// Copies of one thread's stack (or reads of a thread list that looped back) before giving up.
const MAX_ATTEMPTS: usize = 16;
/// Frames shown per thread (deeper stacks are cut, and marked).
const MAX_DUMP_FRAMES: u32 = 4096;

#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct ProcessDump {
    pub pid: u32,
    /// The pid inside its own pid namespace (a container), when that is not the host's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ns_pid: Option<u32>,
    pub command: String,
    pub python_version: String,
    /// A free-threaded (`Py_GIL_DISABLED`) build: no thread holds a GIL.
    pub free_threaded: bool,
    pub binary: String,
    pub threads: Vec<ThreadDump>,
    /// `--async`: every asyncio task.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tasks: Option<Vec<super::tasks::TaskDump>>,
}

/// Whether a thread was running when it was looked at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ThreadState {
    /// On a CPU, or ready to run (`R` in `/proc`).
    Running,
    /// Sleeping, waiting (for I/O, a lock, the GIL) or stopped.
    Idle,
    /// The thread has no `/proc` entry any more (it just ended).
    Gone,
}

#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct ThreadDump {
    /// Thread id on the host (what `top -H`, `/proc` and `perf` show).
    pub tid: u32,
    /// The id inside the process's pid namespace, when that differs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ns_tid: Option<u32>,
    /// The thread's name as the OS knows it (`/proc/PID/task/TID/comm`).
    pub name: String,
    pub state: ThreadState,
    /// `/proc`'s one-letter state (`R`, `S`, `D`, ...).
    pub os_state: String,
    /// Holds the GIL; `None` where the layout does not locate it (and in free-threaded builds,
    /// which have none).
    pub holds_gil: Option<bool>,
    /// Most recent call first.
    pub frames: Vec<FrameDump>,
    /// Deeper than [`MAX_DUMP_FRAMES`]: `frames` are its top part.
    pub truncated: bool,
    /// The stack did not stay still over [`MAX_ATTEMPTS`] copies: the frames are from one
    /// copy, which may mix two moments.
    pub consistent: bool,
    /// Why the stack could not be read, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `--native`: see [`super::native`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub native: Option<super::native::NativeDump>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct FrameDump {
    pub function: String,
    pub file: String,
    pub line: u32,
    /// `--locals`: the frame's bound variables, arguments first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locals: Option<Vec<Local>>,
}

/// Looks at every thread of `proc` once.
pub(crate) fn snapshot(
    proc: &PythonProcess,
    symbols: &mut Symbolizer,
    locals: bool,
) -> anyhow::Result<ProcessDump> {
    let mem = ProcessMemory::new(proc.pid);
    let layout = &proc.layout;
    let mut reads = 0u64;
    // A list that loops back changed while it was read (a thread state freed and reused):
    // read it again, as a moving stack is.
    let mut attempt = 1;
    let tstates = loop {
        match thread_states(&mem, layout, proc.runtime, &mut reads) {
            Err(ThreadsError::Cycle(_)) if attempt < MAX_ATTEMPTS => attempt += 1,
            result => break result?,
        }
    };
    let host_tids: HashMap<u32, u32> = match proc.ns_pid {
        Some(_) => crate::procfs::host_tids(proc.pid).into_iter().collect(),
        None => HashMap::new(),
    };
    let mut threads = Vec::with_capacity(tstates.len());
    for (tstate, fields) in tstates {
        let native_id = fields.native_id as u32;
        let tid = match proc.ns_pid {
            Some(_) => host_tids.get(&native_id).copied().unwrap_or(native_id),
            None => native_id,
        };
        let stat = crate::procfs::stat(tid).ok();
        let state = match stat.as_ref().map(|s| s.state) {
            None => ThreadState::Gone,
            Some('R') => ThreadState::Running,
            Some(_) => ThreadState::Idle,
        };
        let name = std::fs::read_to_string(format!("/proc/{}/task/{tid}/comm", proc.pid))
            .map(|n| n.trim_end().to_string())
            .unwrap_or_default();
        let mut thread = ThreadDump {
            tid,
            ns_tid: proc.ns_pid.map(|_| native_id),
            name,
            state,
            os_state: stat.map(|s| s.state.to_string()).unwrap_or_default(),
            holds_gil: holds_gil(&mem, proc, tstate, &fields),
            frames: Vec::new(),
            truncated: false,
            consistent: true,
            error: None,
            native: None,
        };
        match stack(&mem, proc, tstate, fields, &mut reads) {
            Ok((records, truncated, consistent)) => {
                thread.truncated = truncated;
                thread.consistent = consistent;
                thread.frames = records
                    .iter()
                    .map(|rec| frame(&mem, proc, symbols, rec, locals))
                    .collect();
            }
            Err(e) => thread.error = Some(e.to_string()),
        }
        threads.push(thread);
    }
    threads.sort_by_key(|t| t.tid);
    Ok(ProcessDump {
        pid: proc.pid,
        ns_pid: proc.ns_pid,
        command: proc.command.clone(),
        python_version: proc.layout.version.to_string(),
        free_threaded: proc.layout.free_threaded,
        binary: proc.binary.clone(),
        threads,
        tasks: None,
    })
}

/// The thread's frames, leaf first and tagged; whether they were cut, and whether the copy was
/// consistent.
fn stack(
    mem: &ProcessMemory,
    proc: &PythonProcess,
    tstate: u64,
    mut fields: ThreadFields,
    reads: &mut u64,
) -> Result<(Vec<RawFrame>, bool, bool), StackError> {
    let layout = &proc.layout;
    let mut last = None;
    for _ in 0..MAX_ATTEMPTS {
        if fields.frame == 0 {
            return Ok((Vec::new(), false, true));
        }
        let copy = ChunkCopy::read(mem, layout, fields.datastack_chunk, reads)?;
        let walked = copy.walk(mem, layout, fields.frame, MAX_DUMP_FRAMES, reads)?;
        let after = thread_fields(mem, layout, tstate, reads)?;
        let still = after.frame == fields.frame && after.datastack_chunk == fields.datastack_chunk;
        let mut frames = walked.frames;
        tag_frames(mem, layout, &mut frames, reads)?;
        if still {
            return Ok((frames, !walked.complete, true));
        }
        last = Some((frames, !walked.complete));
        fields = after;
    }
    let (frames, truncated) = last.unwrap_or_default();
    Ok((frames, truncated, false))
}

pub(super) fn frame(
    mem: &ProcessMemory,
    proc: &PythonProcess,
    symbols: &mut Symbolizer,
    rec: &RawFrame,
    locals: bool,
) -> FrameDump {
    let layout = &proc.layout;
    let code = symbols.code(proc.pid, layout, rec.code, rec.tag);
    let (function, file, line) = match &code {
        Some(c) => (
            c.qualname.clone(),
            c.filename.clone(),
            symbols.line(proc.pid, layout, rec.code, c, rec.instr),
        ),
        None => (format!("<code at {:#x}>", rec.code), "?".into(), 0),
    };
    let locals = locals.then(|| {
        frame_locals(mem, layout, rec.frame, rec.code).unwrap_or_else(|e| {
            vec![Local {
                name: "<unreadable>".into(),
                value: format!("{e:#}"),
                arg: false,
            }]
        })
    });
    FrameDump {
        function,
        file,
        line,
        locals,
    }
}

/// Whether the GIL is taken and its last holder is `tstate`; `None` where the layout does not
/// say where the GIL is.
fn holds_gil(
    mem: &ProcessMemory,
    proc: &PythonProcess,
    tstate: u64,
    fields: &ThreadFields,
) -> Option<bool> {
    let k = &proc.layout.kernel;
    if k.flags & LAYOUT_GIL_MASK == 0 {
        return None;
    }
    let base = match k.flags & LAYOUT_GIL_RUNTIME != 0 {
        true => proc.runtime,
        false => fields.interp,
    };
    let mut gil = base.wrapping_add(k.gil_offset as u64);
    if k.flags & LAYOUT_GIL_INDIRECT != 0 {
        gil = mem.read_u64(gil).ok()?;
    }
    let end = k.gil_locked.max(k.gil_last_holder) as usize + 8;
    let bytes = mem.read_vec(gil, end).ok()?;
    let locked = bytes.u32_at(k.gil_locked as usize)? != 0;
    let holder = bytes.u64_at(k.gil_last_holder as usize)?;
    Some(locked && holder == tstate)
}
