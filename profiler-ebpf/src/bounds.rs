//! Sizes handed to helpers, in a form every verifier since 6.1 can bound by itself.
//!
//! A helper that copies `len` bytes wants the verifier to prove `len` fits the buffer. A
//! comparison in the source (`if len > MAX { return }`) is not enough on older kernels: the
//! compiler tests one copy of the value and passes another (reloaded from the stack, or
//! recomputed), whose bounds the 6.1 verifier never learned; and where the compiler can
//! already prove the bound it deletes the comparison altogether. So the value is first made
//! opaque to the compiler, then masked: the mask survives optimization and travels with the
//! register, spills included.

/// `value`, with everything the compiler knows about it forgotten.
#[inline(always)]
fn opaque(mut value: u64) -> u64 {
    // A register move onto itself: one real instruction, because an empty sequence leaves a
    // line-info record with no instruction of its own, which 6.1's loader refuses.
    // SAFETY: the instruction reads and writes only `value`'s register.
    unsafe { core::arch::asm!("{0} = {0}", inout(reg) value, options(pure, nomem, nostack)) };
    value
}

/// `len` (which the caller keeps within 1..=`MAX`) as a value the verifier knows is within
/// 1..=`MAX`. `MAX` is a power of two; a `len` outside the range wraps into it.
#[inline(always)]
pub(crate) fn size<const MAX: u64>(len: u64) -> u64 {
    const { assert!(MAX.is_power_of_two()) };
    (opaque(len).wrapping_sub(1) & (MAX - 1)) + 1
}
