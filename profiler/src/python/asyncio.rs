//! asyncio tasks of CPython 3.14+, read from outside the process.
//!
//! CPython 3.14 publishes the layout of its C `Task` objects in the `_asyncio` module's
//! `.AsyncioDebug` ELF section: `_Py_AsyncioModuleDebugOffsets`, 13 little-endian `uint64_t`
//! in three groups (task object; interpreter state; thread state). The module is built into
//! some executables (sid's 3.15) and is a separate `lib-dynload/_asyncio.cpython-3XY*.so`
//! in others (sid's 3.14), loaded only when the program imports asyncio, possibly long after
//! pyebpf found the process: [`locate`] then reads the section from that file on disk,
//! through `/proc/PID/root` (containers, chroots). 3.11–3.13 have no such section.
//!
//! What is read (only with `process_vm_readv`, never trusting what comes back):
//! - [`read_task`]: one task's name, its awaiters (`task_awaited_by`: one task, or a set of
//!   them), its coroutine and that coroutine's suspended `await` chain as frames;
//! - [`all_tasks`]: every task of every thread's and interpreter's task list.
//!
//! Bounds: [`MAX_AWAITERS`] awaiters per task, [`MAX_CORO_DEPTH`] coroutines per chain,
//! [`MAX_TASKS`] tasks per listing, [`MAX_SET_SLOTS`] slots of an awaiter set; every walk
//! also stops at an address it already visited (cycles in garbage, or in a list being
//! changed under it).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use object::elf::{FileHeader64, SHT_NOBITS};
use object::read::elf::{FileHeader as _, SectionHeader as _};
use object::{Endianness, ReadCache, ReadRef};
use profiler_common::{RawFrame, TaskLayout, MAX_INTERPRETERS, MAX_THREAD_WALK};

use super::code::{read_str, read_tag};
use super::layout::{CoroutineLayout, PyLayout, PyVersion};
use crate::discovery::{self, PythonProcess};
use crate::memory::{Fields, ProcessMemory, ReadError};

/// Name of the ELF section holding `_Py_AsyncioModuleDebugOffsets`.
pub(crate) const SECTION: &str = ".AsyncioDebug";
/// `uint64_t` values of `_Py_AsyncioModuleDebugOffsets` (3.14, 3.15).
pub(crate) const SECTION_WORDS: usize = 13;
/// Awaiters read from one task's awaiter set.
pub(crate) const MAX_AWAITERS: usize = 64;
/// Slots of an awaiter set's hash table walked (a set of 64 awaiters has 256).
pub(crate) const MAX_SET_SLOTS: u64 = 1024;
/// Coroutines followed down one task's `await` chain.
pub(crate) const MAX_CORO_DEPTH: usize = 64;
/// Tasks [`all_tasks`] lists.
pub(crate) const MAX_TASKS: usize = 100_000;
/// Bytes of a task name's type name read (`str`, `int`).
const TP_NAME_BYTES: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum AsyncError {
    #[error(
        "CPython {version} publishes no asyncio task layout (the `_asyncio` module's debug \
         offsets exist from CPython 3.14)"
    )]
    Unsupported { version: PyVersion },
    #[error(
        "no {SECTION} section found for pid {pid} (looked in {looked}): asyncio is not loaded \
         and its module file was not found"
    )]
    NotFound { pid: u32, looked: String },
    #[error("{path}: {what}")]
    Elf { path: String, what: String },
    #[error("implausible _Py_AsyncioModuleDebugOffsets: {0}")]
    Implausible(String),
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("{addr:#x} is not an asyncio task ({what})")]
    NotATask { addr: u64, what: String },
    #[error("coroutine at {addr:#x}: {what}")]
    BadCoroutine { addr: u64, what: String },
}

impl AsyncError {
    /// The process exited (its memory cannot be read any more).
    pub(crate) fn is_gone(&self) -> bool {
        matches!(self, AsyncError::Read(ReadError::Gone { .. }))
    }
}

/// `_Py_AsyncioModuleDebugOffsets.asyncio_task_object`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskOffsets {
    /// `sizeof(TaskObj)`: one read covers every field below.
    pub size: u16,
    /// `task_name` (a `str`, or an `int` n standing for `Task-n` until `get_name()` runs).
    pub name: u16,
    /// `task_awaited_by`: the awaiting task, or (with `awaited_by_is_set`) a `set` of them.
    pub awaited_by: u16,
    /// `task_is_task` (a `char`, 1 for tasks, 0 for plain futures).
    pub is_task: u16,
    /// `task_awaited_by_is_set` (a `char`).
    pub awaited_by_is_set: u16,
    /// `task_coro`.
    pub coro: u16,
    /// `task_node`: the `llist_node` linking the task into its thread's (or, once the thread
    /// ended, its interpreter's) task list.
    pub node: u16,
}

/// The `.AsyncioDebug` section, checked: where tasks, their lists and a thread's running
/// task are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AsyncOffsets {
    pub task: TaskOffsets,
    /// `PyInterpreterState.asyncio_tasks_head` (an `llist_node` list head).
    pub interp_tasks_head: u16,
    /// `PyThreadState.asyncio_running_loop`.
    pub thread_running_loop: u16,
    /// `PyThreadState.asyncio_running_task` (what the kernel reads with each sample).
    pub thread_running_task: u16,
    /// `PyThreadState.asyncio_tasks_head` (an `llist_node` list head).
    pub thread_tasks_head: u16,
}

impl AsyncOffsets {
    /// Decodes and checks the section's contents: sizes plausible, every field inside its
    /// struct. Garbage gives [`AsyncError::Implausible`].
    pub fn parse(bytes: &[u8]) -> Result<AsyncOffsets, AsyncError> {
        let word = |i: usize| bytes.u64_at(i * 8);
        let words: Vec<u64> = (0..SECTION_WORDS)
            .map(word)
            .collect::<Option<_>>()
            .ok_or_else(|| {
                AsyncError::Implausible(format!(
                    "{} bytes, {} needed",
                    bytes.len(),
                    SECTION_WORDS * 8
                ))
            })?;
        let [task_size, name, awaited_by, is_task, is_set, coro, node, interp_size, interp_head, thread_size, running_loop, running_task, thread_head] =
            words[..]
        else {
            unreachable!("SECTION_WORDS values");
        };
        let sized = |what: &str, size: u64, lo: u64, hi: u64| {
            if (lo..=hi).contains(&size) {
                Ok(size)
            } else {
                Err(AsyncError::Implausible(format!(
                    "sizeof({what}) = {size} (expected {lo}..={hi})"
                )))
            }
        };
        let task_size = sized("TaskObj", task_size, 32, 4096)?;
        let interp_size = sized("PyInterpreterState", interp_size, 1024, 16 << 20)?;
        let thread_size = sized("PyThreadState", thread_size, 128, 1 << 20)?;
        let inside = |what: &str, at: u64, width: u64, size: u64| -> Result<u16, AsyncError> {
            match at.checked_add(width) {
                Some(end) if end <= size && at >= 16 => Ok(at as u16),
                _ => Err(AsyncError::Implausible(format!(
                    "{what} = {at} does not fit a {width}-byte field into {size} bytes"
                ))),
            }
        };
        let task = TaskOffsets {
            size: task_size as u16,
            name: inside("task_name", name, 8, task_size)?,
            awaited_by: inside("task_awaited_by", awaited_by, 8, task_size)?,
            is_task: inside("task_is_task", is_task, 1, task_size)?,
            awaited_by_is_set: inside("task_awaited_by_is_set", is_set, 1, task_size)?,
            coro: inside("task_coro", coro, 8, task_size)?,
            node: inside("task_node", node, 16, task_size)?,
        };
        let pointers = [task.name, task.awaited_by, task.coro];
        if (1..pointers.len()).any(|i| pointers[..i].contains(&pointers[i]))
            || task.is_task == task.awaited_by_is_set
        {
            return Err(AsyncError::Implausible(format!(
                "task fields overlap: {task:?}"
            )));
        }
        Ok(AsyncOffsets {
            task,
            interp_tasks_head: inside("asyncio_tasks_head", interp_head, 16, interp_size)?,
            thread_running_loop: inside("asyncio_running_loop", running_loop, 8, thread_size)?,
            thread_running_task: inside("asyncio_running_task", running_task, 8, thread_size)?,
            thread_tasks_head: inside("asyncio_tasks_head", thread_head, 16, thread_size)?,
        })
    }
}

/// Everything the async view needs about one interpreter build: the `.AsyncioDebug` offsets
/// and the generic object fields of its [`PyLayout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncLayout {
    pub offsets: AsyncOffsets,
    /// Coroutine, set, list and int fields (from `_Py_DebugOffsets`).
    pub coroutines: CoroutineLayout,
    /// What the kernel reads to capture a sample's task chain.
    pub kernel: TaskLayout,
}

impl AsyncLayout {
    /// Pairs the section's offsets with `layout`; fails for a layout without the object
    /// fields (before 3.14).
    pub fn new(offsets: AsyncOffsets, layout: &PyLayout) -> Result<AsyncLayout, AsyncError> {
        let coroutines = layout.coroutines.ok_or(AsyncError::Unsupported {
            version: layout.version,
        })?;
        let t = &offsets.task;
        let kernel = TaskLayout {
            awaited_by: t.awaited_by,
            coro: t.coro,
            name: t.name,
            is_task: t.is_task,
            awaited_by_is_set: t.awaited_by_is_set,
            ob_type: layout.ob_type,
            gi_iframe: coroutines.gi_iframe,
            gi_frame_state: coroutines.gi_frame_state,
            stackpointer: coroutines.stackpointer,
            suspended_yield_from: coroutines.suspended_yield_from as u8,
            yield_from_slot: coroutines.yield_from_slot,
            _pad: 0,
        };
        Ok(AsyncLayout {
            offsets,
            coroutines,
            kernel,
        })
    }

    /// Where a task's coroutine frame is, given its coroutine.
    pub fn coro_frame(&self, coro: u64) -> u64 {
        coro.wrapping_add(self.coroutines.gi_iframe as u64)
    }
}

/// Where an [`AsyncLayout`] was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// In an ELF file the process maps (the executable, libpython, a loaded `_asyncio`).
    Mapped(String),
    /// In the `_asyncio` module file on disk, not loaded (yet) by the process.
    OnDisk(PathBuf),
}

/// Finds the `.AsyncioDebug` section for `process`: in the files it maps, else in its
/// `_asyncio` module file under the interpreter's stdlib directory.
pub(crate) fn locate(process: &PythonProcess) -> Result<(AsyncLayout, Found), AsyncError> {
    let layout = &process.layout;
    if layout.coroutines.is_none() {
        return Err(AsyncError::Unsupported {
            version: layout.version,
        });
    }
    let pid = process.pid;
    let maps = discovery::read_maps(pid).map_err(|e| AsyncError::NotFound {
        pid,
        looked: format!("/proc/{pid}/maps: {e}"),
    })?;
    let mut paths: Vec<&str> = maps.iter().map(|m| m.path.as_str()).collect();
    paths.sort_unstable();
    paths.dedup();
    let mapped = paths.iter().copied().filter(|p| {
        let base = discovery::basename(p);
        *p == process.binary
            || base.starts_with("python")
            || base.starts_with("libpython")
            || base.starts_with("_asyncio")
    });
    let mut looked = Vec::new();
    for path in mapped {
        let on_disk = discovery::openable_path(pid, &maps, path);
        if let Some(bytes) = section_bytes(&on_disk)? {
            let offsets = AsyncOffsets::parse(&bytes)?;
            return Ok((
                AsyncLayout::new(offsets, layout)?,
                Found::Mapped(path.to_string()),
            ));
        }
        looked.push(path.to_string());
    }
    let dirs = module_dirs(&process.binary, layout.version.minor, &paths);
    let prefix = format!("_asyncio.cpython-3{}", layout.version.minor);
    for dir in &dirs {
        looked.push(format!("{dir}/{prefix}*.so"));
        // As the process sees it (through its root: containers), else as this process does
        // (`maps` shows a chroot'ed process's files by their host paths).
        let entries =
            std::fs::read_dir(discovery::host_path(pid, dir)).or_else(|_| std::fs::read_dir(dir));
        let Ok(entries) = entries else {
            continue;
        };
        let mut names: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with(&prefix) && name.ends_with(".so")
            })
            .map(|e| e.path())
            .collect();
        names.sort();
        for file in names {
            if let Some(bytes) = section_bytes(&file)? {
                let offsets = AsyncOffsets::parse(&bytes)?;
                return Ok((AsyncLayout::new(offsets, layout)?, Found::OnDisk(file)));
            }
        }
    }
    Err(AsyncError::NotFound {
        pid,
        looked: looked.join(", "),
    })
}

/// Directories (as the process sees them) that may hold the interpreter's `_asyncio`
/// module: those of the extension modules it already loaded, then
/// `PREFIX/lib/python3.X/lib-dynload` for the prefixes above its binary.
pub(crate) fn module_dirs(binary: &str, minor: u8, mapped: &[&str]) -> Vec<String> {
    let mut dirs: Vec<String> = mapped
        .iter()
        .filter_map(|p| {
            let (dir, _) = p.rsplit_once('/')?;
            dir.ends_with("/lib-dynload").then(|| dir.to_string())
        })
        .collect();
    let version = format!("python3.{minor}");
    let mut at = Path::new(binary).parent();
    for _ in 0..3 {
        let Some(dir) = at else { break };
        for candidate in [
            dir.join("lib").join(&version).join("lib-dynload"),
            dir.join(&version).join("lib-dynload"),
        ] {
            dirs.push(candidate.to_string_lossy().into_owned());
        }
        at = dir.parent();
    }
    let mut seen = HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

/// The contents of `path`'s `.AsyncioDebug` section; `Ok(None)` for an ELF file without
/// one. Reads the headers and the section only.
pub(crate) fn section_bytes(path: &Path) -> Result<Option<Vec<u8>>, AsyncError> {
    let elf_error = |what: String| AsyncError::Elf {
        path: path.display().to_string(),
        what,
    };
    let file = std::fs::File::open(path).map_err(|e| elf_error(format!("opening: {e}")))?;
    section_data(&ReadCache::new(file)).map_err(elf_error)
}

/// [`section_bytes`] over a file already in memory (the fuzz targets feed it arbitrary bytes).
pub fn section_bytes_in(data: &[u8]) -> Result<Option<Vec<u8>>, AsyncError> {
    section_data(data).map_err(|what| AsyncError::Elf {
        path: "(in memory)".into(),
        what,
    })
}

/// The one lookup behind [`section_bytes`] and [`section_bytes_in`]; errors are messages.
fn section_data<'data, R: ReadRef<'data>>(data: R) -> Result<Option<Vec<u8>>, String> {
    let header = FileHeader64::<Endianness>::parse(data).map_err(|e| e.to_string())?;
    let endian = header.endian().map_err(|e| e.to_string())?;
    let sections = header.sections(endian, data).map_err(|e| e.to_string())?;
    let Some((_, section)) = sections.section_by_name(endian, SECTION.as_bytes()) else {
        return Ok(None);
    };
    if section.sh_type(endian) == SHT_NOBITS {
        return Err(format!("{SECTION} has no contents"));
    }
    let len = section.sh_size(endian).min(4096);
    let bytes = data
        .read_bytes_at(section.sh_offset(endian), len)
        .map_err(|_| format!("{SECTION} ({len} bytes) is outside the file"))?;
    Ok(Some(bytes.to_vec()))
}

/// One asyncio task as read from the target.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TaskInfo {
    pub addr: u64,
    /// `get_name()`: the name given, or `Task-N`.
    pub name: String,
    /// The tasks awaiting this one (`await task`, `gather`, a `TaskGroup`'s parent), in set
    /// order; empty for a root task. At most [`MAX_AWAITERS`].
    pub awaited_by: Vec<u64>,
    /// `task_coro`: the coroutine the task runs.
    pub coro: u64,
    /// The coroutine chain the task is suspended (or running) in, **leaf first**: the
    /// innermost awaited coroutine's frame first, the task's own coroutine frame
    /// ([`AsyncLayout::coro_frame`]) last. `code` is untagged, `tag` is the code object's tag
    /// (0 when it could not be read), ready for the symbolizer.
    pub coro_frames: Vec<RawFrame>,
    /// The chain was cut at [`MAX_CORO_DEPTH`] or at a cycle.
    pub coro_truncated: bool,
}

/// Reads the task at `task`: its name, awaiters and coroutine chain. Fails when `task` is not
/// a task (wrong type flag, no coroutine) or cannot be read.
pub(crate) fn read_task(
    mem: &ProcessMemory,
    layout: &PyLayout,
    a: &AsyncLayout,
    task: u64,
) -> Result<TaskInfo, AsyncError> {
    let t = &a.offsets.task;
    let buf = mem.read_vec(task, t.size as usize)?;
    let not_a_task = |what: &str| AsyncError::NotATask {
        addr: task,
        what: what.to_string(),
    };
    let byte = |at: u16| buf.get(at as usize).copied();
    if byte(t.is_task) != Some(1) {
        return Err(not_a_task("its task flag is not set"));
    }
    let word = |at: u16| buf.u64_at(at as usize).ok_or_else(|| not_a_task("short"));
    let coro = word(t.coro)?;
    if coro == 0 {
        return Err(not_a_task("no coroutine"));
    }
    let name_ptr = word(t.name)?;
    let awaited_by_ptr = word(t.awaited_by)?;
    let awaited_by = match (awaited_by_ptr, byte(t.awaited_by_is_set)) {
        (0, _) => Vec::new(),
        (set, Some(1)) => read_set(mem, &a.coroutines, set)?,
        (one, _) => vec![one],
    };
    let name = read_name(mem, layout, &a.coroutines, task, name_ptr)?;
    let (coro_frames, coro_truncated) = coro_chain(mem, layout, a, coro)?;
    Ok(TaskInfo {
        addr: task,
        name,
        awaited_by,
        coro,
        coro_frames,
        coro_truncated,
    })
}

/// The members of a `set` object (its table's live keys: neither empty nor the dummy of a
/// deleted entry), at most [`MAX_AWAITERS`].
pub(crate) fn read_set(
    mem: &ProcessMemory,
    o: &CoroutineLayout,
    set: u64,
) -> Result<Vec<u64>, AsyncError> {
    let head_len = [o.set_used, o.set_table, o.set_mask]
        .iter()
        .map(|&f| f as usize + 8)
        .max()
        .unwrap_or(0);
    let head = mem.read_vec(set, head_len)?;
    let field = |at: u16| head.u64_at(at as usize).unwrap_or(0);
    let (used, table, mask) = (field(o.set_used), field(o.set_table), field(o.set_mask));
    if used == 0 || table == 0 {
        return Ok(Vec::new());
    }
    // A table's size is a power of two; a mask that is not one less is garbage.
    let slots = mask.wrapping_add(1);
    if !slots.is_power_of_two() {
        return Err(AsyncError::BadCoroutine {
            addr: set,
            what: format!("awaiter set with mask {mask:#x}"),
        });
    }
    let slots = slots.min(MAX_SET_SLOTS);
    // setentry: {PyObject *key; Py_hash_t hash}; a deleted entry keeps the dummy key with
    // hash -1.
    let entries = mem.read_vec(table, slots as usize * 16)?;
    let mut out = Vec::new();
    for entry in entries.chunks_exact(16) {
        let key = entry.u64_at(0).unwrap_or(0);
        let hash = entry.u64_at(8).unwrap_or(0) as i64;
        if key != 0 && hash != -1 && !out.contains(&key) {
            out.push(key);
            if out.len() >= MAX_AWAITERS || out.len() as u64 >= used {
                break;
            }
        }
    }
    Ok(out)
}

/// A task's name: a `str`, or the `int` n of an unnamed task (`Task-n`); CPython keeps nothing
/// else there (`set_name` stores `str(value)`). So a name that is neither, or none, means the
/// object is no longer a task (freed, its memory reused while the process runs) and `task` is
/// not read, rather than shown under a name that is not its own. A `str` or `int` whose value
/// cannot be read is named by its address.
fn read_name(
    mem: &ProcessMemory,
    layout: &PyLayout,
    o: &CoroutineLayout,
    task: u64,
    name: u64,
) -> Result<String, AsyncError> {
    let not_a_task = |what: String| AsyncError::NotATask { addr: task, what };
    if name == 0 {
        return Err(not_a_task("it has no name".to_string()));
    }
    match type_name(mem, layout, name).as_deref() {
        Ok("str") => Ok(read_str(mem, layout, name).unwrap_or_else(|_| format!("{name:#x}"))),
        Ok("int") => Ok(read_small_int(mem, o, name)
            .map(|n| format!("Task-{n}"))
            .unwrap_or_else(|| format!("Task-{name:#x}"))),
        Ok(other) => Err(not_a_task(format!(
            "its name is a {other:?}, neither a str nor an int"
        ))),
        Err(e) => Err(not_a_task(format!("its name's type is unreadable: {e}"))),
    }
}

/// `type(obj).__name__` as its C `tp_name`.
fn type_name(mem: &ProcessMemory, layout: &PyLayout, obj: u64) -> Result<String, ReadError> {
    let ty = mem.read_u64(obj.wrapping_add(layout.ob_type as u64))?;
    type_name_of(mem, layout, ty)
}

/// The C `tp_name` of the type object at `ty`.
pub(crate) fn type_name_of(
    mem: &ProcessMemory,
    layout: &PyLayout,
    ty: u64,
) -> Result<String, ReadError> {
    let tp_name = mem.read_u64(ty.wrapping_add(layout.tp_name as u64))?;
    let bytes = mem.read_upto(tp_name, TP_NAME_BYTES)?;
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
}

/// A non-negative compact `int` of at most two 30-bit digits.
fn read_small_int(mem: &ProcessMemory, o: &CoroutineLayout, obj: u64) -> Option<u64> {
    let buf = mem
        .read_vec(obj, o.long_digit.max(o.long_tag) as usize + 8)
        .ok()?;
    small_int_in(&buf, o)
}

/// [`read_small_int`] of an object whose first bytes are `buf`.
pub(crate) fn small_int_in(buf: &[u8], o: &CoroutineLayout) -> Option<u64> {
    let tag = buf.u64_at(o.long_tag as usize)?;
    let (digits, sign) = (tag >> 3, tag & 3);
    let digit = |i: usize| buf.u32_at(o.long_digit as usize + 4 * i).map(u64::from);
    match (sign, digits) {
        (1, _) => Some(0),
        (0, 1) => digit(0),
        (0, 2) => Some(digit(0)? | (digit(1)? << 30)),
        _ => None,
    }
}

/// The coroutine chain of a task, leaf first (see [`TaskInfo::coro_frames`]), and whether
/// it was cut short.
pub(crate) fn coro_chain(
    mem: &ProcessMemory,
    layout: &PyLayout,
    a: &AsyncLayout,
    coro: u64,
) -> Result<(Vec<RawFrame>, bool), AsyncError> {
    let o = &a.coroutines;
    let k = &layout.kernel;
    let mask = k.executable_mask;
    let frame_len = [k.frame_executable, k.frame_instr_ptr, o.stackpointer]
        .iter()
        .map(|&f| f as usize + 8)
        .max()
        .unwrap_or(0);
    let len = (o.gi_iframe as usize + frame_len).max(o.gi_frame_state as usize + 1);
    let mut frames = Vec::new();
    let mut seen = HashSet::new();
    let mut coro_type = None;
    let mut gen = coro;
    let mut truncated = true;
    for _ in 0..MAX_CORO_DEPTH {
        if !seen.insert(gen) {
            break;
        }
        let buf = mem.read_vec(gen, len)?;
        let bad = |what: &str| AsyncError::BadCoroutine {
            addr: gen,
            what: what.to_string(),
        };
        let at = |field: u16| {
            buf.u64_at(o.gi_iframe as usize + field as usize)
                .ok_or_else(|| bad("short"))
        };
        let ty = buf
            .u64_at(layout.ob_type as usize)
            .ok_or_else(|| bad("short"))?;
        let code = at(k.frame_executable)? & mask;
        if code == 0 {
            return Err(bad("frame without code"));
        }
        let instr = at(k.frame_instr_ptr)?;
        let tag = read_tag(mem, layout, code).unwrap_or(0);
        frames.push(RawFrame {
            frame: a.coro_frame(gen),
            code,
            instr,
            tag,
        });
        let state = buf.get(o.gi_frame_state as usize).copied().unwrap_or(0) as i8;
        if state != o.suspended_yield_from {
            truncated = false;
            break;
        }
        let sp = at(o.stackpointer)?;
        let slot = sp.wrapping_sub(8 * o.yield_from_slot as u64);
        let awaited = mem.read_u64(slot)? & mask;
        let awaited_type = match awaited {
            0 => None,
            _ => mem
                .read_u64(awaited.wrapping_add(layout.ob_type as u64))
                .ok(),
        };
        let coro_type = *coro_type.get_or_insert(ty);
        let is_coroutine = match awaited_type {
            None => false,
            Some(t) if t == coro_type => true,
            Some(_) => matches!(
                type_name(mem, layout, awaited).as_deref(),
                Ok("coroutine" | "generator")
            ),
        };
        if !is_coroutine {
            // Awaiting a future, a task or anything else that is not a coroutine: the
            // chain ends here.
            truncated = false;
            break;
        }
        gen = awaited;
    }
    frames.reverse();
    Ok((frames, truncated))
}

/// Every task of `process`: those in each thread's list and in each interpreter's list
/// (tasks of threads that ended), at most [`MAX_TASKS`], each once.
pub(crate) fn all_tasks(
    mem: &ProcessMemory,
    process: &PythonProcess,
    a: &AsyncLayout,
) -> Result<Vec<u64>, AsyncError> {
    let k = &process.layout.kernel;
    let mut tasks = Vec::new();
    let mut seen = HashSet::new();
    let mut interp = mem.read_u64(
        process
            .runtime
            .wrapping_add(k.runtime_interpreters_head as u64),
    )?;
    let mut interps = HashSet::new();
    for _ in 0..MAX_INTERPRETERS {
        if interp == 0 || !interps.insert(interp) {
            break;
        }
        let mut tstate = mem.read_u64(interp.wrapping_add(k.interp_threads_head as u64))?;
        let mut threads = HashSet::new();
        for _ in 0..MAX_THREAD_WALK {
            if tstate == 0 || !threads.insert(tstate) {
                break;
            }
            let head = tstate.wrapping_add(a.offsets.thread_tasks_head as u64);
            walk_list(mem, a, head, &mut tasks, &mut seen)?;
            tstate = mem.read_u64(tstate.wrapping_add(k.tstate_next as u64))?;
        }
        let head = interp.wrapping_add(a.offsets.interp_tasks_head as u64);
        walk_list(mem, a, head, &mut tasks, &mut seen)?;
        interp = mem.read_u64(interp.wrapping_add(k.interp_next as u64))?;
    }
    Ok(tasks)
}

/// Appends the tasks of the `llist_node` list headed at `head` (a circular list whose empty
/// head points at itself).
fn walk_list(
    mem: &ProcessMemory,
    a: &AsyncLayout,
    head: u64,
    tasks: &mut Vec<u64>,
    seen: &mut HashSet<u64>,
) -> Result<(), AsyncError> {
    let next = a.coroutines.llist_next as u64;
    let mut node = mem.read_u64(head.wrapping_add(next))?;
    while node != head && node != 0 && tasks.len() < MAX_TASKS {
        let task = node.wrapping_sub(a.offsets.task.node as u64);
        if !seen.insert(task) {
            break;
        }
        tasks.push(task);
        node = mem.read_u64(node.wrapping_add(next))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn section_found_in_a_trimmed_real_module() {
        // sid's `_asyncio` module of 3.14 cut to its headers and `.AsyncioDebug` by
        // `cargo xtask fuzz --seeds` (seeds of the `asyncio` fuzz target).
        let elf = include_bytes!("../../../fuzz/seeds/asyncio/sid-3.14-elf");
        let section = section_bytes_in(elf).unwrap().expect(".AsyncioDebug");
        assert_eq!(
            section,
            include_bytes!("../../../fuzz/seeds/asyncio/sid-3.14-section")
        );
        AsyncOffsets::parse(&section).expect("real offsets parse");
        assert!(section_bytes_in(&elf[..100]).is_err());
    }

    /// Measured in sid's 3.14.10 (`_asyncio.cpython-314-x86_64-linux-gnu.so`) and 3.15.2
    /// (in `/usr/bin/python3.15`).
    pub(crate) const SECTION_314: [u64; 13] = [
        168, 136, 96, 108, 109, 128, 152, 225864, 10880, 936, 864, 872, 880,
    ];
    pub(crate) const SECTION_315: [u64; 13] = [
        168, 136, 96, 108, 109, 128, 152, 226240, 10856, 1104, 1024, 1032, 1048,
    ];

    fn bytes(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn parses_the_real_sections() {
        let o = AsyncOffsets::parse(&bytes(&SECTION_314)).unwrap();
        assert_eq!(
            o.task,
            TaskOffsets {
                size: 168,
                name: 136,
                awaited_by: 96,
                is_task: 108,
                awaited_by_is_set: 109,
                coro: 128,
                node: 152,
            }
        );
        assert_eq!(
            (
                o.interp_tasks_head,
                o.thread_running_loop,
                o.thread_running_task,
                o.thread_tasks_head
            ),
            (10880, 864, 872, 880)
        );
        let o = AsyncOffsets::parse(&bytes(&SECTION_315)).unwrap();
        assert_eq!((o.thread_running_task, o.interp_tasks_head), (1032, 10856));
    }

    #[test]
    fn garbage_is_refused_never_panics() {
        assert!(AsyncOffsets::parse(&[]).is_err());
        assert!(AsyncOffsets::parse(&bytes(&SECTION_314[..12])).is_err());
        // A task field past the struct.
        let mut w = SECTION_314;
        w[6] = 200;
        assert!(AsyncOffsets::parse(&bytes(&w)).is_err());
        // The running task past the thread state.
        let mut w = SECTION_314;
        w[11] = 4000;
        assert!(AsyncOffsets::parse(&bytes(&w)).is_err());
        // Overlapping pointers.
        let mut w = SECTION_314;
        w[1] = w[5];
        assert!(AsyncOffsets::parse(&bytes(&w)).is_err());
        let mut rng = fastrand::Rng::with_seed(3);
        for _ in 0..20_000 {
            let mut w = SECTION_314;
            for v in w.iter_mut() {
                match rng.u8(..4) {
                    0 => *v = rng.u64(..),
                    1 => *v = rng.u64(..300),
                    _ => {}
                }
            }
            if let Ok(o) = AsyncOffsets::parse(&bytes(&w)) {
                assert!(o.task.node as u64 + 16 <= o.task.size as u64);
            }
        }
    }

    #[test]
    fn module_dirs_cover_debian_and_prefix_layouts() {
        let dirs = module_dirs(
            "/usr/bin/python3.14",
            14,
            &["/usr/lib/python3.14/lib-dynload/_json.cpython-314-x86_64-linux-gnu.so"],
        );
        assert_eq!(dirs[0], "/usr/lib/python3.14/lib-dynload");
        assert_eq!(dirs.iter().filter(|d| d.as_str() == dirs[0]).count(), 1);
        let dirs = module_dirs("/opt/py/lib/libpython3.14.so.1.0", 14, &[]);
        assert!(dirs.contains(&"/opt/py/lib/python3.14/lib-dynload".to_string()));
    }

    /// A fake address space: reads of a `ProcessMemory` on this very process.
    #[test]
    fn reads_a_task_and_its_chain_from_memory() {
        use crate::python::layout::CoroutineLayout;
        let mut layout = crate::python::tables::builtin(PyVersion::from_hex(0x030c_04f0)).unwrap();
        let o = CoroutineLayout {
            gi_iframe: 64,
            gi_frame_state: 40,
            suspended_yield_from: -1,
            stackpointer: 80,
            yield_from_slot: 1,
            set_used: 24,
            set_table: 40,
            set_mask: 32,
            llist_next: 0,
            long_tag: 16,
            long_digit: 24,
        };
        layout.coroutines = Some(o);
        layout.kernel.executable_mask = !3;
        let a =
            AsyncLayout::new(AsyncOffsets::parse(&bytes(&SECTION_314)).unwrap(), &layout).unwrap();
        let k = layout.kernel;
        // Two coroutines of one type, the outer one awaiting the inner one; the inner one
        // awaits a plain object (of another type, named "Future").
        let mut ty = vec![0u64; 64];
        let future_name = b"Future\0".to_vec();
        let mut future_ty = vec![0u64; 64];
        future_ty[layout.tp_name as usize / 8] = future_name.as_ptr() as u64;
        let future = vec![0u64, future_ty.as_ptr() as u64, 0, 0];
        let mut future = future;
        future[layout.ob_type as usize / 8] = future_ty.as_ptr() as u64;
        let code = vec![0u64; 64];
        let mut inner = vec![0u64; 64];
        // (the 3.12 frame: f_code at 0, prev_instr at 56; the async fields placed apart)
        let mut outer = vec![0u64; 64];
        let inner_stack = [future.as_ptr() as u64 | 1];
        let outer_stack = [inner.as_ptr() as u64];
        for (gen, stack) in [(&mut inner, &inner_stack), (&mut outer, &outer_stack)] {
            gen[layout.ob_type as usize / 8] = ty.as_mut_ptr() as u64;
            gen[(o.gi_iframe + k.frame_executable) as usize / 8] = code.as_ptr() as u64 | 1;
            gen[(o.gi_iframe + k.frame_instr_ptr) as usize / 8] = 0x1234;
            gen[(o.gi_iframe + o.stackpointer) as usize / 8] = stack.as_ptr() as u64 + 8;
            gen[o.gi_frame_state as usize / 8] = 0xff; // -1: suspended in yield from
        }
        let mem = ProcessMemory::new(std::process::id());
        let (frames, truncated) = coro_chain(&mem, &layout, &a, outer.as_ptr() as u64).unwrap();
        assert!(!truncated);
        assert_eq!(
            frames.iter().map(|f| f.frame).collect::<Vec<_>>(),
            [inner.as_ptr() as u64 + 64, outer.as_ptr() as u64 + 64],
            "leaf first"
        );
        assert!(frames
            .iter()
            .all(|f| f.code == code.as_ptr() as u64 && f.instr == 0x1234));
        // A cycle (the inner coroutine awaiting the outer one) ends the chain.
        let cyclic = [outer.as_ptr() as u64];
        inner[(o.gi_iframe + o.stackpointer) as usize / 8] = cyclic.as_ptr() as u64 + 8;
        let (frames, truncated) = coro_chain(&mem, &layout, &a, outer.as_ptr() as u64).unwrap();
        assert!(truncated);
        assert_eq!(frames.len(), 2);

        // A task named by an int (Task-7), awaited by a set of two tasks (one deleted entry).
        let t = a.offsets.task;
        let mut int_ty = vec![0u64; 64];
        let int_name = b"int\0".to_vec();
        int_ty[layout.tp_name as usize / 8] = int_name.as_ptr() as u64;
        let mut seven = [0u64; 8];
        seven[layout.ob_type as usize / 8] = int_ty.as_ptr() as u64;
        seven[o.long_tag as usize / 8] = 1 << 3;
        seven[o.long_digit as usize / 8] = 7;
        let table: Vec<u64> = vec![0, 0, 0xa000, 5, 0xdead, u64::MAX, 0xb000, 9];
        let mut set = [0u64; 8];
        set[o.set_used as usize / 8] = 2;
        set[o.set_table as usize / 8] = table.as_ptr() as u64;
        set[o.set_mask as usize / 8] = 3;
        let mut task = vec![0u64; t.size as usize / 8];
        task[t.coro as usize / 8] = outer.as_ptr() as u64;
        task[t.name as usize / 8] = seven.as_ptr() as u64;
        task[t.awaited_by as usize / 8] = set.as_ptr() as u64;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut task);
        bytes[t.is_task as usize] = 1;
        bytes[t.awaited_by_is_set as usize] = 1;
        inner[(o.gi_iframe + o.stackpointer) as usize / 8] = inner_stack.as_ptr() as u64 + 8;
        let info = read_task(&mem, &layout, &a, task.as_ptr() as u64).unwrap();
        assert_eq!(info.name, "Task-7");
        assert_eq!(info.awaited_by, [0xa000, 0xb000]);
        assert_eq!(info.coro_frames.len(), 2);
        // A name that is neither a str nor an int: the memory is no longer a task.
        let mut float_ty = vec![0u64; 64];
        let float_name = b"float\0".to_vec();
        float_ty[layout.tp_name as usize / 8] = float_name.as_ptr() as u64;
        let mut float = [0u64; 8];
        float[layout.ob_type as usize / 8] = float_ty.as_ptr() as u64;
        task[t.name as usize / 8] = float.as_ptr() as u64;
        assert!(matches!(
            read_task(&mem, &layout, &a, task.as_ptr() as u64),
            Err(AsyncError::NotATask { what, .. }) if what.contains("\"float\"")
        ));
        task[t.name as usize / 8] = 0;
        assert!(matches!(
            read_task(&mem, &layout, &a, task.as_ptr() as u64),
            Err(AsyncError::NotATask { .. })
        ));
        task[t.name as usize / 8] = seven.as_ptr() as u64;
        // Not a task.
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut task);
        bytes[t.is_task as usize] = 0;
        assert!(matches!(
            read_task(&mem, &layout, &a, task.as_ptr() as u64),
            Err(AsyncError::NotATask { .. })
        ));
        drop((ty, code));
    }
}

#[cfg(test)]
mod hostile {
    use super::*;
    use crate::memory::test_support::{hostile_process, layouts, Arena};

    #[test]
    fn asyncio_readers_survive_hostile_memory() {
        // sid 3.14.10's `.AsyncioDebug`.
        let section: Vec<u8> = [
            168u64, 136, 96, 108, 109, 128, 152, 225864, 10880, 936, 864, 872, 880,
        ]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
        let offsets = AsyncOffsets::parse(&section).expect("the real section parses");
        let mut rng = fastrand::Rng::with_seed(17);
        let mem = ProcessMemory::new(std::process::id());
        let mut arena = Arena::new();
        let (mut runs, mut tasks) = (0, 0);
        for layout in layouts() {
            let Ok(a) = AsyncLayout::new(offsets, &layout) else {
                continue;
            };
            runs += 1;
            for _ in 0..300 {
                arena.scramble(&mut rng);
                for _ in 0..10 {
                    if let Ok(task) = read_task(&mem, &layout, &a, arena.inside(&mut rng)) {
                        tasks += task.awaited_by.len() + task.coro_frames.len();
                    }
                    let _ = coro_chain(&mem, &layout, &a, arena.word(&mut rng));
                }
                let proc = hostile_process(arena.word(&mut rng), layout);
                let _ = all_tasks(&mem, &proc, &a);
            }
        }
        assert_eq!(runs, 2, "the 3.14 and 3.15 layouts take part");
        let _ = tasks;
    }
}
