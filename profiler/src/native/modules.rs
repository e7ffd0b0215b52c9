//! Which files a process runs code from, and what pyebpf keeps of each file.
//!
//! A process's executable file-backed mappings come from `/proc/PID/maps`. A file is known by
//! its device and inode as `maps` shows them ([`FileKey`]), so a libc mapped by a thousand
//! processes, in any mount namespace, is read and parsed once: [`FileCache`] holds its unwind
//! sections (for framehop) and its symbol resolver (blazesym), independently of any process.
//! Files are opened through `/proc/PID/map_files/START-END`, which names the mapped file itself
//! whatever container or chroot the path in `maps` is relative to, else through
//! `/proc/PID/root/PATH`.
//!
//! Bounds: [`MAX_FILES`] files (least recently used evicted, counted), files over
//! [`MAX_FILE_SIZE`] refused, and of a file only the headers and the unwind sections are read
//! (blazesym maps the file and touches only the symbol tables and DWARF it needs).

use std::fs::File;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use blazesym::helper::ElfResolver;
use object::read::elf::ElfFile64;
use object::{Endianness, Object, ObjectSection, ObjectSegment, ReadCache};
use rustc_hash::{FxHashMap, FxHashSet};

/// Files kept; past this the least recently used one is dropped (`file_cache_evictions`).
pub(super) const MAX_FILES: usize = 512;
/// Bigger files are not read: no real shared library comes close, and a container could map
/// anything.
pub(super) const MAX_FILE_SIZE: u64 = 1 << 30;
/// An unwind section bigger than this is not copied (the biggest `.eh_frame` of a browser
/// engine is ~10 MB).
const MAX_SECTION_SIZE: u64 = 64 << 20;
/// Where blazesym looks for split debug information (its own defaults).
const DEBUG_DIRS: [&str; 2] = ["/usr/lib/debug", "/lib/debug"];
const PAGE: u64 = 4096;

/// One file on one host, as `/proc/PID/maps` identifies it: the same in every process and
/// mount namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct FileKey {
    pub dev: u64,
    pub inode: u64,
}

/// An executable mapping of a process. `file` is `None` for the kernel's named regions
/// (`[vdso]`), which are kept only to name their addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mapping {
    pub start: u64,
    pub end: u64,
    /// File offset mapped at `start`.
    pub offset: u64,
    pub file: Option<FileKey>,
    /// The path as the process sees it (`/usr/lib/x86_64-linux-gnu/libc.so.6`, `[vdso]`).
    pub path: Arc<str>,
}

impl Mapping {
    /// The file offset of `addr`, which must lie inside the mapping.
    pub(super) fn file_offset(&self, addr: u64) -> u64 {
        addr - self.start + self.offset
    }

    /// A path through which this process can open the mapped file.
    pub(super) fn openable_paths(&self, pid: u32) -> [PathBuf; 2] {
        [
            PathBuf::from(format!(
                "/proc/{pid}/map_files/{:x}-{:x}",
                self.start, self.end
            )),
            Path::new(&format!("/proc/{pid}/root")).join(self.path.trim_start_matches('/')),
        ]
    }

    /// The file name shown for frames of this mapping (`libc.so.6`).
    pub(super) fn display_name(&self) -> Arc<str> {
        match self.path.rsplit_once('/') {
            Some((_, name)) if !name.is_empty() => Arc::from(name),
            _ => self.path.clone(),
        }
    }
}

/// The executable mappings of `pid`, sorted by address.
pub(crate) fn read_exec_maps(pid: u32) -> std::io::Result<Vec<Mapping>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let mut maps: Vec<Mapping> = text.lines().filter_map(parse_maps_line).collect();
    maps.sort_by_key(|m| m.start);
    Ok(maps)
}

/// `start-end perms offset MAJ:MIN inode path`; `None` for lines that are not executable code
/// with a name.
fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut fields = line.splitn(6, ' ');
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?;
    if perms.as_bytes().get(2) != Some(&b'x') {
        return None;
    }
    let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let (major, minor) = fields.next()?.split_once(':')?;
    let inode: u64 = fields.next()?.parse().ok()?;
    let path = fields.next()?.trim_start();
    let file = if path.starts_with('/') && inode != 0 {
        let major = u32::from_str_radix(major, 16).ok()?;
        let minor = u32::from_str_radix(minor, 16).ok()?;
        Some(FileKey {
            dev: libc::makedev(major, minor),
            inode,
        })
    } else if path.starts_with('[') {
        None
    } else {
        return None;
    };
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    if start >= end {
        return None;
    }
    Some(Mapping {
        start,
        end,
        offset,
        file,
        path: Arc::from(path.strip_suffix(" (deleted)").unwrap_or(path)),
    })
}

/// The mapping of `maps` (sorted) that contains `addr`.
pub(crate) fn find(maps: &[Mapping], addr: u64) -> Option<&Mapping> {
    let after = maps.partition_point(|m| m.start <= addr);
    maps[..after].last().filter(|m| addr < m.end)
}

/// Unwind data as framehop takes it: shared, so every process mapping the file reuses it.
pub(crate) type SectionData = Arc<[u8]>;

/// A file's sections that framehop reads, with their addresses as the file states them.
#[derive(Default)]
pub(crate) struct UnwindSections {
    pub text_svma: Option<Range<u64>>,
    pub got_svma: Option<Range<u64>>,
    pub eh_frame_svma: Option<Range<u64>>,
    pub eh_frame: Option<SectionData>,
    pub eh_frame_hdr_svma: Option<Range<u64>>,
    pub eh_frame_hdr: Option<SectionData>,
    /// Only read when there is no `.eh_frame` (framehop ignores it otherwise).
    pub debug_frame: Option<SectionData>,
}

/// A `PT_LOAD` segment: which file bytes land at which virtual address.
#[derive(Clone, Debug)]
pub(crate) struct Segment {
    pub file_range: Range<u64>,
    pub vaddr: u64,
    pub executable: bool,
}

/// What pyebpf keeps of one file.
pub(crate) struct LoadedFile {
    /// The file name from `maps` (`libz.so.1.2.13`).
    pub name: Arc<str>,
    /// The path it was read through (for logs: it may belong to a process long gone).
    pub path: PathBuf,
    pub unwind: UnwindSections,
    pub segments: Vec<Segment>,
    /// `None` when blazesym could not open the file: its frames keep `[file+0x…]` names.
    pub symbols: Option<Rc<ElfResolver>>,
    /// The GNU build id (`.note.gnu.build-id`) in lower-case hex, when the file has one: what
    /// tells a backend which build a native frame came from (OTLP mappings carry it).
    pub build_id: Option<Arc<str>>,
    last_use: u64,
}

impl LoadedFile {
    /// The address the file's virtual address 0 lands at, for an executable mapping of this
    /// file. `None` when no executable segment holds the mapping's offset.
    pub(super) fn load_bias(&self, mapping: &Mapping) -> Option<u64> {
        // The kernel maps whole pages: the mapping starts at the page holding the segment's
        // first byte, so its offset may be below the segment's `p_offset`.
        let segment = self.segments.iter().find(|s| {
            s.executable
                && s.file_range.start & !(PAGE - 1) <= mapping.offset
                && mapping.offset < s.file_range.end
        })?;
        // Offset `o` of the mapping sits at `start + o - offset` and at `vaddr + o - p_offset`
        // in the file's address space. Wrapping: garbage stays garbage, without a panic.
        Some(
            mapping
                .start
                .wrapping_sub(mapping.offset)
                .wrapping_add(segment.file_range.start)
                .wrapping_sub(segment.vaddr),
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum LoadError {
    #[error("opening {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is {size} bytes, more than the {MAX_FILE_SIZE} read")]
    TooLarge { path: PathBuf, size: u64 },
    #[error("{path} is no longer the file mapped (inode {found}, mapped {mapped})")]
    Replaced {
        path: PathBuf,
        found: u64,
        mapped: u64,
    },
    #[error("parsing ELF {path}: {source}")]
    Elf {
        path: PathBuf,
        source: object::Error,
    },
}

#[derive(Default, Debug, Clone, Copy, serde::Serialize)]
pub(super) struct FileStats {
    pub files_loaded: u64,
    pub file_errors: u64,
    /// Files whose symbols blazesym could not open (unwinding still works).
    pub symbol_file_errors: u64,
    pub file_cache_evictions: u64,
}

/// Parsed files by [`FileKey`], for every process.
#[derive(Default)]
pub(crate) struct FileCache {
    files: FxHashMap<FileKey, LoadedFile>,
    /// Files that are unusable (too big, not ELF, replaced on disk), so they are not re-read
    /// for every sample; forgotten with the next eviction or after [`MAX_FILES`] of them.
    /// A file that could not be opened is not among them: another process may still reach it.
    broken: FxHashSet<FileKey>,
    clock: u64,
    pub stats: FileStats,
}

impl FileCache {
    /// The file mapped by `mapping` of `pid`, read on first use. `None` when it cannot be
    /// read (counted, logged at debug level).
    pub(super) fn get(&mut self, pid: u32, mapping: &Mapping) -> Option<&LoadedFile> {
        let key = mapping.file?;
        self.clock += 1;
        let clock = self.clock;
        if !self.files.contains_key(&key) {
            if self.broken.contains(&key) {
                return None;
            }
            match load(pid, mapping, key) {
                Ok(mut file) => {
                    self.stats.files_loaded += 1;
                    if file.symbols.is_none() {
                        self.stats.symbol_file_errors += 1;
                    }
                    file.last_use = clock;
                    self.make_room();
                    self.files.insert(key, file);
                }
                Err(err) => {
                    self.stats.file_errors += 1;
                    log::debug!("pid {pid}: {err}");
                    if !matches!(err, LoadError::Open { .. }) {
                        if self.broken.len() >= MAX_FILES {
                            self.broken.clear();
                        }
                        self.broken.insert(key);
                    }
                    return None;
                }
            }
        }
        let file = self.files.get_mut(&key)?;
        file.last_use = clock;
        Some(file)
    }

    /// The file if it is cached, without reading anything.
    pub(super) fn cached(&self, key: FileKey) -> Option<&LoadedFile> {
        self.files.get(&key)
    }

    fn make_room(&mut self) {
        if self.files.len() < MAX_FILES {
            return;
        }
        // A linear scan, only when a new file arrives with the cache full: 512 entries.
        if evict_least_recent(&mut self.files, |f| f.last_use) {
            self.stats.file_cache_evictions += 1;
            self.broken.clear();
        }
    }
}

fn load(pid: u32, mapping: &Mapping, key: FileKey) -> Result<LoadedFile, LoadError> {
    let [direct, in_root] = mapping.openable_paths(pid);
    let (path, file) = match File::open(&direct) {
        Ok(file) => (direct, file),
        Err(_) => {
            let file = File::open(&in_root).map_err(|source| LoadError::Open {
                path: in_root.clone(),
                source,
            })?;
            (in_root, file)
        }
    };
    let meta = file.metadata().map_err(|source| LoadError::Open {
        path: path.clone(),
        source,
    })?;
    // Through the root, the path may now name an upgraded file, not the one mapped.
    if !path.starts_with(format!("/proc/{pid}/map_files")) && meta.ino() != key.inode {
        return Err(LoadError::Replaced {
            path,
            found: meta.ino(),
            mapped: key.inode,
        });
    }
    if meta.len() > MAX_FILE_SIZE {
        return Err(LoadError::TooLarge {
            path,
            size: meta.len(),
        });
    }
    let (unwind, segments, build_id) = read_elf(&file).map_err(|source| LoadError::Elf {
        path: path.clone(),
        source,
    })?;
    // blazesym opens a path: give it the file already opened and checked, not a path that
    // may name another file by now. It maps the file and keeps no descriptor.
    let fd_path = format!("/proc/self/fd/{}", file.as_raw_fd());
    let symbols = match ElfResolver::open_with_debug_dirs(&fd_path, DEBUG_DIRS) {
        Ok(resolver) => Some(Rc::new(resolver)),
        Err(err) => {
            log::debug!("pid {pid}: symbols of {}: {err}", path.display());
            None
        }
    };
    Ok(LoadedFile {
        name: mapping.display_name(),
        path,
        unwind,
        segments,
        symbols,
        build_id,
        last_use: 0,
    })
}

/// What `read_elf` reads of a file: its unwind sections, load segments and build id.
type ElfParts = (UnwindSections, Vec<Segment>, Option<Arc<str>>);

/// Bytes of a build id kept: GNU ids are 20 (SHA-1) or 16 (MD5); anything longer is garbage.
const MAX_BUILD_ID: usize = 64;

/// The unwind sections, load segments and build id of an ELF file, reading only those bytes.
fn read_elf(file: &File) -> Result<ElfParts, object::Error> {
    let cache = ReadCache::new(file);
    let elf = ElfFile64::<Endianness, _>::parse(&cache)?;
    let segments = elf
        .segments()
        .filter_map(|s| {
            let (offset, size) = s.file_range();
            let executable = matches!(
                s.flags(),
                object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0
            );
            Some(Segment {
                file_range: offset..offset.checked_add(size)?,
                vaddr: s.address(),
                executable,
            })
        })
        .collect();
    let range = |name: &str| {
        let section = elf.section_by_name(name)?;
        let start = section.address();
        Some(start..start.checked_add(section.size())?)
    };
    let data = |name: &str| -> Option<SectionData> {
        let section = elf.section_by_name(name)?;
        if section.size() > MAX_SECTION_SIZE {
            return None;
        }
        // Compressed sections (only ever `.debug_frame`) are skipped: `data` would hand back
        // the compressed bytes.
        if let object::SectionFlags::Elf { sh_flags } = section.flags() {
            if sh_flags & u64::from(object::elf::SHF_COMPRESSED) != 0 {
                return None;
            }
        }
        section.data().ok().map(Arc::from)
    };
    let eh_frame = data(".eh_frame");
    let unwind = UnwindSections {
        text_svma: range(".text"),
        got_svma: range(".got"),
        eh_frame_svma: range(".eh_frame"),
        eh_frame_hdr_svma: range(".eh_frame_hdr"),
        eh_frame_hdr: data(".eh_frame_hdr"),
        debug_frame: if eh_frame.is_none() {
            data(".debug_frame")
        } else {
            None
        },
        eh_frame,
    };
    let build_id = elf
        .build_id()
        .ok()
        .flatten()
        .filter(|id| !id.is_empty() && id.len() <= MAX_BUILD_ID)
        .map(|id| Arc::from(id.iter().map(|b| format!("{b:02x}")).collect::<String>()));
    Ok((unwind, segments, build_id))
}

/// Removes the entry of `map` used longest ago (a linear scan: for bounded caches, when a new
/// entry arrives with the cache full). Returns whether one was removed.
pub(crate) fn evict_least_recent<K: Copy + Eq + std::hash::Hash, V, S: std::hash::BuildHasher>(
    map: &mut std::collections::HashMap<K, V, S>,
    last_use: impl Fn(&V) -> u64,
) -> bool {
    let oldest = map.iter().min_by_key(|(_, v)| last_use(v)).map(|(k, _)| *k);
    oldest.is_some_and(|k| map.remove(&k).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines() {
        let line = "7f1c2a428000-7f1c2a57d000 r-xp 00028000 fd:01 1835053                    /usr/lib/x86_64-linux-gnu/libc.so.6";
        let m = parse_maps_line(line).unwrap();
        assert_eq!(
            (m.start, m.end, m.offset),
            (0x7f1c2a428000, 0x7f1c2a57d000, 0x28000)
        );
        assert_eq!(
            m.file,
            Some(FileKey {
                dev: libc::makedev(0xfd, 1),
                inode: 1835053
            })
        );
        assert_eq!(&*m.display_name(), "libc.so.6");
        let vdso = parse_maps_line("7ffd1b1f0000-7ffd1b1f2000 r-xp 00000000 00:00 0   [vdso]");
        assert_eq!(vdso.unwrap().file, None);
        // Not executable, anonymous, or garbage: skipped.
        assert!(parse_maps_line("7f1c2a400000-7f1c2a428000 r--p 00000000 fd:01 1835053 /usr/lib/x86_64-linux-gnu/libc.so.6").is_none());
        assert!(parse_maps_line("7f1c2a400000-7f1c2a428000 r-xp 00000000 00:00 0 ").is_none());
        assert!(parse_maps_line("zz-7f r-xp 0 fd:01 1 /x").is_none());
        assert!(parse_maps_line("20-10 r-xp 0 fd:01 1 /x").is_none());
        assert!(parse_maps_line("").is_none());
        let deleted = parse_maps_line("10-20 r-xp 0 fd:01 7 /tmp/lib.so (deleted)").unwrap();
        assert_eq!(&*deleted.path, "/tmp/lib.so");
    }

    #[test]
    fn own_maps_and_files() {
        let pid = std::process::id();
        let maps = read_exec_maps(pid).unwrap();
        let here = own_maps_and_files as *const () as u64;
        let m = find(&maps, here).expect("the test's own code is mapped");
        let mut files = FileCache::default();
        let file = files.get(pid, m).expect("the test binary loads");
        assert!(file.unwind.eh_frame.is_some());
        assert!(file.symbols.is_some());
        assert!(file.load_bias(m).is_some());
        assert!(find(&maps, 0).is_none());
        assert_eq!(files.stats.files_loaded, 1);
    }
}
