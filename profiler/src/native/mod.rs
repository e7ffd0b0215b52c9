//! `--native`: the C frames of a sample, unwound and named in userspace.
//!
//! The kernel sends, per sample, either the registers at the interrupt and a copy of the top
//! of the user stack ("stack copy" mode, for binaries without frame pointers), or the
//! instruction pointers of a frame-pointer walk. [`Native`] turns either into named frames,
//! leaf first: `unwind` walks a copy with framehop, `symbols` names addresses with blazesym,
//! and `modules` knows which file each address belongs to. The merge with the Python stack
//! uses each frame's stack pointer to tell which native frame a Python entry frame ran in.
//!
//! Bounds: [`MAX_PROCESSES`] processes (least recently sampled dropped, counted), per-file
//! caches in `modules` and `symbols`, [`unwind::MAX_FRAMES`] frames. A process's mappings are
//! kept until [`Native::forget`], so samples still queued when it exits are named from the
//! cached files. Garbage from the target (registers, stack bytes) never panics.

pub(crate) mod merge;
mod modules;
mod symbols;
mod unwind;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

pub(crate) use modules::FileKey;
use modules::{FileCache, Mapping};
use symbols::Symbols;
use unwind::{ProcessUnwinder, RawFrame, RuleCache};

/// Processes kept; past this the least recently sampled one is dropped
/// (`process_evictions`), and rebuilt from `/proc` if it is sampled again.
pub(crate) const MAX_PROCESSES: usize = 1024;
/// A process's mappings are re-read at most this often when an address falls outside them
/// (a library loaded since, or JIT code that no re-read will explain).
const REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// The user registers at the interrupt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Regs {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

/// One native frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NativeFrame {
    /// The address as captured: the interrupted ip for the first frame, else a return address.
    pub ip: u64,
    /// The stack pointer in this frame (see `unwind::RawFrame::sp`); 0 when unknown (frame
    /// pointer mode).
    pub sp: u64,
    /// Whether `ip` is a return address (looked up at `ip - 1`).
    pub return_address: bool,
    /// The file the code belongs to; `None` for anonymous code (JIT) and `[vdso]`.
    pub file: Option<FileKey>,
    /// The file name (`libc.so.6`), the region name (`[vdso]`), or `[unknown]`.
    pub module: Arc<str>,
    /// `None` when no symbol covers the address: show `[module+0xoffset]`.
    pub function: Option<Arc<str>>,
    /// The module's GNU build id (hex), when its file is loaded and has one.
    pub build_id: Option<Arc<str>>,
    /// The file offset looked up (`ip - 1` for return addresses); the address itself for
    /// code outside any mapping.
    pub offset: u64,
}

/// How a walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub(crate) enum StackEnd {
    /// The outermost frame was reached (a null return address, or CFI says so).
    Complete,
    /// The walk needed stack bytes beyond the copy: the stack is deeper than the copy.
    OutOfStack,
    /// [`unwind::MAX_FRAMES`] frames were walked.
    MaxFrames,
    /// The unwind information led nowhere (garbage, or code framehop cannot unwind).
    Failed,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NativeStack {
    /// Leaf first.
    pub frames: Vec<NativeFrame>,
    pub end: StackEnd,
}

#[derive(Default, Debug, Clone, Copy, serde::Serialize)]
pub(crate) struct NativeStats {
    /// Stack copies walked.
    pub unwinds: u64,
    pub unwind_complete: u64,
    pub out_of_stack: u64,
    pub max_frames: u64,
    pub unwind_failures: u64,
    /// Frame-pointer stacks symbolized.
    pub ip_stacks: u64,
    pub frames: u64,
    /// `/proc/PID/maps` re-read because an address was outside every known module.
    pub module_refreshes: u64,
    /// Such re-reads skipped because the last one was under a second ago.
    pub module_refreshes_limited: u64,
    pub maps_errors: u64,
    /// Frames outside every mapping of their process (JIT code, or a bad walk).
    pub unmapped_frames: u64,
    pub process_evictions: u64,
    pub files_loaded: u64,
    pub file_errors: u64,
    pub symbol_file_errors: u64,
    pub file_cache_evictions: u64,
    /// Times framehop's shared rule cache started over (see `unwind::RuleCache`).
    pub unwind_cache_resets: u64,
    pub symbol_lookups: u64,
    pub symbol_cache_hits: u64,
    pub symbol_cache_misses: u64,
    pub symbol_cache_evictions: u64,
    pub unknown_symbols: u64,
    pub symbol_errors: u64,
}

struct Process {
    /// Executable mappings, sorted.
    maps: Vec<Mapping>,
    /// Built on the first stack copy; dropped when the mappings change.
    unwinder: Option<ProcessUnwinder>,
    refreshed: Instant,
    last_use: u64,
}

/// Native stacks for every profiled process.
pub(crate) struct Native {
    processes: FxHashMap<u32, Process>,
    files: FileCache,
    symbols: Symbols,
    rules: RuleCache,
    clock: u64,
    stats: NativeStats,
}

impl Default for Native {
    fn default() -> Self {
        Self::new()
    }
}

impl Native {
    pub(crate) fn new() -> Self {
        Self {
            processes: FxHashMap::default(),
            files: FileCache::default(),
            symbols: Symbols::default(),
            rules: RuleCache::default(),
            clock: 0,
            stats: NativeStats::default(),
        }
    }

    /// Unwinds a stack copy of `pid` (`stack` holds the bytes from `regs.sp`) and names its
    /// frames.
    pub(crate) fn unwind_copy(&mut self, pid: u32, regs: Regs, stack: &[u8]) -> NativeStack {
        self.stats.unwinds += 1;
        self.touch(pid);
        if !self.covered(pid, regs.ip) {
            self.refresh(pid);
        }
        let mut walk = self.walk(pid, regs, stack);
        if walk
            .frames
            .iter()
            .any(|f| !self.covered(pid, f.lookup_address()))
            && self.refresh(pid)
        {
            walk = self.walk(pid, regs, stack);
        }
        match walk.end {
            StackEnd::Complete => self.stats.unwind_complete += 1,
            StackEnd::OutOfStack => self.stats.out_of_stack += 1,
            StackEnd::MaxFrames => self.stats.max_frames += 1,
            StackEnd::Failed => self.stats.unwind_failures += 1,
        }
        NativeStack {
            frames: self.name_all(pid, &walk.frames),
            end: walk.end,
        }
    }

    /// Names the frames of the kernel's frame-pointer walk: (ip, sp) pairs, leaf first (the
    /// interrupted ip, then return addresses). `complete` when the chain ended at a null frame
    /// pointer; a walk cut short (code without frame pointers broke the chain) is
    /// `OutOfStack`.
    pub(crate) fn symbolize_frame_pointers(
        &mut self,
        pid: u32,
        pairs: &[(u64, u64)],
        complete: bool,
    ) -> NativeStack {
        self.stats.ip_stacks += 1;
        self.touch(pid);
        let frames: Vec<RawFrame> = pairs
            .iter()
            .take_while(|&&(ip, _)| ip != 0)
            .take(unwind::MAX_FRAMES)
            .enumerate()
            .map(|(i, &(address, sp))| RawFrame {
                address,
                return_address: i > 0,
                sp,
            })
            .collect();
        if frames
            .iter()
            .any(|f| !self.covered(pid, f.lookup_address()))
        {
            self.refresh(pid);
        }
        let end = if complete {
            StackEnd::Complete
        } else {
            StackEnd::OutOfStack
        };
        NativeStack {
            frames: self.name_all(pid, &frames),
            end,
        }
    }

    /// Drops what is kept for `pid` (it exited and its queued samples are done). Its files
    /// stay cached for other processes.
    pub(crate) fn forget(&mut self, pid: u32) {
        self.processes.remove(&pid);
    }

    pub(crate) fn stats(&self) -> NativeStats {
        let files = self.files.stats;
        let symbols = self.symbols.stats;
        NativeStats {
            files_loaded: files.files_loaded,
            file_errors: files.file_errors,
            symbol_file_errors: files.symbol_file_errors,
            file_cache_evictions: files.file_cache_evictions,
            unwind_cache_resets: self.rules.resets,
            symbol_lookups: symbols.lookups,
            symbol_cache_hits: symbols.hits,
            symbol_cache_misses: symbols.misses,
            symbol_cache_evictions: symbols.evictions,
            unknown_symbols: symbols.unknown,
            symbol_errors: symbols.errors,
            ..self.stats
        }
    }

    /// The process entry of `pid`, created from `/proc/PID/maps` on first sight.
    fn touch(&mut self, pid: u32) {
        self.clock += 1;
        let clock = self.clock;
        if let Some(process) = self.processes.get_mut(&pid) {
            process.last_use = clock;
            return;
        }
        if self.processes.len() >= MAX_PROCESSES
            && modules::evict_least_recent(&mut self.processes, |p| p.last_use)
        {
            self.stats.process_evictions += 1;
        }
        let maps = modules::read_exec_maps(pid).unwrap_or_else(|err| {
            self.stats.maps_errors += 1;
            log::debug!("pid {pid}: reading maps: {err}");
            Vec::new()
        });
        self.processes.insert(
            pid,
            Process {
                maps,
                unwinder: None,
                refreshed: Instant::now(),
                last_use: clock,
            },
        );
    }

    fn covered(&self, pid: u32, addr: u64) -> bool {
        self.processes
            .get(&pid)
            .is_some_and(|p| modules::find(&p.maps, addr).is_some())
    }

    /// Re-reads `pid`'s mappings unless that was done under [`REFRESH_INTERVAL`] ago.
    /// True when they changed.
    fn refresh(&mut self, pid: u32) -> bool {
        let Some(process) = self.processes.get_mut(&pid) else {
            return false;
        };
        if process.refreshed.elapsed() < REFRESH_INTERVAL {
            self.stats.module_refreshes_limited += 1;
            return false;
        }
        process.refreshed = Instant::now();
        self.stats.module_refreshes += 1;
        match modules::read_exec_maps(pid) {
            Ok(maps) if maps != process.maps => {
                process.maps = maps;
                process.unwinder = None;
                true
            }
            Ok(_) => false,
            // Gone: the old mappings still name its queued samples.
            Err(err) => {
                self.stats.maps_errors += 1;
                log::debug!("pid {pid}: re-reading maps: {err}");
                false
            }
        }
    }

    fn walk(&mut self, pid: u32, regs: Regs, stack: &[u8]) -> unwind::Walk {
        let Some(process) = self.processes.get_mut(&pid) else {
            return unwind::Walk {
                frames: Vec::new(),
                end: StackEnd::Failed,
            };
        };
        let unwinder = process.unwinder.get_or_insert_with(|| {
            unwind::build(pid, &process.maps, &mut self.files, &mut self.rules)
        });
        unwind::walk(unwinder, &mut self.rules, regs.ip, regs.sp, regs.bp, stack)
    }

    fn name_all(&mut self, pid: u32, frames: &[RawFrame]) -> Vec<NativeFrame> {
        self.stats.frames += frames.len() as u64;
        frames.iter().map(|f| self.name(pid, f)).collect()
    }

    fn name(&mut self, pid: u32, frame: &RawFrame) -> NativeFrame {
        let lookup = frame.lookup_address();
        let mapping = self
            .processes
            .get(&pid)
            .and_then(|p| modules::find(&p.maps, lookup));
        let Some(mapping) = mapping else {
            self.stats.unmapped_frames += 1;
            return NativeFrame {
                ip: frame.address,
                sp: frame.sp,
                return_address: frame.return_address,
                file: None,
                module: Arc::from("[unknown]"),
                function: None,
                build_id: None,
                offset: lookup,
            };
        };
        let offset = mapping.file_offset(lookup);
        let (module, function, build_id) = match mapping.file {
            Some(key) => {
                let files = &mut self.files;
                let function = self.symbols.name(key, offset, || files.get(pid, mapping));
                let file = files.cached(key);
                let module = file.map_or_else(|| mapping.display_name(), |f| f.name.clone());
                (module, function, file.and_then(|f| f.build_id.clone()))
            }
            None => (mapping.display_name(), None, None),
        };
        NativeFrame {
            ip: frame.address,
            sp: frame.sp,
            return_address: frame.return_address,
            file: mapping.file,
            module,
            function,
            build_id,
            offset,
        }
    }
}

use profiler_common::{NATIVE_FRAME_POINTERS, NATIVE_NONE, NATIVE_STACK_COPY};

/// How native stacks are captured (`--native-unwind`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Unwind {
    /// Frame pointers where the interpreter is built with them, else a stack copy.
    #[default]
    Auto,
    /// The kernel's frame-pointer walk, for every process: cheapest where the binaries keep
    /// frame pointers; a sample whose chain breaks before the outermost eval loop carries a
    /// stack copy instead.
    FramePointers,
    /// A copy of the top of the user stack, unwound with the binaries' CFI (any build).
    StackCopy,
}

/// `--native` and its settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NativeOptions {
    pub unwind: Unwind,
    /// Bytes of user stack copied per sample in stack-copy mode.
    pub stack_bytes: u32,
}

impl NativeOptions {
    /// The kernel's `NATIVE_*` mode for a process whose eval loop keeps frame pointers or not
    /// (`None`: unknown, so the copy, which works either way).
    pub fn mode(options: Option<NativeOptions>, frame_pointers: Option<bool>) -> u32 {
        match options.map(|o| o.unwind) {
            None => NATIVE_NONE,
            Some(Unwind::FramePointers) => NATIVE_FRAME_POINTERS,
            Some(Unwind::StackCopy) => NATIVE_STACK_COPY,
            Some(Unwind::Auto) if frame_pointers == Some(true) => NATIVE_FRAME_POINTERS,
            Some(Unwind::Auto) => NATIVE_STACK_COPY,
        }
    }
}

#[cfg(test)]
mod tests;
