//! What `dump` shows of a process and each of its threads, and how a stack's frames are named
//! (the same symbol cache and line tables as every sample) and given their variables.

use profiler_common::{RawFrame, LAYOUT_GIL_INDIRECT, LAYOUT_GIL_MASK, LAYOUT_GIL_RUNTIME};

use crate::discovery::PythonProcess;
use crate::memory::{Fields, ProcessMemory};
use crate::python::objects::{frame_locals, Local};
use crate::python::threads::ThreadFields;
use crate::symbolize::Symbolizer;

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
    /// Why the thread list could not be read, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `--async`: every asyncio task.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tasks: Option<Vec<super::tasks::TaskDump>>,
}

/// Whether a thread was running when its stack was taken.
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

/// Where a thread's stack came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Source {
    /// The BPF sampler's copy, taken in the timer interrupt while the thread ran on a CPU.
    Interrupt,
    /// A copy from userspace (`process_vm_readv`), checked not to have moved while it was
    /// taken.
    Userspace,
}

/// Where a thread's name came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum NameSource {
    /// `threading.Thread.name`, read from the target's `threading._active`.
    Threading,
    /// The OS's (`/proc/PID/task/TID/comm`).
    Os,
}

#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct ThreadDump {
    /// Thread id on the host (what `top -H`, `/proc` and `perf` show).
    pub tid: u32,
    /// The id inside the process's pid namespace, when that differs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ns_tid: Option<u32>,
    /// `threading`'s name for the thread, else its OS name.
    pub name: String,
    pub name_source: NameSource,
    /// The OS's name (`/proc/PID/task/TID/comm`, at most 15 bytes).
    pub os_name: String,
    pub state: ThreadState,
    /// `/proc`'s one-letter state (`R`, `S`, `D`, ...) when the stack was taken.
    pub os_state: String,
    /// Holds the GIL; `None` where the layout does not locate it (and in free-threaded builds,
    /// which have none).
    pub holds_gil: Option<bool>,
    /// Most recent call first.
    pub frames: Vec<FrameDump>,
    /// Deeper than can be shown: `frames` are its top part.
    pub truncated: bool,
    /// False when no copy could be checked: `frames` are an unchecked copy, which may mix
    /// two moments.
    pub consistent: bool,
    /// Where `frames` came from (`None` when there are none to show).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<Source>,
    /// Milliseconds after the sampling window opened that the stack was taken.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub taken_ms: Option<f64>,
    /// Copies of the stack made from userspace (each checked; a thread that ran during one
    /// is copied again).
    pub attempts: u32,
    /// `--locals` of a stack taken in the interrupt: how long after it the variables were
    /// read (a frame that returned meanwhile shows none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locals_read_after_ms: Option<f64>,
    /// Why the stack could not be had, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `--native`: see [`super::native`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub native: Option<super::native::NativeDump>,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub(crate) struct FrameDump {
    pub function: String,
    pub file: String,
    pub line: u32,
    /// `--locals`: the frame's bound variables, arguments first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locals: Option<Vec<Local>>,
    /// `--locals`: why there are none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locals_unavailable: Option<String>,
}

/// A frame named from its code object and instruction pointer; with `locals`, its variables
/// read now.
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
    let locals = locals.then(|| read_locals(mem, proc, rec.frame, rec.code));
    FrameDump {
        function,
        file,
        line,
        locals,
        locals_unavailable: None,
    }
}

/// The variables of the frame at `frame` running `code`, or one `<unreadable>` entry saying
/// why.
pub(super) fn read_locals(
    mem: &ProcessMemory,
    proc: &PythonProcess,
    frame: u64,
    code: u64,
) -> Vec<Local> {
    frame_locals(mem, &proc.layout, frame, code).unwrap_or_else(|e| {
        vec![Local {
            name: "<unreadable>".into(),
            value: format!("{e:#}"),
            arg: false,
        }]
    })
}

/// Whether the GIL is taken and its last holder is `tstate`; `None` where the layout does not
/// say where the GIL is.
pub(super) fn holds_gil(
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
