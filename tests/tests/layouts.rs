//! Proves the CPython layouts (`python::tables` for 3.11/3.12, `python::debug_offsets` for
//! 3.13+) against every interpreter on this machine.
//!
//! `tests/workloads/probe_layout.py` runs inside each interpreter and dumps raw memory of its
//! own runtime, interpreter states, thread states, frames (including the C-stack entry frames
//! Python cannot see), code objects, strings and types, together with what the C API and
//! Python itself say about them (addresses from `PyInterpreterState_Head`/`ThreadHead`, `id()`,
//! `co_*` attributes, `f_lineno`, native thread ids). This test reads that memory only through
//! the layout's offsets, the way the BPF program and userspace will, and compares. A wrong
//! offset makes a pointer miss, a string decode wrong, a line number differ or a walk diverge.

use std::collections::HashMap;

use profiler::python::debug_offsets::{self, DebugOffsetsError};
use profiler::python::layout::{PyLayout, PyVersion};
use profiler::python::linetable::LineTable;
use profiler::python::tables;
use serde_json::Value;

use profiler_common::{
    FRAME_HEADER_BYTES, LAYOUT_CFRAME, LAYOUT_GIL_INDIRECT, LAYOUT_GIL_INTERP, LAYOUT_GIL_RUNTIME,
};

/// `profiler_common::CODE_TAG_BYTES`, as the offsets it is added to.
const CODE_TAG_BYTES: u64 = profiler_common::CODE_TAG_BYTES as u64;
/// Frames walked at most (the probe's stack is ~310 deep).
const MAX_WALK: usize = 5000;
/// Frame-owner codes that are Python code in every version (THREAD, GENERATOR, FRAME_OBJECT).
const OWNER_THREAD: u8 = 0;
const OWNER_GENERATOR: u8 = 1;
const OWNER_FRAME_OBJECT: u8 = 2;

type Check = Result<String, String>;

fn ensure(cond: bool, msg: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(msg())
    }
}

fn hex_bytes(hex: &str) -> Result<Vec<u8>, String> {
    if !hex.len().is_multiple_of(2) {
        return Err("odd-length hex".into());
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(|e| e.to_string()))
        .collect()
}

fn num(v: &Value, what: &str) -> Result<u64, String> {
    v.as_u64()
        .ok_or_else(|| format!("probe output: {what} is not a number: {v}"))
}

fn text<'a>(v: &'a Value, what: &str) -> Result<&'a str, String> {
    v.as_str()
        .ok_or_else(|| format!("probe output: {what} is not a string: {v}"))
}

/// Which dumps may answer a read (see `REGIONS` in the probe).
#[derive(Clone, Copy, PartialEq, Eq)]
enum View {
    /// Long-lived objects: any dump, the latest first.
    Any,
    /// The frame chain and stack chunks: dumps taken while `probe_here` ran, the latest first.
    Stack,
    /// The thread's current frame: only what was copied at the snapshot instant.
    Snapshot,
    /// Runtime and interpreter states copied while the main thread held the GIL.
    GilHeld,
    /// The same, copied while no thread held it.
    GilReleased,
}

/// The dumped memory, each region tagged with the probe's phase.
struct Memory {
    /// (addr, bytes, phase), latest dump first.
    regions: Vec<(u64, Vec<u8>, String)>,
}

impl Memory {
    fn from_probe(probe: &Value) -> Result<Memory, String> {
        let list = probe["regions"]
            .as_array()
            .ok_or("probe output: no regions")?;
        let mut regions = Vec::with_capacity(list.len());
        for r in list {
            regions.push((
                num(&r["addr"], "region addr")?,
                hex_bytes(text(&r["hex"], "region hex")?)?,
                text(&r["phase"], "region phase")?.to_string(),
            ));
        }
        regions.reverse();
        Ok(Memory { regions })
    }

    fn read_in(&self, addr: u64, len: usize, view: View) -> Result<&[u8], String> {
        let phases: &[&[&str]] = match view {
            View::Any => &[&["snapshot", "stack", "late"]],
            View::Stack => &[&["stack"], &["snapshot"]],
            View::Snapshot => &[&["snapshot"]],
            View::GilHeld => &[&["gil_held"]],
            View::GilReleased => &[&["gil_released"]],
        };
        for allowed in phases {
            for (start, data, phase) in &self.regions {
                if allowed.contains(&phase.as_str())
                    && addr >= *start
                    && addr.saturating_add(len as u64) <= start + data.len() as u64
                {
                    let at = (addr - start) as usize;
                    return Ok(&data[at..at + len]);
                }
            }
        }
        Err(format!("{len} bytes at {addr:#x} are not in the dump"))
    }

    fn read(&self, addr: u64, len: usize) -> Result<&[u8], String> {
        self.read_in(addr, len, View::Any)
    }

    fn u64_in(&self, addr: u64, view: View) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.read_in(addr, 8, view)?.try_into().unwrap(),
        ))
    }

    fn u64(&self, addr: u64) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.read(addr, 8)?.try_into().unwrap()))
    }

    fn u32(&self, addr: u64) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.read(addr, 4)?.try_into().unwrap()))
    }

    fn i32(&self, addr: u64) -> Result<i32, String> {
        Ok(i32::from_le_bytes(self.read(addr, 4)?.try_into().unwrap()))
    }

    fn u8(&self, addr: u64) -> Result<u8, String> {
        Ok(self.read(addr, 1)?[0])
    }

    fn cstr(&self, addr: u64) -> Result<String, String> {
        let mut out = Vec::new();
        for i in 0..256 {
            match self.u8(addr + i)? {
                0 => return Ok(String::from_utf8_lossy(&out).into_owned()),
                b => out.push(b),
            }
        }
        Err(format!("no NUL within 256 bytes at {addr:#x}"))
    }
}

/// A decoded `str`: its text and the `state` bits as the layout reads them.
struct DecodedStr {
    text: String,
    kind: u32,
    compact: bool,
    ascii: bool,
}

fn decode_str(mem: &Memory, l: &PyLayout, addr: u64) -> Result<DecodedStr, String> {
    let u = &l.unicode;
    let state = mem.u32(addr + u64::from(u.state))?;
    let kind = (state >> u.kind_shift) & 0b111;
    let compact = (state >> u.compact_bit) & 1 == 1;
    let ascii = (state >> u.ascii_bit) & 1 == 1;
    let length = mem.u64(addr + u64::from(u.length))?;
    ensure(length < 1 << 20, || {
        format!("str at {addr:#x}: length {length}")
    })?;
    ensure(matches!(kind, 1 | 2 | 4), || {
        format!("str at {addr:#x}: kind {kind}")
    })?;
    let data = addr + u64::from(if ascii { u.ascii_data } else { u.compact_data });
    let raw = mem.read(data, length as usize * kind as usize)?;
    let text = raw
        .chunks(kind as usize)
        .map(|c| {
            let mut word = [0u8; 4];
            word[..c.len()].copy_from_slice(c);
            char::from_u32(u32::from_le_bytes(word)).unwrap_or('\u{fffd}')
        })
        .collect();
    Ok(DecodedStr {
        text,
        kind,
        compact,
        ascii,
    })
}

/// Checks `addr` holds the str `expected` with the state bits CPython would give it.
fn check_str(mem: &Memory, l: &PyLayout, addr: u64, expected: &str) -> Result<(), String> {
    let s = decode_str(mem, l, addr)?;
    let max = expected.chars().map(u32::from).max().unwrap_or(0);
    let kind = match max {
        0..=0xff => 1,
        0x100..=0xffff => 2,
        _ => 4,
    };
    ensure(s.text == expected, || {
        format!(
            "str at {addr:#x}: decoded {:?}, expected {expected:?}",
            s.text
        )
    })?;
    ensure(s.kind == kind, || {
        format!("str {expected:?}: kind {} expected {kind}", s.kind)
    })?;
    ensure(s.compact, || {
        format!("str {expected:?}: compact bit not set")
    })?;
    ensure(s.ascii == expected.is_ascii(), || {
        format!("str {expected:?}: ascii bit {}", s.ascii)
    })
}

/// One frame as the kernel walk sees it.
#[derive(Debug)]
struct Walked {
    frame: u64,
    code: u64,
    /// `f_executable` before masking.
    raw_code: u64,
    owner: u8,
    skipped: bool,
}

/// The kernel's view: the thread's current frame, through the cframe when flagged.
fn current_frame(mem: &Memory, l: &PyLayout, tstate: u64) -> Result<u64, String> {
    let k = &l.kernel;
    let first = mem.u64_in(tstate + u64::from(k.tstate_current_frame), View::Snapshot)?;
    if k.flags & LAYOUT_CFRAME == 0 || first == 0 {
        return Ok(first);
    }
    mem.u64_in(first + u64::from(k.cframe_current_frame), View::Snapshot)
}

/// The kernel's walk: one FRAME_HEADER_BYTES read per frame, fields picked by offset.
fn walk(mem: &Memory, l: &PyLayout, mut frame: u64) -> Result<Vec<Walked>, String> {
    let k = &l.kernel;
    let mut out = Vec::new();
    while frame != 0 {
        ensure(out.len() < MAX_WALK, || {
            "frame walk does not end".to_string()
        })?;
        let header = mem
            .read_in(frame, FRAME_HEADER_BYTES, View::Stack)
            .map_err(|e| format!("frame #{} of the walk: {e}", out.len()))?;
        let word = |off: u16| -> Result<u64, String> {
            let bytes = header.get(off as usize..off as usize + 8).ok_or_else(|| {
                format!("frame offset {off} outside the {FRAME_HEADER_BYTES}-byte header")
            })?;
            Ok(u64::from_le_bytes(bytes.try_into().unwrap()))
        };
        let previous = word(k.frame_previous)?;
        let raw_code = word(k.frame_executable)?;
        let code = raw_code & k.executable_mask;
        let owner = *header
            .get(k.frame_owner as usize)
            .ok_or_else(|| format!("owner offset {} outside the header", k.frame_owner))?;
        let shim = owner < 32 && k.skip_owner_mask & (1 << owner) != 0;
        out.push(Walked {
            frame,
            code,
            raw_code,
            owner,
            skipped: shim || code == 0,
        });
        frame = previous;
    }
    Ok(out)
}

struct Probe {
    json: Value,
    mem: Memory,
    minor: u8,
}

impl Probe {
    fn addr(&self, key: &str) -> Result<u64, String> {
        num(&self.json[key], key)
    }

    fn code_info(&self, code: u64) -> Result<&Value, String> {
        let info = &self.json["codes"][code.to_string()];
        ensure(!info.is_null(), || {
            format!("no probe info for code {code:#x}")
        })?;
        Ok(info)
    }
}

/// Where the layout comes from: the built-in table (3.11, 3.12) or the target's struct.
fn layout_for(p: &Probe) -> Result<(PyLayout, String), String> {
    let hex = p.addr("hexversion")?;
    let runtime = p.addr("runtime")?;
    let head = p.mem.read(runtime, debug_offsets::READ_SIZE)?;
    if p.minor >= 13 {
        ensure(head.starts_with(debug_offsets::COOKIE), || {
            "no xdebugpy cookie".to_string()
        })?;
        let layout = debug_offsets::parse(head).map_err(|e| e.to_string())?;
        ensure(layout.version.hex == hex, || {
            format!(
                "struct version {:#x} != sys.hexversion {hex:#x}",
                layout.version.hex
            )
        })?;
        // Every prefix shorter than the struct must be refused, not misread.
        ensure(
            matches!(
                debug_offsets::parse(&head[..200]),
                Err(DebugOffsetsError::TooShort { .. })
            ),
            || "a 200-byte prefix was not refused as too short".into(),
        )?;
        Ok((layout, "debug_offsets::parse".into()))
    } else {
        ensure(
            matches!(
                debug_offsets::parse(head),
                Err(DebugOffsetsError::BadCookie { .. })
            ),
            || "3.11/3.12 runtime unexpectedly parsed as _Py_DebugOffsets".into(),
        )?;
        let layout = tables::builtin(PyVersion::from_hex(hex)).ok_or("no built-in table")?;
        Ok((layout, "tables::builtin".into()))
    }
}

fn check_interpreters(p: &Probe, l: &PyLayout) -> Check {
    let k = &l.kernel;
    let runtime = p.addr("runtime")?;
    let api: Vec<u64> = p.json["interps"]
        .as_array()
        .ok_or("no interps")?
        .iter()
        .map(|v| num(v, "interp"))
        .collect::<Result<_, _>>()?;
    let mut walked = Vec::new();
    let mut interp = p
        .mem
        .u64(runtime + u64::from(k.runtime_interpreters_head))?;
    while interp != 0 && walked.len() < 16 {
        walked.push(interp);
        interp = p.mem.u64(interp + u64::from(k.interp_next))?;
    }
    ensure(walked == api, || {
        format!("interpreters via layout {walked:x?}, via PyInterpreterState_Head/Next {api:x?}")
    })?;
    let main = p.addr("main_interp")?;
    ensure(p.addr("interp")? == main && api.contains(&main), || {
        "main interpreter not in the list".into()
    })?;
    Ok(format!(
        "{} interpreter(s) walked from _PyRuntime",
        walked.len()
    ))
}

/// The kernel's GIL test (`locked != 0 && last_holder == tstate`, the GIL state found as the
/// layout says) on the copies taken with the GIL held by the main thread and released. A
/// free-threaded build has no GIL: its layout must locate none (`--gil` keeps all its samples).
fn check_gil(p: &Probe, l: &PyLayout) -> Check {
    let k = &l.kernel;
    let tstate = p.addr("tstate")?;
    if l.free_threaded {
        ensure(
            k.flags & (LAYOUT_GIL_RUNTIME | LAYOUT_GIL_INTERP) == 0,
            || {
                format!(
                    "a free-threaded layout locates a GIL (flags {:#x})",
                    k.flags
                )
            },
        )?;
        ensure(p.json["gil_enabled"] == false, || {
            format!(
                "the layout says free-threaded, the interpreter says sys._is_gil_enabled() = {}",
                p.json["gil_enabled"]
            )
        })?;
        // tstate->interp is still read (the kernel's GIL base elsewhere): it must be right.
        let interp = p.mem.u64(tstate + u64::from(k.tstate_interp))?;
        ensure(interp == p.addr("main_interp")?, || {
            format!("tstate->interp {interp:#x} is not the main interpreter")
        })?;
        return Ok("free-threaded: no GIL located, sys._is_gil_enabled() is False".to_string());
    }
    ensure(p.json["gil_enabled"] == true, || {
        "a layout with a GIL for an interpreter whose GIL is disabled".to_string()
    })?;
    let worker = num(&p.json["worker"]["tstate"], "worker tstate")?;
    let holds = |view: View, t: u64| -> Result<(bool, u64, u32), String> {
        let u64_at = |a: u64| p.mem.u64_in(a, view);
        let base = if k.flags & LAYOUT_GIL_INTERP != 0 {
            p.mem.u64(t + u64::from(k.tstate_interp))?
        } else if k.flags & LAYOUT_GIL_RUNTIME != 0 {
            p.addr("runtime")?
        } else {
            return Err("the layout locates no GIL".into());
        };
        let mut gil = base + u64::from(k.gil_offset);
        if k.flags & LAYOUT_GIL_INDIRECT != 0 {
            gil = u64_at(gil)?;
        }
        let locked = p.mem.read_in(gil + u64::from(k.gil_locked), 4, view)?;
        let locked = u32::from_le_bytes(locked.try_into().unwrap());
        let holder = u64_at(gil + u64::from(k.gil_last_holder))?;
        Ok((locked != 0 && holder == t, holder, locked))
    };
    let (main_held, holder, locked) = holds(View::GilHeld, tstate)?;
    ensure(main_held, || {
        format!("GIL held by the main thread: locked {locked}, last_holder {holder:#x}, main tstate {tstate:#x}")
    })?;
    let (worker_held, ..) = holds(View::GilHeld, worker)?;
    ensure(!worker_held, || {
        "the blocked worker appears to hold the GIL".into()
    })?;
    let (released, holder, locked) = holds(View::GilReleased, tstate)?;
    ensure(!released && locked == 0 && holder == tstate, || {
        format!("GIL released: locked {locked}, last_holder {holder:#x} (expected 0, {tstate:#x})")
    })?;
    if k.flags & LAYOUT_GIL_INTERP != 0 {
        let interp = p.mem.u64(tstate + u64::from(k.tstate_interp))?;
        ensure(interp == p.addr("main_interp")?, || {
            format!("tstate->interp {interp:#x} is not the main interpreter")
        })?;
    }
    Ok(
        "main thread holds the GIL (locked, last_holder), blocked worker does not; released: locked 0"
            .to_string(),
    )
}

fn check_threads(p: &Probe, l: &PyLayout) -> Check {
    let k = &l.kernel;
    let mut total = 0;
    for (interp, list) in p.json["threads"].as_object().ok_or("no threads")? {
        let interp: u64 = interp.parse().map_err(|_| "bad interp key")?;
        let api: Vec<u64> = list
            .as_array()
            .ok_or("bad thread list")?
            .iter()
            .map(|v| num(v, "tstate"))
            .collect::<Result<_, _>>()?;
        let mut walked = Vec::new();
        let mut t = p.mem.u64(interp + u64::from(k.interp_threads_head))?;
        while t != 0 && walked.len() < 64 {
            walked.push(t);
            t = p.mem.u64(t + u64::from(k.tstate_next))?;
        }
        ensure(walked == api, || {
            format!("threads of {interp:#x} via layout {walked:x?}, via C API {api:x?}")
        })?;
        for &t in &walked {
            for field in [l.thread.interp, k.tstate_interp] {
                let owner = p.mem.u64(t + u64::from(field))?;
                ensure(owner == interp, || {
                    format!("tstate {t:#x}: interp field at {field}: {owner:#x} != {interp:#x}")
                })?;
            }
        }
        total += walked.len();
    }
    let main_list = &p.json["threads"][p.addr("main_interp")?.to_string()];
    let tstate = p.addr("tstate")?;
    let worker = num(&p.json["worker"]["tstate"], "worker tstate")?;
    let has = |t: u64| {
        main_list
            .as_array()
            .is_some_and(|l| l.iter().any(|v| v.as_u64() == Some(t)))
    };
    ensure(has(tstate) && has(worker), || {
        "main/worker thread state not in the main interpreter's list".into()
    })?;
    Ok(format!(
        "{total} thread state(s) walked, interp fields match"
    ))
}

fn check_thread_ids(p: &Probe, l: &PyLayout) -> Check {
    let k = &l.kernel;
    for (tstate, native, ident) in [
        (p.addr("tstate")?, p.addr("native_id")?, p.addr("ident")?),
        (
            num(&p.json["worker"]["tstate"], "worker tstate")?,
            num(&p.json["worker"]["native_id"], "worker native_id")?,
            num(&p.json["worker"]["ident"], "worker ident")?,
        ),
    ] {
        let got = p.mem.u64(tstate + u64::from(k.tstate_native_thread_id))?;
        ensure(got == native, || {
            format!("tstate {tstate:#x}: native_thread_id {got} != {native}")
        })?;
        let got = p.mem.u64(tstate + u64::from(l.thread.thread_id))?;
        ensure(got == ident, || {
            format!("tstate {tstate:#x}: thread_id {got:#x} != {ident:#x}")
        })?;
    }
    // The kernel's lookup by tid walks every interpreter's threads for a state naming the tid.
    // A thread may own one state per interpreter (creating a subinterpreter leaves one on the
    // creating thread in 3.11/3.12), so the wanted state must be among those the walk finds.
    let runtime = p.addr("runtime")?;
    let mut ambiguous = Vec::new();
    for (tid, want) in [
        (p.addr("native_id")?, p.addr("tstate")?),
        (
            num(&p.json["worker"]["native_id"], "worker native_id")?,
            num(&p.json["worker"]["tstate"], "worker tstate")?,
        ),
    ] {
        let mut found = Vec::new();
        let mut interp = p
            .mem
            .u64(runtime + u64::from(k.runtime_interpreters_head))?;
        while interp != 0 {
            let mut t = p.mem.u64(interp + u64::from(k.interp_threads_head))?;
            while t != 0 {
                if p.mem.u64(t + u64::from(k.tstate_native_thread_id))? == tid {
                    found.push(t);
                }
                t = p.mem.u64(t + u64::from(k.tstate_next))?;
            }
            interp = p.mem.u64(interp + u64::from(k.interp_next))?;
        }
        ensure(found.contains(&want), || {
            format!("tid {tid}: kernel-style lookup found {found:x?}, want {want:#x}")
        })?;
        if found.len() > 1 {
            ambiguous.push(format!("tid {tid} has {} states {found:x?}", found.len()));
        }
    }
    if !ambiguous.is_empty() {
        return Ok(format!(
            "native_thread_id, thread_id of 2 threads; kernel tid lookup finds both (NOTE: {})",
            ambiguous.join("; ")
        ));
    }
    Ok("native_thread_id, thread_id of 2 threads; kernel tid lookup finds both".into())
}

/// The walk from the thread state must produce exactly the frames Python sees, in order,
/// with C-stack entry frames recognised by owner and skipped.
fn check_frames(p: &Probe, l: &PyLayout) -> Check {
    let k = &l.kernel;
    let frames = p.json["frames"].as_array().ok_or("no frames")?;
    let visible: Vec<u64> = frames
        .iter()
        .map(|f| num(&f["iframe"], "iframe"))
        .collect::<Result<_, _>>()?;
    let tstate = p.addr("tstate")?;
    let current = current_frame(&p.mem, l, tstate)?;
    ensure(current == visible[0], || {
        format!(
            "current frame {current:#x} != probe_here's f_frame {:#x}",
            visible[0]
        )
    })?;
    ensure(k.skip_owner_mask & 0b111 == 0, || {
        format!(
            "skip_owner_mask {:#b} skips Python frames",
            k.skip_owner_mask
        )
    })?;
    let walked = walk(&p.mem, l, current)?;
    let kept: Vec<&Walked> = walked.iter().filter(|w| !w.skipped).collect();
    let kept_addrs: Vec<u64> = kept.iter().map(|w| w.frame).collect();
    ensure(kept_addrs == visible, || {
        format!(
            "frames kept by the walk ({}) differ from Python's ({}); first kept {:x?}, first visible {:x?}",
            kept_addrs.len(),
            visible.len(),
            &kept_addrs[..kept_addrs.len().min(6)],
            &visible[..visible.len().min(6)]
        )
    })?;
    let mut generators = 0;
    for (w, f) in kept.iter().zip(frames) {
        let code = num(&f["code"], "code")?;
        ensure(w.code == code, || {
            format!(
                "frame {:#x}: executable {:#x} != id(code) {code:#x}",
                w.frame, w.code
            )
        })?;
        let generator = f["generator"].as_bool().unwrap_or(false);
        let want = if generator {
            OWNER_GENERATOR
        } else {
            OWNER_THREAD
        };
        ensure(w.owner == want, || {
            format!("frame {:#x}: owner {} expected {want}", w.frame, w.owner)
        })?;
        generators += usize::from(generator);
    }
    ensure(generators == 1, || {
        format!("{generators} generator frames, expected 1")
    })?;
    // Shims: below the generator (resumed by next(), a C function), below keyfunc (called by
    // sorted()), below <module>; 3.11 has none (its entry frames are ordinary frames).
    let shims: Vec<&Walked> = walked.iter().filter(|w| w.skipped).collect();
    for s in &shims {
        ensure(
            s.owner < 32 && k.skip_owner_mask & (1 << s.owner) != 0 || s.code == 0,
            || format!("skipped frame {:#x} owner {}", s.frame, s.owner),
        )?;
    }
    let position = |addr: u64| walked.iter().position(|w| w.frame == addr).unwrap();
    let between = |a: usize, b: usize| walked[position(visible[a]) + 1..position(visible[b])].len();
    let owners: Vec<u8> = shims.iter().map(|s| s.owner).collect();
    if p.minor >= 13 {
        // Entry frames (and the 3.15 base frame) execute None: a tagged reference from 3.14 on.
        let none = p.addr("none")?;
        for s in &shims {
            ensure(s.code == none, || {
                format!(
                    "entry frame {:#x}: executable {:#x} (raw {:#x}) is not None {none:#x}",
                    s.frame, s.code, s.raw_code
                )
            })?;
        }
    }
    if p.minor == 11 {
        ensure(shims.is_empty(), || {
            format!("3.11 walk skipped frames with owners {owners:?}")
        })?;
        ensure(walked.iter().all(|w| w.owner <= OWNER_FRAME_OBJECT), || {
            "3.11 owner > 2".into()
        })?;
    } else {
        ensure(between(1, 2) >= 1 && between(2, 3) >= 1, || {
            format!(
                "expected entry frames below gen_π and keyfunc, found {} and {}",
                between(1, 2),
                between(2, 3)
            )
        })?;
    }
    // The dead frame: owned by its frame object.
    let dead = &p.json["dead_frame"];
    let dead_frame = num(&dead["iframe"], "dead iframe")?;
    let owner = p.mem.u8(dead_frame + u64::from(k.frame_owner))?;
    ensure(owner == OWNER_FRAME_OBJECT, || {
        format!("returned frame: owner {owner}, expected {OWNER_FRAME_OBJECT}")
    })?;
    let code = p.mem.u64(dead_frame + u64::from(k.frame_executable))? & k.executable_mask;
    ensure(code == num(&dead["code"], "dead code")?, || {
        "returned frame: executable".into()
    })?;
    let tagged = kept.iter().filter(|w| w.raw_code != w.code).count();
    Ok(format!(
        "current frame via {}; {} frames walked, {} kept == Python's f_back chain (executable, owner THREAD/GENERATOR; {} with tag bits), {} skipped with owners {:?}{}; FRAME_OBJECT owner",
        if k.flags & LAYOUT_CFRAME != 0 { "cframe" } else { "tstate" },
        walked.len(),
        kept.len(),
        tagged,
        shims.len(),
        owners,
        if p.minor >= 13 {
            format!(" executing None ({} tagged)", shims.iter().filter(|s| s.raw_code != s.code).count())
        } else {
            String::new()
        }
    ))
}

/// instr_ptr, co_code_adaptive and the line table together give each frame's line.
fn check_lines(p: &Probe, l: &PyLayout) -> Check {
    let frames = p.json["frames"].as_array().ok_or("no frames")?;
    let snapshot_line = p.addr("snapshot_line")?;
    for (i, f) in frames.iter().enumerate() {
        let iframe = num(&f["iframe"], "iframe")?;
        let code = num(&f["code"], "code")?;
        let info = p.code_info(code)?;
        // The top frame's instruction as of the snapshot line; callers are suspended in a call.
        let view = if i == 0 { View::Snapshot } else { View::Stack };
        let instr = p
            .mem
            .u64_in(iframe + u64::from(l.kernel.frame_instr_ptr), view)?;
        let start = code + u64::from(l.code.code_adaptive);
        let len = num(&info["co_code_len"], "co_code_len")?;
        let offset = instr.wrapping_sub(start);
        ensure(offset < len && offset % 2 == 0, || {
            format!(
                "frame #{i}: instr {instr:#x} is not inside co_code_adaptive [{start:#x}, +{len})"
            )
        })?;
        let table = LineTable::parse(
            &hex_bytes(text(&info["linetable"], "linetable")?)?,
            num(&info["firstlineno"], "firstlineno")? as u32,
        );
        let line = table.line_at((offset / 2) as u32).map(u64::from);
        let want = if i == 0 {
            snapshot_line
        } else {
            num(&f["lineno"], "lineno")?
        };
        ensure(line == Some(want), || {
            format!(
                "frame #{i} ({}): line {line:?} at offset {offset}, Python says {want}",
                info["qualname"]
            )
        })?;
    }
    Ok(format!(
        "{} frames: instr_ptr - co_code_adaptive → line table → f_lineno",
        frames.len()
    ))
}

fn check_code_objects(p: &Probe, l: &PyLayout) -> Check {
    let c = &l.code;
    let code_type = num(&p.json["types"]["code"]["type"], "code type")?;
    let codes = p.json["codes"].as_object().ok_or("no codes")?;
    for (addr, info) in codes {
        let code: u64 = addr.parse().map_err(|_| "bad code key")?;
        let name = text(&info["qualname"], "qualname")?;
        let ob_type = p.mem.u64(code + u64::from(l.ob_type))?;
        ensure(ob_type == code_type, || {
            format!("{name}: ob_type {ob_type:#x} != code type {code_type:#x}")
        })?;
        for (field, off) in [
            ("filename", c.filename),
            ("name", c.name),
            ("qualname", c.qualname),
        ] {
            let ptr = p.mem.u64(code + u64::from(off))?;
            let want = num(&info[format!("{field}_addr")], field)?;
            ensure(ptr == want, || {
                format!("{name}: co_{field} {ptr:#x} != id() {want:#x}")
            })?;
            check_str(&p.mem, l, ptr, text(&info[field], field)?)
                .map_err(|e| format!("{name}: co_{field}: {e}"))?;
        }
        // co_code_adaptive holds the quickened bytecode: specialisation rewrites opcodes and
        // caches, but an instruction's oparg byte is the one co_code (deoptimised) shows.
        let co_code = hex_bytes(text(&info["co_code"], "co_code")?)?;
        let adaptive = p
            .mem
            .read(code + u64::from(c.code_adaptive), co_code.len())?;
        let (mut same, mut units) = (0, 0);
        for (want, got) in co_code.chunks(2).zip(adaptive.chunks(2)) {
            if want[0] != 0 {
                units += 1;
                same += usize::from(want[1] == got[1]);
            }
        }
        ensure(units > 0 && same * 10 >= units * 9, || {
            format!(
                "{name}: co_code_adaptive opargs match co_code in {same} of {units} instructions"
            )
        })?;
        let first = p.mem.i32(code + u64::from(c.firstlineno))?;
        let want = num(&info["firstlineno"], "firstlineno")?;
        ensure(first as u64 == want, || {
            format!("{name}: co_firstlineno {first} != {want}")
        })?;
        let lt = p.mem.u64(code + u64::from(c.linetable))?;
        ensure(
            lt == num(&info["linetable_addr"], "linetable_addr")?,
            || format!("{name}: co_linetable pointer"),
        )?;
        let table = hex_bytes(text(&info["linetable"], "linetable")?)?;
        let size = p.mem.u64(lt + u64::from(l.bytes.size))?;
        ensure(size == table.len() as u64, || {
            format!("{name}: linetable ob_size {size} != {}", table.len())
        })?;
        let data = p.mem.read(lt + u64::from(l.bytes.data), table.len() + 1)?;
        ensure(
            data[..table.len()] == table[..] && data[table.len()] == 0,
            || format!("{name}: linetable ob_sval differs"),
        )?;
        // The kernel's tag span covers the four pointers and is readable.
        let tag = u64::from(l.kernel.code_tag_offset);
        for off in [c.filename, c.name, c.qualname, c.linetable] {
            let off = u64::from(off);
            ensure(off >= tag && off + 8 <= tag + CODE_TAG_BYTES, || {
                format!("code tag span [{tag}, +32) misses offset {off}")
            })?;
        }
        // ...and ends with co_linetable, so it reaches back as far as it can (over co_version,
        // the per-code-object creation counter, from 3.12 on).
        ensure(tag + CODE_TAG_BYTES == u64::from(c.linetable) + 8, || {
            format!("code tag span [{tag}, +{CODE_TAG_BYTES}) does not end with co_linetable")
        })?;
        p.mem.read(code + tag, CODE_TAG_BYTES as usize)?;
    }
    Ok(format!(
        "{} code objects: ob_type, filename/name/qualname (str contents), co_code_adaptive opargs, firstlineno, linetable (bytes size+data), tag span",
        codes.len()
    ))
}

fn check_strings_and_types(p: &Probe, l: &PyLayout) -> Check {
    let strings = p.json["strings"].as_array().ok_or("no strings")?;
    let mut kinds = [0usize; 5];
    for s in strings {
        let addr = num(&s["addr"], "str addr")?;
        let want = text(&s["text"], "str text")?;
        check_str(&p.mem, l, addr, want)?;
        kinds[decode_str(&p.mem, l, addr)?.kind as usize] += 1;
    }
    ensure(kinds[1] > 0 && kinds[2] > 0 && kinds[4] > 0, || {
        format!("string kinds covered: {kinds:?}")
    })?;
    let types = p.json["types"].as_object().ok_or("no types")?;
    for (name, t) in types {
        let obj = num(&t["object"], "object")?;
        let ty = num(&t["type"], "type")?;
        let ob_type = p.mem.u64(obj + u64::from(l.ob_type))?;
        ensure(ob_type == ty, || {
            format!("{name} object: ob_type {ob_type:#x} != {ty:#x}")
        })?;
        let tp_name = p.mem.cstr(p.mem.u64(ty + u64::from(l.tp_name))?)?;
        ensure(tp_name == *name, || {
            format!("tp_name {tp_name:?} != {name:?}")
        })?;
    }
    Ok(format!(
        "{} strs (kind 1/2/4: {}/{}/{}, ascii and compact bits, data offsets); ob_type + tp_name of {}",
        strings.len(),
        kinds[1],
        kinds[2],
        kinds[4],
        types.keys().cloned().collect::<Vec<_>>().join("/")
    ))
}

/// The thread's stack chunks hold its thread-owned frames; localsplus fixes their spacing.
fn check_chunks(p: &Probe, l: &PyLayout) -> Check {
    let ch = &l.chunk;
    let frames = p.json["frames"].as_array().ok_or("no frames")?;
    let tstate = p.addr("tstate")?;
    let chunk = p.mem.u64_in(
        tstate + u64::from(l.kernel.tstate_datastack_chunk),
        View::Snapshot,
    )?;
    let header = |c: u64| -> Result<(u64, u64, u64), String> {
        Ok((
            p.mem
                .u64_in(c + u64::from(l.kernel.chunk_previous), View::Stack)?,
            p.mem
                .u64_in(c + u64::from(l.kernel.chunk_size), View::Stack)?,
            p.mem.u64_in(c + u64::from(ch.top), View::Stack)?,
        ))
    };
    let (previous, size, _) = header(chunk)?;
    ensure(size >= 4096 && size % 8 == 0 && size < 1 << 30, || {
        format!("chunk {chunk:#x}: size {size}")
    })?;
    let inside =
        |c: u64, size: u64, f: u64| f >= c + u64::from(l.kernel.chunk_data) && f < c + size;
    let thread_owned: Vec<(u64, u64)> = frames
        .iter()
        .filter(|f| !f["generator"].as_bool().unwrap_or(false))
        .map(|f| Ok((num(&f["iframe"], "iframe")?, num(&f["code"], "code")?)))
        .collect::<Result<_, String>>()?;
    ensure(inside(chunk, size, thread_owned[0].0), || {
        "probe_here's frame is not in tstate's datastack_chunk".into()
    })?;
    ensure(previous != 0, || {
        "the stack did not span two chunks; raise RECURSION in the probe".into()
    })?;
    let (_, psize, ptop) = header(previous)?;
    let ptop_addr = previous + u64::from(l.kernel.chunk_data) + 8 * ptop;
    ensure(ptop > 0 && ptop_addr <= previous + psize, || {
        format!("previous chunk: top {ptop} size {psize}")
    })?;
    let localsplus = u64::from(l.frame_localsplus);
    let mut in_previous = 0;
    let mut in_current = 0;
    let mut spacing_checked = 0;
    for (i, &(f, code)) in thread_owned.iter().enumerate() {
        if inside(chunk, size, f) {
            in_current += 1;
        } else if inside(previous, psize, f) {
            in_previous += 1;
            let info = p.code_info(code)?;
            let end = f + localsplus + 8 * num(&info["nlocalsplus"], "nlocalsplus")?;
            ensure(end <= ptop_addr, || {
                format!("frame {f:#x} ends past the previous chunk's top")
            })?;
        }
        // Consecutive frames of recurse() in one chunk are exactly one frame size apart.
        if let Some(&(caller, caller_code)) = thread_owned.get(i + 1) {
            let info = p.code_info(code)?;
            if code == caller_code
                && info["qualname"] == "recurse"
                && f > caller
                && f - caller < 4096
            {
                let slots = num(&info["nlocalsplus"], "nlocalsplus")?
                    + num(&info["stacksize"], "stacksize")?;
                ensure(f - caller == localsplus + 8 * slots, || {
                    format!(
                        "recurse frames {} apart, expected localsplus {localsplus} + 8*{slots}",
                        f - caller
                    )
                })?;
                spacing_checked += 1;
            }
        }
    }
    // A chunk that is not the thread's first gets its first frame at data[0], and the frame
    // at data[0] is the last of the chunk to be popped: the lowest frame is exactly there.
    let lowest = thread_owned
        .iter()
        .map(|&(f, _)| f)
        .filter(|&f| inside(chunk, size, f))
        .min();
    ensure(
        lowest == Some(chunk + u64::from(l.kernel.chunk_data)),
        || {
            format!(
                "lowest frame of the current chunk {lowest:x?}, chunk data at {:#x}",
                chunk + u64::from(l.kernel.chunk_data)
            )
        },
    )?;
    ensure(
        in_current > 0 && in_previous > 0 && spacing_checked > 100,
        || {
            format!("frames in current/previous chunk: {in_current}/{in_previous}, spacings {spacing_checked}")
        },
    )?;
    Ok(format!(
        "datastack_chunk holds the top frame; previous chunk top bounds {in_previous} frames; {spacing_checked} frame spacings == localsplus + 8*(nlocalsplus+stacksize)"
    ))
}

fn summary(l: &PyLayout) -> String {
    let k = &l.kernel;
    format!(
        "head={} interp.next={} threads={} ts.next={} native_id={} thread_id={} ts.interp={} cur={}{} chunk={} \
         frame prev={} exec={} instr={} owner={} localsplus={} mask={:#x} skip={:#b} tag={} \
         code fn={} name={} qn={} lt={} first={} adaptive={} bytes {}/{} str len={} state={} ascii={} compact={} \
         bits k{}/c{}/a{} ob_type={} tp_name={} ts.interp={} gil={}{}{}+{} locked={} holder={}",
        k.runtime_interpreters_head,
        k.interp_next,
        k.interp_threads_head,
        k.tstate_next,
        k.tstate_native_thread_id,
        l.thread.thread_id,
        l.thread.interp,
        k.tstate_current_frame,
        if k.flags & LAYOUT_CFRAME != 0 { format!("->cframe+{}", k.cframe_current_frame) } else { String::new() },
        k.tstate_datastack_chunk,
        k.frame_previous,
        k.frame_executable,
        k.frame_instr_ptr,
        k.frame_owner,
        l.frame_localsplus,
        k.executable_mask,
        k.skip_owner_mask,
        k.code_tag_offset,
        l.code.filename,
        l.code.name,
        l.code.qualname,
        l.code.linetable,
        l.code.firstlineno,
        l.code.code_adaptive,
        l.bytes.size,
        l.bytes.data,
        l.unicode.length,
        l.unicode.state,
        l.unicode.ascii_data,
        l.unicode.compact_data,
        l.unicode.kind_shift,
        l.unicode.compact_bit,
        l.unicode.ascii_bit,
        l.ob_type,
        l.tp_name,
        k.tstate_interp,
        if k.flags & LAYOUT_GIL_RUNTIME != 0 { "runtime" } else { "" },
        if k.flags & LAYOUT_GIL_INTERP != 0 { "interp" } else { "" },
        if k.flags & LAYOUT_GIL_INDIRECT != 0 { "->" } else { "" },
        k.gil_offset,
        k.gil_locked,
        k.gil_last_holder,
    )
}

type CheckFn = fn(&Probe, &PyLayout) -> Check;

const CHECKS: [(&str, CheckFn); 9] = [
    ("interpreters", check_interpreters),
    ("threads", check_threads),
    ("thread ids", check_thread_ids),
    ("frames", check_frames),
    ("lines", check_lines),
    ("code objects", check_code_objects),
    ("strings/types", check_strings_and_types),
    ("stack chunks", check_chunks),
    ("gil", check_gil),
];

/// Mutable references to every offset of a layout, by name.
fn offsets_of(l: &mut PyLayout) -> Vec<(&'static str, &mut u16)> {
    let k = &mut l.kernel;
    vec![
        (
            "runtime_interpreters_head",
            &mut k.runtime_interpreters_head,
        ),
        ("interp_next", &mut k.interp_next),
        ("interp_threads_head", &mut k.interp_threads_head),
        ("tstate_next", &mut k.tstate_next),
        ("tstate_native_thread_id", &mut k.tstate_native_thread_id),
        ("tstate_current_frame", &mut k.tstate_current_frame),
        ("cframe_current_frame", &mut k.cframe_current_frame),
        ("tstate_datastack_chunk", &mut k.tstate_datastack_chunk),
        ("frame_previous", &mut k.frame_previous),
        ("frame_executable", &mut k.frame_executable),
        ("frame_instr_ptr", &mut k.frame_instr_ptr),
        ("frame_owner", &mut k.frame_owner),
        ("code_tag_offset", &mut k.code_tag_offset),
        ("code.filename", &mut l.code.filename),
        ("code.name", &mut l.code.name),
        ("code.qualname", &mut l.code.qualname),
        ("code.linetable", &mut l.code.linetable),
        ("code.firstlineno", &mut l.code.firstlineno),
        ("code.code_adaptive", &mut l.code.code_adaptive),
        ("bytes.size", &mut l.bytes.size),
        ("bytes.data", &mut l.bytes.data),
        ("unicode.length", &mut l.unicode.length),
        ("unicode.state", &mut l.unicode.state),
        ("unicode.ascii_data", &mut l.unicode.ascii_data),
        ("unicode.compact_data", &mut l.unicode.compact_data),
        ("chunk_previous", &mut k.chunk_previous),
        ("chunk_size", &mut k.chunk_size),
        ("chunk.top", &mut l.chunk.top),
        ("chunk_data", &mut k.chunk_data),
        ("thread.thread_id", &mut l.thread.thread_id),
        ("thread.interp", &mut l.thread.interp),
        ("ob_type", &mut l.ob_type),
        ("tp_name", &mut l.tp_name),
        ("frame_localsplus", &mut l.frame_localsplus),
        ("tstate_interp", &mut k.tstate_interp),
        ("gil_offset", &mut k.gil_offset),
        ("gil_locked", &mut k.gil_locked),
        ("gil_last_holder", &mut k.gil_last_holder),
    ]
}

/// Applies every single-value mistake to the layout and counts those the checks reject.
/// Returns (rejected, accepted: names, not applicable: names).
fn mutation_coverage(p: &Probe, good: &PyLayout) -> (usize, Vec<String>, Vec<String>) {
    let mut mutants: Vec<(String, PyLayout)> = Vec::new();
    let names: Vec<&str> = offsets_of(&mut good.clone())
        .iter()
        .map(|(n, _)| *n)
        .collect();
    for (i, name) in names.iter().enumerate() {
        // Pointer-sized fields move by a word, byte-sized ones (owner) by one; both ways.
        let step = if *name == "frame_owner" {
            1
        } else if *name == "code.firstlineno" || *name == "unicode.state" || *name == "gil_locked" {
            4
        } else {
            8
        };
        for delta in [step, -step] {
            let mut l = *good;
            let value = offsets_of(&mut l).swap_remove(i).1;
            let Some(v) = (*value as i32)
                .checked_add(delta)
                .filter(|v| (0..=u16::MAX as i32).contains(v))
            else {
                continue;
            };
            *value = v as u16;
            mutants.push((format!("{name}{delta:+}"), l));
        }
    }
    for name in ["kind_shift", "compact_bit", "ascii_bit"] {
        for delta in [1i8, -1] {
            let mut l = *good;
            let u = &mut l.unicode;
            let field = match name {
                "kind_shift" => &mut u.kind_shift,
                "compact_bit" => &mut u.compact_bit,
                _ => &mut u.ascii_bit,
            };
            *field = field.wrapping_add_signed(delta);
            mutants.push((format!("unicode.{name}{delta:+}"), l));
        }
    }
    let mut l = *good;
    l.kernel.flags ^= LAYOUT_CFRAME;
    mutants.push(("flags^CFRAME".into(), l));
    for (name, bits) in [
        ("flags^GIL_INDIRECT", LAYOUT_GIL_INDIRECT),
        (
            "flags^GIL_RUNTIME^GIL_INTERP",
            LAYOUT_GIL_RUNTIME | LAYOUT_GIL_INTERP,
        ),
    ] {
        let mut l = *good;
        l.kernel.flags ^= bits;
        mutants.push((name.into(), l));
    }
    let mut skipped = Vec::new();
    if good.free_threaded {
        // No GIL: the kernel tests none, whatever these say (the flags that would locate one
        // are still mutated above, and caught).
        let unused = [
            "gil_offset",
            "gil_locked",
            "gil_last_holder",
            "flags^GIL_INDIRECT",
        ];
        mutants.retain(|(n, _)| !unused.iter().any(|u| n.starts_with(u)));
        skipped.push(
            "gil_offset, gil_locked, gil_last_holder, GIL_INDIRECT (free-threaded: no GIL)"
                .to_string(),
        );
    }
    if good.kernel.skip_owner_mask != 0 {
        let mut l = *good;
        l.kernel.skip_owner_mask = 0;
        mutants.push(("skip_owner_mask=0".into(), l));
    } else {
        skipped.push("skip_owner_mask=0 (already 0)".to_string());
    }
    if good.kernel.executable_mask != u64::MAX {
        let mut l = *good;
        l.kernel.executable_mask = u64::MAX;
        mutants.push(("executable_mask=!0".into(), l));
    } else {
        skipped.push("executable_mask (no tag bits)".to_string());
    }
    if good.kernel.flags & LAYOUT_CFRAME == 0 {
        // cframe_current_frame is unused without the flag.
        mutants.retain(|(n, _)| !n.starts_with("cframe_current_frame"));
        skipped.push("cframe_current_frame (no cframe)".to_string());
    }
    let mut caught = 0;
    let mut missed = Vec::new();
    for (name, l) in &mutants {
        if CHECKS.iter().any(|(_, check)| check(p, l).is_err()) {
            caught += 1;
        } else {
            missed.push(name.clone());
        }
    }
    (caught, missed, skipped)
}

#[test]
fn layouts_match_live_interpreters() {
    let interpreters = tests::interpreters_logged();
    assert!(
        !interpreters.is_empty(),
        "no CPython 3.11+ interpreter found"
    );
    let script = tests::workloads_dir().join("probe_layout.py");
    let mut failures = Vec::new();
    let mut results: HashMap<String, usize> = HashMap::new();
    for interp in &interpreters {
        let label = format!(
            "{} ({}.{})",
            interp.label, interp.version.0, interp.version.1
        );
        let out = interp
            .command(&script, &[&debug_offsets::READ_SIZE.to_string()])
            .output()
            .expect("run probe");
        if !out.status.success() {
            failures.push(format!(
                "{label}: probe failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
            continue;
        }
        let json: Value = match serde_json::from_slice(&out.stdout) {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!("{label}: probe output is not JSON: {e}"));
                continue;
            }
        };
        let mem = match Memory::from_probe(&json) {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{label}: {e}"));
                continue;
            }
        };
        let probe = Probe {
            json,
            mem,
            minor: interp.version.1 as u8,
        };
        let (layout, source) = match layout_for(&probe) {
            Ok(l) => l,
            Err(e) => {
                failures.push(format!("{label}: layout: {e}"));
                continue;
            }
        };
        eprintln!("== {label}: CPython {} via {source}", layout.version);
        eprintln!("   {}", summary(&layout));
        for (name, check) in CHECKS {
            match check(&probe, &layout) {
                Ok(what) => {
                    eprintln!("   ok   {name}: {what}");
                    *results.entry(label.clone()).or_default() += 1;
                }
                Err(e) => {
                    eprintln!("   FAIL {name}: {e}");
                    failures.push(format!("{label}: {name}: {e}"));
                }
            }
        }
        // The checks must notice any single wrong value.
        let (caught, missed, skipped) = mutation_coverage(&probe, &layout);
        eprintln!(
            "   mutations: {}/{} wrong layouts rejected{}",
            caught,
            caught + missed.len(),
            if skipped.is_empty() {
                String::new()
            } else {
                format!(" (not applicable: {})", skipped.join(", "))
            }
        );
        if !missed.is_empty() {
            failures.push(format!(
                "{label}: checks accept wrong layouts: {}",
                missed.join(", ")
            ));
        }
    }
    for (label, passed) in &results {
        eprintln!("{label}: {passed} checks passed");
    }
    assert!(
        failures.is_empty(),
        "layout checks failed:\n{}",
        failures.join("\n")
    );
}
