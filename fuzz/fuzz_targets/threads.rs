//! The thread-list reader of `--idle` and `dump` (`python::threads`): `thread_states` walks
//! `_PyRuntime` → interpreters → thread states, `thread_fields` reads one thread state (and,
//! in 3.11 and 3.12, its `_PyCFrame`).
//!
//! Arguments: 0 `_PyRuntime`, 1 a thread state.
#![no_main]

use libfuzzer_sys::fuzz_target;
use profiler::fuzzing::{thread_fields, thread_states};
use profiler::python::layout::PyLayout;
use profiler_common::{LAYOUT_CFRAME, MAX_INTERPRETERS, MAX_THREAD_WALK};
use pyebpf_fuzz::{load, write_seeds, Image, ARENA};

/// The most thread states one walk gives: [`MAX_THREAD_WALK`] in each of [`MAX_INTERPRETERS`].
const MAX_THREADS: usize = (MAX_INTERPRETERS * MAX_THREAD_WALK) as usize;
/// The most remote reads one walk makes: the runtime's list head; per interpreter its thread
/// list head and its `next`; per thread state its prefix and its `_PyCFrame`.
const MAX_READS: u64 = 1 + MAX_INTERPRETERS as u64 * (2 + 2 * MAX_THREAD_WALK as u64);

fn addr(at: usize) -> u64 {
    ARENA + at as u64
}

/// Runtimes with one interpreter of three thread states (the last one running no Python
/// code), and with two interpreters of two and one.
fn seeds(i: usize, l: &PyLayout) -> Vec<Vec<u8>> {
    let k = &l.kernel;
    let cframe = k.flags & LAYOUT_CFRAME != 0;
    let interp_len = k.interp_next.max(k.interp_threads_head) as usize + 8;
    let tstate_len = [
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
    let mut out = Vec::new();
    for threads_per_interp in [&[3usize][..], &[2, 1]] {
        let mut im = Image::new(i, 0);
        let runtime = im.alloc(k.runtime_interpreters_head as usize + 8);
        let interps: Vec<usize> = threads_per_interp
            .iter()
            .map(|_| im.alloc(interp_len))
            .collect();
        im.u64(
            runtime + k.runtime_interpreters_head as usize,
            addr(interps[0]),
        );
        let mut first_tstate = None;
        let mut native_id = 4242;
        for (n, (&interp, &threads)) in interps.iter().zip(threads_per_interp).enumerate() {
            if let Some(&next) = interps.get(n + 1) {
                im.u64(interp + k.interp_next as usize, addr(next));
            }
            let tstates: Vec<usize> = (0..threads).map(|_| im.alloc(tstate_len)).collect();
            im.u64(interp + k.interp_threads_head as usize, addr(tstates[0]));
            first_tstate.get_or_insert(tstates[0]);
            for (t, &tstate) in tstates.iter().enumerate() {
                // A stack chunk and a frame in it; the last thread runs no Python code.
                let chunk = im.alloc(0x100);
                let running = t + 1 < threads || threads == 1;
                let frame = if running { addr(chunk + 0x40) } else { 0 };
                let current = if cframe {
                    let c = im.alloc(k.cframe_current_frame as usize + 8);
                    im.u64(c + k.cframe_current_frame as usize, frame);
                    addr(c)
                } else {
                    frame
                };
                let next = tstates.get(t + 1).map_or(0, |&n| addr(n));
                im.u64(tstate + k.tstate_next as usize, next)
                    .u64(tstate + k.tstate_interp as usize, addr(interp))
                    .u64(tstate + k.tstate_native_thread_id as usize, native_id)
                    .u64(tstate + k.tstate_current_frame as usize, current)
                    .u64(tstate + k.tstate_datastack_chunk as usize, addr(chunk));
                native_id += 1;
            }
        }
        im.arg(0, addr(runtime))
            .arg(1, addr(first_tstate.expect("a thread state")));
        out.push(im.finish());
    }
    out
}

fuzz_target!(
    init: write_seeds("threads", seeds),
    |data: &[u8]| {
        let Some(input) = load(data) else {
            return;
        };
        let pid = std::process::id();
        let l = &input.layout;
        let [runtime, tstate, _, _] = input.args;
        let mut reads = 0;
        if let Some(threads) = thread_states(pid, l, runtime, &mut reads) {
            assert!(threads.len() <= MAX_THREADS, "{} thread states", threads.len());
            assert!(reads <= MAX_READS, "{reads} reads");
            // A list that loops back is refused, so no thread is reported twice.
            let distinct: std::collections::HashSet<u64> =
                threads.iter().map(|t| t.tstate).collect();
            assert_eq!(distinct.len(), threads.len(), "a thread state listed twice");
            // Each list is followed through `next`: a thread state is followed by its `next`,
            // unless its list ended there (`next` 0, or the walk's cap) and another
            // interpreter's list starts.
            let capped = threads.len() >= MAX_THREAD_WALK as usize;
            for w in threads.windows(2) {
                assert!(
                    w[0].next == w[1].tstate || w[0].next == 0 || capped,
                    "{:#x} follows {:#x} (next {:#x})",
                    w[1].tstate,
                    w[0].tstate,
                    w[0].next
                );
            }
            // Memory did not change: a thread state read again alone reads the same.
            for t in threads.iter().take(4) {
                let mut again = 0;
                assert_eq!(thread_fields(pid, l, t.tstate, &mut again), Some(*t));
                assert!(again <= 2);
            }
        }
        let mut reads = 0;
        let _ = thread_fields(pid, l, tstate, &mut reads);
        assert!(reads <= 2, "{reads} reads of one thread state");
    }
);
