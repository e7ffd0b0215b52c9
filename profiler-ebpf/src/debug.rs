//! BPF-side diagnostics (`pyebpf record --debug-bpf`), through aya-log.
//!
//! Every log statement goes through [`log_if!`]. Built without the `log` feature (the object
//! pyebpf loads normally) it expands to nothing: not a branch, not a load of a flag, so a
//! sample costs what it cost before the logging existed. The `log` build (the object
//! `--debug-bpf` loads) reads `DEBUG`, a read-only global userspace sets at load time to the
//! kinds asked for; the kernel freezes it before verifying, so the verifier drops the
//! branches of kinds not asked for. Messages go through aya-log's ring buffer, which drops
//! (and never blocks) when userspace falls behind.

#[cfg(feature = "log")]
use aya_ebpf::Global;

/// Frames whose owner code the layout does not know, and thread states that don't match.
pub const LOG_OWNERS: u32 = 1 << 0;
/// Failed reads of target (or kernel) memory, with their addresses.
pub const LOG_READS: u32 = 1 << 1;
/// Limits hit: frame and thread walks, chunk copies, the deep digest, full ring buffers.
pub const LOG_LIMITS: u32 = 1 << 2;
/// A layout that doesn't validate against what the walk finds.
pub const LOG_LAYOUT: u32 = 1 << 3;

/// `LOG_*` bits userspace asked for.
#[cfg(feature = "log")]
#[unsafe(no_mangle)]
static DEBUG: Global<u32> = Global::new(0);

#[cfg(feature = "log")]
#[inline(always)]
pub fn enabled(what: u32) -> bool {
    DEBUG.load() & what != 0
}

/// The current process id, for log messages.
#[cfg(feature = "log")]
#[inline(always)]
pub fn current_pid() -> u32 {
    (aya_ebpf::helpers::bpf_get_current_pid_tgid() >> 32) as u32
}

/// `log_if!(LOG_READS, "format {}", args...)`: an aya-log warning when `--debug-bpf` asked for
/// that kind of message.
#[cfg(feature = "log")]
macro_rules! log_if {
    ($what:expr, $($arg:tt)+) => {
        if $crate::debug::enabled($what) {
            aya_log_ebpf::warn!(&(), $($arg)+);
        }
    };
}

/// Without the `log` feature: nothing at all (naming the kind only keeps its import used).
#[cfg(not(feature = "log"))]
macro_rules! log_if {
    ($what:expr, $($arg:tt)+) => {
        let _ = $what;
    };
}
pub(crate) use log_if;
