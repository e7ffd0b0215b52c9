//! Stacks → counts. Frames are interned once, so a sample costs one hash of a small `Vec<u32>`.

use rustc_hash::FxHashMap;
use std::sync::Arc;

/// What a frame in an aggregated stack stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FrameKind {
    /// `<command> (<pid>)`: the root of every stack when a recording covers several processes.
    Process,
    /// `thread <tid> (<name>)`, with `--threads`.
    Thread,
    /// A Python function.
    Python,
    /// The rest of a stack that could not be completed or validated.
    Truncated,
}

/// One distinct frame. Python frames with the same function, file and line are one frame.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub kind: FrameKind,
    /// Function qualname for Python frames; the label otherwise.
    pub name: Arc<str>,
    /// Source file (Python frames only).
    pub file: Option<Arc<str>>,
    /// Line executing in this frame (0 when unknown).
    pub line: u32,
}

impl Frame {
    /// `function (file:line)` for Python frames, the bare label otherwise.
    pub fn label(&self) -> String {
        match &self.file {
            Some(file) => format!("{} ({}:{})", self.name, file, self.line),
            None => self.name.to_string(),
        }
    }
}

pub type FrameId = u32;

/// All samples of a recording: interned frames and root-first stacks with their counts.
#[derive(Default, Debug)]
pub struct Profile {
    frames: Vec<Frame>,
    index: FxHashMap<Frame, FrameId>,
    stacks: FxHashMap<Vec<FrameId>, u64>,
    /// Samples added (sum of all counts).
    pub samples: u64,
}

impl Profile {
    pub fn intern(&mut self, frame: Frame) -> FrameId {
        if let Some(&id) = self.index.get(&frame) {
            return id;
        }
        let id = self.frames.len() as FrameId;
        self.frames.push(frame.clone());
        self.index.insert(frame, id);
        id
    }

    /// Adds `count` samples of `stack` (root first).
    pub fn add(&mut self, stack: &[FrameId], count: u64) {
        if let Some(total) = self.stacks.get_mut(stack) {
            *total += count;
        } else {
            self.stacks.insert(stack.to_vec(), count);
        }
        self.samples += count;
    }

    pub fn frame(&self, id: FrameId) -> &Frame {
        &self.frames[id as usize]
    }

    pub fn frames(&self) -> &[Frame] {
        &self.frames
    }

    /// Stacks (root first) and their counts, heaviest first, ties by stack, for stable output.
    pub fn stacks(&self) -> Vec<(&[FrameId], u64)> {
        let mut stacks: Vec<_> = self
            .stacks
            .iter()
            .map(|(s, &c)| (s.as_slice(), c))
            .collect();
        stacks.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        stacks
    }
}
