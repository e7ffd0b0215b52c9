//! Real stacks and real files: this test process's own stack, its libc, a `sleep` child.

use super::modules::{self, Mapping};
use super::*;
use crate::memory::ProcessMemory;

/// The registers here and up to 32 KiB of this thread's stack from `sp`, as the kernel
/// would copy them.
#[inline(never)]
fn capture() -> (Regs, Vec<u8>) {
    let (ip, sp, bp): (u64, u64, u64);
    // SAFETY: reads three registers into locals, touches no memory.
    unsafe {
        std::arch::asm!(
            "lea {ip}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            ip = out(reg) ip,
            sp = out(reg) sp,
            bp = out(reg) bp,
            options(nomem, nostack, preserves_flags),
        );
    }
    let stack = copy_own_stack(sp, 32 << 10);
    (Regs { ip, sp, bp }, stack)
}

/// Up to `len` bytes from `sp`, stopping where the stack's mapping ends.
fn copy_own_stack(sp: u64, len: u64) -> Vec<u8> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let end = maps
        .lines()
        .filter_map(|l| {
            let (start, end) = l.split_whitespace().next()?.split_once('-')?;
            Some((
                u64::from_str_radix(start, 16).ok()?,
                u64::from_str_radix(end, 16).ok()?,
            ))
        })
        .find(|&(start, end)| (start..end).contains(&sp))
        .expect("sp is mapped")
        .1;
    let len = len.min(end - sp) as usize;
    ProcessMemory::new(std::process::id())
        .read_vec(sp, len)
        .unwrap()
}

#[inline(never)]
fn native_test_c() -> (Regs, Vec<u8>) {
    let r = capture();
    std::hint::black_box(&r);
    r
}

#[inline(never)]
fn native_test_b() -> (Regs, Vec<u8>) {
    let r = native_test_c();
    std::hint::black_box(&r);
    r
}

#[inline(never)]
fn native_test_a() -> (Regs, Vec<u8>) {
    let r = native_test_b();
    std::hint::black_box(&r);
    r
}

#[inline(never)]
fn native_test_deep(depth: u32) -> (Regs, Vec<u8>) {
    let r = if depth == 0 {
        capture()
    } else {
        native_test_deep(depth - 1)
    };
    std::hint::black_box(&r);
    r
}

fn position(stack: &NativeStack, name: &str) -> usize {
    stack
        .frames
        .iter()
        .position(|f| f.function.as_deref().is_some_and(|n| n.contains(name)))
        .unwrap_or_else(|| panic!("no frame {name} in {:#?}", stack.frames))
}

#[test]
fn unwinds_own_stack() {
    let (regs, stack) = native_test_a();
    let mut native = Native::new();
    let walked = native.unwind_copy(std::process::id(), regs, &stack);
    let (c, b, a) = (
        position(&walked, "native_test_c"),
        position(&walked, "native_test_b"),
        position(&walked, "native_test_a"),
    );
    assert!(c < b && b < a, "{:#?}", walked.frames);
    let sp = |i: usize| walked.frames[i].sp;
    assert!(sp(c) < sp(b) && sp(b) < sp(a));
    assert!(walked.frames[0]
        .function
        .as_deref()
        .unwrap()
        .contains("capture"));
    assert!(!walked.frames[0].return_address && walked.frames[c].return_address);
    for pair in walked.frames.windows(2) {
        assert!(
            pair[0].sp <= pair[1].sp,
            "sp goes down: {:#?}",
            walked.frames
        );
    }
    // The test harness's frames are above: the walk reaches the thread's start or the copy's
    // end, it does not fail.
    assert_ne!(walked.end, StackEnd::Failed, "{:#?}", walked.frames);
    assert!(walked.frames.len() > 5);
    let stats = native.stats();
    assert_eq!((stats.unwinds, stats.unwind_failures), (1, 0));
}

#[test]
fn truncated_copy_runs_out_of_stack() {
    let (regs, stack) = native_test_deep(20);
    let mut native = Native::new();
    let walked = native.unwind_copy(std::process::id(), regs, &stack[..256]);
    assert_eq!(walked.end, StackEnd::OutOfStack, "{:#?}", walked.frames);
    assert!(!walked.frames.is_empty());
    assert_eq!(native.stats().out_of_stack, 1);
    // Nothing copied at all: just the ip.
    let walked = native.unwind_copy(std::process::id(), regs, &[]);
    assert_eq!(walked.frames.len(), 1);
}

#[test]
fn garbage_never_panics() {
    let pid = std::process::id();
    let (regs, stack) = native_test_deep(3);
    let mut native = Native::new();
    let mut rng = fastrand::Rng::with_seed(7);
    for round in 0..2000 {
        let mut bytes = stack.clone();
        // Keep the real return addresses sometimes, so walks go somewhere before the garbage.
        let keep = if round % 2 == 0 {
            0
        } else {
            rng.usize(0..bytes.len())
        };
        rng.fill(&mut bytes[keep..]);
        if round % 3 == 0 {
            // Garbage that looks like code addresses and stack addresses.
            for word in bytes[keep..].chunks_exact_mut(8) {
                let value = match rng.u8(0..3) {
                    0 => regs
                        .ip
                        .wrapping_add(rng.u64(0..0x10000))
                        .wrapping_sub(0x8000),
                    1 => regs.sp.wrapping_add(rng.u64(0..0x10000)),
                    _ => rng.u64(..),
                };
                word.copy_from_slice(&value.to_le_bytes());
            }
        }
        let garbage_regs = match round % 4 {
            0 => regs,
            1 => Regs {
                bp: rng.u64(..),
                ..regs
            },
            2 => Regs {
                sp: rng.u64(..),
                bp: rng.u64(..),
                ..regs
            },
            _ => Regs {
                ip: rng.u64(..),
                sp: rng.u64(..),
                bp: rng.u64(..),
            },
        };
        let walked = native.unwind_copy(pid, garbage_regs, &bytes);
        assert!(walked.frames.len() <= unwind::MAX_FRAMES);
        let ips: Vec<u64> = (0..rng.usize(0..300)).map(|_| rng.u64(..)).collect();
        from_ips(&mut native, pid, &ips);
    }
    // Unknown pids: nothing to read, no panic.
    let walked = native.unwind_copy(u32::MAX - 1, regs, &stack);
    assert_eq!(walked.frames[0].function, None);
    from_ips(&mut native, u32::MAX - 1, &[regs.ip, 0, 5]);
}

fn mapping_of(pid: u32, addr: u64) -> Mapping {
    let maps = modules::read_exec_maps(pid).unwrap();
    modules::find(&maps, addr).cloned().unwrap()
}

/// With libc's debug symbols installed (`libc6-dbg`), `.symtab` names the function by its
/// internal alias `__GI_qsort`; without them `.dynsym` says `qsort`.
fn is_qsort(name: Option<&str>) -> bool {
    matches!(name, Some("qsort" | "__GI_qsort" | "__libc_qsort"))
}

#[test]
fn names_libc_functions() {
    let pid = std::process::id();
    let qsort = libc::qsort as *const () as u64;
    let mut native = Native::new();
    let stack = from_ips(&mut native, pid, &[qsort + 1]);
    let frame = &stack.frames[0];
    assert!(is_qsort(frame.function.as_deref()), "{frame:#?}");
    assert_eq!(&*frame.module, "libc.so.6");
    assert_eq!(frame.offset, mapping_of(pid, qsort).file_offset(qsort + 1));
    assert!(frame.file.is_some());
    // A return address is looked up one byte earlier: the end of the previous function
    // stays in it.
    let stack = from_ips(&mut native, pid, &[qsort + 1, qsort + 1]);
    assert_eq!(stack.frames[1].offset, frame.offset - 1);
}

/// The address in `child` of `addr` of this process, once `child` maps the same file.
fn same_code_in(child: u32, addr: u64) -> u64 {
    let own = mapping_of(std::process::id(), addr);
    let offset = own.file_offset(addr);
    for _ in 0..200 {
        let maps = modules::read_exec_maps(child).unwrap_or_default();
        let found = maps.iter().find(|m| {
            m.file == own.file && (m.offset..m.offset + (m.end - m.start)).contains(&offset)
        });
        if let Some(m) = found {
            return m.start + (offset - m.offset);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("pid {child} never mapped {}", own.path);
}

#[test]
fn names_are_cached_per_file_across_processes() {
    let pid = std::process::id();
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let child_pid = child.id();
    let qsort = libc::qsort as *const () as u64;
    let bsearch = libc::bsearch as *const () as u64;
    let child_qsort = same_code_in(child_pid, qsort);
    let child_bsearch = same_code_in(child_pid, bsearch);

    let mut native = Native::new();
    let own = from_ips(&mut native, pid, &[qsort]);
    let before = native.stats();
    let theirs = from_ips(&mut native, child_pid, &[child_qsort]);
    let after = native.stats();
    assert!(is_qsort(theirs.frames[0].function.as_deref()));
    assert_eq!(theirs.frames[0].offset, own.frames[0].offset);
    assert_eq!(theirs.frames[0].file, own.frames[0].file);
    assert_eq!(after.symbol_cache_hits, before.symbol_cache_hits + 1);
    assert_eq!(after.symbol_cache_misses, before.symbol_cache_misses);
    assert_eq!(after.files_loaded, before.files_loaded);

    // Gone, with a sample still queued: named from its kept mappings and the cached file.
    child.kill().unwrap();
    child.wait().unwrap();
    let late = from_ips(&mut native, child_pid, &[child_bsearch]);
    let name = late.frames[0].function.as_deref().unwrap();
    assert!(name.ends_with("bsearch"), "{name}");
    assert_eq!(&*late.frames[0].module, "libc.so.6");
    native.forget(child_pid);
    let forgotten = from_ips(&mut native, child_pid, &[child_bsearch]);
    assert_eq!(forgotten.frames[0].function, None);
}

/// A frame-pointer walk of `ips` (stack addresses unknown), whole.
fn from_ips(native: &mut Native, pid: u32, ips: &[u64]) -> NativeStack {
    let pairs: Vec<(u64, u64)> = ips.iter().map(|&ip| (ip, 0)).collect();
    native.symbolize_frame_pointers(pid, &pairs, true)
}
