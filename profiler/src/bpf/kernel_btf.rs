//! Kernel-struct facts the BPF programs need, read from the running kernel's BTF at load
//! time: no offset in pyebpf belongs to one kernel version.
//!
//! Today that is one chain, for the exit hook: `task_struct.signal` → `signal_struct.live`
//! (the number of the process's threads that have not begun exiting; 0 at the last thread's
//! `sched_process_exit`).

use anyhow::{bail, Context, Result};
use btf_rs::{Btf, Type};

/// Byte offsets for `current->signal->live`, as the kernel's `TASK_SIGNAL_OFFSET` and
/// `SIGNAL_LIVE_OFFSET` globals want them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ExitOffsets {
    pub task_signal: u32,
    pub signal_live: u32,
}

pub(super) const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

impl ExitOffsets {
    /// From the BTF blob at [`VMLINUX`], as read (not mapped: older kernels, 6.1 here,
    /// refuse to map that sysfs file).
    pub(super) fn from_bytes(vmlinux: &[u8]) -> Result<ExitOffsets> {
        let btf = Btf::from_bytes(vmlinux).with_context(|| format!("parsing {VMLINUX}"))?;
        Self::from_btf(&btf)
    }

    pub(super) fn from_btf(btf: &Btf) -> Result<ExitOffsets> {
        let task_signal = member_offset(btf, "task_struct", "signal")?;
        let signal_live = member_offset(btf, "signal_struct", "live")?;
        // 0 tells the BPF side "unknown"; `signal` is never the first field of task_struct.
        if task_signal == 0 {
            bail!("task_struct.signal at offset 0 in the kernel's BTF: not a layout pyebpf knows");
        }
        Ok(ExitOffsets {
            task_signal,
            signal_live,
        })
    }
}

/// Byte offset of `field` in `struct strukt`, looking inside anonymous struct and union
/// members (randomized or grouped layouts put fields there).
pub(super) fn member_offset(btf: &Btf, strukt: &str, field: &str) -> Result<u32> {
    let types = btf
        .resolve_types_by_name(strukt)
        .with_context(|| format!("struct {strukt} is not in the kernel's BTF"))?;
    for ty in types {
        if let Type::Struct(s) = ty {
            if let Some(bits) = find_member(btf, &s, field, 0)? {
                if bits % 8 != 0 {
                    bail!("{strukt}.{field} is a bit field");
                }
                return u32::try_from(bits / 8).context("offset overflows");
            }
            bail!("struct {strukt} has no field {field} in the kernel's BTF");
        }
    }
    bail!("struct {strukt} is not in the kernel's BTF")
}

/// Nested anonymous members are few and shallow; this bounds the recursion all the same.
const MAX_ANONYMOUS_DEPTH: u32 = 8;

fn find_member(btf: &Btf, s: &btf_rs::Struct, field: &str, depth: u32) -> Result<Option<u64>> {
    for member in &s.members {
        let name = btf.resolve_name(member).unwrap_or_default();
        if name == field {
            return Ok(Some(member.bit_offset() as u64));
        }
        if name.is_empty() && depth < MAX_ANONYMOUS_DEPTH {
            let inner = btf.resolve_chained_type(member)?;
            if let Type::Struct(inner) | Type::Union(inner) = inner {
                if let Some(bits) = find_member(btf, &inner, field, depth + 1)? {
                    return Ok(Some(member.bit_offset() as u64 + bits));
                }
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The running kernel's own BTF (every kernel pyebpf runs on has one).
    #[test]
    fn exit_offsets_from_the_running_kernel() {
        let vmlinux = std::fs::read(VMLINUX).unwrap();
        let offsets = ExitOffsets::from_bytes(&vmlinux).expect("offsets from the kernel's BTF");
        assert!(offsets.task_signal > 0 && offsets.task_signal < 16384);
        assert!(offsets.signal_live < 4096);
    }

    #[test]
    fn missing_fields_are_errors() {
        let btf = Btf::from_bytes(&std::fs::read(VMLINUX).unwrap()).unwrap();
        let err = member_offset(&btf, "task_struct", "no_such_field").unwrap_err();
        assert!(err.to_string().contains("no field no_such_field"), "{err}");
        assert!(member_offset(&btf, "no_such_struct_anywhere", "x").is_err());
    }

    /// A field inside an anonymous union: `struct sk_buff`'s `next` sits in one on every kernel
    /// since 4.x; its offset must still come out (0 here, as the union is first).
    #[test]
    fn fields_in_anonymous_members() {
        let btf = Btf::from_bytes(&std::fs::read(VMLINUX).unwrap()).unwrap();
        assert_eq!(member_offset(&btf, "sk_buff", "next").unwrap(), 0);
        let sk = member_offset(&btf, "sk_buff", "sk").unwrap();
        assert!(sk > 0, "sk_buff.sk at {sk}");
    }
}
