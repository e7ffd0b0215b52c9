//! Python and native frames of one sample → one stack, in call order.
//!
//! Every call of the eval loop (`_PyEval_EvalFrameDefault`, its `.cold` part, and 3.14's
//! `_TAIL_CALL_*` handlers above it) is one *activation* in the native stack, and runs one
//! *group* of Python frames: the frames between two entry frames of the kernel walk (see
//! `PyOffsets::entry_owner_mask` and `frame_is_entry`). The merge replaces each activation by
//! its group:
//!
//! ```text
//! native (leaf first):  deflate  zlib_compress  [A1]  PyObject_Call  [A2]  main  _start
//! python (leaf first):  [ compress_it  work ]  [ <module> ]
//! merged:               deflate  zlib_compress  compress_it  work  <module>
//! ```
//!
//! Between activations only what people look for stays: frames outside the interpreter
//! binary (extension modules, libc, libffi) and interpreter functions that wait or collect
//! (sleep, locks, the GIL, GC). Interpreter plumbing (`PyObject_Call`, `_PyEval_Vector`,
//! `main`) goes.
//!
//! A stack is never mis-spliced: activations and groups must agree in number when the
//! native stack reached its root; when it did not (the copy or the frame-pointer chain ended
//! early), the leafmost activations are paired with the leafmost groups and, where both
//! carry addresses, each group's entry frame must lie in its activation's stack frame (3.12+
//! push it on the C stack). Anything else keeps the Python stack whole under a marker, and is
//! counted.

/// What a native frame is to the merge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// `_PyEval_EvalFrameDefault` (or its `.cold` part): one activation.
    Eval,
    /// A tail-calling interpreter's opcode handler: part of the activation below it.
    TailCall,
    /// Interpreter plumbing between activations: dropped there.
    Internal,
    /// Anything else: kept.
    Other,
}

/// One native frame as the merge sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NativeIn {
    pub role: Role,
    /// The stack pointer in this frame (0: unknown).
    pub sp: u64,
    /// Code of the interpreter binary.
    pub interpreter: bool,
    /// A symbol named it.
    pub named: bool,
    /// Its place in the caller's list of native frames (an eval frame [`anchor`] adds
    /// shares its neighbour's; it is never shown).
    pub index: usize,
}

impl NativeIn {
    /// A frame of the given role, inside or outside the interpreter, named.
    pub(crate) fn new(role: Role, sp: u64, interpreter: bool) -> NativeIn {
        NativeIn {
            role,
            sp,
            interpreter,
            named: true,
            index: 0,
        }
    }
}

/// Marks as eval frames the native frames that hold the groups' entry frames, which 3.12+ keep
/// on the C stack of their `_PyEval_EvalFrameDefault` call: the eval loop is then found by
/// where its frame is, whatever the symbols say (a stripped, partitioned eval loop is named
/// only near its entry). An entry frame inside a frame of other code (a frame-pointer walk
/// skips the caller of code without frame pointers, here the eval loop) gets an eval frame of
/// its own, just rootward of that frame.
pub(crate) fn anchor(native: &mut Vec<NativeIn>, groups: &[Group]) {
    for group in groups {
        let Some(entry) = group.entry else {
            continue;
        };
        let holder = native
            .windows(2)
            .position(|w| w[0].sp != 0 && w[1].sp != 0 && (w[0].sp..w[1].sp).contains(&entry));
        let Some(j) = holder else {
            continue;
        };
        if native[j].interpreter {
            native[j].role = Role::Eval;
        } else {
            let eval = NativeIn {
                role: Role::Eval,
                sp: native[j].sp,
                interpreter: true,
                named: false,
                index: native[j].index,
            };
            native.insert(j + 1, eval);
        }
    }
}

/// The Python frames of one activation: `frames[start..end]` of the sample's Python frames
/// (leaf first, `start` the previous group's `end`), and the address of the entry frame that
/// closes it, when it has one on the C stack. The groups cover every Python frame; the last
/// one is open (`entry: None`) when no entry frame closed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Group {
    pub end: usize,
    pub entry: Option<u64>,
}

/// One frame of the merged stack (leaf first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Piece {
    Python(usize),
    Native(usize),
    Marker(&'static str),
}

/// Marks where the native stack stopped short of its root.
pub(crate) const NATIVE_TRUNCATED: &str = "<native stack truncated>";
/// Marks a stack whose native part could not be merged (its Python frames are whole).
pub(crate) const NATIVE_UNMERGED: &str = "<native frames unavailable>";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Every activation found its group.
    Merged,
    /// The native stack ended early; its activations were paired with the leafmost groups.
    Partial,
    /// Nothing could be paired safely: Python frames only, under [`NATIVE_UNMERGED`].
    Failed,
}

/// Merges `native` (leaf first, `complete` when it reached the thread's root) with `groups`
/// of `python_len` Python frames. Returns the outcome; `out` gets the merged stack.
pub(crate) fn merge(
    native: &[NativeIn],
    complete: bool,
    groups: &[Group],
    python_len: usize,
    out: &mut Vec<Piece>,
) -> Outcome {
    out.clear();
    // Activations: (index of their eval frame, index of their leafmost frame).
    let mut activations: Vec<(usize, usize)> = Vec::new();
    let mut top = None;
    for (i, f) in native.iter().enumerate() {
        match f.role {
            Role::TailCall => {
                top.get_or_insert(i);
            }
            Role::Eval => activations.push((i, top.take().unwrap_or(i))),
            _ => top = None,
        }
    }
    // Entry frames at the root with no Python frame under them (a thread's base frame) run
    // no activation.
    let mut groups = groups;
    let start_of = |g: &[Group], k: usize| if k == 0 { 0 } else { g[k - 1].end };
    while let Some(last) = groups.last() {
        if last.end > start_of(groups, groups.len() - 1) || groups.len() == 1 {
            break;
        }
        groups = &groups[..groups.len() - 1];
    }
    let (m, n) = (activations.len(), groups.len());
    // Pairs from the leaf; every pair checked where addresses allow: a group's entry frame sits
    // in its activation's C frame, between the activation's stack pointer and the next
    // (older) frame's.
    let mut verified = 0;
    for (k, &(eval, leafmost)) in activations.iter().enumerate().take(n) {
        let (Some(entry), lo) = (groups[k].entry, native[leafmost].sp) else {
            continue;
        };
        let hi = native.get(eval + 1).map_or(0, |f| f.sp);
        if lo == 0 || hi == 0 {
            continue;
        }
        if !(lo..hi).contains(&entry) {
            return failed(python_len, out);
        }
        verified += 1;
    }
    // A native stack that reached its root must have as many eval loops as there are groups.
    // One cut short pairs its activations with the leafmost groups only if every pair was
    // checked: an eval loop that has not pushed its entry frame yet would shift the pairing.
    let paired = if m == n && (complete || verified == m) {
        Outcome::Merged
    } else if !complete && m < n && verified == m {
        Outcome::Partial
    } else {
        return failed(python_len, out);
    };
    let mut next = 0;
    for (k, &(eval, leafmost)) in activations.iter().enumerate() {
        let between = &native[next..leafmost];
        out.extend(
            between
                .iter()
                .enumerate()
                // The leaf's own calls stay whole: they are what its Python frame is doing.
                .filter(|(_, f)| k == 0 || f.role == Role::Other)
                .map(|(j, _)| Piece::Native(next + j)),
        );
        let start = start_of(groups, k);
        out.extend((start..groups[k].end).map(Piece::Python));
        next = eval + 1;
    }
    if m == 0 {
        // No activation at all: the whole native stack is the leaf's, then the Python stack.
        out.extend((0..native.len()).map(Piece::Native));
    } else {
        // Below the outermost eval loop: how the thread started. Named calls stay (a C
        // library that runs Python callbacks on its own threads); unnamed start-up code goes.
        out.extend(
            (next..native.len())
                .filter(|&j| native[j].role == Role::Other && native[j].named)
                .map(Piece::Native),
        );
    }
    if paired == Outcome::Partial || m == 0 {
        let start = if m == 0 { 0 } else { groups[m - 1].end };
        if start < python_len {
            out.push(Piece::Marker(NATIVE_TRUNCATED));
            out.extend((start..python_len).map(Piece::Python));
        }
        return Outcome::Partial;
    }
    // Python frames past the last group (none, when the walk's groups are whole).
    let end = groups.last().map_or(0, |g| g.end);
    out.extend((end..python_len).map(Piece::Python));
    paired
}

fn failed(python_len: usize, out: &mut Vec<Piece>) -> Outcome {
    out.clear();
    out.push(Piece::Marker(NATIVE_UNMERGED));
    out.extend((0..python_len).map(Piece::Python));
    Outcome::Failed
}

/// Interpreter functions kept between eval loops: what a thread waits on or spends on
/// collection, which people look for in a native profile.
const KEPT_INTERNALS: &[&str] = &[
    "time_sleep",
    "pysleep",
    "take_gil",
    "drop_gil",
    "PyThread_acquire_lock",
    "acquire_timed",
    "lock_PyThread_acquire_lock",
    "rlock_acquire",
    "PyMutex_Lock",
    "_PyMutex_Lock",
    "_PySemaphore_Wait",
    "gc_collect",
    "_PyGC_Collect",
    "PyGC_Collect",
    "_Py_RunGC",
];

/// C library frames at the root of every thread: plumbing too.
const ROOT_PLUMBING: &[&str] = &[
    "_start",
    "__libc_start_main",
    "__libc_start_call_main",
    "__libc_start_main_impl",
    "start_thread",
    "clone3",
    "clone",
];

/// What a native frame is to the merge, from its function and module.
pub(crate) fn role(function: Option<&str>, module: &str, interpreter: &str) -> Role {
    if module != interpreter {
        return match function {
            Some(f) if ROOT_PLUMBING.contains(&f) => Role::Internal,
            _ => Role::Other,
        };
    }
    match function {
        Some(f)
            if f == "_PyEval_EvalFrameDefault" || f.starts_with("_PyEval_EvalFrameDefault.") =>
        {
            Role::Eval
        }
        Some(f) if f.starts_with("_TAIL_CALL_") => Role::TailCall,
        Some(f) if KEPT_INTERNALS.iter().any(|k| f.starts_with(k)) => Role::Other,
        _ => Role::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(role: Role) -> NativeIn {
        NativeIn::new(role, 0, role != Other)
    }

    fn at(role: Role, sp: u64, interpreter: bool) -> NativeIn {
        NativeIn::new(role, sp, interpreter)
    }

    fn g(end: usize) -> Group {
        Group { end, entry: None }
    }

    use Piece::{Marker, Native as N, Python as P};
    use Role::{Eval, Internal, Other, TailCall};

    #[test]
    fn activations_take_their_groups_in_order() {
        // deflate, zlib_compress, [A1], PyObject_Call, qsort, [A2], main, _start
        let native = [
            n(Other),
            n(Other),
            n(Eval),
            n(Internal),
            n(Other),
            n(Eval),
            n(Internal),
            n(Other),
        ];
        let mut out = Vec::new();
        let outcome = merge(&native, true, &[g(2), g(3)], 3, &mut out);
        assert_eq!(outcome, Outcome::Merged);
        assert_eq!(out, [N(0), N(1), P(0), P(1), N(4), P(2), N(7)]);
    }

    #[test]
    fn tail_call_handlers_belong_to_the_eval_frame_below() {
        let native = [n(Other), n(TailCall), n(TailCall), n(Eval), n(Internal)];
        let mut out = Vec::new();
        assert_eq!(merge(&native, true, &[g(1)], 1, &mut out), Outcome::Merged);
        assert_eq!(out, [N(0), P(0)]);
    }

    #[test]
    fn counts_that_disagree_keep_the_python_stack_whole() {
        // An eval loop in its prologue has no group yet: pairing from the leaf would put
        // the caller's frames under the wrong C frames.
        let native = [n(Eval), n(Internal), n(Eval), n(Internal)];
        let mut out = Vec::new();
        assert_eq!(merge(&native, true, &[g(2)], 2, &mut out), Outcome::Failed);
        assert_eq!(out, [Marker(NATIVE_UNMERGED), P(0), P(1)]);
    }

    #[test]
    fn an_early_end_pairs_the_leafmost_activations() {
        let native = [
            at(Other, 0x1000, false),
            at(Eval, 0x1100, true),
            at(Other, 0x1400, false),
        ];
        let first = Group {
            end: 1,
            entry: Some(0x1200),
        };
        let mut out = Vec::new();
        let outcome = merge(&native, false, &[first, g(3)], 3, &mut out);
        assert_eq!(outcome, Outcome::Partial);
        assert_eq!(
            out,
            [N(0), P(0), N(2), Marker(NATIVE_TRUNCATED), P(1), P(2)]
        );
        // Without addresses to check the pairing against, an early end pairs nothing.
        let native = [n(Other), n(Eval), n(Other)];
        assert_eq!(
            merge(&native, false, &[g(1), g(3)], 3, &mut out),
            Outcome::Failed
        );
    }

    #[test]
    fn entry_frames_must_sit_in_their_activations_c_frame() {
        let native = [
            at(Other, 0x1000, false),
            at(Eval, 0x1100, true),
            at(Other, 0x1400, false),
        ];
        let mut out = Vec::new();
        let inside = Group {
            end: 1,
            entry: Some(0x1200),
        };
        assert_eq!(
            merge(&native, false, &[inside, g(2)], 2, &mut out),
            Outcome::Partial
        );
        let outside = Group {
            end: 1,
            entry: Some(0x1800),
        };
        assert_eq!(
            merge(&native, false, &[outside, g(2)], 2, &mut out),
            Outcome::Failed
        );
    }

    #[test]
    fn a_base_frame_at_the_root_is_not_an_activation() {
        // 3.15: the thread's base frame is an entry-owned shim with nothing under it.
        let native = [n(Eval), n(Internal)];
        let mut out = Vec::new();
        assert_eq!(
            merge(&native, true, &[g(2), g(2)], 2, &mut out),
            Outcome::Merged
        );
        assert_eq!(out, [P(0), P(1)]);
    }

    #[test]
    fn no_activation_keeps_the_native_leaf_and_marks_the_rest() {
        let native = [n(Other), n(Internal)];
        let mut out = Vec::new();
        assert_eq!(
            merge(&native, false, &[g(1)], 1, &mut out),
            Outcome::Partial
        );
        assert_eq!(out, [N(0), N(1), Marker(NATIVE_TRUNCATED), P(0)]);
    }

    #[test]
    fn entry_frames_find_unnamed_eval_loops() {
        // A stripped build: the eval loop's body has no symbol, but the entry frame of each
        // group lies in its C frame.
        let mut native = vec![
            at(Other, 0x1000, false),
            at(Internal, 0x1100, true),
            at(Internal, 0x1200, true),
            at(Internal, 0x1300, true),
            at(Other, 0x1400, false),
        ];
        let groups = [
            Group {
                end: 1,
                entry: Some(0x1180),
            },
            Group {
                end: 2,
                entry: Some(0x1350),
            },
        ];
        anchor(&mut native, &groups);
        let roles: Vec<Role> = native.iter().map(|f| f.role).collect();
        assert_eq!(roles, [Other, Eval, Internal, Eval, Other]);
        let mut out = Vec::new();
        assert_eq!(merge(&native, true, &groups, 2, &mut out), Outcome::Merged);
        assert_eq!(out, [N(0), P(0), P(1), N(4)]);
    }

    #[test]
    fn an_entry_frame_in_foreign_code_gets_an_eval_frame_after_it() {
        // A frame-pointer walk skipped the eval loop: its entry frame sits in the frame of
        // the libc function it called.
        let mut native = vec![at(Other, 0x1000, false), at(Internal, 0x1400, true)];
        let groups = [Group {
            end: 1,
            entry: Some(0x1200),
        }];
        anchor(&mut native, &groups);
        let roles: Vec<Role> = native.iter().map(|f| f.role).collect();
        assert_eq!(roles, [Other, Eval, Internal]);
        let mut out = Vec::new();
        assert_eq!(merge(&native, true, &groups, 1, &mut out), Outcome::Merged);
        assert_eq!(out, [N(0), P(0)]);
    }

    #[test]
    fn unnamed_start_up_code_below_the_outermost_eval_loop_goes() {
        let mut unnamed = at(Other, 0, false);
        unnamed.named = false;
        let native = [n(Eval), n(Internal), at(Other, 0, false), unnamed];
        let mut out = Vec::new();
        assert_eq!(merge(&native, true, &[g(1)], 1, &mut out), Outcome::Merged);
        assert_eq!(out, [P(0), N(2)]);
    }

    #[test]
    fn roles_of_native_frames() {
        let py = "python3.11";
        assert_eq!(role(Some("_PyEval_EvalFrameDefault"), py, py), Role::Eval);
        assert_eq!(
            role(Some("_PyEval_EvalFrameDefault.cold"), py, py),
            Role::Eval
        );
        assert_eq!(role(Some("_TAIL_CALL_BINARY_OP"), py, py), Role::TailCall);
        assert_eq!(role(Some("PyObject_Vectorcall"), py, py), Role::Internal);
        assert_eq!(role(None, py, py), Role::Internal);
        assert_eq!(role(Some("take_gil"), py, py), Role::Other);
        assert_eq!(
            role(Some("deflate_slow"), "libz.so.1.2.13", py),
            Role::Other
        );
        assert_eq!(
            role(Some("__libc_start_call_main"), "libc.so.6", py),
            Role::Internal
        );
        // The same name outside the interpreter is somebody else's function.
        assert_eq!(
            role(Some("_PyEval_EvalFrameDefault"), "libfoo.so", py),
            Role::Other
        );
    }
}
