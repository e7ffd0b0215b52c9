//! The kernel half of pyebpf: on every CPU-clock tick, if the running task belongs to a
//! registered CPython process, find its thread state, walk its interpreter frames and emit
//! one ring-buffer record. Everything version-specific comes from the `LAYOUTS` map.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

#[cfg(target_arch = "bpf")]
mod bounds;
#[cfg(target_arch = "bpf")]
mod chunk_copy;
#[cfg(target_arch = "bpf")]
mod debug;
#[cfg(target_arch = "bpf")]
mod lifecycle;
#[cfg(target_arch = "bpf")]
mod sampler;
#[cfg(target_arch = "bpf")]
mod tasks;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";

// Lets `cargo check --workspace` on the host type-check the crate without the BPF target.
#[cfg(not(target_arch = "bpf"))]
fn main() {}
