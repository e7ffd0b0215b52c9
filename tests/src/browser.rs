//! Headless Chromium and the speedscope web app, the consumers people open flame graphs and
//! speedscope profiles with, and readers of what Chromium reports back (`--dump-dom`,
//! `--screenshot`).
//!
//! `cargo xtask test` installs both and passes their paths as `PYEBPF_CHROMIUM` and
//! `PYEBPF_SPEEDSCOPE`; when it could not, it passes why as `PYEBPF_CONSUMERS_ERROR`, and
//! [`chromium`] / [`speedscope_app`] fail with that reason. Run by hand (plain `cargo test`),
//! `chromium` from `PATH` and speedscope in its default place are used.
//!
//! The DOM is read with string scanning, not an HTML parser: Chromium serializes it the same way
//! every time, and the few things read here (`<title>`, table cells, `<g>`/`<title>`/`<rect>`
//! of an SVG) are flat.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::temp_path;

/// Where `cargo xtask test` installs speedscope with `npm install --prefix`.
pub const DEFAULT_SPEEDSCOPE_PREFIX: &str = "/var/cache/pyebpf/speedscope";

/// Why `cargo xtask test` could not install a consumer, if it said so.
fn install_error() -> String {
    match std::env::var("PYEBPF_CONSUMERS_ERROR") {
        Ok(err) => format!("`cargo xtask test` could not install it: {err}"),
        Err(_) => "run `cargo xtask test`, which installs it".to_string(),
    }
}

/// The Chromium binary: `$PYEBPF_CHROMIUM`, else `chromium` on `PATH`. Panics with the reason
/// when there is none.
pub fn chromium() -> PathBuf {
    let path = std::env::var_os("PYEBPF_CHROMIUM")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::split_paths(&std::env::var_os("PATH")?)
                .map(|dir| dir.join("chromium"))
                .find(|p| p.is_file())
        });
    match path {
        Some(path) if path.is_file() => path,
        _ => panic!(
            "chromium not found (these tests open pyebpf's output in it): {}",
            install_error()
        ),
    }
}

/// The speedscope app's directory (holding `index.html`): `$PYEBPF_SPEEDSCOPE`, else the
/// default install. Panics with the reason when it is missing.
pub fn speedscope_app() -> PathBuf {
    let app = std::env::var_os("PYEBPF_SPEEDSCOPE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(DEFAULT_SPEEDSCOPE_PREFIX).join("node_modules/speedscope/dist/release")
        });
    assert!(
        app.join("index.html").is_file(),
        "speedscope app not found at {} (these tests open profiles in it): {}",
        app.display(),
        install_error()
    );
    app
}

/// Headless Chromium with a fresh profile directory for every run.
pub struct Chromium {
    binary: PathBuf,
    /// Longest a run may take before it is killed and reported as hung.
    timeout: Duration,
}

/// What one Chromium run printed.
pub struct Run {
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Chromium's stderr without its complaints about the missing D-Bus (there is none here).
    pub fn messages(&self) -> String {
        let lines: Vec<&str> = self
            .stderr
            .lines()
            .filter(|l| !l.contains("dbus"))
            .collect();
        lines.join("\n")
    }
}

impl Chromium {
    /// Finds the binary now ([`chromium`]), so that a test without it fails before it records.
    pub fn new(timeout: Duration) -> Chromium {
        Chromium {
            binary: chromium(),
            timeout,
        }
    }

    /// Runs Chromium on `url` with `args` (e.g. `--dump-dom`); `Err` when it fails or hangs.
    pub fn run(&self, args: &[&str], url: &str) -> Result<Run, String> {
        let profile = temp_path("chromium", "d");
        let mut child = Command::new(&self.binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                // speedscope draws with WebGL: software WebGL must be asked for by name.
                "--enable-unsafe-swiftshader",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                "--window-size=1280,900",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .args(args)
            .arg(url)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.binary.display()))?;
        let mut stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let out = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stdout.read_to_string(&mut s);
            s
        });
        let err = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let run = Run {
            stdout: out.join().unwrap_or_default(),
            stderr: err.join().unwrap_or_default(),
        };
        let _ = std::fs::remove_dir_all(&profile);
        match status {
            Some(status) if status.success() => Ok(run),
            Some(status) => Err(format!("chromium failed ({status}): {}", run.messages())),
            None => Err(format!(
                "chromium did not finish within {:?} on {url}: {}",
                self.timeout,
                run.messages()
            )),
        }
    }

    /// The DOM of `url` after the page has had `budget_ms` of virtual time to load and run.
    pub fn dump_dom(&self, url: &str, budget_ms: u32) -> Result<String, String> {
        let budget = format!("--virtual-time-budget={budget_ms}");
        Ok(self.run(&["--dump-dom", &budget], url)?.stdout)
    }

    /// A PNG screenshot of `url`, written to `png`.
    pub fn screenshot(&self, url: &str, png: &Path, budget_ms: u32) -> Result<(), String> {
        let budget = format!("--virtual-time-budget={budget_ms}");
        let shot = format!("--screenshot={}", png.display());
        self.run(&[&shot, &budget], url)?;
        if png.is_file() {
            Ok(())
        } else {
            Err(format!("chromium wrote no screenshot to {}", png.display()))
        }
    }
}

/// Put into the `<head>` of the HTML pages [`StaticServer`] serves: `alert()` writes its message
/// into the DOM instead of opening a dialog. speedscope reports a file it cannot read with
/// `alert("Unrecognized format! ...")`, and in headless Chromium a dialog stops the page (and
/// its virtual time) until the run is killed.
pub const ALERT_TO_DOM: &str = "<script>window.alert = function (message) { \
     var note = document.createElement('div'); note.id = 'pyebpf-alert'; \
     note.textContent = 'alert: ' + message; document.documentElement.appendChild(note); };\
     </script>";

/// A static HTTP server on 127.0.0.1: `/profiles/NAME` from `profiles`, every other path from
/// `root`, with [`ALERT_TO_DOM`] in its HTML pages. One origin for the app and the profile, so
/// the app's `fetch` needs no CORS. Stops when dropped.
pub struct StaticServer {
    pub port: u16,
    stop: Arc<AtomicBool>,
}

impl StaticServer {
    pub fn start(root: &Path, profiles: HashMap<String, PathBuf>) -> StaticServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let root = root.to_path_buf();
        let profiles = Arc::new(profiles);
        let stopping = stop.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let (root, profiles) = (root.clone(), profiles.clone());
                std::thread::spawn(move || serve(stream, &root, &profiles));
            }
        });
        StaticServer { port, stop }
    }

    /// `http://127.0.0.1:PORT/PATH` (`path` starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

impl Drop for StaticServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop so that it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Answers one GET on `stream` and closes it.
fn serve(stream: TcpStream, root: &Path, profiles: &HashMap<String, PathBuf>) {
    let mut reader = BufReader::new(&stream);
    let mut request = String::new();
    if reader.read_line(&mut request).is_err() {
        return;
    }
    loop {
        let mut header = String::new();
        match reader.read_line(&mut header) {
            Ok(0) | Err(_) => break,
            Ok(_) if header.trim().is_empty() => break,
            Ok(_) => {}
        }
    }
    let path = request
        .split_whitespace()
        .nth(1)
        .unwrap_or("/")
        .split(['?', '#'])
        .next()
        .unwrap_or("/");
    let file = match path.strip_prefix("/profiles/") {
        Some(name) => profiles.get(name).cloned(),
        None if path.split('/').any(|part| part == "..") => None,
        None => Some(root.join(path.trim_start_matches('/'))),
    };
    let mut stream = &stream;
    let (status, kind, body) = match file.map(std::fs::read) {
        Some(Ok(body)) if path.ends_with(".html") => {
            let html = String::from_utf8_lossy(&body).replacen(
                "<head>",
                &format!("<head>{ALERT_TO_DOM}"),
                1,
            );
            ("200 OK", content_type(path), html.into_bytes())
        }
        Some(Ok(body)) => ("200 OK", content_type(path), body),
        _ => ("404 Not Found", "text/plain", b"not found".to_vec()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: \
         close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(&body);
}

fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next().unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" => "application/json",
        "wasm" => "application/wasm",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "svg" => "image/svg+xml",
        _ => "text/plain; charset=utf-8",
    }
}

/// `s` with `%`-escapes for everything but unreserved characters (for a URL in a URL).
pub fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Text with the entities Chromium writes when it serializes a DOM replaced by their characters.
pub fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&nbsp;", "\u{a0}")
        .replace("&amp;", "&")
}

/// The text of `html` with its tags removed, unescaped.
pub fn text_of(html: &str) -> String {
    let mut text = String::new();
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    unescape(&text)
}

/// The inner HTML of every `<tag ...>...</tag>` in `html`, in order (not nested in itself).
pub fn elements<'a>(html: &'a str, tag: &str) -> Vec<&'a str> {
    let open = format!("<{tag}");
    let close = format!("</{tag}>");
    let mut found = Vec::new();
    let mut rest = html;
    while let Some(at) = rest.find(&open) {
        let after = &rest[at + open.len()..];
        // `<tr` must not match `<track`: the name ends at a space, `>` or `/`.
        if !after.starts_with([' ', '>', '/']) {
            rest = after;
            continue;
        }
        let Some(gt) = after.find('>') else { break };
        if after[..gt].ends_with('/') {
            found.push("");
            rest = &after[gt + 1..];
            continue;
        }
        let body = &after[gt + 1..];
        let Some(end) = body.find(&close) else { break };
        found.push(&body[..end]);
        rest = &body[end + close.len()..];
    }
    found
}

/// The opening tags (`<tag ...>`, attributes included) of every `tag` in `html`.
pub fn open_tags<'a>(html: &'a str, tag: &str) -> Vec<&'a str> {
    let open = format!("<{tag}");
    let mut found = Vec::new();
    let mut rest = html;
    while let Some(at) = rest.find(&open) {
        let after = &rest[at..];
        let Some(gt) = after.find('>') else { break };
        if after[open.len()..].starts_with([' ', '>', '/']) {
            found.push(&after[..=gt]);
        }
        rest = &after[gt + 1..];
    }
    found
}

/// The value of attribute `name` in an opening tag, unescaped.
pub fn attribute(tag: &str, name: &str) -> Option<String> {
    let key = format!(" {name}=\"");
    let at = tag.find(&key)? + key.len();
    let end = tag[at..].find('"')?;
    Some(unescape(&tag[at..at + end]))
}

/// One row of speedscope's sandwich table: a symbol and its total and self shares, in percent
/// of the profile's weight, as the app shows them.
#[derive(Clone, Debug, PartialEq)]
pub struct SandwichRow {
    pub symbol: String,
    /// The `title` of the symbol cell: the frame's file.
    pub file: Option<String>,
    pub total_percent: f64,
    pub self_percent: f64,
}

/// What speedscope shows once it has loaded a profile, read from its DOM.
#[derive(Debug)]
pub struct SpeedscopeView {
    /// The document title (`<profile file's name> - speedscope`).
    pub title: String,
    /// All the text of the page (the toolbar names the active profile).
    pub text: String,
    pub rows: Vec<SandwichRow>,
}

/// Reads speedscope's DOM with `#view=sandwich`; `Err` unless it shows a loaded profile: the
/// app's error box, the title it has before loading, or no table row all mean it did not.
pub fn speedscope_view(dom: &str) -> Result<SpeedscopeView, String> {
    let title = elements(dom, "title")
        .first()
        .map(|t| unescape(t))
        .ok_or("no <title> in the DOM")?;
    let text = text_of(dom);
    let note = r#"<div id="pyebpf-alert">"#;
    if let Some(at) = dom.find(note) {
        let alert = &dom[at + note.len()..];
        let alert = unescape(&alert[..alert.find("</div>").unwrap_or(alert.len())]);
        return Err(format!("speedscope refused the file: {alert}"));
    }
    if text.contains("Something went wrong") {
        return Err(format!("speedscope shows its error box: {}", text.trim()));
    }
    if title == "speedscope" {
        return Err("speedscope did not load a profile (its title is still `speedscope`)".into());
    }
    let mut rows = Vec::new();
    for tr in elements(dom, "tr") {
        let cells = elements(tr, "td");
        let tds = open_tags(tr, "td");
        if cells.len() != 3 || tds.len() != 3 {
            continue;
        }
        rows.push(SandwichRow {
            symbol: text_of(cells[2]).trim().to_string(),
            file: attribute(tds[2], "title").filter(|f| !f.is_empty()),
            total_percent: percent(&text_of(cells[0]))?,
            self_percent: percent(&text_of(cells[1]))?,
        });
    }
    if rows.is_empty() {
        return Err("speedscope's sandwich table has no row".into());
    }
    Ok(SpeedscopeView { title, text, rows })
}

/// The share in a cell such as `7 (70%)`, `12 (4.5%)`, `1 (0.25%)`, `>99%` or `<0.01%`.
fn percent(cell: &str) -> Result<f64, String> {
    let inner = cell
        .rsplit_once('(')
        .and_then(|(_, p)| p.split_once("%)"))
        .map(|(p, _)| p)
        .ok_or_else(|| format!("no percentage in table cell {cell:?}"))?;
    let (bound, number) = match inner.strip_prefix('>') {
        Some(n) => (0.5, n),
        None => match inner.strip_prefix('<') {
            Some(n) => (-0.005, n),
            None => (0.0, inner),
        },
    };
    number
        .trim()
        .parse::<f64>()
        .map(|p| p + bound)
        .map_err(|_| format!("bad percentage in table cell {cell:?}"))
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn reads_sandwich_rows() {
        let dom = r#"<html><head><title>a &amp; b - speedscope</title></head><body>
            <table><thead><tr><th>Total</th><th>Self</th><th>Symbol Name</th></tr></thead></table>
            <table><tr class="x"><td class="c">7 (70%)<div><div style="width: 70%;"></div></div></td>
            <td>7 (70%)</td><td title="/w/chain.py" class="n"><span></span>leaf</td></tr>
            <tr><td>10 (100%)</td><td>0 (0.00%)</td><td title="/w/chain.py">&lt;module&gt;</td></tr>
            <tr><td>3 (&gt;99%)</td><td>1 (&lt;0.01%)</td><td>x</td></tr></table></body></html>"#;
        let view = speedscope_view(dom).unwrap();
        assert_eq!(view.title, "a & b - speedscope");
        assert_eq!(view.rows.len(), 3);
        assert_eq!(view.rows[0].symbol, "leaf");
        assert_eq!(view.rows[0].file.as_deref(), Some("/w/chain.py"));
        assert_eq!(view.rows[0].total_percent, 70.0);
        assert_eq!(view.rows[1].symbol, "<module>");
        assert_eq!(view.rows[1].self_percent, 0.0);
        assert_eq!(view.rows[2].total_percent, 99.5);
        assert!(view.rows[2].self_percent < 0.01);
    }

    #[test]
    fn an_unloaded_or_failed_app_is_an_error() {
        let empty = "<html><head><title>speedscope</title></head><body></body></html>";
        assert!(speedscope_view(empty).is_err());
        let failed = "<html><head><title>x - speedscope</title></head><body><div>😿 Something \
                      went wrong.</div></body></html>";
        assert!(speedscope_view(failed).unwrap_err().contains("error box"));
        let no_rows = "<html><head><title>x - speedscope</title></head><body></body></html>";
        assert!(speedscope_view(no_rows).is_err());
        let alerted = "<html><head><title>speedscope</title></head><body></body>\
                       <div id=\"pyebpf-alert\">alert: Unrecognized format!</div></html>";
        assert!(speedscope_view(alerted)
            .unwrap_err()
            .contains("Unrecognized format!"));
    }

    #[test]
    fn url_encoding() {
        assert_eq!(
            url_encode("http://127.0.0.1:80/profiles/a b.json"),
            "http%3A%2F%2F127.0.0.1%3A80%2Fprofiles%2Fa%20b.json"
        );
    }

    #[test]
    fn elements_and_attributes() {
        let svg = r#"<svg><g><title>a (1 samples)</title><rect x="1" fill="rgb(1,2,3)"/></g><g><title>b</title></g></svg>"#;
        let titles: Vec<_> = elements(svg, "g")
            .iter()
            .flat_map(|g| elements(g, "title"))
            .collect();
        assert_eq!(titles, ["a (1 samples)", "b"]);
        let rects = open_tags(svg, "rect");
        assert_eq!(attribute(rects[0], "fill").as_deref(), Some("rgb(1,2,3)"));
        assert!(elements("<tr><track></track></tr>", "track").len() == 1);
        assert!(open_tags("<track>", "tr").is_empty());
    }
}
