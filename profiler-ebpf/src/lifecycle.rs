//! Process lifecycle, seen from the scheduler's tracepoints, attached through BTF (`tp_btf`):
//! nothing needs tracefs or debugfs mounted, only `/sys/kernel/btf/vmlinux`.
//!
//! - `sched_process_exec`: every `execve` on the host is announced to userspace through
//!   `PROC_EVENTS`, so a new interpreter is inspected within milliseconds instead of at the
//!   next `/proc` scan. A pid that was registered loses its entry: the old image is gone.
//! - `sched_process_exit`: every exiting thread leaves `THREADS`; when the last thread of a
//!   process exits, its `PROCS` entry goes too and userspace is told, so the kernel maps stay
//!   as large as the set of live interpreters however many come and go.
//!
//! "Last thread" is `current->signal->live == 0`: `do_exit` decrements the live-thread count
//! before it fires the tracepoint, on every kernel since long before 6.1. (Linux 6.16 also
//! passes `group_dead` to the tracepoint, but older kernels don't, so it is not used.) The
//! two field offsets come from the running kernel's BTF, set by userspace at load time.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map},
    maps::RingBuf,
    programs::BtfTracePointContext,
    Global,
};
use profiler_common::{stat, ProcEvent, PROC_EVENT_EXEC, PROC_EVENT_EXIT};

use crate::{
    debug::{log_if, LOG_READS},
    sampler::{bump, PROCS, THREADS},
};

/// Lifecycle notifications are rare next to samples: 256 KiB holds ~16k of them.
const PROC_EVENTS_BYTES: u32 = 256 << 10;

/// `offsetof(struct task_struct, signal)` in the running kernel (from its BTF; 0: unknown,
/// and exits are then left to userspace's `/proc` sweep).
#[unsafe(no_mangle)]
static TASK_SIGNAL_OFFSET: Global<u32> = Global::new(0);
/// `offsetof(struct signal_struct, live)` (an `atomic_t`).
#[unsafe(no_mangle)]
static SIGNAL_LIVE_OFFSET: Global<u32> = Global::new(0);

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

#[btf_tracepoint(function = "sched_process_exec")]
pub fn process_exec(_ctx: BtfTracePointContext) -> i32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    // After exec the caller is the process's only thread and carries the process id.
    let _ = PROCS.remove(&pid);
    let _ = THREADS.remove(&pid);
    notify(PROC_EVENT_EXEC, pid);
    0
}

#[btf_tracepoint(function = "sched_process_exit")]
pub fn process_exit(_ctx: BtfTracePointContext) -> i32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    if THREADS.remove(&tid).is_ok() {
        bump(stat::EXIT_THREADS_REMOVED);
    }
    // Only registered interpreters matter: one lookup spares every other exit the reads.
    if unsafe { PROCS.get(&pid) }.is_none() {
        return 0;
    }
    if live_threads() == Some(0) && PROCS.remove(&pid).is_ok() {
        bump(stat::EXIT_PROCS_REMOVED);
        notify(PROC_EVENT_EXIT, pid);
    }
    0
}

/// `current->signal->live`: the process's threads that have not started exiting.
#[inline(always)]
fn live_threads() -> Option<i32> {
    let signal_offset = TASK_SIGNAL_OFFSET.load();
    let live_offset = SIGNAL_LIVE_OFFSET.load();
    if signal_offset == 0 {
        return None;
    }
    let task = unsafe { bpf_get_current_task() };
    let signal: u64 = read_kernel(task.wrapping_add(signal_offset as u64))?;
    let live: i32 = read_kernel(signal.wrapping_add(live_offset as u64))?;
    Some(live)
}

#[inline(always)]
fn read_kernel<T>(addr: u64) -> Option<T> {
    let value = unsafe { aya_ebpf::helpers::bpf_probe_read_kernel(addr as *const T) };
    if value.is_err() {
        bump(stat::READ_ERRORS);
        log_if!(LOG_READS, "exit hook: kernel read at {:x} failed", addr);
    }
    value.ok()
}
