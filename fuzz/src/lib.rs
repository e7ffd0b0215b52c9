//! Shared by the fuzz targets that read "another process": a memory image laid out in this
//! process and read back with `ProcessMemory::new(std::process::id())` (`process_vm_readv`),
//! so the readers run unchanged, syscall included.
//!
//! The image lives in one mapping at a fixed address ([`ARENA`]), so that the pointers inside
//! an input (a code object's `co_qualname`, a frame's `previous`) mean the same thing in every
//! run and in every saved crash. Nothing is mapped around it: a pointer out of the arena reads
//! as EFAULT, as a freed page in a target would.
//!
//! A memory input is a [`HEADER_BYTES`] header (layout number, flags, four argument words)
//! followed by the image, copied to the start of the arena.
//!
//! The seeds of these targets are built here from the layouts (there is no real process to
//! take them from) and written when `PYEBPF_FUZZ_SEEDS` names a directory: `cargo xtask fuzz`
//! does so into the run's corpus.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use profiler::python::asyncio::{AsyncLayout, AsyncOffsets};
use profiler::python::debug_offsets;
use profiler::python::layout::{PyLayout, PyVersion};
use profiler::python::tables;
use profiler_common::FRAME_HEADER_BYTES;

/// Where the image is mapped: in AddressSanitizer's high application memory on x86-64
/// (above its shadow, below the executable and libraries), away from anything else.
pub const ARENA: u64 = 0x4000_0000_0000;
/// 16 pages: room for a stack chunk (CPython's are 16 KiB) and the objects it points to.
pub const ARENA_BYTES: usize = 64 << 10;
/// Layout number, flags (2 bytes), 5 spare bytes, then four little-endian `u64` arguments.
pub const HEADER_BYTES: usize = 40;

/// Bytes of the arena the previous input wrote: zeroed before the next one is copied.
static DIRTY: AtomicUsize = AtomicUsize::new(0);

fn arena() -> *mut u8 {
    static MAPPED: OnceLock<usize> = OnceLock::new();
    *MAPPED.get_or_init(|| {
        // SAFETY: a new private anonymous mapping at a fixed address that must be free
        // (MAP_FIXED_NOREPLACE fails rather than replace anything).
        let at = unsafe {
            libc::mmap(
                ARENA as *mut libc::c_void,
                ARENA_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        assert_eq!(
            at as u64, ARENA,
            "mapping the fuzz arena at {ARENA:#x} failed"
        );
        at as usize
    }) as *mut u8
}

/// One memory input, decoded.
pub struct Input {
    /// Its index in [`layouts`].
    pub index: usize,
    pub layout: PyLayout,
    pub flags: u16,
    pub args: [u64; 4],
}

/// Decodes the header and lays the image out in the arena; `None` for an input shorter than
/// the header.
pub fn load(data: &[u8]) -> Option<Input> {
    let header = data.get(..HEADER_BYTES)?;
    let image = &data[HEADER_BYTES..];
    let all = layouts();
    let index = header[0] as usize % all.len();
    let layout = all[index];
    let flags = u16::from_le_bytes([header[1], header[2]]);
    let args = [0, 1, 2, 3].map(|i| {
        let at = 8 + 8 * i;
        u64::from_le_bytes(header[at..at + 8].try_into().unwrap())
    });
    let len = image.len().min(ARENA_BYTES);
    let base = arena();
    let dirty = DIRTY.swap(len, Ordering::Relaxed);
    // SAFETY: both ranges lie inside the arena mapping, which nothing else writes.
    unsafe {
        std::ptr::copy_nonoverlapping(image.as_ptr(), base, len);
        if dirty > len {
            std::ptr::write_bytes(base.add(len), 0, dirty - len);
        }
    }
    Some(Input {
        index,
        layout,
        flags,
        args,
    })
}

/// Every layout shape pyebpf knows: the 3.11 and 3.12 tables, and 3.13–3.15 from the
/// `_Py_DebugOffsets` of real interpreters (the `debug_offsets` target's seeds).
pub fn layouts() -> &'static [PyLayout] {
    static ALL: OnceLock<Vec<PyLayout>> = OnceLock::new();
    ALL.get_or_init(|| {
        let mut all: Vec<PyLayout> = [0x030b_07f0, 0x030c_01f0]
            .into_iter()
            .filter_map(|hex| tables::builtin(PyVersion::from_hex(hex)))
            .collect();
        for bytes in [
            &include_bytes!("../seeds/debug_offsets/sid-3.13")[..],
            &include_bytes!("../seeds/debug_offsets/sid-3.14")[..],
            &include_bytes!("../seeds/debug_offsets/sid-3.15")[..],
        ] {
            all.push(debug_offsets::parse(bytes).expect("a real _Py_DebugOffsets parses"));
        }
        all
    })
}

/// The asyncio layout of each of [`layouts`], where it has one (3.14, 3.15): the real
/// `.AsyncioDebug` sections (the `asyncio` target's seeds) paired with it.
pub fn async_layouts() -> &'static [Option<AsyncLayout>] {
    static ALL: OnceLock<Vec<Option<AsyncLayout>>> = OnceLock::new();
    ALL.get_or_init(|| {
        layouts()
            .iter()
            .map(|layout| {
                let section: &[u8] = match layout.version.minor {
                    14 => include_bytes!("../seeds/asyncio/sid-3.14-section"),
                    15 => include_bytes!("../seeds/asyncio/sid-3.15-section"),
                    _ => return None,
                };
                let offsets = AsyncOffsets::parse(section).expect("a real .AsyncioDebug parses");
                Some(AsyncLayout::new(offsets, layout).expect("3.14+ layouts have coroutines"))
            })
            .collect()
    })
}

/// Writes `seeds` into `$PYEBPF_FUZZ_SEEDS/<name>-<i>` when that variable is set.
pub fn write_seeds(name: &str, seeds: impl Fn(usize, &PyLayout) -> Vec<Vec<u8>>) {
    let Some(dir) = std::env::var_os("PYEBPF_FUZZ_SEEDS") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    std::fs::create_dir_all(&dir).expect("creating the seed directory");
    for (i, layout) in layouts().iter().enumerate() {
        for (j, seed) in seeds(i, layout).into_iter().enumerate() {
            let path = dir.join(format!("{name}-{}-{j}", layout.version));
            std::fs::write(&path, seed).expect("writing a seed");
        }
    }
}

/// Builds a memory input: header plus an image, with arena addresses for pointers.
pub struct Image {
    layout: u8,
    flags: u16,
    args: [u64; 4],
    bytes: Vec<u8>,
}

impl Image {
    pub fn new(layout: usize, flags: u16) -> Image {
        Image {
            layout: layout as u8,
            flags,
            args: [0; 4],
            bytes: Vec::new(),
        }
    }

    pub fn arg(&mut self, i: usize, value: u64) -> &mut Image {
        self.args[i] = value;
        self
    }

    fn grow(&mut self, end: usize) {
        if self.bytes.len() < end {
            self.bytes.resize(end, 0);
        }
    }

    /// Room for `size` bytes after everything written so far (16-byte aligned, zeroed): where
    /// a seed builder puts its next object.
    pub fn alloc(&mut self, size: usize) -> usize {
        let at = self.bytes.len().next_multiple_of(16);
        self.grow(at + size);
        at
    }

    pub fn put(&mut self, at: usize, bytes: &[u8]) -> &mut Image {
        self.grow(at + bytes.len());
        self.bytes[at..at + bytes.len()].copy_from_slice(bytes);
        self
    }

    pub fn u64(&mut self, at: usize, v: u64) -> &mut Image {
        self.put(at, &v.to_le_bytes())
    }

    pub fn u32(&mut self, at: usize, v: u32) -> &mut Image {
        self.put(at, &v.to_le_bytes())
    }

    /// A compact `str` object at `at` (ASCII, or UCS-2/UCS-4 for `width` 2/4).
    pub fn str(&mut self, l: &PyLayout, at: usize, text: &str, width: u32) -> u64 {
        let u = &l.unicode;
        let ascii = width == 1 && text.is_ascii();
        let state =
            (width.max(1) << u.kind_shift) | (1 << u.compact_bit) | ((ascii as u32) << u.ascii_bit);
        self.u64(at + u.length as usize, text.chars().count() as u64);
        self.u32(at + u.state as usize, state);
        let data = if ascii { u.ascii_data } else { u.compact_data } as usize;
        let encoded: Vec<u8> = match width {
            2 => text.encode_utf16().flat_map(u16::to_le_bytes).collect(),
            4 => text
                .chars()
                .flat_map(|c| (c as u32).to_le_bytes())
                .collect(),
            _ => text.bytes().collect(),
        };
        self.put(at + data, &encoded);
        ARENA + at as u64
    }

    /// A `bytes` object at `at`.
    pub fn bytes(&mut self, l: &PyLayout, at: usize, data: &[u8]) -> u64 {
        self.u64(at + l.bytes.size as usize, data.len() as u64);
        self.put(at + l.bytes.data as usize, data);
        ARENA + at as u64
    }

    pub fn finish(&self) -> Vec<u8> {
        let mut out = vec![0u8; HEADER_BYTES];
        out[0] = self.layout;
        out[1..3].copy_from_slice(&self.flags.to_le_bytes());
        for (i, a) in self.args.iter().enumerate() {
            out[8 + 8 * i..16 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        out.extend_from_slice(&self.bytes);
        out
    }
}

/// A real-looking line table (`def f():` at line 10, three statements, a long jump back).
pub const LINETABLE: &[u8] = &[
    0xf0, 0x03, 0x01, 0x05, 0x09, 0xd8, 0x04, 0x08, 0xd9, 0x0b, 0x0c, 0x88, 0x03, 0xd0, 0x04, 0x12,
    0xf8, 0x71, 0x01,
];

/// Offsets inside one stack chunk image: its header, then `frames` frame headers.
pub fn chunk_frame(layout: &PyLayout, chunk_at: usize, i: usize) -> usize {
    chunk_at + layout.kernel.chunk_data as usize + i * FRAME_HEADER_BYTES
}
