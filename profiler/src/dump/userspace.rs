//! Copies of a thread's stack made from userspace, and the check that makes one worth showing.
//!
//! A thread's frames change only while it runs. So a copy is the thread's stack if the thread
//! did not run while the copy was made: it was not runnable before or after, and the kernel
//! switched it out no more often (`/proc`'s context-switch counts, [`Check::Scheduler`]). A
//! thread that is runnable cannot be proven idle that way; its copy is checked by its frames
//! instead ([`Check::Frames`]): the current frame and the instruction it runs are the same
//! before and after, and the copy's leaf agrees with them (a chain is only pushed or popped
//! by moving the current frame).
//!
//! A copy that fails while the thread ran (an address that was just freed: `EFAULT`; a chain
//! whose frames left the copied stack chunks) is a moving stack, not unreadable memory: the
//! caller copies again, or takes the stack from the interrupt.

use std::collections::HashMap;

use profiler_common::{RawFrame, FRAME_HEADER_BYTES};

use crate::complete::{tag_frames, ChunkCopy, StackError};
use crate::discovery::PythonProcess;
use crate::memory::{Fields, ProcessMemory, ReadError};
use crate::procfs::Sched;
use crate::python::objects::{code_vars, locals_from_slots, CodeVars, Local};
use crate::python::threads::{thread_fields, ThreadFields};

/// Frames shown per thread (deeper stacks are cut, and marked).
pub(super) const MAX_DUMP_FRAMES: u32 = 4096;

/// How a copy is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Check {
    /// The thread did not run: not runnable before or after, no context switch in between.
    Scheduler,
    /// The thread's current frame and its instruction did not move.
    Frames,
}

/// One copy of a thread's stack.
#[derive(Clone, Debug)]
pub(super) struct Copy {
    /// Leaf first, tagged.
    pub frames: Vec<RawFrame>,
    pub truncated: bool,
    /// With `locals` and [`Check::Scheduler`]: each frame's variables, read inside the
    /// checked span (so they are the frames' own, at the same moment).
    pub locals: Option<Vec<Vec<Local>>>,
    pub fields: ThreadFields,
    /// The thread's `/proc` state when the copy began.
    pub sched: Sched,
}

/// What one attempt found.
#[derive(Debug)]
pub(super) enum Outcome {
    /// The thread's stack, checked.
    Checked(Copy),
    /// The thread ran, or its stack moved, while it was copied: the copy if one was made,
    /// and the error if the copy failed.
    Moved {
        copy: Option<Copy>,
        error: Option<String>,
    },
    /// The thread runs no Python code.
    NoFrames(Sched),
    /// The thread is runnable ([`Check::Scheduler`] copies only idle threads).
    Runnable,
    /// The copy failed although the thread stood still: not a stack that can be read.
    Failed(String),
    /// The thread (or the process) is gone.
    Gone,
}

/// Copies the stack of the thread at `tstate` (host tid `tid`) once.
pub(super) fn copy_stack(
    mem: &ProcessMemory,
    proc: &PythonProcess,
    tstate: u64,
    tid: u32,
    check: Check,
    locals: bool,
    reads: &mut u64,
) -> Outcome {
    let layout = &proc.layout;
    let Some(before) = crate::procfs::sched(proc.pid, tid) else {
        return Outcome::Gone;
    };
    if check == Check::Scheduler && before.runnable() {
        return Outcome::Runnable;
    }
    let fields = match thread_fields(mem, layout, tstate, reads) {
        Ok(f) => f,
        Err(crate::python::threads::ThreadsError::Read(ReadError::Gone { .. })) => {
            return Outcome::Gone
        }
        Err(e) => {
            return Outcome::Moved {
                copy: None,
                error: Some(e.to_string()),
            }
        }
    };
    if fields.frame == 0 {
        return Outcome::NoFrames(before);
    }
    let leaf_before = match check {
        Check::Frames => leaf(mem, proc, fields.frame, reads),
        Check::Scheduler => None,
    };
    let copied = copy(
        mem,
        proc,
        &fields,
        before,
        check == Check::Scheduler && locals,
        reads,
    );
    let after_fields = thread_fields(mem, layout, tstate, reads).ok();
    let after = crate::procfs::sched(proc.pid, tid);
    let same_frame = after_fields
        .is_some_and(|a| a.frame == fields.frame && a.datastack_chunk == fields.datastack_chunk);
    let still = same_frame
        && match check {
            Check::Scheduler => {
                after.is_some_and(|a| !a.runnable() && a.switches == before.switches)
            }
            Check::Frames => {
                let leaf_after = leaf(mem, proc, fields.frame, reads);
                let leaf_copied = copied
                    .as_ref()
                    .ok()
                    .and_then(|c| c.frames.first())
                    .map(|f| (f.frame, f.code, f.instr));
                leaf_before.is_some()
                    && leaf_before == leaf_after
                    && leaf_copied.is_none_or(|(frame, code, instr)| {
                        Some((frame, code, instr)) == leaf_before.map(|(c, i)| (fields.frame, c, i))
                    })
            }
        };
    match (copied, still) {
        (Ok(copy), true) => Outcome::Checked(copy),
        (Ok(copy), false) => Outcome::Moved {
            copy: Some(copy),
            error: None,
        },
        (Err(StackError::Read(ReadError::Gone { .. })), _) => Outcome::Gone,
        (Err(e), false) => Outcome::Moved {
            copy: None,
            error: Some(e.to_string()),
        },
        (Err(e), true) => Outcome::Failed(e.to_string()),
    }
}

/// The stack chunks copied and walked from the current frame; the frames tagged; with
/// `locals`, every frame's variables.
fn copy(
    mem: &ProcessMemory,
    proc: &PythonProcess,
    fields: &ThreadFields,
    sched: Sched,
    locals: bool,
    reads: &mut u64,
) -> Result<Copy, StackError> {
    let layout = &proc.layout;
    let chunks = ChunkCopy::read(mem, layout, fields.datastack_chunk, reads)?;
    let walked = chunks.walk(mem, layout, fields.frame, MAX_DUMP_FRAMES, reads)?;
    let mut frames = walked.frames;
    tag_frames(mem, layout, &mut frames, reads)?;
    let locals = locals.then(|| {
        frames
            .iter()
            .map(|f| super::snapshot::read_locals(mem, proc, f.frame, f.code))
            .collect()
    });
    Ok(Copy {
        frames,
        truncated: !walked.complete,
        locals,
        fields: *fields,
        sched,
    })
}

/// The code object and instruction pointer of the frame at `frame`.
pub(super) fn leaf(
    mem: &ProcessMemory,
    proc: &PythonProcess,
    frame: u64,
    reads: &mut u64,
) -> Option<(u64, u64)> {
    let k = &proc.layout.kernel;
    *reads += 1;
    let head = mem.read_vec(frame, FRAME_HEADER_BYTES).ok()?;
    let code = head.u64_at(k.frame_executable as usize)? & k.executable_mask;
    let instr = head.u64_at(k.frame_instr_ptr as usize)?;
    Some((code, instr))
}

/// Why a frame of a stack taken earlier shows no variables.
pub(super) const RETURNED: &str = "the frame returned after its stack was taken";
pub(super) const CHANGED: &str = "its variables changed while they were read";

/// Each frame's variables, read now for a stack taken earlier (leaf first: the frame's
/// address, code object and instruction). A frame's are kept only when it is still the frame
/// that was taken: it runs the same code, at the same instruction unless it is the leaf (a
/// caller waits on its call without moving), and so does every frame below it. A frame that
/// returned and was called again at the same place by the same callers cannot be told from
/// the one taken: its variables are shown as they are now, which is what "read after" says.
/// The callers' frames and variable slots are copied twice in a row, each time in one
/// batched read, and must agree (a chain rebuilt while it was read mixes calls), and again
/// after the values were decoded (a value freed in between would be decoded from garbage).
/// The leaf's variables are one copy's: it runs on.
pub(super) fn locals_after(
    mem: &ProcessMemory,
    proc: &PythonProcess,
    frames: &[(u64, u64, u64)],
) -> Vec<Result<Vec<Local>, &'static str>> {
    let layout = &proc.layout;
    let k = &layout.kernel;
    let mut vars: HashMap<u64, Option<CodeVars>> = HashMap::new();
    for &(_, code, _) in frames {
        vars.entry(code)
            .or_insert_with(|| code_vars(mem, layout, code).ok());
    }
    let slots_at = layout.frame_localsplus as usize;
    let regions: Vec<(u64, usize)> = frames
        .iter()
        .map(|&(frame, code, _)| {
            let slots = vars
                .get(&code)
                .and_then(|v| v.as_ref())
                .map_or(0, |v| v.slots_len());
            (frame, (slots_at + slots).max(FRAME_HEADER_BYTES))
        })
        .collect();
    let copy = || mem.read_batch(&regions).unwrap_or_default();
    let (first, second) = (copy(), copy());
    let header = |bytes: &Option<Vec<u8>>| {
        let b = bytes.as_ref()?;
        let code = b.u64_at(k.frame_executable as usize)? & k.executable_mask;
        let instr = b.u64_at(k.frame_instr_ptr as usize)?;
        Some((code, instr))
    };
    let mut out = vec![Err(RETURNED); frames.len()];
    // From the root up: a frame's callers must all be unchanged.
    let mut callers_unchanged = true;
    for i in (0..frames.len()).rev() {
        let (_, code, instr) = frames[i];
        let a = first.get(i).cloned().flatten();
        let now = header(&a);
        // A caller stands at its call: its frame and variables do not move. The leaf runs
        // on: its instruction and variables move, so only its code must stay.
        let (still, same) = match i {
            0 => {
                let code_of = |copy: &Vec<Option<Vec<u8>>>| {
                    header(&copy.get(i).cloned().flatten()).map(|(c, _)| c)
                };
                let still = now.is_some_and(|(c, _)| c == code);
                (still, still && code_of(&second) == Some(code))
            }
            _ => (
                now == Some((code, instr)),
                a.is_some() && second.get(i) == first.get(i),
            ),
        };
        if callers_unchanged && still {
            out[i] = match (same, vars.get(&code).and_then(|v| v.as_ref()), &a) {
                (true, Some(v), Some(bytes)) => Ok(locals_from_slots(
                    mem,
                    layout,
                    v,
                    bytes.get(slots_at..).unwrap_or_default(),
                )),
                (true, None, _) => Err("its code object's variables could not be read"),
                _ => Err(CHANGED),
            };
        }
        callers_unchanged &= same && now == Some((code, instr));
    }
    // The decoded values were the frames': they are all still there.
    let third = copy();
    let mut unchanged = true;
    for i in (0..frames.len()).rev() {
        let kept = match i {
            0 => header(&third.get(i).cloned().flatten()).map(|(c, _)| c) == Some(frames[i].1),
            _ => third.get(i).is_some() && third.get(i) == first.get(i),
        };
        unchanged &= kept;
        if !unchanged && out[i].is_ok() {
            out[i] = Err(CHANGED);
        }
    }
    out
}
