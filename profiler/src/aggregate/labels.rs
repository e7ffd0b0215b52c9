//! Sample labels: who ran a stack (pid, tid, thread name, and the process's own labels from
//! [`crate::identity::sample_labels`]), as opposed to what code it ran. pprof writes them as
//! sample labels; the other formats ignore them.
//!
//! A sample's labels are interned as one set, so a sample costs one id, and the sets of a
//! thread are built once (see [`super::stacks::Aggregator`]).

use std::sync::Arc;

use rustc_hash::FxHashMap;

/// Index of an interned label set in its [`super::Profile`].
pub(crate) type LabelSetId = u32;

/// The empty label set, interned in every profile.
pub(crate) const NO_LABELS: LabelSetId = 0;

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum LabelValue {
    /// pprof's `Label.num`: pid and tid, so that consumers can filter them as numbers.
    Num(i64),
    Str(Arc<str>),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Label {
    pub key: &'static str,
    pub value: LabelValue,
}

impl Label {
    pub(crate) fn num(key: &'static str, value: i64) -> Label {
        Label {
            key,
            value: LabelValue::Num(value),
        }
    }

    pub(crate) fn str(key: &'static str, value: impl Into<Arc<str>>) -> Label {
        Label {
            key,
            value: LabelValue::Str(value.into()),
        }
    }
}

/// Label sets, each sorted by key (then value) so that the same labels in any order are one
/// set.
#[derive(Debug)]
pub(super) struct Interner {
    sets: Vec<Box<[Label]>>,
    index: FxHashMap<Box<[Label]>, LabelSetId>,
}

impl Default for Interner {
    fn default() -> Self {
        let empty: Box<[Label]> = Box::new([]);
        let mut index = FxHashMap::default();
        index.insert(empty.clone(), NO_LABELS);
        Interner {
            sets: vec![empty],
            index,
        }
    }
}

impl Interner {
    pub(super) fn intern(&mut self, mut labels: Vec<Label>) -> LabelSetId {
        labels.sort();
        let set = labels.into_boxed_slice();
        if let Some(&id) = self.index.get(&set) {
            return id;
        }
        let id = self.sets.len() as LabelSetId;
        self.sets.push(set.clone());
        self.index.insert(set, id);
        id
    }

    pub(super) fn get(&self, id: LabelSetId) -> &[Label] {
        self.sets.get(id as usize).map_or(&[], |s| s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_are_order_independent() {
        let mut i = Interner::default();
        assert_eq!(i.intern(Vec::new()), NO_LABELS);
        let a = i.intern(vec![Label::num("pid", 1), Label::str("process", "x")]);
        let b = i.intern(vec![Label::str("process", "x"), Label::num("pid", 1)]);
        let c = i.intern(vec![Label::num("pid", 2)]);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(i.get(a)[0], Label::num("pid", 1));
        assert!(i.get(999).is_empty());
    }
}
