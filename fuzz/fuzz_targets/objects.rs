//! `dump --locals`: short reprs of objects (`short_repr`) and a frame's variables
//! (`frame_locals`) read from a target's memory.
//!
//! Arguments: 0 an object, 1 a frame, 2 its code object.
#![no_main]

use libfuzzer_sys::fuzz_target;
use profiler::memory::ProcessMemory;
use profiler::python::layout::PyLayout;
use profiler::python::objects::{frame_locals, short_repr};
use pyebpf_fuzz::{load, write_seeds, Image, ARENA};

/// Type objects named `tp_name`: one per type the reprs know, and one they don't.
const TYPES: &[&str] = &[
    "int", "bool", "float", "str", "bytes", "NoneType", "cell", "list",
];

fn seeds(i: usize, l: &PyLayout) -> Vec<Vec<u8>> {
    let o = &l.objects;
    let mut out = Vec::new();
    for (t, name) in TYPES.iter().enumerate() {
        let mut im = Image::new(i, 0);
        let ty = 0x100 + 0x40 * t;
        im.put(0x300 + 0x10 * t, name.as_bytes());
        im.u64(ty + l.tp_name as usize, ARENA + 0x300 + 0x10 * t as u64);
        let obj = 0x400;
        im.u64(obj + l.ob_type as usize, ARENA + ty as u64);
        match *name {
            "int" | "bool" => {
                let size = if o.long_tagged { 2 << 3 } else { 2 };
                im.u64(obj + o.long_size as usize, size)
                    .u32(obj + o.long_digits as usize, 5)
                    .u32(obj + o.long_digits as usize + 4, 1);
            }
            "float" => {
                im.u64(obj + o.float_value as usize, 2.5f64.to_bits());
            }
            "str" => {
                im.str(l, obj, "héllo\n", 2);
                im.u64(obj + l.ob_type as usize, ARENA + ty as u64);
            }
            "bytes" => {
                im.bytes(l, obj, b"\x00ab'");
                im.u64(obj + l.ob_type as usize, ARENA + ty as u64);
            }
            "cell" => {
                im.u64(obj + o.cell_ref as usize, ARENA + obj as u64);
            }
            _ => {}
        }
        im.arg(0, ARENA + obj as u64);
        // A frame of two locals (`a`, `b`) whose values are the object above and a tagged
        // or plain pointer to it.
        let (code, names, kinds, frame) = (0x500, 0x600, 0x680, 0x700);
        im.u32(code + o.code_argcount as usize, 1)
            .u64(code + o.code_localsplusnames as usize, ARENA + names as u64)
            .u64(code + o.code_localspluskinds as usize, ARENA + kinds as u64);
        let a = im.str(l, 0x800, "a", 1);
        let b = im.str(l, 0x880, "b", 1);
        im.u64(names + o.tuple_size as usize, 2)
            .u64(names + o.tuple_items as usize, a)
            .u64(names + o.tuple_items as usize + 8, b);
        im.bytes(l, kinds, &[0x26, 0x20]);
        im.u64(frame + l.frame_localsplus as usize, ARENA + obj as u64)
            .u64(
                frame + l.frame_localsplus as usize + 8,
                ARENA + obj as u64 | 1,
            );
        im.arg(1, ARENA + frame as u64).arg(2, ARENA + code as u64);
        out.push(im.finish());
    }
    out
}

fuzz_target!(
    init: write_seeds("objects", seeds),
    |data: &[u8]| {
        let Some(input) = load(data) else {
            return;
        };
        let mem = ProcessMemory::new(std::process::id());
        let l = &input.layout;
        let [obj, frame, code, _] = input.args;
        let _ = short_repr(&mem, l, obj);
        if let Ok(locals) = frame_locals(&mem, l, frame, code) {
            assert!(locals.len() <= profiler::python::objects::MAX_LOCALS);
        }
    }
);
