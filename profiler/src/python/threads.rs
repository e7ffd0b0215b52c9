//! The thread states of an interpreter process, read from outside: `_PyRuntime` →
//! interpreters → thread states, with `process_vm_readv` and the layout's offsets. Used by the
//! `--idle` passes and by `dump`.
//!
//! Bounded: [`MAX_INTERPRETERS`] interpreters, [`MAX_THREAD_WALK`] thread states each (the
//! kernel's own limits), and a list that loops back is refused, so no thread is reported twice.

use std::collections::HashSet;

use profiler_common::{LAYOUT_CFRAME, MAX_INTERPRETERS, MAX_THREAD_WALK};

use crate::memory::{Fields, ProcessMemory, ReadError};
use crate::python::layout::PyLayout;

#[derive(Debug, thiserror::Error)]
pub(crate) enum ThreadsError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("thread state field at offset {0} is outside the bytes read")]
    Field(u16),
    /// A list led back to an entry already walked: the memory changed while it was read (or
    /// is not a thread list). Read again later rather than report threads twice.
    #[error("the thread list loops back to {0:#x} (it changed while being read)")]
    Cycle(u64),
}

/// The fields of one thread state.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ThreadFields {
    /// Its interpreter (`PyInterpreterState *`).
    pub interp: u64,
    pub next: u64,
    /// `native_thread_id`: the thread id in the process's pid namespace.
    pub native_id: u64,
    /// The current frame (through the `_PyCFrame` where the layout has one); 0 when the
    /// thread runs no Python code.
    pub frame: u64,
    pub datastack_chunk: u64,
}

/// Every thread state of every interpreter of the process at `runtime` (bounded), with its
/// fields; `reads` counts the remote reads made.
pub(crate) fn thread_states(
    mem: &ProcessMemory,
    layout: &PyLayout,
    runtime: u64,
    reads: &mut u64,
) -> Result<Vec<(u64, ThreadFields)>, ThreadsError> {
    let k = &layout.kernel;
    let mut out = Vec::new();
    *reads += 1;
    let mut interp = mem.read_u64(runtime.wrapping_add(k.runtime_interpreters_head as u64))?;
    let mut interps = 0;
    let mut walked = HashSet::new();
    while interp != 0 && interps < MAX_INTERPRETERS {
        interps += 1;
        if !walked.insert(interp) {
            return Err(ThreadsError::Cycle(interp));
        }
        *reads += 1;
        let mut tstate = mem.read_u64(interp.wrapping_add(k.interp_threads_head as u64))?;
        let mut n = 0;
        while tstate != 0 && n < MAX_THREAD_WALK {
            n += 1;
            if !walked.insert(tstate) {
                return Err(ThreadsError::Cycle(tstate));
            }
            let fields = thread_fields(mem, layout, tstate, reads)?;
            let next = fields.next;
            out.push((tstate, fields));
            tstate = next;
        }
        *reads += 1;
        interp = mem.read_u64(interp.wrapping_add(k.interp_next as u64))?;
    }
    Ok(out)
}

/// One read of the thread state's prefix (plus the `_PyCFrame` where the layout has one).
pub(crate) fn thread_fields(
    mem: &ProcessMemory,
    layout: &PyLayout,
    tstate: u64,
    reads: &mut u64,
) -> Result<ThreadFields, ThreadsError> {
    let k = &layout.kernel;
    let len = [
        k.tstate_next,
        k.tstate_native_thread_id,
        k.tstate_current_frame,
        k.tstate_datastack_chunk,
        k.tstate_interp,
    ]
    .into_iter()
    .max()
    .unwrap_or(0) as usize
        + 8;
    *reads += 1;
    let bytes = mem.read_vec(tstate, len)?;
    let field = |off: u16| bytes.u64_at(off as usize).ok_or(ThreadsError::Field(off));
    let mut frame = field(k.tstate_current_frame)?;
    if k.flags & LAYOUT_CFRAME != 0 && frame != 0 {
        *reads += 1;
        frame = mem.read_u64(frame.wrapping_add(k.cframe_current_frame as u64))?;
    }
    Ok(ThreadFields {
        interp: field(k.tstate_interp)?,
        next: field(k.tstate_next)?,
        native_id: field(k.tstate_native_thread_id)?,
        frame,
        datastack_chunk: field(k.tstate_datastack_chunk)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::test_support::layouts;

    /// Room for each structure: the layouts' offsets into them stay below this.
    const REGION: usize = 1 << 16;

    /// `_PyRuntime` → one interpreter → thread states `a` → `b` → (`a` again when `cycle`).
    fn walk(layout: &PyLayout, cycle: bool) -> Result<Vec<(u64, ThreadFields)>, ThreadsError> {
        let k = &layout.kernel;
        let mut image = vec![0u64; 4 * REGION / 8];
        let base = image.as_ptr() as u64;
        let (runtime, interp, a, b) = (0, REGION, 2 * REGION, 3 * REGION);
        let mut put = |at: usize, off: u16, value: u64| image[(at + off as usize) / 8] = value;
        put(runtime, k.runtime_interpreters_head, base + interp as u64);
        put(interp, k.interp_threads_head, base + a as u64);
        put(a, k.tstate_next, base + b as u64);
        put(a, k.tstate_native_thread_id, 11);
        put(b, k.tstate_native_thread_id, 12);
        if cycle {
            put(b, k.tstate_next, base + a as u64);
        }
        let mem = ProcessMemory::new(std::process::id());
        thread_states(&mem, layout, base, &mut 0)
    }

    #[test]
    fn a_list_that_loops_back_is_refused_not_walked_again() {
        for layout in layouts() {
            let threads = walk(&layout, false).expect("a well-formed list");
            let ids: Vec<u64> = threads.iter().map(|(_, f)| f.native_id).collect();
            assert_eq!(ids, [11, 12]);
            assert!(
                matches!(walk(&layout, true), Err(ThreadsError::Cycle(_))),
                "a cycle must end the walk"
            );
        }
    }
}
