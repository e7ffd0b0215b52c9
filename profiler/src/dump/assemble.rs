//! From what the window captured to what `dump` shows: each thread's name, state, frames
//! (named through the same symbol cache and line tables as every sample), variables and
//! native frames.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::native::{NativeDump, IDLE_NATIVE};
use super::snapshot::{
    frame, holds_gil, FrameDump, NameSource, ProcessDump, Source, ThreadDump, ThreadState,
};
use super::userspace::{locals_after, Check};
use super::window::{unavailable, Capture, ProcCapture, SampledFrame, Taken, ThreadCapture};
use crate::discovery::PythonProcess;
use crate::memory::ProcessMemory;
use crate::python::objects::Local;
use crate::python::thread_names::{os_name, process_thread_names, ProcessNames};
use crate::session::Session;
use crate::symbolize::Symbolizer;

/// What the caller asked to see.
#[derive(Clone, Copy, Debug)]
pub(super) struct Wanted {
    pub locals: bool,
    pub native: bool,
    pub window: Duration,
}

/// A frame the sampler took, with, for `--locals`, its variables as
/// `userspace::locals_after` read them.
pub(super) fn sampled_frame(
    f: &SampledFrame,
    locals: Option<Result<Vec<Local>, &'static str>>,
) -> FrameDump {
    let mut out = FrameDump {
        function: f.function.clone(),
        file: f.file.clone(),
        line: f.line,
        locals: None,
        locals_unavailable: None,
    };
    set_locals(&mut out, locals);
    out
}

/// Gives `frame` the variables read for it, or the reason there are none.
pub(super) fn set_locals(frame: &mut FrameDump, locals: Option<Result<Vec<Local>, &'static str>>) {
    match locals {
        Some(Ok(values)) => frame.locals = Some(values),
        Some(Err(why)) => frame.locals_unavailable = Some(why.to_string()),
        None => {}
    }
}

/// `--locals` of a stack taken earlier, read now (see `userspace::locals_after`); none
/// without `--locals`.
pub(super) fn later_locals(
    mem: &ProcessMemory,
    proc: &PythonProcess,
    wanted: bool,
    shape: impl Iterator<Item = (u64, u64, u64)>,
) -> Vec<Result<Vec<Local>, &'static str>> {
    match wanted {
        true => locals_after(mem, proc, &shape.collect::<Vec<_>>()),
        false => Vec::new(),
    }
}

/// The dump of one process.
pub(super) fn process(
    capture: &Capture,
    p: &ProcCapture,
    symbols: &mut Symbolizer,
    wanted: Wanted,
) -> ProcessDump {
    let proc = &p.proc;
    let names = process_thread_names(proc, &mut ProcessNames::default()).unwrap_or_else(|e| {
        log::debug!("pid {}: thread names from threading: {e}", proc.pid);
        HashMap::new()
    });
    let threads = p
        .threads
        .iter()
        .map(|t| thread(capture, proc, t, &names, symbols, wanted))
        .collect();
    ProcessDump {
        pid: proc.pid,
        ns_pid: proc.ns_pid,
        command: proc.command.clone(),
        python_version: proc.layout.version.to_string(),
        free_threaded: proc.layout.free_threaded,
        binary: proc.binary.clone(),
        threads,
        error: p.error.clone(),
        tasks: None,
    }
}

fn ms(from: Instant, to: Instant) -> f64 {
    let d = to.saturating_duration_since(from).as_secs_f64() * 1e3;
    (d * 10.0).round() / 10.0
}

fn thread(
    capture: &Capture,
    proc: &PythonProcess,
    t: &ThreadCapture,
    names: &HashMap<u32, String>,
    symbols: &mut Symbolizer,
    wanted: Wanted,
) -> ThreadDump {
    let mem = ProcessMemory::new(proc.pid);
    let os = os_name(proc.pid, t.tid);
    let (name, name_source) = match names.get(&t.tid) {
        Some(n) => (n.clone(), NameSource::Threading),
        None => (os.clone(), NameSource::Os),
    };
    let mut out = ThreadDump {
        tid: t.tid,
        ns_tid: t.ns_tid,
        name,
        name_source,
        os_name: os,
        state: ThreadState::Gone,
        os_state: String::new(),
        holds_gil: None,
        frames: Vec::new(),
        truncated: false,
        consistent: true,
        source: None,
        taken_ms: None,
        attempts: t.attempts,
        locals_read_after_ms: None,
        error: None,
        native: None,
    };
    let not_sampled = |why: &str| {
        wanted
            .native
            .then(|| NativeDump::Unavailable(why.to_string()))
    };
    match &t.taken {
        Some(Taken::Interrupt) => {
            let Some(s) = capture.samples.get(&(proc.pid, t.tid)) else {
                return out;
            };
            let mut values = later_locals(
                &mem,
                proc,
                wanted.locals,
                s.frames.iter().map(|f| (f.frame, f.code, f.instr)),
            )
            .into_iter();
            out.frames = s
                .frames
                .iter()
                .map(|f| sampled_frame(f, values.next()))
                .collect();
            out.state = ThreadState::Running;
            out.os_state = "R".into();
            out.holds_gil = Session::gil_known(proc).then_some(s.holds_gil);
            out.truncated = s.truncated;
            out.source = Some(Source::Interrupt);
            out.taken_ms = Some(ms(capture.opened, s.at));
            if wanted.locals {
                out.locals_read_after_ms = Some(ms(s.at, Instant::now()));
            }
            out.native = wanted.native.then(|| match &s.native {
                Some(frames) => NativeDump::Sampled {
                    frames: frames.clone(),
                },
                None => NativeDump::Unavailable("the sample has no native part".into()),
            });
        }
        Some(Taken::Userspace { copy, check, at }) => {
            out.frames = copy
                .frames
                .iter()
                .map(|rec| frame(&mem, proc, symbols, rec, false))
                .collect();
            match &copy.locals {
                Some(values) => {
                    for (f, v) in out.frames.iter_mut().zip(values) {
                        f.locals = Some(v.clone());
                    }
                }
                None if wanted.locals => {
                    // Checked by its frames (it was runnable): its variables may have moved
                    // on; read them now, from the frames that are still there.
                    let values = later_locals(
                        &mem,
                        proc,
                        true,
                        copy.frames.iter().map(|f| (f.frame, f.code, f.instr)),
                    );
                    for (f, v) in out.frames.iter_mut().zip(values) {
                        set_locals(f, Some(v));
                    }
                    out.locals_read_after_ms = Some(ms(*at, Instant::now()));
                }
                None => {}
            }
            out.state = match copy.sched.runnable() {
                true => ThreadState::Running,
                false => ThreadState::Idle,
            };
            out.os_state = copy.sched.state.to_string();
            out.holds_gil = holds_gil(&mem, proc, t.tstate, &copy.fields);
            out.truncated = copy.truncated;
            out.source = Some(Source::Userspace);
            out.taken_ms = Some(ms(capture.opened, *at));
            out.native = not_sampled(match check {
                Check::Scheduler => IDLE_NATIVE,
                Check::Frames => {
                    "it was not sampled on a CPU during the window (its frames were copied \
                     from memory)"
                }
            });
        }
        Some(Taken::NoFrames(sched)) => {
            out.state = match sched.runnable() {
                true => ThreadState::Running,
                false => ThreadState::Idle,
            };
            out.os_state = sched.state.to_string();
            out.native = not_sampled("it runs no Python code and was not sampled on a CPU");
        }
        Some(Taken::Failed(why)) => {
            out.state = ThreadState::Idle;
            out.error = Some(format!(
                "unreadable although the thread stood still, in {} copies: {why}",
                t.attempts
            ));
        }
        Some(Taken::Gone) => {}
        None => {
            out.state = match t.runnable {
                true => ThreadState::Running,
                false => ThreadState::Idle,
            };
            let why = unavailable(t, wanted.window, capture.sampling);
            match &t.unchecked {
                // Frames from one copy that could not be checked: shown, and marked.
                Some(copy) => {
                    out.frames = copy
                        .frames
                        .iter()
                        .map(|rec| frame(&mem, proc, symbols, rec, false))
                        .collect();
                    out.truncated = copy.truncated;
                    out.consistent = false;
                    out.source = Some(Source::Userspace);
                    out.os_state = copy.sched.state.to_string();
                }
                None => out.error = Some(why),
            }
        }
    }
    out
}

/// Whether a thread has something to show (frames, or the fact that it runs none).
pub(super) fn shown(t: &ThreadDump) -> bool {
    t.error.is_none() && t.state != ThreadState::Gone
}
