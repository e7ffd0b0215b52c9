//! BPF-side diagnostics (`pyebpf record --debug-bpf`), through aya-log.
//!
//! Every log statement goes through [`log_if!`], which first reads `DEBUG`: a read-only
//! global that userspace sets at load time. The kernel freezes read-only data before it
//! verifies a program, so the verifier knows the value, never explores a disabled branch and
//! removes it as dead code: with `--debug-bpf` off a sample runs exactly the instructions it
//! ran before the logging existed. With it on, messages go through aya-log's ring buffer,
//! which drops (and never blocks) when userspace falls behind.

use aya_ebpf::Global;

/// Frames whose owner code the layout does not know, and thread states that don't match.
pub const LOG_OWNERS: u32 = 1 << 0;
/// Failed reads of target (or kernel) memory, with their addresses.
pub const LOG_READS: u32 = 1 << 1;
/// Limits hit: frame and thread walks, stack windows, the deep digest, full ring buffers.
pub const LOG_LIMITS: u32 = 1 << 2;
/// A layout that doesn't validate against what the walk finds.
pub const LOG_LAYOUT: u32 = 1 << 3;

/// `LOG_*` bits userspace asked for; 0 (the default) removes every log site at load.
#[unsafe(no_mangle)]
static DEBUG: Global<u32> = Global::new(0);

#[inline(always)]
pub fn enabled(what: u32) -> bool {
    DEBUG.load() & what != 0
}

/// `log_if!(LOG_READS, "format {}", args...)`: an aya-log warning when `--debug-bpf` asked for
/// that kind of message.
macro_rules! log_if {
    ($what:expr, $($arg:tt)+) => {
        if $crate::debug::enabled($what) {
            aya_log_ebpf::warn!(&(), $($arg)+);
        }
    };
}
pub(crate) use log_if;
