//! Resolved samples → interned, root-first stacks: the process and thread frames a recording
//! asks for, the Python frames, and markers for truncated and idle stacks; with
//! [`Aggregator::with_labels`], each sample's labels too (see [`super::labels`]).
//!
//! Threads are named as Python knows them (`threading`'s names, else the OS's; see
//! `python::thread_names`), in `--threads` frames and the `thread_name` label.
//!
//! Bounds: the thread caches (names, label sets) hold at most [`MAX_THREADS`] entries and
//! start over when full, so a long run with thread churn keeps them flat; a thread seen again
//! after that costs one more read of its name.

use std::collections::HashMap;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::labels::{Label, LabelSetId};
use super::{Frame, FrameId, FrameKind, Profile, NO_LABELS};
use crate::discovery::PythonProcess;
use crate::python::thread_names::ThreadNames;
use crate::resolve::Mixed;
use crate::session::{PyFrame, Resolved, Session};

/// Entries of each per-thread cache before it is emptied.
pub(crate) const MAX_THREADS: usize = 1 << 16;

/// Turns resolved samples into interned, root-first stacks.
pub(crate) struct Aggregator {
    pub profile: Profile,
    by_process: bool,
    by_thread: bool,
    /// Give each sample its label set (pid, tid, thread name, process labels).
    labeled: bool,
    python: FxHashMap<(u32, u64, u64, u32), FrameId>,
    process_frames: FxHashMap<u32, FrameId>,
    /// `(pid, ns pid …, container …)` of processes in other namespaces; `(pid)` otherwise.
    id_labels: HashMap<u32, String>,
    /// [`process_labels`] of the watched processes.
    process_labels: HashMap<u32, Vec<(&'static str, String)>>,
    thread_frames: FxHashMap<(u32, u32), FrameId>,
    label_sets: FxHashMap<(u32, u32), LabelSetId>,
    /// Thread names, for `--threads` frames and the `thread_name` label.
    names: ThreadNames,
    /// (a thread's label set, a task name) → that set with `task_name` (`--task-labels`).
    task_label_sets: FxHashMap<(LabelSetId, Arc<str>), LabelSetId>,
    stack: Vec<FrameId>,
    /// `--gil`: keep only samples whose thread held the GIL.
    pub gil_only: bool,
    /// Samples left out by `--gil`.
    pub gil_dropped: u64,
    /// Processes whose build exposes no GIL, already reported.
    gil_warned: std::collections::HashSet<u32>,
}

impl Aggregator {
    /// An aggregator into `profile`, which decides the stack limit.
    pub(crate) fn new(profile: Profile, by_process: bool, by_thread: bool) -> Self {
        Aggregator {
            profile,
            by_process,
            by_thread,
            labeled: false,
            python: FxHashMap::default(),
            process_frames: FxHashMap::default(),
            id_labels: HashMap::new(),
            process_labels: HashMap::new(),
            thread_frames: FxHashMap::default(),
            label_sets: FxHashMap::default(),
            names: ThreadNames::default(),
            task_label_sets: FxHashMap::default(),
            stack: Vec::new(),
            gil_only: false,
            gil_dropped: 0,
            gil_warned: Default::default(),
        }
    }

    /// Labels each sample with its pid, tid, thread name and [`process_labels`]. Off by
    /// default: it costs a `/proc` read per thread and multiplies the keys of the profile by
    /// the threads, which only pprof has a use for.
    pub(crate) fn with_labels(mut self, yes: bool) -> Self {
        self.labeled = yes;
        self
    }

    /// Remembers the labels of newly watched processes; with `--gil`, names the ones whose
    /// build has no GIL (every sample kept) or does not expose it (every sample left out),
    /// once each.
    pub(crate) fn note_processes(&mut self, session: &Session) {
        for p in session.watched() {
            if self.gil_only
                && (p.layout.free_threaded || !Session::gil_known(p))
                && self.gil_warned.insert(p.pid)
            {
                if p.layout.free_threaded {
                    eprintln!(
                        "pyebpf: --gil: pid {} ({}, CPython {}) is free-threaded: it has no GIL, so --gil keeps every one of its samples",
                        p.pid, p.binary, p.layout.version
                    );
                } else {
                    eprintln!(
                        "pyebpf: warning: pid {} ({}, CPython {}) does not expose its GIL, so --gil leaves out all of its samples",
                        p.pid, p.binary, p.layout.version
                    );
                }
            }
            if (p.ns_pid.is_some() || p.identity.container_id.is_some())
                && !self.id_labels.contains_key(&p.pid)
            {
                self.id_labels.insert(p.pid, p.id_label());
            }
            if self.labeled {
                let labels = process_labels(p);
                if self.process_labels.get(&p.pid) != Some(&labels) {
                    // New, or the pid exec'd into another program: its threads' sets are stale.
                    self.label_sets.retain(|&(pid, _), _| pid != p.pid);
                    self.process_labels.insert(p.pid, labels);
                }
            }
        }
        if self.process_labels.len() > MAX_THREADS {
            // Exited processes pile up over a long run; keep the watched ones.
            let watched: std::collections::HashSet<u32> =
                session.watched().map(|p| p.pid).collect();
            self.process_labels.retain(|pid, _| watched.contains(pid));
        }
        let watched: std::collections::HashSet<u32> = session.watched().map(|p| p.pid).collect();
        self.names.keep(|pid| watched.contains(&pid));
    }

    /// Adds one resolved sample of `process`.
    pub(crate) fn add(&mut self, sample: &Resolved, process: &PythonProcess) {
        let command = process.command.as_str();
        if self.gil_only && !sample.holds_gil {
            self.gil_dropped += sample.weight;
            return;
        }
        let mut stack = std::mem::take(&mut self.stack);
        stack.clear();
        if self.by_process {
            let profile = &mut self.profile;
            let id_labels = &self.id_labels;
            let id = *self.process_frames.entry(sample.pid).or_insert_with(|| {
                let id = id_labels
                    .get(&sample.pid)
                    .cloned()
                    .unwrap_or_else(|| format!("({})", sample.pid));
                profile.intern(Frame::marker(FrameKind::Process, format!("{command} {id}")))
            });
            stack.push(id);
        }
        if self.by_thread {
            let key = (sample.pid, sample.tid);
            let id = match self.thread_frames.get(&key) {
                Some(&id) => id,
                None => {
                    let name = self.names.name(process, sample.tid);
                    let id = self.profile.intern(Frame::marker(
                        FrameKind::Thread,
                        format!("thread {} ({name})", sample.tid),
                    ));
                    bounded_insert(&mut self.thread_frames, key, id);
                    id
                }
            };
            stack.push(id);
        }
        if sample.truncated || sample.partial {
            let text = if sample.truncated {
                "<truncated>"
            } else {
                "<partial stack>"
            };
            stack.push(
                self.profile
                    .intern(Frame::marker(FrameKind::Truncated, text)),
            );
        }
        match sample.mixed {
            Some(mixed) => self.mixed_frames(sample, mixed, &mut stack),
            None => {
                let mut last = None;
                for frame in sample.frames.iter().rev() {
                    stack.push(self.python_node(sample.pid, frame, &mut last));
                }
            }
        }
        if sample.idle {
            stack.push(
                self.profile
                    .intern(Frame::marker(FrameKind::Python, "<idle>")),
            );
        }
        let labels = match (self.labeled, &sample.task_name) {
            (false, _) => NO_LABELS,
            (true, None) => self.label_set(sample.pid, sample.tid, process),
            (true, Some(task)) => {
                let thread = self.label_set(sample.pid, sample.tid, process);
                self.task_label_set(thread, task)
            }
        };
        self.profile.add_labeled(labels, &stack, sample.weight);
        self.stack = stack;
    }

    /// The label set of a thread's samples, built on its first sample.
    fn label_set(&mut self, pid: u32, tid: u32, process: &PythonProcess) -> LabelSetId {
        if let Some(&id) = self.label_sets.get(&(pid, tid)) {
            return id;
        }
        let mut labels = vec![
            Label::num("pid", pid.into()),
            Label::num("tid", tid.into()),
            Label::str("thread_name", self.names.name(process, tid)),
        ];
        // Not noted yet (a sample can precede the next `note_processes`, and the agent's
        // windows never note): the labels of the process the sample came with.
        let fresh;
        let known = match self.process_labels.get(&pid) {
            Some(known) => known,
            None => {
                fresh = process_labels(process);
                &fresh
            }
        };
        labels.extend(known.iter().map(|(k, v)| Label::str(k, v.as_str())));
        let id = self.profile.intern_labels(labels);
        bounded_insert(&mut self.label_sets, (pid, tid), id);
        id
    }

    /// `thread`'s label set with the sample's running task's name as `task_name`.
    fn task_label_set(&mut self, thread: LabelSetId, task: &Arc<str>) -> LabelSetId {
        if let Some(&id) = self.task_label_sets.get(&(thread, task.clone())) {
            return id;
        }
        let mut labels = self.profile.label_set(thread).to_vec();
        labels.push(Label::str("task_name", task.clone()));
        let id = self.profile.intern_labels(labels);
        if self.task_label_sets.len() >= MAX_THREADS {
            self.task_label_sets.clear();
        }
        self.task_label_sets.insert((thread, task.clone()), id);
        id
    }

    /// Pushes a merged stack (`--native`), root first.
    fn mixed_frames(&mut self, sample: &Resolved, mixed: &[Mixed], stack: &mut Vec<FrameId>) {
        let mut last: Option<(&PyFrame, FrameId)> = None;
        for item in mixed.iter().rev() {
            let id = match item {
                Mixed::Python(i) => {
                    let Some(frame) = sample.frames.get(*i) else {
                        continue;
                    };
                    stack.push(self.python_node(sample.pid, frame, &mut last));
                    continue;
                }
                Mixed::Native {
                    function,
                    module,
                    build_id,
                } => self.profile.intern(Frame {
                    kind: FrameKind::Native,
                    name: function.clone(),
                    file: Some(module.clone()),
                    first_line: 0,
                    line: 0,
                    build_id: build_id.clone(),
                }),
                Mixed::Marker(text) => self
                    .profile
                    .intern(Frame::marker(FrameKind::Truncated, *text)),
                Mixed::Task(name) => self
                    .profile
                    .intern(Frame::marker(FrameKind::Task, format!("<task {name}>"))),
            };
            last = None;
            stack.push(id);
        }
    }

    /// The node of a Python frame, given the Python frame just below it (`last`, updated):
    /// recursion, the same code at the same line as the frame before, is the same node.
    fn python_node<'f>(
        &mut self,
        pid: u32,
        frame: &'f PyFrame,
        last: &mut Option<(&'f PyFrame, FrameId)>,
    ) -> FrameId {
        let id = match *last {
            Some((prev, id))
                if prev.code_addr == frame.code_addr
                    && prev.tag == frame.tag
                    && prev.line == frame.line =>
            {
                id
            }
            _ => self.python_frame(pid, frame),
        };
        *last = Some((frame, id));
        id
    }

    fn python_frame(&mut self, pid: u32, frame: &PyFrame) -> FrameId {
        let key = (pid, frame.code_addr, frame.tag, frame.line);
        if let Some(&id) = self.python.get(&key) {
            return id;
        }
        let id = match &frame.code {
            Some(code) => self.profile.intern(Frame {
                kind: FrameKind::Python,
                name: code.qualname.as_str().into(),
                file: Some(code.filename.as_str().into()),
                first_line: code.firstlineno,
                line: frame.line,
                build_id: None,
            }),
            None => self
                .profile
                .intern(Frame::marker(FrameKind::Python, "<unknown code object>")),
        };
        self.python.insert(key, id);
        id
    }
}

/// Inserts into a per-thread cache, emptying it first when it is full.
fn bounded_insert<V>(cache: &mut FxHashMap<(u32, u32), V>, key: (u32, u32), value: V) {
    if cache.len() >= MAX_THREADS {
        cache.clear();
    }
    cache.insert(key, value);
}

/// What every sample of `process` carries besides pid, tid and thread name (see
/// [`crate::identity::sample_labels`]).
fn process_labels(process: &PythonProcess) -> Vec<(&'static str, String)> {
    crate::identity::sample_labels(&process.command, &process.identity)
}
