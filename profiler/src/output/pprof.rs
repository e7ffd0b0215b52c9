//! pprof: gzipped `profile.proto` (<https://github.com/google/pprof/blob/main/proto/profile.proto>),
//! the format of `go tool pprof` and of the continuous-profiling backends.
//!
//! - Values: `samples/count` and `cpu/nanoseconds` (count × period); the period type is
//!   `cpu/nanoseconds` with `period` = 1e9 / rate. An idle stack's weight (the periods it
//!   covers) counts in both.
//! - One `Function` per (name, file, first line), one `Location` per (function, line), all in
//!   one `Mapping` that says functions, file names and lines are resolved. Sample locations are
//!   leaf first.
//! - Process and thread frames are not frames here: the same facts are sample labels (`pid`,
//!   `tid` as numbers, `thread_name`, `process`, `container_id`), when the aggregation collected
//!   them. Markers (`<truncated>`, `<idle>`, `<unknown code object>`, ...) are functions with
//!   an empty file name.
//! - `Function.system_name` is left empty. When it equals `name`, `go tool pprof` treats the
//!   name as a C++ symbol and simplifies it, which reduces `<module>`, `<lambda>` and
//!   `<listcomp>` to empty names.

use std::io::Write;

use anyhow::Context;
use flate2::write::GzEncoder;
use prost::Message;
use rustc_hash::FxHashMap;

use crate::aggregate::{Frame, FrameId, LabelValue, Profile};
use crate::proto::perftools::profiles as pb;

/// The only mapping: Python code is not addressed by binary images.
const MAPPING_ID: u64 = 1;

/// pprof's string table: index 0 is the empty string, every other string appears once.
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: FxHashMap<String, i64>,
}

impl Strings {
    fn new() -> Strings {
        let mut s = Strings::default();
        s.id("");
        s
    }

    fn id(&mut self, s: &str) -> i64 {
        if let Some(&id) = self.index.get(s) {
            return id;
        }
        let id = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), id);
        id
    }
}

/// Builds the `Profile` message (exposed for tests; [`write`] encodes and compresses it).
pub(crate) fn build(profile: &Profile, title: &str) -> pb::Profile {
    let mut strings = Strings::new();
    let period = profile.timing.period_ns;
    let value_type = |strings: &mut Strings, kind: &str, unit: &str| pb::ValueType {
        r#type: strings.id(kind),
        unit: strings.id(unit),
    };
    let sample_type = vec![
        value_type(&mut strings, "samples", "count"),
        value_type(&mut strings, "cpu", "nanoseconds"),
    ];
    let period_type = Some(value_type(&mut strings, "cpu", "nanoseconds"));

    let mut functions: Vec<pb::Function> = Vec::new();
    let mut function_ids: FxHashMap<(&str, &str, u32), u64> = FxHashMap::default();
    let mut locations: Vec<pb::Location> = Vec::new();
    let mut location_ids: FxHashMap<(u64, u32), u64> = FxHashMap::default();
    // Frame id → location id (0: not a location, i.e. a process or thread frame).
    let mut frame_locations: Vec<Option<u64>> = vec![None; profile.frames().len()];
    let mut location_of = |id: FrameId, strings: &mut Strings| -> u64 {
        if let Some(Some(loc)) = frame_locations.get(id as usize) {
            return *loc;
        }
        let frame: &Frame = profile.frame(id);
        let loc = if frame.kind.is_label() {
            0
        } else {
            let file = frame.file.as_deref().unwrap_or("");
            let key = (frame.name.as_ref(), file, frame.first_line);
            let function_id = *function_ids.entry(key).or_insert_with(|| {
                let id = functions.len() as u64 + 1;
                functions.push(pb::Function {
                    id,
                    name: strings.id(&frame.name),
                    // Empty on purpose: see the module docs.
                    system_name: 0,
                    filename: strings.id(file),
                    start_line: frame.first_line.into(),
                });
                id
            });
            *location_ids
                .entry((function_id, frame.line))
                .or_insert_with(|| {
                    let id = locations.len() as u64 + 1;
                    locations.push(pb::Location {
                        id,
                        mapping_id: MAPPING_ID,
                        address: 0,
                        line: vec![pb::Line {
                            function_id,
                            line: frame.line.into(),
                            column: 0,
                        }],
                        is_folded: false,
                    });
                    id
                })
        };
        if let Some(slot) = frame_locations.get_mut(id as usize) {
            *slot = Some(loc);
        }
        loc
    };

    let mut samples = Vec::new();
    for (labels, stack, count) in profile.labeled_stacks() {
        if count == 0 {
            continue;
        }
        let location_id: Vec<u64> = stack
            .iter()
            .rev()
            .map(|&id| location_of(id, &mut strings))
            .filter(|&loc| loc != 0)
            .collect();
        if location_id.is_empty() {
            continue;
        }
        let label = profile
            .label_set(labels)
            .iter()
            .map(|l| {
                let key = strings.id(l.key);
                match &l.value {
                    LabelValue::Num(n) => pb::Label {
                        key,
                        num: *n,
                        ..Default::default()
                    },
                    LabelValue::Str(s) => pb::Label {
                        key,
                        str: strings.id(s),
                        ..Default::default()
                    },
                }
            })
            .collect();
        let count = i64::try_from(count).unwrap_or(i64::MAX);
        samples.push(pb::Sample {
            location_id,
            value: vec![count, count.saturating_mul(period as i64)],
            label,
        });
    }

    let comment = if title.is_empty() {
        Vec::new()
    } else {
        vec![strings.id(title)]
    };
    let default_sample_type = strings.id("cpu");
    pb::Profile {
        sample_type,
        sample: samples,
        mapping: vec![pb::Mapping {
            id: MAPPING_ID,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            ..Default::default()
        }],
        location: locations,
        function: functions,
        string_table: strings.table,
        time_nanos: profile.timing.start_unix_ns.try_into().unwrap_or(i64::MAX),
        duration_nanos: profile.timing.duration_ns.try_into().unwrap_or(i64::MAX),
        period_type,
        period: period.try_into().unwrap_or(i64::MAX),
        comment,
        default_sample_type,
        ..Default::default()
    }
}

/// Writes `profile` as a gzipped pprof profile whose comment is `title`.
pub(crate) fn write(profile: &Profile, title: &str, out: &mut dyn Write) -> anyhow::Result<()> {
    let bytes = build(profile, title).encode_to_vec();
    let mut gz = GzEncoder::new(out, flate2::Compression::default());
    gz.write_all(&bytes).context("compressing the profile")?;
    gz.finish().context("compressing the profile")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::{FrameKind, Label, Timing};
    use crate::output::test_support::{self, frame, py};

    fn decode(bytes: &[u8]) -> pb::Profile {
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(bytes), &mut raw)
            .expect("not gzip");
        pb::Profile::decode(raw.as_slice()).expect("not a profile")
    }

    fn render(profile: &Profile) -> pb::Profile {
        let mut out = Vec::new();
        write(profile, "title", &mut out).unwrap();
        decode(&out)
    }

    fn s(p: &pb::Profile, id: i64) -> &str {
        &p.string_table[id as usize]
    }

    /// (name, file, line) of each location of a sample, leaf first.
    fn frames(p: &pb::Profile, sample: &pb::Sample) -> Vec<(String, String, i64)> {
        sample
            .location_id
            .iter()
            .map(|&id| {
                let loc = &p.location[id as usize - 1];
                assert_eq!(loc.id, id);
                let line = &loc.line[0];
                let f = &p.function[line.function_id as usize - 1];
                assert_eq!(f.id, line.function_id);
                (s(p, f.name).into(), s(p, f.filename).into(), line.line)
            })
            .collect()
    }

    #[test]
    fn types_period_and_timing() {
        let mut profile = test_support::single();
        profile.timing = Timing {
            start_unix_ns: 1_700_000_000_000_000_000,
            duration_ns: 2_000_000_000,
            period_ns: 10_000_000,
        };
        let p = render(&profile);
        assert_eq!(p.string_table[0], "");
        let types: Vec<(&str, &str)> = p
            .sample_type
            .iter()
            .map(|t| (s(&p, t.r#type), s(&p, t.unit)))
            .collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
        let period_type = p.period_type.as_ref().unwrap();
        assert_eq!(
            (s(&p, period_type.r#type), s(&p, period_type.unit)),
            ("cpu", "nanoseconds")
        );
        assert_eq!(p.period, 10_000_000);
        assert_eq!(p.time_nanos, 1_700_000_000_000_000_000);
        assert_eq!(p.duration_nanos, 2_000_000_000);
        assert_eq!(s(&p, p.default_sample_type), "cpu");
        assert_eq!(s(&p, p.comment[0]), "title");
        let m = &p.mapping[0];
        assert!(m.has_functions && m.has_filenames && m.has_line_numbers);
        // Each sample: count and count × period.
        let total: i64 = p.sample.iter().map(|s| s.value[0]).sum();
        assert_eq!(total, 10);
        for sample in &p.sample {
            assert_eq!(sample.value[1], sample.value[0] * 10_000_000);
        }
    }

    #[test]
    fn locations_leaf_first_functions_by_first_line() {
        let profile = test_support::single();
        let p = render(&profile);
        let first = &p.sample[0];
        assert_eq!(first.value[0], 6);
        assert_eq!(
            frames(&p, first),
            [
                ("f".into(), "app.py".into(), 5),
                ("main".into(), "app.py".into(), 1)
            ]
        );
        // main at lines 1 is one function, one location; f and g one each.
        assert_eq!(p.function.len(), 3);
        assert_eq!(p.location.len(), 3);
        for f in &p.function {
            assert_eq!(f.system_name, 0, "system_name must stay empty");
            assert!(f.start_line >= 1);
        }
    }

    #[test]
    fn one_function_many_lines_and_namesakes_apart() {
        let mut profile = Profile::default();
        let at = |line, first| Frame {
            kind: FrameKind::Python,
            name: "<lambda>".into(),
            file: Some("m.py".into()),
            first_line: first,
            line,
            build_id: None,
        };
        let a = profile.intern(at(10, 10));
        let b = profile.intern(at(11, 10));
        // Another lambda of the same file: same name, another first line.
        let c = profile.intern(at(20, 20));
        let module = profile.intern(py("<module>", "m.py", 30));
        profile.add(&[module, a], 1);
        profile.add(&[module, b], 1);
        profile.add(&[module, c], 1);
        let p = render(&profile);
        assert_eq!(p.function.len(), 3, "two lambdas and <module>");
        assert_eq!(p.location.len(), 4);
        let names: Vec<&str> = p.function.iter().map(|f| s(&p, f.name)).collect();
        assert!(names.contains(&"<lambda>") && names.contains(&"<module>"));
    }

    #[test]
    fn process_and_thread_frames_become_labels_only() {
        let mut profile = test_support::two_processes();
        // The aggregation's labels for one of the stacks.
        let labels = profile.intern_labels(vec![
            Label::num("pid", 100),
            Label::num("tid", 100),
            Label::str("thread_name", "MainThread"),
            Label::str("process", "python3 app.py"),
        ]);
        let proc_a = profile.intern(frame(FrameKind::Process, "python3 (100)"));
        let main = profile.intern(py("main", "/srv/app.py", 10));
        profile.add_labeled(labels, &[proc_a, main], 7);
        let p = render(&profile);
        for f in &p.function {
            let name = s(&p, f.name);
            assert!(
                !name.starts_with("python3 (") && !name.starts_with("thread "),
                "{name} became a function"
            );
        }
        let truncated = p
            .function
            .iter()
            .find(|f| s(&p, f.name) == "[truncated]")
            .expect("markers are functions");
        assert_eq!(s(&p, truncated.filename), "");
        let labeled: Vec<&pb::Sample> = p.sample.iter().filter(|s| !s.label.is_empty()).collect();
        assert_eq!(labeled.len(), 1);
        let sample = labeled[0];
        assert_eq!(
            frames(&p, sample),
            [("main".into(), "/srv/app.py".into(), 10)]
        );
        let mut got: Vec<String> = sample
            .label
            .iter()
            .map(|l| {
                if l.str != 0 {
                    format!("{}={}", s(&p, l.key), s(&p, l.str))
                } else {
                    format!("{}#{}", s(&p, l.key), l.num)
                }
            })
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                "pid#100",
                "process=python3 app.py",
                "thread_name=MainThread",
                "tid#100"
            ]
        );
        let total: i64 = p.sample.iter().map(|s| s.value[0]).sum();
        assert_eq!(total as u64, profile.samples);
    }

    #[test]
    fn deterministic_and_empty() {
        let profile = test_support::two_processes();
        let mut a = Vec::new();
        let mut b = Vec::new();
        write(&profile, "t", &mut a).unwrap();
        write(&profile, "t", &mut b).unwrap();
        assert_eq!(a, b);
        let p = render(&Profile::default());
        assert!(p.sample.is_empty());
        assert_eq!(p.sample_type.len(), 2);
    }
}
