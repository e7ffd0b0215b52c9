//! Process lifecycle, seen from the scheduler's tracepoints:
//!
//! - `sched_process_exec`: every `execve` on the host is announced to userspace through
//!   `PROC_EVENTS`, so a new interpreter is inspected within milliseconds instead of at the
//!   next `/proc` scan. A pid that was registered loses its entry: the old image is gone.
//! - `sched_process_exit`: every exiting thread leaves `THREADS`; when the last thread of a
//!   process exits (`group_dead`), its `PROCS` entry goes too and userspace is told, so the
//!   kernel maps stay as large as the set of live interpreters however many come and go.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::RingBuf,
    programs::TracePointContext,
};
use profiler_common::{stat, ProcEvent, PROC_EVENT_EXEC, PROC_EVENT_EXIT};

use crate::sampler::{bump, PROCS, THREADS};

/// Lifecycle notifications are rare next to samples: 256 KiB holds ~16k of them.
const PROC_EVENTS_BYTES: u32 = 256 << 10;

/// `sched_process_exit` format: `bool group_dead` at offset 32 (Linux 6.16+).
const EXIT_GROUP_DEAD_OFFSET: usize = 32;

#[map]
static PROC_EVENTS: RingBuf = RingBuf::with_byte_size(PROC_EVENTS_BYTES, 0);

#[inline(always)]
fn notify(kind: u32, pid: u32) {
    let event = ProcEvent {
        time_ns: unsafe { bpf_ktime_get_ns() },
        kind,
        pid,
    };
    if PROC_EVENTS.output::<ProcEvent>(&event, 0).is_err() {
        bump(stat::PROC_EVENT_DROPS);
    }
}

#[tracepoint]
pub fn process_exec(_ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    // After exec the caller is the process's only thread and carries the process id.
    let _ = PROCS.remove(&pid);
    let _ = THREADS.remove(&pid);
    notify(PROC_EVENT_EXEC, pid);
    0
}

#[tracepoint]
pub fn process_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    if THREADS.remove(&tid).is_ok() {
        bump(stat::EXIT_THREADS_REMOVED);
    }
    let group_dead: u8 = unsafe { ctx.read_at(EXIT_GROUP_DEAD_OFFSET) }.unwrap_or(0);
    if group_dead != 0 && PROCS.remove(&pid).is_ok() {
        bump(stat::EXIT_PROCS_REMOVED);
        notify(PROC_EVENT_EXIT, pid);
    }
    0
}
