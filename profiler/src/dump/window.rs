//! The sampling window every dump runs: each thread's stack, taken where it can be trusted.
//!
//! A running thread's frames change thousands of times a second; copying them from userspace
//! races with the thread (a freed frame reads as `EFAULT`, a chain leaves the copied stack
//! chunks). The BPF sampler copies them consistently, in the timer interrupt, while the thread
//! is stopped on its CPU. So a dump samples the target for a short window on the one driver
//! (the sampler's `PROCS` map holds only the targets: other processes' samples end at its first
//! lookup), and:
//!
//! - a thread that is runnable gets the stack of its latest sample, completed and symbolized
//!   by the same code as every `record` sample;
//! - a thread that is off CPU does not change its frames: it is copied from userspace and the
//!   copy is kept if the thread did not run meanwhile (`userspace`); one that ran is copied
//!   again (at most [`MAX_ATTEMPTS`] times), and if it keeps running it is a running thread.
//!
//! The window ends as soon as every thread has its stack, at most after `--window` ms.
//! Threads still without one then get a last copy checked by their frames; a stack that cannot
//! be had at all says why, with the attempts made. Without the sampler (no `CAP_BPF`), the
//! same loop runs with frame-checked copies only.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::native::{self, MixedFrame};
use super::userspace::{copy_stack, Check, Copy, Outcome};
use crate::discovery::PythonProcess;
use crate::driver::{Flow, Sink};
use crate::memory::ProcessMemory;
use crate::procfs::Sched;
use crate::python::threads::{thread_states, ThreadsError};
use crate::session::{Resolved, Session};

/// Copies of one thread's stack (or reads of a thread list that looped back) before giving up.
pub(crate) const MAX_ATTEMPTS: u32 = 16;
/// Copies that fail while the thread stood still before the stack is called unreadable.
const MAX_FAILURES: u32 = 2;
/// How often the window looks at what it has (and copies idle threads again).
pub(crate) const STEP: Duration = Duration::from_millis(2);
/// Threads of one process looked at (each interpreter's list is bounded by the kernel's
/// `MAX_THREAD_WALK` too).
const MAX_THREADS: usize = 4096;

/// One stack the sampler took in the interrupt, named.
#[derive(Clone, Debug)]
pub(super) struct Sampled {
    pub at: Instant,
    /// Leaf first.
    pub frames: Vec<SampledFrame>,
    /// Deeper than could be recovered, or a read failed mid-walk.
    pub truncated: bool,
    pub holds_gil: bool,
    /// `--native`: the merged stack.
    pub native: Option<Vec<MixedFrame>>,
    /// `--async`: the task it ran, or 0.
    pub running_task: u64,
}

#[derive(Clone, Debug)]
pub(super) struct SampledFrame {
    pub function: String,
    pub file: String,
    pub line: u32,
    /// The interpreter frame, its code object and instruction (to read its variables later,
    /// and to check that it is still the same frame then).
    pub frame: u64,
    pub code: u64,
    pub instr: u64,
}

/// How a thread's stack was had.
#[derive(Debug)]
pub(super) enum Taken {
    Userspace {
        copy: Copy,
        check: Check,
        at: Instant,
    },
    Interrupt,
    /// The thread runs no Python code.
    NoFrames(Sched),
    /// Copies failed although the thread stood still.
    Failed(String),
    Gone,
}

/// One thread of the thread list, and what was tried to get its stack.
#[derive(Debug)]
pub(super) struct ThreadCapture {
    pub tstate: u64,
    /// Host thread id, and the id in the process's pid namespace when it differs.
    pub tid: u32,
    pub ns_tid: Option<u32>,
    /// Copies made from userspace.
    pub attempts: u32,
    /// ...of which the thread ran or its stack moved during the copy.
    pub moved: u32,
    failures: u32,
    /// Seen runnable (on a CPU or waiting for one) at least once.
    pub runnable: bool,
    pub taken: Option<Taken>,
    /// The latest copy that could not be checked, and the latest error of a moving copy.
    pub unchecked: Option<Copy>,
    pub last_error: Option<String>,
}

pub(super) struct ProcCapture {
    pub proc: PythonProcess,
    pub threads: Vec<ThreadCapture>,
    /// Why the thread list could not be read.
    pub error: Option<String>,
}

/// The state of one dump's window, over every target.
pub(super) struct Capture {
    pub opened: Instant,
    pub procs: Vec<ProcCapture>,
    /// Is the sampler running? Without it, runnable threads are copied from userspace too.
    pub sampling: bool,
    locals: bool,
    listed: bool,
    /// The latest sample of each (pid, host tid).
    pub samples: HashMap<(u32, u32), Sampled>,
    pub sample_count: u64,
    /// Remote reads made by the copies.
    pub reads: u64,
    /// When the last thread got its stack (the window could end there).
    pub settled_at: Option<Instant>,
}

impl Capture {
    pub(super) fn new(procs: Vec<PythonProcess>, sampling: bool, locals: bool) -> Capture {
        Capture {
            opened: Instant::now(),
            procs: procs
                .into_iter()
                .map(|proc| ProcCapture {
                    proc,
                    threads: Vec::new(),
                    error: None,
                })
                .collect(),
            sampling,
            locals,
            listed: false,
            samples: HashMap::new(),
            sample_count: 0,
            reads: 0,
            settled_at: None,
        }
    }

    /// Restarts the clock: the window opens when the sampler runs.
    pub(super) fn open(&mut self) {
        self.opened = Instant::now();
    }

    /// A sample from the sampler.
    pub(super) fn on_sample(&mut self, sample: &Resolved, want_native: bool) {
        self.sample_count += 1;
        let frames = sample
            .frames
            .iter()
            .zip(sample.frame_addrs)
            .map(|(f, &frame)| {
                let (function, file) = match &f.code {
                    Some(c) => (c.qualname.clone(), c.filename.clone()),
                    None => (format!("<code at {:#x}>", f.code_addr), "?".to_string()),
                };
                SampledFrame {
                    function,
                    file,
                    line: f.line,
                    frame,
                    code: f.code_addr,
                    instr: f.instr,
                }
            })
            .collect();
        self.samples.insert(
            (sample.pid, sample.tid),
            Sampled {
                at: Instant::now(),
                frames,
                truncated: sample.truncated || sample.partial,
                holds_gil: sample.holds_gil,
                native: want_native.then(|| native::mixed_frames(sample)),
                running_task: sample.running_task,
            },
        );
    }

    /// One look: the thread lists the first time, then a copy of every idle thread still
    /// without a stack. True when every thread has its stack.
    pub(super) fn step(&mut self) -> bool {
        if !self.listed {
            self.listed = true;
            self.list_threads();
        }
        let mut all = true;
        for p in &mut self.procs {
            let mem = ProcessMemory::new(p.proc.pid);
            for t in &mut p.threads {
                if t.taken.is_some() {
                    continue;
                }
                if self.samples.contains_key(&(p.proc.pid, t.tid)) {
                    t.taken = Some(Taken::Interrupt);
                    continue;
                }
                if t.attempts < MAX_ATTEMPTS {
                    let check = match self.sampling {
                        true => Check::Scheduler,
                        false => match crate::procfs::sched(p.proc.pid, t.tid) {
                            Some(s) if s.runnable() => Check::Frames,
                            _ => Check::Scheduler,
                        },
                    };
                    attempt(&mem, &p.proc, t, check, self.locals, &mut self.reads);
                }
                all &= t.taken.is_some();
            }
        }
        if all && self.settled_at.is_none() {
            self.settled_at = Some(Instant::now());
        }
        all
    }

    /// After the window: the samples that arrived last, then a frame-checked copy of each
    /// thread still without a stack.
    pub(super) fn finish(&mut self) {
        if !self.listed {
            self.step();
        }
        for p in &mut self.procs {
            let mem = ProcessMemory::new(p.proc.pid);
            for t in &mut p.threads {
                if t.taken.is_some() {
                    continue;
                }
                if self.samples.contains_key(&(p.proc.pid, t.tid)) {
                    t.taken = Some(Taken::Interrupt);
                    continue;
                }
                // A thread runnable for the whole window without a sample waited for a CPU
                // (its frames stood still) or ran code the sampler does not see; one that
                // kept moving had all its copies spent. A last few, checked by frames.
                let last = t.attempts + MAX_ATTEMPTS.min(4);
                while t.taken.is_none() && t.attempts < last {
                    attempt(&mem, &p.proc, t, Check::Frames, false, &mut self.reads);
                }
            }
        }
    }

    /// Reads every target's thread list (a list that loops back changed while it was read:
    /// read again, up to [`MAX_ATTEMPTS`] times).
    fn list_threads(&mut self) {
        for p in &mut self.procs {
            let mem = ProcessMemory::new(p.proc.pid);
            let mut attempt = 1;
            let listed = loop {
                match thread_states(&mem, &p.proc.layout, p.proc.runtime, &mut self.reads) {
                    Err(ThreadsError::Cycle(_)) if attempt < MAX_ATTEMPTS => attempt += 1,
                    result => break result,
                }
            };
            let tstates = match listed {
                Ok(t) => t,
                Err(e) => {
                    p.error = Some(format!("reading the thread list: {e}"));
                    continue;
                }
            };
            let host_tids: HashMap<u32, u32> = match p.proc.ns_pid {
                Some(_) => crate::procfs::host_tids(p.proc.pid).into_iter().collect(),
                None => HashMap::new(),
            };
            for (tstate, fields) in tstates.into_iter().take(MAX_THREADS) {
                let native_id = fields.native_id as u32;
                let tid = match p.proc.ns_pid {
                    Some(_) => host_tids.get(&native_id).copied().unwrap_or(native_id),
                    None => native_id,
                };
                p.threads.push(ThreadCapture {
                    tstate,
                    tid,
                    ns_tid: p.proc.ns_pid.map(|_| native_id),
                    attempts: 0,
                    moved: 0,
                    failures: 0,
                    runnable: false,
                    taken: None,
                    unchecked: None,
                    last_error: None,
                });
            }
            p.threads.sort_by_key(|t| t.tid);
        }
    }
}

/// One copy of `t`'s stack, and what it settles.
fn attempt(
    mem: &ProcessMemory,
    proc: &PythonProcess,
    t: &mut ThreadCapture,
    check: Check,
    locals: bool,
    reads: &mut u64,
) {
    let outcome = copy_stack(mem, proc, t.tstate, t.tid, check, locals, reads);
    if !matches!(outcome, Outcome::Runnable) {
        t.attempts += 1;
    }
    match outcome {
        Outcome::Checked(copy) => {
            t.taken = Some(Taken::Userspace {
                copy,
                check,
                at: Instant::now(),
            })
        }
        Outcome::Moved { copy, error } => {
            t.moved += 1;
            if copy.is_some() {
                t.unchecked = copy;
            }
            if error.is_some() {
                t.last_error = error;
            }
        }
        Outcome::NoFrames(sched) => t.taken = Some(Taken::NoFrames(sched)),
        Outcome::Runnable => t.runnable = true,
        Outcome::Failed(why) => {
            t.failures += 1;
            if t.failures >= MAX_FAILURES {
                t.taken = Some(Taken::Failed(why));
            } else {
                t.last_error = Some(why);
            }
        }
        Outcome::Gone => t.taken = Some(Taken::Gone),
    }
}

/// Why a thread without a stack has none, in words.
pub(super) fn unavailable(t: &ThreadCapture, window: Duration, sampling: bool) -> String {
    let copies = match t.attempts {
        1 => "1 copy".to_string(),
        n => format!("{n} copies"),
    };
    let moved = match (t.moved, &t.last_error) {
        (0, _) => String::new(),
        (n, Some(e)) => format!(", {n} of them while it ran (last: {e})"),
        (n, None) => format!(", {n} of them while it ran"),
    };
    let ms = window.as_millis();
    match (t.runnable, sampling) {
        (true, true) => format!(
            "it was runnable during the {ms} ms window but never sampled on a CPU, and its \
             frames moved in each of {copies} made from memory{moved}"
        ),
        (_, false) => format!(
            "its frames moved in each of {copies} made from memory{moved}, and without the \
             BPF sampler a running thread cannot be caught on its CPU"
        ),
        (false, true) => {
            format!("its frames moved in each of {copies} made from memory{moved}")
        }
    }
}

/// The sampler's view of the window: its samples go to the [`Capture`], which looks again
/// every [`STEP`] and ends the run once every thread has its stack.
pub(super) struct WindowSink<'a> {
    pub capture: &'a mut Capture,
    pub native: bool,
}

impl Sink for WindowSink<'_> {
    type Input = std::convert::Infallible;

    fn sample(&mut self, sample: &Resolved, _process: &PythonProcess) {
        self.capture.on_sample(sample, self.native);
    }

    fn period(&self) -> Option<Duration> {
        Some(STEP)
    }

    fn on_period(&mut self, _session: &Session) -> anyhow::Result<Flow> {
        Ok(match self.capture.step() {
            true => Flow::Stop,
            false => Flow::Continue,
        })
    }
}

/// The window without a sampler: look every [`STEP`] until every thread has its stack or
/// `window` is over.
pub(super) fn run_unsampled(capture: &mut Capture, window: Duration) {
    let deadline = capture.opened + window;
    while !capture.step() && Instant::now() < deadline {
        std::thread::sleep(STEP);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread(attempts: u32, moved: u32, runnable: bool, error: Option<&str>) -> ThreadCapture {
        ThreadCapture {
            tstate: 0x1000,
            tid: 7,
            ns_tid: None,
            attempts,
            moved,
            failures: 0,
            runnable,
            taken: None,
            unchecked: None,
            last_error: error.map(str::to_string),
        }
    }

    /// A stack that cannot be had says why in words, with the copies tried.
    #[test]
    fn unavailable_stacks_say_why() {
        let window = Duration::from_millis(100);
        let t = thread(16, 16, true, Some("reading 96 bytes at 0x1: EFAULT"));
        assert_eq!(
            unavailable(&t, window, true),
            "it was runnable during the 100 ms window but never sampled on a CPU, and its \
             frames moved in each of 16 copies made from memory, 16 of them while it ran \
             (last: reading 96 bytes at 0x1: EFAULT)"
        );
        assert_eq!(
            unavailable(&thread(1, 1, false, None), window, false),
            "its frames moved in each of 1 copy made from memory, 1 of them while it ran, and \
             without the BPF sampler a running thread cannot be caught on its CPU"
        );
    }
}
