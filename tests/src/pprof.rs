//! `go tool pprof`, the consumer people read pprof profiles with, run offline
//! (`GOTOOLCHAIN=local`, `GOPROXY=off`) with `HOME` and `GOCACHE` in a temporary directory, and
//! parsers of what it prints: `-raw` (the profile as decoded), `-traces` (each sample with its
//! labels) and `-top`. `cargo xtask test` installs `golang-go` when `go` is missing.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::temp_path;

/// `go`: the one on `PATH`, else Debian's.
pub fn go_binary() -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("go"))
            .find(|p| p.is_file())
    });
    let go = on_path.unwrap_or_else(|| PathBuf::from("/usr/bin/go"));
    assert!(
        go.is_file(),
        "go not found: these tests read profiles with `go tool pprof`; install golang-go \
         (`cargo xtask test` does)"
    );
    go
}

/// `go tool pprof` with a private, throwaway `HOME` and build cache and no network.
pub struct Pprof {
    pub home: PathBuf,
    /// Run inside this network namespace (`nsenter --net=`), to fetch from a server that
    /// listens in a container's own namespace.
    pub netns: Option<PathBuf>,
}

impl Default for Pprof {
    fn default() -> Self {
        Pprof::new()
    }
}

impl Pprof {
    pub fn new() -> Pprof {
        let home = temp_path("gohome", "d");
        std::fs::create_dir_all(&home).expect("creating a HOME for go");
        Pprof { home, netns: None }
    }

    /// `go tool pprof` run inside the network namespace `netns` (e.g. `/proc/PID/ns/net`).
    pub fn in_netns(netns: impl Into<PathBuf>) -> Pprof {
        let mut pprof = Pprof::new();
        pprof.netns = Some(netns.into());
        pprof
    }

    /// Runs `go tool pprof ARGS FILE`; returns its stdout and stderr. Panics when it fails.
    pub fn output(&self, args: &[&str], file: &Path) -> (String, String) {
        let mut cmd = match &self.netns {
            Some(netns) => {
                let mut cmd = Command::new("nsenter");
                cmd.arg(format!("--net={}", netns.display()))
                    .arg("--")
                    .arg(go_binary());
                cmd
            }
            None => Command::new(go_binary()),
        };
        let out = cmd
            .args(["tool", "pprof"])
            .args(args)
            .arg(file)
            .env("GOTOOLCHAIN", "local")
            .env("GOPROXY", "off")
            .env("GOFLAGS", "-mod=mod")
            .env("GOTELEMETRY", "off")
            .env("HOME", &self.home)
            .env("GOPATH", self.home.join("go"))
            .env("GOCACHE", self.home.join("cache"))
            .env("PPROF_TMPDIR", self.home.join("pprof"))
            .env_remove("PPROF_BINARY_PATH")
            .output()
            .expect("running go tool pprof");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "go tool pprof {args:?} {} failed ({}):\n{stderr}\n{stdout}",
            file.display(),
            out.status
        );
        (stdout, stderr)
    }

    pub fn run(&self, args: &[&str], file: &Path) -> String {
        self.output(args, file).0
    }

    pub fn raw(&self, file: &Path) -> Raw {
        Raw::parse(&self.run(&["-raw"], file))
    }

    /// Every sample as `-traces` prints it, its value in samples.
    pub fn traces(&self, file: &Path, extra: &[&str]) -> Vec<Trace> {
        let mut args = vec!["-traces", "-sample_index=samples"];
        args.extend(extra);
        parse_traces(&self.run(&args, file))
    }

    /// `-top` with every node and no cut-off.
    pub fn top(&self, file: &Path, extra: &[&str]) -> Top {
        let mut args = vec![
            "-top",
            "-nodecount=1000",
            "-nodefraction=0",
            "-edgefraction=0",
        ];
        args.extend(extra);
        Top::parse(&self.run(&args, file))
    }
}

impl Drop for Pprof {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

/// `go tool pprof -raw`: the profile as pprof decoded it.
#[derive(Debug, Default)]
pub struct Raw {
    pub comments: Vec<String>,
    /// `cpu nanoseconds`
    pub period_type: String,
    pub period: i64,
    /// The sample types line, e.g. `samples/count cpu/nanoseconds[dflt]`.
    pub sample_types: String,
    pub samples: Vec<RawSample>,
    pub locations: HashMap<u64, Loc>,
}

#[derive(Debug)]
pub struct RawSample {
    pub values: Vec<i64>,
    /// Leaf first.
    pub locations: Vec<u64>,
    pub labels: BTreeMap<String, String>,
}

/// A location's one line: `<function> <file>:<line> s=<start line>(<system name>)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loc {
    pub function: String,
    pub file: String,
    pub line: u32,
    pub start_line: u32,
}

impl Raw {
    pub fn parse(text: &str) -> Raw {
        #[derive(PartialEq)]
        enum Section {
            Header,
            Samples,
            Locations,
            Other,
        }
        let mut raw = Raw::default();
        let mut section = Section::Header;
        for line in text.lines() {
            match line.trim_end() {
                "Samples:" => {
                    section = Section::Samples;
                    continue;
                }
                "Locations" => {
                    section = Section::Locations;
                    continue;
                }
                "Mappings" => {
                    section = Section::Other;
                    continue;
                }
                _ => {}
            }
            match section {
                Section::Header => {
                    if let Some(c) = line.strip_prefix("Comment: ") {
                        raw.comments.push(c.to_string());
                    } else if let Some(t) = line.strip_prefix("PeriodType: ") {
                        raw.period_type = t.trim().to_string();
                    } else if let Some(p) = line.strip_prefix("Period: ") {
                        raw.period = p.trim().parse().expect("bad Period line");
                    }
                }
                Section::Samples => {
                    if raw.sample_types.is_empty() {
                        raw.sample_types = line.trim().to_string();
                    } else if let Some(sample) = parse_raw_sample(line) {
                        raw.samples.push(sample);
                    } else if !line.trim().is_empty() {
                        let sample = raw
                            .samples
                            .last_mut()
                            .unwrap_or_else(|| panic!("labels before any sample: {line:?}"));
                        parse_raw_labels(line, &mut sample.labels);
                    }
                }
                Section::Locations => {
                    if let Some((id, loc)) = parse_raw_location(line) {
                        raw.locations.insert(id, loc);
                    }
                }
                Section::Other => {}
            }
        }
        raw
    }

    /// A sample's frames, leaf first.
    pub fn frames(&self, sample: &RawSample) -> Vec<Loc> {
        sample
            .locations
            .iter()
            .map(|id| {
                self.locations
                    .get(id)
                    .unwrap_or_else(|| panic!("sample names unknown location {id}"))
                    .clone()
            })
            .collect()
    }

    pub fn count(&self) -> i64 {
        self.samples.iter().map(|s| s.values[0]).sum()
    }
}

/// ` <v1> <v2>: <loc> <loc> ...`
pub fn parse_raw_sample(line: &str) -> Option<RawSample> {
    let (values, locations) = line.split_once(':')?;
    let values: Vec<i64> = values
        .split_whitespace()
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    let locations: Vec<u64> = locations
        .split_whitespace()
        .map(|l| l.parse().ok())
        .collect::<Option<_>>()?;
    if values.is_empty() {
        return None;
    }
    Some(RawSample {
        values,
        locations,
        labels: BTreeMap::new(),
    })
}

/// `key:[value] key:[value]`, where a value may hold spaces (`process:[python3 app.py]`).
pub fn parse_raw_labels(line: &str, into: &mut BTreeMap<String, String>) {
    let mut rest = line.trim();
    while let Some((key, after)) = rest.split_once(":[") {
        // The value ends at the `]` that ends the line or comes before the next ` key:[`.
        let end = after
            .match_indices(']')
            .map(|(i, _)| i)
            .find(|&i| {
                let next = &after[i + 1..];
                next.trim().is_empty()
                    || next
                        .strip_prefix(' ')
                        .and_then(|n| n.split_once(":["))
                        .is_some_and(|(k, _)| is_identifier(k))
            })
            .unwrap_or_else(|| panic!("unterminated label value in {line:?}"));
        let previous = into.insert(key.trim().to_string(), after[..end].to_string());
        assert!(previous.is_none(), "label {key} printed twice: {line:?}");
        rest = after[end + 1..].trim_start();
    }
}

pub fn is_identifier(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `     1: 0x0 M=1 leaf /path/chain.py:8 s=6()`
pub fn parse_raw_location(line: &str) -> Option<(u64, Loc)> {
    let (id, rest) = line.trim_start().split_once(": ")?;
    let id = id.parse().ok()?;
    let (_, rest) = rest.split_once(" M=")?;
    let (_, rest) = rest.split_once(' ')?;
    let (name_file_line, start) = rest.rsplit_once(" s=")?;
    let start_line = start.split('(').next()?.parse().ok()?;
    let (name_file, line) = name_file_line.rsplit_once(':')?;
    let (function, file) = name_file.rsplit_once(' ')?;
    Some((
        id,
        Loc {
            function: function.to_string(),
            file: file.to_string(),
            line: line.parse().ok()?,
            start_line,
        },
    ))
}

/// One sample of `go tool pprof -traces -sample_index=samples`.
#[derive(Debug)]
pub struct Trace {
    pub labels: BTreeMap<String, String>,
    pub count: i64,
    /// Names as the report shows them (with `-lines`, `name file:line`), leaf first.
    pub stack: Vec<String>,
}

impl Trace {
    pub fn label(&self, key: &str) -> &str {
        self.labels
            .get(key)
            .unwrap_or_else(|| panic!("sample without a {key} label: {self:?}"))
    }

    /// The `service_name` identity gives a process run as `python <program>.py`: the program,
    /// unless the process runs in a container, which names it by its short id.
    pub fn program_service<'a>(&'a self, program: &'a str) -> &'a str {
        match self.labels.get("container_id") {
            Some(id) => id.get(..12).unwrap_or(id),
            None => program,
        }
    }

    pub fn has(&self, function: &str) -> bool {
        self.stack.iter().any(|f| f == function)
    }
}

/// Blocks between `-----------+----` lines: labels (`%10s:  %s`), then the stack (`%10s   %s`,
/// the value on the leaf's line only).
pub fn parse_traces(text: &str) -> Vec<Trace> {
    let mut traces = Vec::new();
    let mut current: Option<Trace> = None;
    for line in text.lines() {
        if line.starts_with("-----------+") {
            traces.extend(current.take());
            current = Some(Trace {
                labels: BTreeMap::new(),
                count: 0,
                stack: Vec::new(),
            });
            continue;
        }
        let Some(trace) = current.as_mut() else {
            continue; // the header
        };
        let trimmed = line.trim_start();
        if trimmed.is_empty() {
            continue;
        }
        if trace.stack.is_empty() {
            if let Some((key, value)) = trimmed.split_once(":  ") {
                if is_identifier(key) {
                    trace.labels.insert(key.to_string(), value.to_string());
                    continue;
                }
            }
            let (count, name) = trimmed
                .split_once("   ")
                .unwrap_or_else(|| panic!("bad first stack line {line:?}"));
            trace.count = count
                .parse()
                .unwrap_or_else(|_| panic!("bad sample count in {line:?}"));
            trace.stack.push(name.to_string());
        } else {
            trace.stack.push(trimmed.to_string());
        }
    }
    // The last block is the empty one after the closing separator.
    traces.extend(current.filter(|t| !t.stack.is_empty()));
    traces
}

/// `go tool pprof -top`: the total and each node's flat and cumulative shares.
#[derive(Debug)]
pub struct Top {
    /// `Showing nodes accounting for <shown>, P% of <total> total`
    pub shown: String,
    pub total: String,
    pub rows: Vec<TopRow>,
}

#[derive(Debug)]
pub struct TopRow {
    pub flat: String,
    pub flat_pct: f64,
    pub cum_pct: f64,
    pub name: String,
}

impl Top {
    pub fn parse(text: &str) -> Top {
        let showing = text
            .lines()
            .find_map(|l| l.strip_prefix("Showing nodes accounting for "))
            .unwrap_or_else(|| panic!("no `Showing nodes` line in:\n{text}"));
        let (shown, rest) = showing.split_once(", ").expect("bad Showing line");
        let total = rest
            .split_once(" of ")
            .and_then(|(_, t)| t.strip_suffix(" total"))
            .expect("bad Showing line");
        let pct = |s: &str| -> Option<f64> { s.strip_suffix('%')?.parse().ok() };
        let rows = text
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("flat "))
            .skip(1)
            .filter_map(|l| {
                let mut fields = l.split_whitespace();
                let flat = fields.next()?.to_string();
                let flat_pct = pct(fields.next()?)?;
                let _sum_pct = pct(fields.next()?)?;
                let _cum = fields.next()?;
                let cum_pct = pct(fields.next()?)?;
                let name = fields.collect::<Vec<_>>().join(" ");
                Some(TopRow {
                    flat,
                    flat_pct,
                    cum_pct,
                    name,
                })
            })
            .collect();
        Top {
            shown: shown.to_string(),
            total: total.to_string(),
            rows,
        }
    }

    pub fn row(&self, name: &str) -> &TopRow {
        self.rows
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no {name:?} row in -top: {self:#?}"))
    }
}

/// `1234ns` (with `-unit=ns`) as a number.
pub fn nanoseconds(value: &str) -> i64 {
    value
        .strip_suffix("ns")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("not a nanosecond value: {value:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers_read_pprof_text() {
        let raw = Raw::parse(
            "Comment: pyebpf record: 3 samples\nPeriodType: cpu nanoseconds\nPeriod: 5000000\n\
             Samples:\nsamples/count cpu/nanoseconds[dflt]\n          3   15000000: 1 2 \n\
             \x20               process:[python3 a b.py] service_name:[x] thread_name:[Thread-1 (run)]\n\
             \x20               pid:[7] tid:[8]\nLocations\n     1: 0x0 M=1 <unknown code object> :0 s=0()\n\
             \x20    2: 0x0 M=1 <module> /x/a.py:20 s=1()\nMappings\n1: 0x0/0x0/0x0   [FN]\n",
        );
        assert_eq!(raw.period, 5_000_000);
        assert_eq!(raw.period_type, "cpu nanoseconds");
        let s = &raw.samples[0];
        assert_eq!(
            (s.values.clone(), s.locations.clone()),
            (vec![3, 15_000_000], vec![1, 2])
        );
        assert_eq!(s.labels["process"], "python3 a b.py");
        assert_eq!(s.labels["thread_name"], "Thread-1 (run)");
        assert_eq!(s.labels["pid"], "7");
        assert_eq!(s.labels["tid"], "8");
        assert_eq!(raw.locations[&1].function, "<unknown code object>");
        assert_eq!(raw.locations[&1].file, "");
        assert_eq!(
            raw.locations[&2],
            Loc {
                function: "<module>".into(),
                file: "/x/a.py".into(),
                line: 20,
                start_line: 1
            }
        );
        let traces = parse_traces(
            "Type: samples\n-----------+------\n   process:  python3 a.py\nservice_name:  a\n\
             \x20      pid:  7\n        12   leaf /a.py:8\n             <module> /a.py:20\n\
             -----------+------\n",
        );
        assert_eq!(traces.len(), 1);
        assert_eq!(traces[0].count, 12);
        assert_eq!(traces[0].label("service_name"), "a");
        assert_eq!(traces[0].stack, ["leaf /a.py:8", "<module> /a.py:20"]);
    }
}
