//! The asyncio task readers of `--async` and `dump --async` (`python::asyncio`, 3.14+):
//! `read_task` (name, awaiter set or single awaiter, coroutine chain), `coro_chain` (a
//! suspended `await` chain, coroutine by coroutine, down to what is not a coroutine) and
//! `all_tasks` (each thread's and interpreter's `llist_node` task list), with the layouts of
//! 3.14 and 3.15 paired with their real `.AsyncioDebug` sections.
//!
//! Arguments: 0 a task, 1 a coroutine, 2 `_PyRuntime`. Inputs of a layout without asyncio
//! offsets (3.11–3.13) are skipped.
#![no_main]

use std::collections::HashSet;

use libfuzzer_sys::fuzz_target;
use profiler::fuzzing::{
    all_tasks, coro_chain, read_task, Task, MAX_AWAITERS, MAX_CORO_DEPTH, MAX_TASKS,
};
use profiler::python::asyncio::AsyncLayout;
use profiler::python::layout::PyLayout;
use profiler_common::RawFrame;
use pyebpf_fuzz::{async_layouts, load, write_seeds, Image, ARENA};

/// Tasks of one listing read whole (each may cost a chain of [`MAX_CORO_DEPTH`] coroutines).
const TASKS_READ: usize = 8;

fn addr(at: usize) -> u64 {
    ARENA + at as u64
}

/// A C string and a type object whose `tp_name` is it.
fn type_object(im: &mut Image, l: &PyLayout, name: &str) -> u64 {
    let text = im.alloc(name.len() + 1);
    im.put(text, name.as_bytes());
    let ty = im.alloc(l.tp_name as usize + 8);
    im.u64(ty + l.tp_name as usize, addr(text));
    addr(ty)
}

/// An `str` object of type `ty`.
fn str_object(im: &mut Image, l: &PyLayout, ty: u64, text: &str, width: u32) -> u64 {
    let u = &l.unicode;
    let at = im.alloc(u.ascii_data.max(u.compact_data) as usize + 4 * text.chars().count() + 4);
    im.u64(at + l.ob_type as usize, ty);
    im.str(l, at, text, width)
}

/// Where a coroutine (or a task's coroutine) awaits.
enum Awaits {
    /// Suspended in `await` on this object.
    On(u64),
    /// Running (or just created): not suspended in an `await`.
    Nothing,
}

/// A coroutine object of type `ty` running `code`, its frame's value stack holding what it
/// awaits where a suspended `yield from` keeps it.
fn coroutine(
    im: &mut Image,
    l: &PyLayout,
    a: &AsyncLayout,
    ty: u64,
    code: u64,
    awaits: Awaits,
) -> u64 {
    let k = &l.kernel;
    let o = &a.coroutines;
    let frame_fields = [k.frame_executable, k.frame_instr_ptr, o.stackpointer]
        .into_iter()
        .max()
        .unwrap_or(0) as usize
        + 8;
    let locals = o.gi_iframe as usize + l.frame_localsplus as usize;
    let len = (o.gi_iframe as usize + frame_fields)
        .max(o.gi_frame_state as usize + 1)
        .max(locals + 4 * 8);
    let gen = im.alloc(len);
    let frame = gen + o.gi_iframe as usize;
    let locals = gen + locals;
    // Two locals, then the value stack: the awaited object on top.
    let sp = addr(locals) + 8 * (2 + o.yield_from_slot as u64);
    im.u64(gen + l.ob_type as usize, ty)
        .u64(frame + k.frame_executable as usize, code)
        .u64(frame + k.frame_instr_ptr as usize, code + 0x80)
        .u64(frame + o.stackpointer as usize, sp);
    match awaits {
        Awaits::On(obj) => {
            im.u64((sp - 8 * o.yield_from_slot as u64 - ARENA) as usize, obj);
            im.put(
                gen + o.gi_frame_state as usize,
                &[o.suspended_yield_from as u8],
            );
        }
        Awaits::Nothing => {
            im.put(
                gen + o.gi_frame_state as usize,
                &[o.suspended_yield_from.wrapping_add(3) as u8],
            );
        }
    }
    addr(gen)
}

/// Circular `llist_node` lists: `head` (inside its interpreter or thread state) through the
/// `node`s of `tasks`, back to `head`.
fn task_list(im: &mut Image, a: &AsyncLayout, head: u64, tasks: &[u64]) {
    let next = a.coroutines.llist_next as u64;
    let prev = if next == 0 { 8 } else { 0 };
    let nodes: Vec<u64> = tasks
        .iter()
        .map(|t| t + a.offsets.task.node as u64)
        .collect();
    let ring: Vec<u64> = std::iter::once(head).chain(nodes).collect();
    for (n, &node) in ring.iter().enumerate() {
        let after = ring[(n + 1) % ring.len()];
        let before = ring[(n + ring.len() - 1) % ring.len()];
        im.u64((node + next - ARENA) as usize, after)
            .u64((node + prev - ARENA) as usize, before);
    }
}

/// One runtime, interpreter and two thread states (one of them without tasks), and three
/// tasks: `main` (a `str` name) awaiting `Task-7` (an `int` name) and `wörker` (a UCS-2
/// name); `Task-7`, awaited by a set of both, suspended in a chain of two coroutines that
/// ends at a future; `wörker`, awaited by `main` alone, running. The interpreter's own list
/// holds a task of a thread that ended. One seed per task as argument 0.
fn seeds(i: usize, l: &PyLayout) -> Vec<Vec<u8>> {
    let Some(a) = async_layouts()[i] else {
        return Vec::new();
    };
    let (k, t, o) = (&l.kernel, &a.offsets.task, &a.coroutines);
    let mut out = Vec::new();
    for arg in 0..3 {
        let mut im = Image::new(i, 0);
        let runtime = im.alloc(k.runtime_interpreters_head as usize + 8);
        let interp = im.alloc(
            [
                k.interp_next as usize + 8,
                k.interp_threads_head as usize + 8,
                a.offsets.interp_tasks_head as usize + 16,
            ]
            .into_iter()
            .max()
            .unwrap_or(0),
        );
        let tstate_len = [
            k.tstate_next as usize + 8,
            k.tstate_interp as usize + 8,
            a.offsets.thread_running_loop as usize + 8,
            a.offsets.thread_running_task as usize + 8,
            a.offsets.thread_tasks_head as usize + 16,
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        let tstates = [im.alloc(tstate_len), im.alloc(tstate_len)];
        im.u64(runtime + k.runtime_interpreters_head as usize, addr(interp))
            .u64(interp + k.interp_threads_head as usize, addr(tstates[0]))
            .u64(tstates[0] + k.tstate_next as usize, addr(tstates[1]));
        for &ts in &tstates {
            im.u64(ts + k.tstate_interp as usize, addr(interp));
        }

        let coro_ty = type_object(&mut im, l, "coroutine");
        let task_ty = type_object(&mut im, l, "_asyncio.Task");
        let future_ty = type_object(&mut im, l, "_asyncio.Future");
        let str_ty = type_object(&mut im, l, "str");
        let int_ty = type_object(&mut im, l, "int");
        let code = im.alloc(0x200);
        im.put(code, &[0x5a; 0x200]);
        let code = addr(code);

        let tasks: Vec<usize> = (0..4).map(|_| im.alloc(t.size as usize)).collect();
        let [main, seven, worker, orphan] = [tasks[0], tasks[1], tasks[2], tasks[3]].map(addr);

        // Names.
        let main_name = str_object(&mut im, l, str_ty, "main", 1);
        let worker_name = str_object(&mut im, l, str_ty, "wörker", 2);
        let orphan_name = str_object(&mut im, l, str_ty, "orphan", 1);
        let int_name = im.alloc(o.long_tag.max(o.long_digit) as usize + 8);
        im.u64(int_name + l.ob_type as usize, int_ty)
            .u64(int_name + o.long_tag as usize, 1 << 3)
            .u32(int_name + o.long_digit as usize, 7);

        // Coroutines: main awaits Task-7; Task-7 runs two coroutines, the inner one awaiting
        // a future; wörker runs; the orphan awaits Task-7 too.
        let future = im.alloc(l.ob_type as usize + 8);
        im.u64(future + l.ob_type as usize, future_ty);
        let main_coro = coroutine(&mut im, l, &a, coro_ty, code, Awaits::On(seven));
        let inner = coroutine(
            &mut im,
            l,
            &a,
            coro_ty,
            code + 0x10,
            Awaits::On(addr(future)),
        );
        // (a tagged `_PyStackRef`, where the layout masks tags)
        let tag = !k.executable_mask & 1;
        let outer = coroutine(
            &mut im,
            l,
            &a,
            coro_ty,
            code + 0x20,
            Awaits::On(inner | tag),
        );
        let worker_coro = coroutine(&mut im, l, &a, coro_ty, code + 0x30, Awaits::Nothing);
        let orphan_coro = coroutine(&mut im, l, &a, coro_ty, code, Awaits::On(seven));

        // Task-7's awaiter set: main, a deleted entry, wörker, in a table of 8 slots.
        let table = im.alloc(8 * 16);
        let dummy = im.alloc(16);
        for (slot, key, hash) in [
            (1, main, 0x1234u64),
            (4, addr(dummy), u64::MAX),
            (6, worker, 0x5678),
        ] {
            im.u64(table + 16 * slot, key)
                .u64(table + 16 * slot + 8, hash);
        }
        let set = im.alloc(
            [o.set_used, o.set_table, o.set_mask]
                .into_iter()
                .max()
                .unwrap_or(0) as usize
                + 8,
        );
        im.u64(set + o.set_used as usize, 2)
            .u64(set + o.set_table as usize, addr(table))
            .u64(set + o.set_mask as usize, 7);

        for (task, coro, name, awaited_by, is_set) in [
            (tasks[0], main_coro, main_name, 0, 0),
            (tasks[1], outer, addr(int_name), addr(set), 1),
            (tasks[2], worker_coro, worker_name, main, 0),
            (tasks[3], orphan_coro, orphan_name, 0, 0),
        ] {
            im.u64(task + l.ob_type as usize, task_ty)
                .u64(task + t.coro as usize, coro)
                .u64(task + t.name as usize, name)
                .u64(task + t.awaited_by as usize, awaited_by)
                .put(task + t.is_task as usize, &[1])
                .put(task + t.awaited_by_is_set as usize, &[is_set]);
        }

        let head = |at: usize, off: u16| addr(at) + off as u64;
        task_list(
            &mut im,
            &a,
            head(tstates[0], a.offsets.thread_tasks_head),
            &[main, seven, worker],
        );
        task_list(
            &mut im,
            &a,
            head(tstates[1], a.offsets.thread_tasks_head),
            &[],
        );
        task_list(
            &mut im,
            &a,
            head(interp, a.offsets.interp_tasks_head),
            &[orphan],
        );
        im.u64(tstates[0] + a.offsets.thread_running_task as usize, main);

        let (task, coro) = [(seven, outer), (main, main_coro), (worker, worker_coro)][arg];
        im.arg(0, task).arg(1, coro).arg(2, addr(runtime));
        out.push(im.finish());
    }
    out
}

/// What every chain `coro_chain` gives satisfies.
fn check_chain(a: &AsyncLayout, coro: u64, frames: &[RawFrame]) {
    assert!(!frames.is_empty(), "a chain read has its first coroutine");
    assert!(
        frames.len() <= MAX_CORO_DEPTH,
        "{} coroutines",
        frames.len()
    );
    assert_eq!(
        frames.last().map(|f| f.frame),
        Some(a.coro_frame(coro)),
        "leaf first"
    );
    assert!(frames.iter().all(|f| f.code != 0), "a frame without code");
    let distinct: HashSet<u64> = frames.iter().map(|f| f.frame).collect();
    assert_eq!(
        distinct.len(),
        frames.len(),
        "a coroutine twice in one chain"
    );
}

fn check_task(pid: u32, l: &PyLayout, a: &AsyncLayout, addr: u64, task: &Task) {
    assert_eq!(task.addr, addr);
    assert!(task.coro != 0);
    assert!(
        task.name.chars().count() <= 4096,
        "name of {} chars",
        task.name.chars().count()
    );
    assert!(
        task.awaited_by.len() <= MAX_AWAITERS,
        "{} awaiters",
        task.awaited_by.len()
    );
    assert!(task.awaited_by.iter().all(|&t| t != 0), "a null awaiter");
    let distinct: HashSet<u64> = task.awaited_by.iter().copied().collect();
    assert_eq!(distinct.len(), task.awaited_by.len(), "an awaiter twice");
    check_chain(a, task.coro, &task.coro_frames);
    // The task's chain is its coroutine's (memory did not change).
    assert_eq!(
        coro_chain(pid, l, a, task.coro),
        Some((task.coro_frames.clone(), task.coro_truncated))
    );
}

fuzz_target!(
    init: write_seeds("tasks", seeds),
    |data: &[u8]| {
        let Some(input) = load(data) else {
            return;
        };
        let Some(a) = async_layouts()[input.index] else {
            return;
        };
        let pid = std::process::id();
        let l = &input.layout;
        let [task, coro, runtime, _] = input.args;
        if let Some(t) = read_task(pid, l, &a, task) {
            check_task(pid, l, &a, task, &t);
        }
        if let Some((frames, _)) = coro_chain(pid, l, &a, coro) {
            check_chain(&a, coro, &frames);
        }
        if let Some(tasks) = all_tasks(pid, l, &a, runtime) {
            assert!(tasks.len() <= MAX_TASKS, "{} tasks", tasks.len());
            let distinct: HashSet<u64> = tasks.iter().copied().collect();
            assert_eq!(distinct.len(), tasks.len(), "a task listed twice");
            for &t in tasks.iter().take(TASKS_READ) {
                if let Some(info) = read_task(pid, l, &a, t) {
                    check_task(pid, l, &a, t, &info);
                }
            }
        }
    }
);
