//! Code objects, `str` and `bytes` read from a target's memory: `read_tag`, `read_code`
//! (and `line_at_instr` on what it decoded), `read_str`, `read_bytes` and their prefix forms.
//!
//! Arguments: 0 the code object, 1 the tag the kernel saw (flag bit 0: use the tag read now,
//! so that inputs get past the "object changed" check), 2 an instruction pointer, 3 a string
//! or bytes object.
#![no_main]

use libfuzzer_sys::fuzz_target;
use profiler::memory::ProcessMemory;
use profiler::python::code::{
    read_bytes, read_bytes_prefix, read_code, read_str, read_str_prefix, read_tag,
};
use pyebpf_fuzz::{load, write_seeds, Image, ARENA, LINETABLE};

fn seeds(i: usize, l: &profiler::python::layout::PyLayout) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (width, name) in [(1, "main"), (2, "crème"), (4, "fn_\u{1f600}")] {
        let mut im = Image::new(i, 1);
        let code = 0x100;
        let qualname = im.str(l, 0x400, name, width);
        let filename = im.str(l, 0x500, "/srv/app/main.py", 1);
        let table = im.bytes(l, 0x600, LINETABLE);
        let c = &l.code;
        im.u64(code + c.qualname as usize, qualname)
            .u64(code + c.name as usize, qualname)
            .u64(code + c.filename as usize, filename)
            .u64(code + c.linetable as usize, table)
            .u32(code + c.firstlineno as usize, 10);
        let start = ARENA + code as u64 + c.code_adaptive as u64;
        im.arg(0, ARENA + code as u64)
            .arg(2, start + 8)
            .arg(3, if width == 2 { table } else { qualname });
        out.push(im.finish());
    }
    out
}

fuzz_target!(
    init: write_seeds("code", seeds),
    |data: &[u8]| {
        let Some(input) = load(data) else {
            return;
        };
        let mem = ProcessMemory::new(std::process::id());
        let l = &input.layout;
        let [code, tag, instr, obj] = input.args;
        let tag = match read_tag(&mem, l, code) {
            Ok(now) if input.flags & 1 != 0 => now,
            _ => tag,
        };
        if let Ok(info) = read_code(&mem, l, code, tag) {
            let _ = info.line_at_instr(l, code, instr);
        }
        let _ = read_str(&mem, l, obj);
        let _ = read_bytes(&mem, l, obj);
        let _ = read_str_prefix(&mem, l, obj, 80);
        let _ = read_bytes_prefix(&mem, l, obj, 80);
    }
);
