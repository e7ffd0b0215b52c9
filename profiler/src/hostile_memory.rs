//! Everything that reads another process must survive any bytes it finds there: a target can
//! free, reuse or scribble over memory between the kernel's sample and userspace's read. These
//! tests point the readers at memory of this very process filled with words chosen to break
//! arithmetic (addresses near `u64::MAX`, huge sizes, self-references, unaligned pointers) and
//! require that nothing panics, under every layout pyebpf knows.

use profiler_common::{SampleHeader, SAMPLE_TRUNCATED};

use crate::complete::Completer;
use crate::discovery::PythonProcess;
use crate::idle::IdleSampler;
use crate::memory::ProcessMemory;
use crate::python::code::{read_bytes, read_code, read_str, read_tag};
use crate::python::layout::{PyLayout, PyVersion};
use crate::python::{debug_offsets, tables};

const BUFFERS: usize = 8;
const WORDS: usize = 512;

/// Buffers of hostile words, some of which point into the buffers themselves.
struct Arena {
    buffers: Vec<Box<[u64; WORDS]>>,
}

impl Arena {
    fn new() -> Arena {
        Arena {
            buffers: (0..BUFFERS).map(|_| Box::new([0u64; WORDS])).collect(),
        }
    }

    fn base(&self, i: usize) -> u64 {
        self.buffers[i].as_ptr() as u64
    }

    /// An address inside the arena (sometimes unaligned, sometimes near a buffer's end).
    fn inside(&self, rng: &mut fastrand::Rng) -> u64 {
        let base = self.base(rng.usize(0..BUFFERS));
        let bytes = (WORDS * 8) as u64;
        match rng.u8(0..4) {
            0 => base + rng.u64(0..bytes),
            1 => base + bytes - rng.u64(1..64),
            _ => base + 8 * rng.u64(0..WORDS as u64),
        }
    }

    fn word(&self, rng: &mut fastrand::Rng) -> u64 {
        match rng.u8(0..10) {
            0..=2 => self.inside(rng),
            3 => u64::MAX - rng.u64(0..64),
            8 => u64::MAX - rng.u64(0..4096),
            4 => rng.u64(..),
            5 => rng.u64(0..8192),
            6 => 1 << rng.u32(0..64),
            7 => (1u64 << 47) - rng.u64(0..4096),
            _ => 0,
        }
    }

    fn scramble(&mut self, rng: &mut fastrand::Rng) {
        for i in 0..BUFFERS {
            for j in 0..WORDS {
                let w = self.word(rng);
                self.buffers[i][j] = w;
            }
        }
    }
}

fn layouts() -> Vec<PyLayout> {
    let mut all: Vec<PyLayout> = [0x030b_07f0, 0x030c_01f0]
        .into_iter()
        .filter_map(|hex| tables::builtin(PyVersion::from_hex(hex)))
        .collect();
    all.extend(debug_offsets::fixtures::layouts());
    assert_eq!(all.len(), 5, "every layout shape takes part");
    all
}

#[test]
fn code_object_readers_survive_hostile_memory() {
    let mut rng = fastrand::Rng::with_seed(7);
    let mem = ProcessMemory::new(std::process::id());
    let mut arena = Arena::new();
    let (mut tags, mut tries) = (0, 0);
    for layout in layouts() {
        for _ in 0..400 {
            arena.scramble(&mut rng);
            for _ in 0..20 {
                tries += 1;
                let code = arena.word(&mut rng);
                if let Ok(tag) = read_tag(&mem, &layout, code) {
                    tags += 1;
                    if let Ok(info) = read_code(&mem, &layout, code, tag) {
                        info.line_at_instr(&layout, code, arena.word(&mut rng));
                    }
                }
                let _ = read_str(&mem, &layout, arena.word(&mut rng));
                let _ = read_bytes(&mem, &layout, arena.word(&mut rng));
            }
        }
    }
    // Most tags come from readable arena memory: the readers really ran on hostile bytes.
    assert!(
        tags * 4 > tries,
        "only {tags} of {tries} tag reads succeeded"
    );
}

#[test]
fn stack_completion_survives_hostile_memory() {
    let mut rng = fastrand::Rng::with_seed(11);
    let pid = std::process::id();
    let mut arena = Arena::new();
    let mut completer = Completer::default();
    for layout in layouts() {
        for _ in 0..300 {
            arena.scramble(&mut rng);
            for _ in 0..10 {
                let header = SampleHeader {
                    datastack_chunk: arena.word(&mut rng),
                    next_frame: arena.word(&mut rng),
                    deep_hash: rng.u64(..),
                    deep_frames: rng.u32(..),
                    pid,
                    tid: pid,
                    flags: SAMPLE_TRUNCATED,
                    ..Default::default()
                };
                let _ = completer.complete(pid, pid, &layout, &header);
            }
        }
    }
    assert!(completer.stats.reads > 0, "completion never read memory");
}

#[test]
fn idle_thread_walk_survives_hostile_memory() {
    let mut rng = fastrand::Rng::with_seed(13);
    let mut arena = Arena::new();
    let mut idle = IdleSampler::new(100);
    for layout in layouts() {
        for _ in 0..300 {
            arena.scramble(&mut rng);
            let proc = PythonProcess {
                pid: std::process::id(),
                command: "hostile".into(),
                binary: "hostile".into(),
                runtime: arena.word(&mut rng),
                layout,
                ns_pid: None,
                identity: std::sync::Arc::new(crate::identity::ProcessLabels::from_command(
                    std::process::id(),
                    "3.x",
                    "hostile",
                )),
                frame_pointers: None,
            };
            let mut budget = 64;
            let _ = idle.sample_process(&proc, 1, &mut budget);
        }
    }
    assert!(idle.stats.reads > 0, "the idle walk never read memory");
}

#[test]
fn asyncio_readers_survive_hostile_memory() {
    use crate::python::asyncio::{all_tasks, coro_chain, read_task, AsyncLayout, AsyncOffsets};
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
            let proc = PythonProcess {
                pid: std::process::id(),
                command: "hostile".into(),
                binary: "hostile".into(),
                runtime: arena.word(&mut rng),
                layout,
                ns_pid: None,
                identity: std::sync::Arc::new(crate::identity::ProcessLabels::from_command(
                    std::process::id(),
                    "3.x",
                    "hostile",
                )),
                frame_pointers: None,
            };
            let _ = all_tasks(&mem, &proc, &a);
        }
    }
    assert_eq!(runs, 2, "the 3.14 and 3.15 layouts take part");
    let _ = tasks;
}
