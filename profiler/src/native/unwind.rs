//! Unwinding a copy of the top of a user stack with framehop.
//!
//! The kernel hands over the registers at the interrupt and up to 32 KiB of stack from `sp`.
//! framehop reads `.eh_frame` (via `.eh_frame_hdr`), or `.debug_frame`, of the module holding
//! each address, and falls back to frame pointers for code without CFI (JIT code, stripped
//! unwind info). It reads only the copied bytes: a read past them ends the walk as
//! [`StackEnd::OutOfStack`], which is expected for deep stacks, not a failure.
//!
//! One framehop unwinder per process, holding that process's modules at their addresses, built
//! from the [`FileCache`]'s shared sections; one rule cache shared by all of them (framehop
//! tags its entries with a global module generation, so processes do not mix).

use std::ops::Range;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{Error as UnwindError, ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};

use super::modules::{FileCache, Mapping, SectionData};
use super::StackEnd;

/// Frames walked at most; deeper stacks end in [`StackEnd::MaxFrames`].
pub(super) const MAX_FRAMES: usize = 256;
/// A read this far past the copied bytes still looks like the same stack (the default thread
/// stack is 8 MiB); farther, the walk followed a garbage pointer.
const STACK_REACH: u64 = 16 << 20;
/// framehop's module generation is a global `u16` that wraps: a rule cached under generation
/// `g` could be reused 65536 module additions later for another module at the same address.
/// The shared cache starts over well before that.
const MODULES_PER_CACHE: u64 = 30_000;

pub(crate) type ProcessUnwinder = UnwinderX86_64<SectionData>;

/// One walked frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RawFrame {
    /// The interrupted ip (first frame) or a return address.
    pub address: u64,
    pub return_address: bool,
    /// The stack pointer in this frame: the interrupted `sp` for the first frame, then the
    /// canonical frame address of the callee (the caller's `sp` after the call returns).
    pub sp: u64,
}

impl RawFrame {
    /// The address to look up: inside the call instruction for a return address, since the
    /// address after a `call` may already belong to the next function.
    pub(super) fn lookup_address(&self) -> u64 {
        if self.return_address {
            self.address.saturating_sub(1)
        } else {
            self.address
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Walk {
    pub frames: Vec<RawFrame>,
    pub end: StackEnd,
}

/// framehop's rule cache, shared by every process's unwinder.
pub(crate) struct RuleCache {
    cache: CacheX86_64,
    modules_added: u64,
    pub resets: u64,
}

impl Default for RuleCache {
    fn default() -> Self {
        Self {
            cache: CacheX86_64::new(),
            modules_added: 0,
            resets: 0,
        }
    }
}

impl RuleCache {
    fn count_modules(&mut self, added: u64) {
        self.modules_added += added;
        if self.modules_added >= MODULES_PER_CACHE {
            self.cache = CacheX86_64::new();
            self.modules_added = 0;
            self.resets += 1;
        }
    }
}

/// An unwinder for a process with `maps` (sorted), reading files through `pid`'s
/// `/proc` entries when they are not cached yet.
pub(crate) fn build(
    pid: u32,
    maps: &[Mapping],
    files: &mut FileCache,
    rules: &mut RuleCache,
) -> ProcessUnwinder {
    let mut unwinder = ProcessUnwinder::new();
    let mut added = 0;
    for mapping in maps {
        let Some(file) = files.get(pid, mapping) else {
            continue;
        };
        let Some(bias) = file.load_bias(mapping) else {
            continue;
        };
        let u = &file.unwind;
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: u.text_svma.clone(),
            got_svma: u.got_svma.clone(),
            eh_frame_svma: u.eh_frame_svma.clone(),
            eh_frame: u.eh_frame.clone(),
            eh_frame_hdr_svma: u.eh_frame_hdr_svma.clone(),
            eh_frame_hdr: u.eh_frame_hdr.clone(),
            debug_frame: u.debug_frame.clone(),
            ..Default::default()
        };
        let range: Range<u64> = mapping.start..mapping.end;
        unwinder.add_module(Module::new(file.name.to_string(), range, bias, info));
        added += 1;
    }
    rules.count_modules(added);
    unwinder
}

/// Walks the stack copied from `sp` (`stack` holds the bytes at `sp..sp + stack.len()`).
pub(crate) fn walk(
    unwinder: &ProcessUnwinder,
    rules: &mut RuleCache,
    ip: u64,
    sp: u64,
    bp: u64,
    stack: &[u8],
) -> Walk {
    let mut frames = Vec::with_capacity(32);
    let mut regs = UnwindRegsX86_64::new(ip, sp, bp);
    let copied_end = sp.saturating_add(stack.len() as u64);
    let mut read_stack = |addr: u64| -> Result<u64, ()> {
        let at = usize::try_from(addr.checked_sub(sp).ok_or(())?).map_err(|_| ())?;
        let bytes = stack.get(at..at.checked_add(8).ok_or(())?).ok_or(())?;
        Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| ())?))
    };
    if ip == 0 {
        return Walk {
            frames,
            end: StackEnd::Complete,
        };
    }
    frames.push(RawFrame {
        address: ip,
        return_address: false,
        sp,
    });
    let mut address = FrameAddress::from_instruction_pointer(ip);
    let cache = &mut rules.cache;
    let end = loop {
        if frames.len() >= MAX_FRAMES {
            break StackEnd::MaxFrames;
        }
        // framehop computes `cfa - 8` unchecked on one path: with garbage in `rbp` that
        // overflows, which panics in debug builds. A walk that panics is a failed walk.
        let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            unwinder.unwind_frame(address, &mut regs, cache, &mut read_stack)
        }));
        match step {
            Ok(Ok(Some(return_address))) => {
                let Some(next) = FrameAddress::from_return_address(return_address) else {
                    break StackEnd::Complete;
                };
                frames.push(RawFrame {
                    address: return_address,
                    return_address: true,
                    sp: regs.sp(),
                });
                address = next;
            }
            Ok(Ok(None)) | Ok(Err(UnwindError::ReturnAddressIsNull)) => break StackEnd::Complete,
            Ok(Err(UnwindError::CouldNotReadStack(at)))
                if at >= copied_end && at - copied_end < STACK_REACH =>
            {
                break StackEnd::OutOfStack
            }
            Ok(Err(_)) | Err(_) => break StackEnd::Failed,
        }
    };
    Walk { frames, end }
}
