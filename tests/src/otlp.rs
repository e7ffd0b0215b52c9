//! OTLP profiles as an independent consumer reads them: `tests/tools/otlp_receiver.py`, run by
//! the venv's Python with the upstream `opentelemetry-proto` classes (PyPI, pinned in
//! `tests/requirements.txt`), decodes each request or file and resolves it through its
//! dictionary into JSON; pyebpf's own generated code is never used to read what it wrote.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

/// Where `cargo xtask test` makes the tests' venv.
pub const DEFAULT_VENV: &str = "/var/cache/pyebpf/venv";

/// The Python of the tests' venv (`$PYEBPF_TEST_VENV`, default [`DEFAULT_VENV`]).
pub fn venv_python() -> PathBuf {
    let venv = std::env::var_os("PYEBPF_TEST_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_VENV));
    let python = venv.join("bin/python");
    assert!(
        python.exists(),
        "{} not found: the tests' venv is made by `cargo xtask test` (or set PYEBPF_TEST_VENV)",
        python.display()
    );
    python
}

fn receiver_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/otlp_receiver.py")
}

/// A binary `ExportProfilesServiceRequest` file, decoded.
pub fn decode_file(path: &Path) -> Value {
    let out = Command::new(venv_python())
        .arg(receiver_script())
        .arg("decode")
        .arg(path)
        .output()
        .expect("running the OTLP decoder");
    assert!(
        out.status.success(),
        "the upstream classes could not decode {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the decoder's JSON")
}

/// An OTLP/HTTP receiver on 127.0.0.1 that answers like a Collector; killed when dropped.
pub struct Receiver {
    child: Child,
    port: u16,
    out: PathBuf,
}

impl Receiver {
    /// Answers each of `script` in turn (`503`, `400`, `partial`), then 200.
    pub fn start(script: &[&str]) -> Receiver {
        let out = crate::temp_path("otlp-received", "jsonl");
        let mut child = Command::new(venv_python())
            .arg(receiver_script())
            .arg("serve")
            .arg(&out)
            .arg(script.join(","))
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the OTLP receiver");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("reading the receiver's port");
        let port = line
            .trim()
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the receiver did not start: {line:?}"));
        Receiver { child, port, out }
    }

    /// The base URL to give `--otlp`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request so far, decoded, with the status it was answered with.
    pub fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.out);
    }
}

/// One decoded sample: frames leaf first as `function file:line` (file name without its
/// directory), its attributes, and its value in sample periods.
#[derive(Clone, Debug)]
pub struct Sample {
    pub frames: Vec<String>,
    pub attributes: serde_json::Map<String, Value>,
    pub value: i64,
    /// The decoded frames, for what `frames` leaves out (mappings, frame types).
    pub raw_frames: Vec<Value>,
}

/// The samples of every profile of a decoded resource, with each value divided by the
/// profile's period (so a value is a sample count).
pub fn samples(resource: &Value) -> Vec<Sample> {
    let mut out = Vec::new();
    for scope in resource["scopes"].as_array().into_iter().flatten() {
        for profile in scope["profiles"].as_array().into_iter().flatten() {
            let period = profile["period"].as_i64().unwrap_or(1).max(1);
            for s in profile["samples"].as_array().into_iter().flatten() {
                let raw_frames: Vec<Value> = s["frames"].as_array().cloned().unwrap_or_default();
                let frames = raw_frames
                    .iter()
                    .map(|f| {
                        let file = f["file"].as_str().unwrap_or("");
                        let file = file.rsplit('/').next().unwrap_or(file);
                        format!(
                            "{} {file}:{}",
                            f["function"].as_str().unwrap_or("?"),
                            f["line"]
                        )
                    })
                    .collect();
                let value = s["values"][0].as_i64().expect("a value");
                assert_eq!(value % period, 0, "a value that is not whole periods: {s}");
                out.push(Sample {
                    frames,
                    attributes: s["attributes"].as_object().cloned().unwrap_or_default(),
                    value: value / period,
                    raw_frames,
                });
            }
        }
    }
    out
}

/// The resources of a decoded request whose attribute `key` is `value`.
pub fn resources_with<'a>(request: &'a Value, key: &str, value: &Value) -> Vec<&'a Value> {
    request["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| &r["attributes"][key] == value)
        .collect()
}
