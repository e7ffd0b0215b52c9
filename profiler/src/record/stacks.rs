//! Resolved samples → interned, root-first stacks: the process and thread frames a recording
//! asks for, the Python frames, and markers for truncated and idle stacks.

use std::collections::HashMap;

use rustc_hash::FxHashMap;

use crate::aggregate::{Frame, FrameId, FrameKind, Profile};
use crate::session::{PyFrame, Resolved, Session};

/// Turns resolved samples into interned, root-first stacks.
pub(super) struct Aggregator {
    pub(super) profile: Profile,
    by_process: bool,
    by_thread: bool,
    python: FxHashMap<(u32, u64, u64, u32), FrameId>,
    labels: FxHashMap<u32, FrameId>,
    /// `(pid, ns pid …, container …)` of processes in other namespaces; `(pid)` otherwise.
    id_labels: HashMap<u32, String>,
    threads: FxHashMap<(u32, u32), FrameId>,
    stack: Vec<FrameId>,
    /// `--gil`: keep only samples whose thread held the GIL.
    pub(super) gil_only: bool,
    /// Samples left out by `--gil`.
    pub(super) gil_dropped: u64,
    /// Processes whose build exposes no GIL, already reported.
    gil_warned: std::collections::HashSet<u32>,
}

impl Aggregator {
    pub(super) fn new(by_process: bool, by_thread: bool) -> Self {
        Aggregator {
            profile: Profile::default(),
            by_process,
            by_thread,
            python: FxHashMap::default(),
            labels: FxHashMap::default(),
            id_labels: HashMap::new(),
            threads: FxHashMap::default(),
            stack: Vec::new(),
            gil_only: false,
            gil_dropped: 0,
            gil_warned: Default::default(),
        }
    }

    /// Remembers the namespace labels of newly watched processes; with `--gil`, names the
    /// ones whose build does not expose its GIL (once each).
    pub(super) fn note_processes(&mut self, session: &Session) {
        for p in session.watched() {
            if self.gil_only && !Session::gil_known(p) && self.gil_warned.insert(p.pid) {
                eprintln!(
                    "pyebpf: warning: pid {} ({}, CPython {}{}) does not expose its GIL, so --gil leaves out all of its samples",
                    p.pid,
                    p.binary,
                    p.layout.version,
                    if p.layout.free_threaded { ", free-threaded" } else { "" }
                );
            }
            if (p.ns_pid.is_some() || p.container.is_some()) && !self.id_labels.contains_key(&p.pid)
            {
                self.id_labels.insert(p.pid, p.id_label());
            }
        }
    }

    pub(super) fn add(&mut self, sample: &Resolved, command: &str) {
        if self.gil_only && !sample.holds_gil {
            self.gil_dropped += sample.weight;
            return;
        }
        let mut stack = std::mem::take(&mut self.stack);
        stack.clear();
        if self.by_process {
            let profile = &mut self.profile;
            let id_labels = &self.id_labels;
            let id = *self.labels.entry(sample.pid).or_insert_with(|| {
                let id = id_labels
                    .get(&sample.pid)
                    .cloned()
                    .unwrap_or_else(|| format!("({})", sample.pid));
                profile.intern(label(FrameKind::Process, format!("{command} {id}")))
            });
            stack.push(id);
        }
        if self.by_thread {
            let profile = &mut self.profile;
            let id = *self
                .threads
                .entry((sample.pid, sample.tid))
                .or_insert_with(|| {
                    let name = std::fs::read_to_string(format!(
                        "/proc/{}/task/{}/comm",
                        sample.pid, sample.tid
                    ))
                    .map(|n| n.trim().to_string())
                    .unwrap_or_default();
                    profile.intern(label(
                        FrameKind::Thread,
                        format!("thread {} ({name})", sample.tid),
                    ))
                });
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
                    .intern(label(FrameKind::Truncated, text.to_string())),
            );
        }
        let mut last: Option<(&PyFrame, FrameId)> = None;
        for frame in sample.frames.iter().rev() {
            // Recursion: the same code at the same line as the frame before is the same node.
            let id = match last {
                Some((prev, id))
                    if prev.code_addr == frame.code_addr
                        && prev.tag == frame.tag
                        && prev.line == frame.line =>
                {
                    id
                }
                _ => self.python_frame(sample.pid, frame),
            };
            last = Some((frame, id));
            stack.push(id);
        }
        if sample.idle {
            stack.push(
                self.profile
                    .intern(label(FrameKind::Python, "<idle>".into())),
            );
        }
        self.profile.add(&stack, sample.weight);
        self.stack = stack;
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
                line: frame.line,
            }),
            None => self
                .profile
                .intern(label(FrameKind::Python, "<unknown code object>".into())),
        };
        self.python.insert(key, id);
        id
    }
}

fn label(kind: FrameKind, text: String) -> Frame {
    Frame {
        kind,
        name: text.into(),
        file: None,
        line: 0,
    }
}
