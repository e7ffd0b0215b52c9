//! Stacks → counts. Frames and label sets are interned once, so a sample costs one hash of a
//! small `Vec<u32>`.
//!
//! A [`Profile`] counts samples per (label set, stack). Writers that have no use for labels
//! (flame graph, speedscope, collapsed) read [`Profile::stacks`], which merges label sets away;
//! pprof reads [`Profile::labeled_stacks`]. [`stacks::Aggregator`] builds a profile from
//! resolved samples.
//!
//! Bounds: [`Profile::with_stack_limit`] caps the distinct (label set, stack) keys. Samples of
//! a new key past the cap are counted in [`Profile::over_limit`] and added to one
//! [`OVER_LIMIT`] stack, so totals stay right while memory stays flat. `record` keeps every
//! stack (no cap).

use rustc_hash::FxHashMap;
use std::sync::Arc;

pub(crate) mod labels;
pub(crate) mod stacks;

pub(crate) use labels::{Label, LabelSetId, LabelValue, NO_LABELS};

/// What a frame in an aggregated stack stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum FrameKind {
    /// `<command> (<pid>)`: the root of every stack when a recording covers several processes.
    Process,
    /// `thread <tid> (<name>)`, with `--threads`.
    Thread,
    /// A Python function.
    Python,
    /// A native function (`--native`): `file` is its module (`libz.so.1`).
    Native,
    /// `<task NAME>` (`--async`): the asyncio task running the frames above it, awaited by
    /// the task below.
    Task,
    /// The rest of a stack that could not be completed or validated, or (the
    /// [`OVER_LIMIT`] frame) samples past a profile's stack limit.
    Truncated,
}

impl FrameKind {
    /// Process and thread frames stand for who ran a stack, not for code: pprof carries them as
    /// sample labels instead.
    pub(crate) fn is_label(self) -> bool {
        matches!(self, FrameKind::Process | FrameKind::Thread)
    }
}

/// The one frame of the stack that collects samples past [`Profile::with_stack_limit`].
pub(crate) const OVER_LIMIT: &str = "<stacks over limit>";

/// One distinct frame. Python frames with the same function (qualname, file, first line) and
/// line are one frame.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Frame {
    pub kind: FrameKind,
    /// Function qualname for Python frames; the label otherwise.
    pub name: Arc<str>,
    /// Source file (Python frames only).
    pub file: Option<Arc<str>>,
    /// The code object's `co_firstlineno`: with name and file, what tells functions apart
    /// (pprof's `Function.start_line`). 0 when unknown and for non-Python frames.
    pub first_line: u32,
    /// Line executing in this frame (0 when unknown).
    pub line: u32,
    /// A native frame's module's GNU build id (hex), when known; `None` for other frames.
    pub build_id: Option<Arc<str>>,
}

impl Frame {
    /// A frame that is only a name: process, thread, truncation and other markers.
    pub(crate) fn marker(kind: FrameKind, name: impl Into<Arc<str>>) -> Frame {
        Frame {
            kind,
            name: name.into(),
            file: None,
            first_line: 0,
            line: 0,
            build_id: None,
        }
    }

    /// `function (file:line)` for Python frames, `function (module)` for native ones, the
    /// bare label otherwise.
    pub(crate) fn label(&self) -> String {
        match (&self.file, self.kind) {
            (Some(module), FrameKind::Native) => format!("{} ({module})", self.name),
            (file, _) => python_label(&self.name, file.as_deref(), self.line),
        }
    }
}

/// `function (file:line)`, or the bare name without a file: how a Python frame reads in every
/// output and in `top`.
pub(crate) fn python_label(name: &str, file: Option<&str>, line: u32) -> String {
    match file {
        Some(file) => format!("{name} ({file}:{line})"),
        None => name.to_string(),
    }
}

pub(crate) type FrameId = u32;

/// All samples of a recording (or of one window of the agent): interned frames and label sets,
/// and root-first stacks with their counts.
#[derive(Debug)]
pub(crate) struct Profile {
    frames: Vec<Frame>,
    index: FxHashMap<Frame, FrameId>,
    labels: labels::Interner,
    /// Counts by label set, then by stack: two lookups, but a known stack is found by its
    /// slice, with no allocation per sample.
    stacks: FxHashMap<LabelSetId, FxHashMap<Vec<FrameId>, u64>>,
    /// Keys in `stacks`.
    keys: usize,
    /// Distinct (label set, stack) keys kept before samples go to the [`OVER_LIMIT`] stack.
    stack_limit: usize,
    /// Samples added (sum of all counts).
    pub samples: u64,
    /// Samples that went to the [`OVER_LIMIT`] stack because the limit was reached.
    pub over_limit: u64,
    /// When and how the samples were taken, for formats that record it (pprof).
    pub timing: Timing,
}

/// When a profile's samples were taken and what one sample stands for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Timing {
    /// Wall-clock start, nanoseconds since the Unix epoch (0: unknown).
    pub start_unix_ns: u64,
    /// Nanoseconds covered (0: unknown).
    pub duration_ns: u64,
    /// CPU time one sample stands for: 1e9 / the sampling rate in Hz (0: unknown).
    pub period_ns: u64,
}

impl Default for Profile {
    fn default() -> Self {
        Profile::with_stack_limit(usize::MAX)
    }
}

impl Profile {
    /// A profile that keeps at most `limit` distinct (label set, stack) keys, plus the one
    /// [`OVER_LIMIT`] stack that collects the samples of any further key.
    pub(crate) fn with_stack_limit(limit: usize) -> Profile {
        Profile {
            frames: Vec::new(),
            index: FxHashMap::default(),
            labels: labels::Interner::default(),
            stacks: FxHashMap::default(),
            keys: 0,
            stack_limit: limit,
            samples: 0,
            over_limit: 0,
            timing: Timing::default(),
        }
    }

    pub(crate) fn intern(&mut self, frame: Frame) -> FrameId {
        if let Some(&id) = self.index.get(&frame) {
            return id;
        }
        let id = self.frames.len() as FrameId;
        self.frames.push(frame.clone());
        self.index.insert(frame, id);
        id
    }

    /// Interns a label set (order does not matter; see [`labels`]).
    pub(crate) fn intern_labels(&mut self, labels: Vec<Label>) -> LabelSetId {
        self.labels.intern(labels)
    }

    /// Adds `count` samples of `stack` (root first) without labels.
    #[cfg(test)]
    pub(crate) fn add(&mut self, stack: &[FrameId], count: u64) {
        self.add_labeled(NO_LABELS, stack, count);
    }

    /// Adds `count` samples of `stack` (root first) taken with the label set `labels`.
    pub(crate) fn add_labeled(&mut self, labels: LabelSetId, stack: &[FrameId], count: u64) {
        self.samples += count;
        if let Some(total) = self
            .stacks
            .get_mut(&labels)
            .and_then(|stacks| stacks.get_mut(stack))
        {
            *total += count;
            return;
        }
        if self.keys >= self.stack_limit {
            self.over_limit += count;
            let over = self.intern(Frame::marker(FrameKind::Truncated, OVER_LIMIT));
            // One key for all of them, whatever their labels: the cap must hold.
            let total = self.stacks.entry(NO_LABELS).or_default().entry(vec![over]);
            if matches!(total, std::collections::hash_map::Entry::Vacant(_)) {
                self.keys += 1;
            }
            *total.or_default() += count;
            return;
        }
        self.stacks
            .entry(labels)
            .or_default()
            .insert(stack.to_vec(), count);
        self.keys += 1;
    }

    pub(crate) fn frame(&self, id: FrameId) -> &Frame {
        &self.frames[id as usize]
    }

    pub(crate) fn frames(&self) -> &[Frame] {
        &self.frames
    }

    /// The labels of a set, sorted by key.
    pub(crate) fn label_set(&self, id: LabelSetId) -> &[Label] {
        self.labels.get(id)
    }

    /// Distinct (label set, stack) keys held.
    #[cfg(test)]
    pub(crate) fn stack_count(&self) -> usize {
        self.keys
    }

    /// Stacks (root first) and their counts, summed over label sets; heaviest first, ties by
    /// stack, for stable output.
    pub(crate) fn stacks(&self) -> Vec<(&[FrameId], u64)> {
        let mut merged: FxHashMap<&[FrameId], u64> = FxHashMap::default();
        for (stack, &count) in self.stacks.values().flatten() {
            *merged.entry(stack.as_slice()).or_default() += count;
        }
        let mut stacks: Vec<_> = merged.into_iter().collect();
        stacks.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        stacks
    }

    /// (label set, stack root first, count) for every key; heaviest first, ties by stack, then
    /// by the labels, for stable output.
    pub(crate) fn labeled_stacks(&self) -> Vec<(LabelSetId, &[FrameId], u64)> {
        let mut stacks: Vec<_> = self
            .stacks
            .iter()
            .flat_map(|(&labels, stacks)| {
                stacks
                    .iter()
                    .map(move |(stack, &count)| (labels, stack.as_slice(), count))
            })
            .collect();
        stacks.sort_by(|a, b| {
            b.2.cmp(&a.2)
                .then_with(|| a.1.cmp(b.1))
                .then_with(|| self.label_set(a.0).cmp(self.label_set(b.0)))
        });
        stacks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(name: &str, line: u32) -> Frame {
        Frame {
            kind: FrameKind::Python,
            name: name.into(),
            file: Some("a.py".into()),
            first_line: 1,
            line,
            build_id: None,
        }
    }

    #[test]
    fn stacks_merge_label_sets() {
        let mut p = Profile::default();
        let a = p.intern(py("a", 2));
        let b = p.intern(py("b", 5));
        let one = p.intern_labels(vec![Label::num("tid", 1)]);
        let two = p.intern_labels(vec![Label::num("tid", 2)]);
        p.add_labeled(one, &[a, b], 3);
        p.add_labeled(two, &[a, b], 4);
        p.add(&[a], 5);
        p.add_labeled(one, &[a, b], 1);
        assert_eq!(p.samples, 13);
        assert_eq!(p.stacks(), vec![(&[a, b][..], 8), (&[a][..], 5)]);
        assert_eq!(
            p.labeled_stacks(),
            vec![
                (NO_LABELS, &[a][..], 5),
                (one, &[a, b][..], 4),
                (two, &[a, b][..], 4)
            ]
        );
        assert_eq!(p.stack_count(), 3);
    }

    #[test]
    fn stack_limit_folds_new_stacks_and_keeps_totals() {
        let mut p = Profile::with_stack_limit(2);
        let frames: Vec<FrameId> = (0..10).map(|i| p.intern(py("f", i))).collect();
        let tid = |p: &mut Profile, t| p.intern_labels(vec![Label::num("tid", t)]);
        let (t1, t2) = (tid(&mut p, 1), tid(&mut p, 2));
        p.add_labeled(t1, &[frames[0]], 1);
        p.add_labeled(t1, &[frames[1]], 1);
        // Known keys still count in full past the limit.
        p.add_labeled(t1, &[frames[0]], 5);
        for (i, &f) in frames.iter().enumerate().skip(2) {
            p.add_labeled(t2, &[f], i as u64);
        }
        // Same stack, new label set: a new key too.
        p.add_labeled(t2, &[frames[0]], 100);
        let over: u64 = (2..10).sum::<u64>() + 100;
        assert_eq!(p.over_limit, over);
        assert_eq!(p.samples, 7 + over);
        assert_eq!(p.stack_count(), 3, "limit plus the one over-limit stack");
        let stacks = p.stacks();
        let total: u64 = stacks.iter().map(|(_, c)| c).sum();
        assert_eq!(total, p.samples);
        let (stack, count) = stacks[0];
        assert_eq!(p.frame(stack[0]).name.as_ref(), OVER_LIMIT);
        assert_eq!(count, over);
    }

    #[test]
    fn unlimited_by_default() {
        let mut p = Profile::default();
        for i in 0..1000 {
            let f = p.intern(py("f", i));
            p.add(&[f], 1);
        }
        assert_eq!(p.stack_count(), 1000);
        assert_eq!(p.over_limit, 0);
    }
}
