//! speedscope JSON (<https://www.speedscope.app/file-format-schema.json>).
//!
//! `shared.frames` holds every frame of the profile, at its [`FrameId`] as index. When stacks
//! start with a [`FrameKind::Process`] frame, each process gets a `sampled` profile of its own,
//! named by that frame, whose samples leave the process frame out; stacks without a process root
//! then go to a profile named `(no process)`. Otherwise there is one profile named by the title.
//! Profiles are ordered heaviest first, samples as [`Profile::stacks`] orders them.

use std::collections::HashMap;
use std::io::Write;

use serde::Serialize;

use crate::aggregate::{Frame, FrameId, FrameKind, Profile};

pub(crate) const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

/// Name of the profile that collects stacks without a process root when others have one.
pub(crate) const NO_PROCESS: &str = "(no process)";

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct File<'a> {
    #[serde(rename = "$schema")]
    schema: &'static str,
    shared: Shared<'a>,
    profiles: Vec<SampledProfile>,
    name: &'a str,
    active_profile_index: usize,
    exporter: String,
}

#[derive(Serialize)]
struct Shared<'a> {
    frames: Vec<SpeedscopeFrame<'a>>,
}

#[derive(Serialize)]
struct SpeedscopeFrame<'a> {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u32>,
}

impl<'a> SpeedscopeFrame<'a> {
    fn new(frame: &'a Frame) -> Self {
        match (frame.kind, &frame.file) {
            (FrameKind::Python, Some(file)) => SpeedscopeFrame {
                name: frame.name.to_string(),
                file: Some(file),
                line: (frame.line != 0).then_some(frame.line),
            },
            (FrameKind::Native, Some(module)) => SpeedscopeFrame {
                name: frame.name.to_string(),
                file: Some(module),
                line: None,
            },
            _ => SpeedscopeFrame {
                name: frame.label(),
                file: None,
                line: None,
            },
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SampledProfile {
    #[serde(rename = "type")]
    kind: &'static str,
    name: String,
    unit: &'static str,
    start_value: u64,
    end_value: u64,
    /// Frame indexes, root first.
    samples: Vec<Vec<FrameId>>,
    weights: Vec<u64>,
}

impl SampledProfile {
    fn new(name: String) -> Self {
        SampledProfile {
            kind: "sampled",
            name,
            unit: "none",
            start_value: 0,
            end_value: 0,
            samples: Vec::new(),
            weights: Vec::new(),
        }
    }

    fn push(&mut self, stack: &[FrameId], weight: u64) {
        self.samples.push(stack.to_vec());
        self.weights.push(weight);
        self.end_value += weight;
    }
}

fn profiles(profile: &Profile, title: &str) -> Vec<SampledProfile> {
    let is_process = |id: &FrameId| profile.frame(*id).kind == FrameKind::Process;
    let stacks: Vec<_> = profile
        .stacks()
        .into_iter()
        .filter(|(_, w)| *w > 0)
        .collect();

    if !stacks
        .iter()
        .any(|(stack, _)| stack.first().is_some_and(is_process))
    {
        let mut single = SampledProfile::new(title.to_string());
        for (stack, weight) in stacks {
            single.push(stack, weight);
        }
        return vec![single];
    }

    // Keyed by the process frame; `None` for stacks without one.
    let mut index: HashMap<Option<FrameId>, usize> = HashMap::new();
    let mut split: Vec<SampledProfile> = Vec::new();
    for (stack, weight) in stacks {
        let (process, rest) = match stack.split_first() {
            Some((root, rest)) if is_process(root) => (Some(*root), rest),
            _ => (None, stack),
        };
        let i = *index.entry(process).or_insert_with(|| {
            let name = match process {
                Some(id) => profile.frame(id).label(),
                None => NO_PROCESS.to_string(),
            };
            split.push(SampledProfile::new(name));
            split.len() - 1
        });
        split[i].push(rest, weight);
    }
    split.sort_by(|a, b| {
        b.end_value
            .cmp(&a.end_value)
            .then_with(|| a.name.cmp(&b.name))
    });
    split
}

/// Writes `profile` as a speedscope file named `title`.
pub(crate) fn write(profile: &Profile, title: &str, out: &mut dyn Write) -> anyhow::Result<()> {
    let file = File {
        schema: SCHEMA,
        shared: Shared {
            frames: profile.frames().iter().map(SpeedscopeFrame::new).collect(),
        },
        profiles: profiles(profile, title),
        name: title,
        active_profile_index: 0,
        exporter: format!("pyebpf {}", env!("CARGO_PKG_VERSION")),
    };
    serde_json::to_writer(&mut *out, &file)?;
    out.write_all(b"\n")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::test_support::{self, frame, py};
    use serde_json::Value;

    fn render(profile: &Profile, title: &str) -> Value {
        let mut out = Vec::new();
        write(profile, title, &mut out).unwrap();
        serde_json::from_slice(&out).expect("not JSON")
    }

    /// Checks the invariants every file must satisfy and returns the profiles.
    fn check(json: &Value, total: u64) -> &Vec<Value> {
        assert_eq!(json["$schema"], SCHEMA);
        let frames = json["shared"]["frames"].as_array().expect("no frames");
        let profiles = json["profiles"].as_array().expect("no profiles");
        assert!(!profiles.is_empty());
        let mut sum = 0;
        for p in profiles {
            assert_eq!(p["type"], "sampled");
            assert_eq!(p["unit"], "none");
            assert_eq!(p["startValue"], 0);
            assert!(p["name"].is_string());
            let samples = p["samples"].as_array().unwrap();
            let weights = p["weights"].as_array().unwrap();
            assert_eq!(samples.len(), weights.len());
            for sample in samples {
                for index in sample.as_array().unwrap() {
                    let index = index.as_u64().expect("frame index is not an integer");
                    assert!(
                        (index as usize) < frames.len(),
                        "frame {index} out of range"
                    );
                }
            }
            let weight: u64 = weights.iter().map(|w| w.as_u64().unwrap()).sum();
            assert_eq!(p["endValue"], weight);
            sum += weight;
        }
        assert_eq!(sum, total);
        assert_eq!(json["activeProfileIndex"], 0);
        profiles
    }

    fn names(json: &Value, sample: &Value) -> Vec<String> {
        sample
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                let frame = &json["shared"]["frames"][i.as_u64().unwrap() as usize];
                frame["name"].as_str().unwrap().to_string()
            })
            .collect()
    }

    #[test]
    fn splits_per_process() {
        let profile = test_support::two_processes();
        let json = render(&profile, "pyebpf record");
        let profiles = check(&json, profile.samples);
        assert_eq!(json["name"], "pyebpf record");
        assert_eq!(profiles.len(), 2);

        assert_eq!(profiles[0]["name"], "python3 (100)");
        assert_eq!(profiles[0]["endValue"], 70);
        assert_eq!(profiles[1]["name"], "wor;ker (200)");
        assert_eq!(profiles[1]["endValue"], 30);

        // Samples leave the process frame out and start with the thread.
        let first = &profiles[0]["samples"][0];
        assert_eq!(
            names(&json, first),
            ["thread 100 (MainThread)", "main", "work"]
        );
        assert_eq!(profiles[0]["weights"][0], 40);
        for p in profiles {
            for sample in p["samples"].as_array().unwrap() {
                let names = names(&json, sample);
                assert!(names[0].starts_with("thread "), "{names:?}");
            }
        }
    }

    #[test]
    fn python_frames_have_file_and_line() {
        let profile = test_support::two_processes();
        let json = render(&profile, "t");
        let frames = json["shared"]["frames"].as_array().unwrap();
        assert_eq!(frames.len(), profile.frames().len());

        let work = frames.iter().find(|f| f["name"] == "work").unwrap();
        assert_eq!(work["file"], "/srv/app.py");
        assert_eq!(work["line"], 20);

        // Line 0 means unknown: no line.
        let parse = frames.iter().find(|f| f["name"] == "Parser.parse").unwrap();
        assert!(parse["file"].is_string());
        assert!(parse.get("line").is_none());

        let thread = frames
            .iter()
            .find(|f| f["name"] == "thread 100 (MainThread)")
            .unwrap();
        assert!(thread.get("file").is_none() && thread.get("line").is_none());
        assert!(frames.iter().any(|f| f["name"] == "[truncated]"));
    }

    #[test]
    fn one_profile_without_process_frames() {
        let profile = test_support::single();
        let json = render(&profile, "my title");
        let profiles = check(&json, 10);
        assert_eq!(profiles.len(), 1);
        assert_eq!(profiles[0]["name"], "my title");
        assert_eq!(profiles[0]["endValue"], 10);
        assert_eq!(names(&json, &profiles[0]["samples"][0]), ["main", "f"]);
        assert_eq!(profiles[0]["weights"], serde_json::json!([6, 3, 1]));
    }

    #[test]
    fn stacks_without_process_root_are_kept() {
        let mut profile = Profile::default();
        let proc_a = profile.intern(frame(FrameKind::Process, "a (1)"));
        let main = profile.intern(py("main", "m.py", 1));
        let lost = profile.intern(frame(FrameKind::Truncated, "[truncated]"));
        profile.add(&[proc_a, main], 2);
        profile.add(&[lost], 5);
        profile.add(&[proc_a], 1);
        let json = render(&profile, "t");
        let profiles = check(&json, 8);
        assert_eq!(profiles.len(), 2);
        assert_eq!(profiles[0]["name"], NO_PROCESS);
        assert_eq!(profiles[0]["endValue"], 5);
        assert_eq!(profiles[1]["name"], "a (1)");
        // A sample of the process frame alone becomes an empty stack.
        assert_eq!(profiles[1]["samples"], serde_json::json!([[1], []]));
    }

    #[test]
    fn empty_profile_is_valid() {
        let json = render(&Profile::default(), "empty");
        let profiles = check(&json, 0);
        assert_eq!(profiles.len(), 1);
        assert_eq!(profiles[0]["endValue"], 0);
    }
}
