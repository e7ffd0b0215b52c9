//! Writers for aggregated profiles.
//!
//! [`write`] renders a [`Profile`] as a flame graph (SVG, via inferno), a speedscope JSON file,
//! collapsed ("folded") stacks, the text format most flame graph tools read, or pprof's gzipped
//! `profile.proto`, which `go tool pprof` and continuous-profiling backends read.

pub(crate) mod collapsed;
pub(crate) mod destination;
pub(crate) mod flamegraph;
pub(crate) mod otlp;
pub(crate) mod pprof;
pub(crate) mod speedscope;

use std::io::Write;

use crate::aggregate::Profile;

/// An output format for a recording.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Interactive SVG flame graph.
    Flamegraph,
    /// JSON for <https://www.speedscope.app>, one profile per process.
    Speedscope,
    /// Collapsed stacks: `frame;frame;frame count`, one line per distinct stack.
    Collapsed,
    /// pprof (gzipped protobuf), for `go tool pprof` and profiling backends; processes and
    /// threads are sample labels.
    Pprof,
    /// OTLP profiles: one binary `ExportProfilesServiceRequest` (protobuf, not compressed;
    /// proto release v1.10.0), one resource per process, to inspect or replay to a Collector.
    Otlp,
}

impl Format {
    /// The usual file extension, without the leading dot.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Flamegraph => "svg",
            Format::Speedscope => "speedscope.json",
            Format::Collapsed => "txt",
            Format::Pprof => "pb.gz",
            Format::Otlp => "otlp.pb",
        }
    }

    /// Whether the format keeps sample labels (pid, tid, thread name, process), so that the
    /// aggregation must collect them.
    pub fn has_labels(self) -> bool {
        matches!(self, Format::Pprof | Format::Otlp)
    }
}

/// Writes `profile` in `format` to `out`. `title` names the recording (e.g. "pyebpf record: 3
/// processes, 12345 samples"). `facts` tells OTLP what the samples' labels do not say about
/// their processes (their executable and Python version).
///
/// A flame graph of a profile without samples is an error (nothing is written); the other
/// formats write an empty (but valid) file.
pub(crate) fn write(
    profile: &Profile,
    format: Format,
    title: &str,
    facts: &dyn Fn(u32) -> Option<otlp::ProcessFacts>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    match format {
        Format::Flamegraph => flamegraph::write(profile, title, out),
        Format::Speedscope => speedscope::write(profile, title, out),
        Format::Collapsed => collapsed::write(profile, out),
        Format::Pprof => pprof::write(profile, title, out),
        Format::Otlp => otlp::write(profile, otlp::host_attributes(), facts, out).map(|_| ()),
    }?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
pub(crate) mod test_support {
    use std::sync::Arc;

    use crate::aggregate::{Frame, FrameId, FrameKind, Profile};

    pub(crate) fn frame(kind: FrameKind, name: &str) -> Frame {
        Frame::marker(kind, name)
    }

    /// A Python frame whose function starts 3 lines above `line` (at line 1 at the least).
    pub(crate) fn py(name: &str, file: &str, line: u32) -> Frame {
        Frame {
            kind: FrameKind::Python,
            name: Arc::from(name),
            file: Some(Arc::from(file)),
            first_line: line.saturating_sub(3).max(1),
            line,
            build_id: None,
        }
    }

    /// Two processes (one with a `;` in its name), threads, Python frames (one with a `;` in
    /// its file name) and a truncated stack: 100 samples in all.
    pub(crate) fn two_processes() -> Profile {
        let mut p = Profile::default();
        let proc_a = p.intern(frame(FrameKind::Process, "python3 (100)"));
        let proc_b = p.intern(frame(FrameKind::Process, "wor;ker (200)"));
        let thread_a = p.intern(frame(FrameKind::Thread, "thread 100 (MainThread)"));
        let thread_b = p.intern(frame(FrameKind::Thread, "thread 201 (pool-1)"));
        let main = p.intern(py("main", "/srv/app.py", 10));
        let work = p.intern(py("work", "/srv/app.py", 20));
        let parse = p.intern(py(
            "Parser.parse",
            "/usr/lib/python3.12/site-packages/lib/parse.py",
            0,
        ));
        let odd = p.intern(py("odd", "/tmp/a;b/odd.py", 3));
        let truncated = p.intern(frame(FrameKind::Truncated, "[truncated]"));

        p.add(&[proc_a, thread_a, main, work], 40);
        p.add(&[proc_a, thread_a, main, parse], 25);
        p.add(&[proc_a, thread_a, main], 5);
        p.add(&[proc_b, thread_b, odd], 20);
        p.add(&[proc_b, thread_b, truncated], 7);
        p.add(&[proc_b, thread_b, odd], 3);
        assert_eq!(p.samples, 100);
        p
    }

    /// A single process without a process root frame: 10 samples.
    pub(crate) fn single() -> Profile {
        let mut p = Profile::default();
        let main = p.intern(py("main", "app.py", 1));
        let f = p.intern(py("f", "app.py", 5));
        let g = p.intern(py("g", "app.py", 9));
        p.add(&[main, f], 6);
        p.add(&[main, g], 3);
        p.add(&[main], 1);
        p
    }

    /// Labels of a stack, root first.
    pub(crate) fn labels(p: &Profile, stack: &[FrameId]) -> Vec<String> {
        stack.iter().map(|&id| p.frame(id).label()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extensions() {
        assert_eq!(Format::Flamegraph.extension(), "svg");
        assert_eq!(Format::Speedscope.extension(), "speedscope.json");
        assert_eq!(Format::Collapsed.extension(), "txt");
        assert_eq!(Format::Pprof.extension(), "pb.gz");
    }

    #[test]
    fn format_parses_from_cli_names() {
        use clap::ValueEnum;
        assert_eq!(
            Format::from_str("flamegraph", false),
            Ok(Format::Flamegraph)
        );
        assert_eq!(
            Format::from_str("speedscope", false),
            Ok(Format::Speedscope)
        );
        assert_eq!(Format::from_str("collapsed", false), Ok(Format::Collapsed));
        assert_eq!(Format::from_str("pprof", false), Ok(Format::Pprof));
    }

    /// Flame graph, speedscope and collapsed output merge label sets away: a profile whose
    /// samples carry labels writes the same bytes as the same samples without them.
    #[test]
    fn label_blind_formats_ignore_labels() {
        use crate::aggregate::{Label, Profile};
        let plain = test_support::two_processes();
        let mut labeled = Profile::default();
        for frame in plain.frames() {
            labeled.intern(frame.clone());
        }
        for (i, (stack, count)) in plain.stacks().into_iter().enumerate() {
            // Split each stack's count over two threads' label sets.
            for tid in [1, 2] {
                let part = if tid == 1 {
                    count / 2
                } else {
                    count - count / 2
                };
                let labels = labeled
                    .intern_labels(vec![Label::num("pid", i as i64), Label::num("tid", tid)]);
                labeled.add_labeled(labels, stack, part);
            }
        }
        for format in [Format::Flamegraph, Format::Speedscope, Format::Collapsed] {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            write(&plain, format, "t", &|_| None, &mut a).unwrap();
            write(&labeled, format, "t", &|_| None, &mut b).unwrap();
            assert!(a == b, "{format:?} output depends on labels");
        }
    }

    /// `--async`'s `<task NAME>` frames reach every format by name: escaped in the SVG, as
    /// is in collapsed and speedscope, a function of their own in pprof.
    #[test]
    fn task_frames_in_every_format() {
        use crate::aggregate::{FrameKind, Profile};
        use std::io::Read;
        let mut p = Profile::default();
        let root = p.intern(test_support::frame(FrameKind::Task, "<task main>"));
        let main = p.intern(test_support::py("main", "app.py", 4));
        let leaf = p.intern(test_support::frame(FrameKind::Task, "<task alpha>"));
        let alpha = p.intern(test_support::py("alpha", "app.py", 9));
        p.add(&[root, main, leaf, alpha], 5);
        let text = |format| {
            let mut out = Vec::new();
            write(&p, format, "t", &|_| None, &mut out).unwrap();
            out
        };
        let svg = String::from_utf8(text(Format::Flamegraph)).unwrap();
        assert!(svg.contains("&lt;task alpha&gt;"));
        assert!(svg.contains(&format!(
            "fill=\"rgb({},{},{})\"",
            flamegraph::TASK_COLOR.r,
            flamegraph::TASK_COLOR.g,
            flamegraph::TASK_COLOR.b
        )));
        let collapsed = String::from_utf8(text(Format::Collapsed)).unwrap();
        assert_eq!(
            collapsed,
            "<task main>;main (app.py:4);<task alpha>;alpha (app.py:9) 5\n"
        );
        let speedscope = String::from_utf8(text(Format::Speedscope)).unwrap();
        assert!(speedscope.contains("\"<task alpha>\""));
        let mut pprof = Vec::new();
        flate2::read::GzDecoder::new(&text(Format::Pprof)[..])
            .read_to_end(&mut pprof)
            .unwrap();
        assert!(pprof.windows(12).any(|w| w == b"<task alpha>"));
    }

    #[test]
    fn write_dispatches() {
        let profile = test_support::single();
        for format in [
            Format::Flamegraph,
            Format::Speedscope,
            Format::Collapsed,
            Format::Pprof,
            Format::Otlp,
        ] {
            let mut out = Vec::new();
            write(&profile, format, "t", &|_| None, &mut out).unwrap();
            if format == Format::Pprof {
                // The gzip magic.
                assert_eq!(out[..2], [0x1f, 0x8b]);
                continue;
            }
            if format == Format::Otlp {
                // A request: field 1 (resource_profiles) first.
                assert_eq!(out[0], 0x0a);
                continue;
            }
            let text = String::from_utf8(out).unwrap();
            match format {
                Format::Flamegraph => assert!(text.contains("<svg")),
                Format::Speedscope => assert!(text.starts_with('{')),
                Format::Collapsed => assert!(text.starts_with("main (app.py:1);f (app.py:5) 6\n")),
                Format::Pprof | Format::Otlp => unreachable!(),
            }
        }
    }
}
