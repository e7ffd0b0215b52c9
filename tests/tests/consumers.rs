//! Every `pyebpf record -f` format opened by a program people read it with: the real BPF
//! programs sample a real interpreter, and every check is on what that consumer shows.
//!
//! - speedscope JSON and collapsed stacks: the speedscope web app (the npm release, served with
//!   the profile from one 127.0.0.1 origin) in headless Chromium, read through its DOM. The
//!   flame graph itself is a WebGL canvas, but the title, the toolbar and the sandwich view's
//!   table (`#view=sandwich`: one row per frame with its total and self share) are DOM; the
//!   shares it shows must be those of the file. Collapsed stacks go to speedscope too: it is
//!   the one independent reader of that format we can install (inferno, the other, is the
//!   library our own SVG writer is built on, so the flame graph test covers it already).
//! - SVG flame graph: Chromium parses it (`--dump-dom`: an `<svg>` root, no parser error, a
//!   titled frame for each function of the chain, widths that match the counts) and draws it
//!   (`--screenshot`: not blank, and the leaf frame's fill is on the picture).
//! - pprof: `go tool pprof`, in tests/tests/pprof.rs.
//!
//! [`every_format_has_a_consumer_test`] fails when `record --help` lists a format that none of
//! these covers.
//!
//! One interpreter (the first found: Debian's python3.11, present on every machine of ours):
//! the writers work on the aggregated profile, which carries nothing that depends on the
//! CPython version, and frames on every version are checked by record.rs and pprof.rs. The
//! file runs in about half a minute. `cargo xtask test` installs Chromium and speedscope
//! (tests/src/browser.rs says how they are found); without them these tests fail and say why.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tests::browser::{
    attribute, elements, open_tags, speedscope_app, speedscope_view, url_encode, Chromium,
    SandwichRow, SpeedscopeView, StaticServer,
};
use tests::{
    interpreters_logged, marker_lines, parse_collapsed, parse_label, pyebpf_bin, temp_path,
    Interpreter, Workload,
};

/// How long each recording lasts, in seconds, and at what rate: a workload on a loaded machine
/// (other builds and tests running) may get a tenth of a CPU, 50 samples.
const SECONDS: &str = "2";
const RATE: &str = "250";
/// Fewest samples a recording must hold for what the consumer shows to mean something.
const MIN_SAMPLES: u64 = 10;
/// chain.py's functions, root first: the flame graph's frames.
const CHAIN: [&str; 4] = ["<module>", "top", "mid", "leaf"];
/// split.py's functions: the speedscope tests use it because its shares are not all 100%
/// (`seventy` and `thirty` split the time 70/30), so that comparing the shares speedscope
/// shows with the file's tells something.
const SPLIT: [&str; 4] = ["<module>", "seventy", "thirty", "unit"];
/// Virtual time Chromium gives a page to load, fetch and render before it is read.
const BUDGET_MS: u32 = 5000;
/// Largest gap, in percentage points, between a share speedscope shows (rounded to 0.01 to 1
/// point, depending on its size) and the file's.
const ROUNDING: f64 = 1.0;

/// The tests take turns: a recording needs a CPU for the workload, and Chromium wants both.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The first interpreter found (probed once for the whole file).
fn interpreter() -> Interpreter {
    static FIRST: std::sync::OnceLock<Option<Interpreter>> = std::sync::OnceLock::new();
    FIRST
        .get_or_init(|| interpreters_logged().into_iter().next())
        .clone()
        .expect("no supported interpreter found")
}

/// Chromium, or a panic saying why it is missing.
fn chromium() -> Chromium {
    Chromium::new(tests::stretch(Duration::from_secs(60)))
}

/// A file `pyebpf record` wrote; removed when dropped.
struct Recorded {
    path: PathBuf,
}

impl Drop for Recorded {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Records `script` under `interp` for [`SECONDS`] with `-f format`; panics unless it works.
fn record(interp: &Interpreter, script: &str, format: &str, ext: &str) -> Recorded {
    let recorded = Recorded {
        path: temp_path(&format!("consumer-{format}"), ext),
    };
    let workload = Workload::start(interp, script, &[]);
    let out = Command::new(pyebpf_bin())
        .args(["record", "-f", format, "-o"])
        .arg(&recorded.path)
        .args(["-p", &workload.pid().to_string(), "-d", SECONDS, "-r", RATE])
        .output()
        .expect("running pyebpf");
    drop(workload);
    assert!(
        out.status.success() && recorded.path.is_file(),
        "{}: pyebpf record -f {format} failed ({}): {}",
        interp.label,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    recorded
}

fn file_name(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

/// speedscope at `server`, on `/profiles/NAME` in its sandwich view, as its DOM shows it.
/// No `&title=`: the app would show that instead of the name it read from the file.
fn open_in_speedscope(
    browser: &Chromium,
    server: &StaticServer,
    name: &str,
) -> Result<SpeedscopeView, String> {
    let profile = server.url(&format!("/profiles/{name}"));
    let url = server.url(&format!(
        "/index.html#profileURL={}&view=sandwich",
        url_encode(&profile)
    ));
    let dom = browser.dump_dom(&url, BUDGET_MS)?;
    speedscope_view(&dom)
}

/// A frame as a consumer names it, with its total and self share of the weight in percent.
#[derive(Debug)]
struct Share {
    name: String,
    file: Option<String>,
    total: f64,
    own: f64,
}

/// Shares of every frame on root-first `stacks` with their weights; `key` names frame `F`.
fn shares<F: Clone + Eq + std::hash::Hash>(
    stacks: &[(Vec<F>, u64)],
    key: impl Fn(&F) -> (String, Option<String>),
) -> Vec<Share> {
    let sum: u64 = stacks.iter().map(|(_, w)| w).sum();
    let mut total: HashMap<F, u64> = HashMap::new();
    let mut own: HashMap<F, u64> = HashMap::new();
    for (stack, weight) in stacks {
        let distinct: std::collections::HashSet<&F> = stack.iter().collect();
        for frame in distinct {
            *total.entry(frame.clone()).or_default() += weight;
        }
        if let Some(leaf) = stack.last() {
            *own.entry(leaf.clone()).or_default() += weight;
        }
    }
    total
        .into_iter()
        .map(|(frame, t)| {
            let (name, file) = key(&frame);
            Share {
                name,
                file,
                total: 100.0 * t as f64 / sum as f64,
                own: 100.0 * own.get(&frame).copied().unwrap_or(0) as f64 / sum as f64,
            }
        })
        .collect()
}

/// Every row speedscope shows is a frame of the file with the same total and self share, and
/// each of `wanted` (a row's symbol) is shown.
fn check_rows(rows: &[SandwichRow], expected: &[Share], wanted: &[String]) {
    for row in rows {
        let matches = expected.iter().any(|s| {
            s.name == row.symbol
                && s.file == row.file
                && (s.total - row.total_percent).abs() <= ROUNDING
                && (s.own - row.self_percent).abs() <= ROUNDING
        });
        assert!(
            matches,
            "speedscope shows {row:?}, which no frame of the file has; the file's: {expected:#?}"
        );
    }
    for name in wanted {
        assert!(
            rows.iter().any(|r| &r.symbol == name),
            "speedscope shows no row for {name:?}; rows: {rows:#?}"
        );
    }
}

/// `-f speedscope` loads in the speedscope app: the title is the file's name, the toolbar
/// names the active profile, and the sandwich table lists split.py's functions with the shares
/// the file gives them. The same check fails on a truncated copy of that file, so it can fail.
#[test]
fn speedscope_app_loads_the_recorded_profile() {
    let _turn = one_at_a_time();
    let browser = chromium();
    let app = speedscope_app();
    let interp = interpreter();
    let recorded = record(&interp, "split.py", "speedscope", "json");
    let text = std::fs::read_to_string(&recorded.path).expect("reading the profile");
    let json: Value = serde_json::from_str(&text).expect("the profile is JSON");

    let frames = json["shared"]["frames"].as_array().expect("shared.frames");
    let active = json["activeProfileIndex"].as_u64().unwrap_or(0) as usize;
    let profile = &json["profiles"][active];
    let stacks: Vec<(Vec<usize>, u64)> = profile["samples"]
        .as_array()
        .expect("samples")
        .iter()
        .zip(profile["weights"].as_array().expect("weights"))
        .map(|(s, w)| {
            let stack = s.as_array().unwrap();
            let ids = stack.iter().map(|i| i.as_u64().unwrap() as usize);
            (ids.collect(), w.as_u64().unwrap())
        })
        .collect();
    let weight: u64 = stacks.iter().map(|(_, w)| w).sum();
    assert!(
        weight >= MIN_SAMPLES,
        "{}: only {weight} samples",
        interp.label
    );
    let expected = shares(&stacks, |&i| {
        let frame = &frames[i];
        let name = frame["name"].as_str().unwrap_or_default().to_string();
        (name, frame["file"].as_str().map(str::to_string))
    });
    let wanted: Vec<String> = SPLIT.iter().map(|f| f.to_string()).collect();

    // The same file cut in half: not JSON any more, which speedscope must refuse.
    let broken = Recorded {
        path: temp_path("consumer-broken", "json"),
    };
    std::fs::write(&broken.path, &text.as_bytes()[..text.len() / 2]).unwrap();
    let server = StaticServer::start(
        &app,
        HashMap::from([
            ("recorded.json".to_string(), recorded.path.clone()),
            ("broken.json".to_string(), broken.path.clone()),
        ]),
    );

    let view = open_in_speedscope(&browser, &server, "recorded.json")
        .unwrap_or_else(|e| panic!("speedscope did not load pyebpf's profile: {e}"));
    let name = json["name"].as_str().expect("the file's name");
    assert_eq!(view.title, format!("{name} - speedscope"));
    let active_name = profile["name"].as_str().expect("the profile's name");
    assert!(
        view.text.contains(active_name),
        "the toolbar does not name the profile {active_name:?}: {}",
        view.text
    );
    check_rows(&view.rows, &expected, &wanted);
    let hot = view.rows.iter().find(|r| r.symbol == "seventy").unwrap();
    assert!(
        hot.file
            .as_deref()
            .is_some_and(|f| f.ends_with("/split.py")),
        "seventy's file: {hot:?}"
    );
    eprintln!("speedscope shows: {:#?}", view.rows);

    let err = open_in_speedscope(&browser, &server, "broken.json")
        .expect_err("the check passed on a truncated profile: it cannot tell a refused file");
    eprintln!("truncated profile, as expected: {err}");
}

/// `-f collapsed` loads in the speedscope app, whose collapsed-stack importer is a reader of
/// its own: every frame label it lists carries the share the file gives it, and split.py's
/// functions are there with their `function (file:line)` labels.
#[test]
fn speedscope_app_reads_collapsed_stacks() {
    let _turn = one_at_a_time();
    let browser = chromium();
    let app = speedscope_app();
    let interp = interpreter();
    let recorded = record(&interp, "split.py", "collapsed", "txt");
    let text = std::fs::read_to_string(&recorded.path).expect("reading the stacks");
    let stacks = parse_collapsed(&text);
    let weight: u64 = stacks.iter().map(|(_, w)| w).sum();
    assert!(
        weight >= MIN_SAMPLES,
        "{}: only {weight} samples",
        interp.label
    );
    let expected = shares(&stacks, |label: &String| (label.clone(), None));
    // One label of each function (any line of it).
    let wanted: Vec<String> = SPLIT
        .iter()
        .map(|function| {
            let label = stacks
                .iter()
                .flat_map(|(s, _)| s)
                .find(|l| {
                    parse_label(l).is_some_and(|p| p.function == *function && p.file == "split.py")
                })
                .unwrap_or_else(|| panic!("no {function} frame in the collapsed stacks: {text}"));
            label.clone()
        })
        .collect();

    let name = file_name(&recorded.path);
    let server = StaticServer::start(&app, HashMap::from([(name.clone(), recorded.path.clone())]));
    let view = open_in_speedscope(&browser, &server, &name)
        .unwrap_or_else(|e| panic!("speedscope did not load pyebpf's collapsed stacks: {e}"));
    assert_eq!(view.title, format!("{name} - speedscope"));
    check_rows(&view.rows, &expected, &wanted);
    eprintln!("speedscope shows: {:#?}", view.rows);
}

/// One frame of an inferno flame graph: its `<title>` and the `<rect>` drawn for it.
#[derive(Debug)]
struct SvgFrame {
    title: String,
    rect: String,
}

/// Each `<title>` of the frames in `svg`, paired with the `<rect>` that follows it in its `<g>`.
fn svg_frames(svg: &str) -> Vec<SvgFrame> {
    svg.split("<g>")
        .skip(1)
        .filter_map(|g| {
            let title = elements(g, "title").first()?.to_string();
            let rect = open_tags(g, "rect").first()?.to_string();
            Some(SvgFrame {
                title: tests::browser::unescape(&title),
                rect,
            })
        })
        .collect()
}

/// `Ok` when a `--dump-dom` is a parsed SVG document: the root is `<svg>` in the SVG
/// namespace, and there is no `<parsererror>` (which Chromium puts into what it could parse
/// when the XML is bad).
fn parsed_svg(dom: &str) -> Result<(), String> {
    let root = root_tag(dom);
    if !(root.starts_with("<svg ") && root.contains(r#"xmlns="http://www.w3.org/2000/svg""#)) {
        return Err(format!("the document is not an SVG (root {root})"));
    }
    if dom.contains("<parsererror") {
        return Err("Chromium reports an XML parser error".into());
    }
    Ok(())
}

/// The opening tag of a serialized document's root element (after its doctype and comments).
fn root_tag(dom: &str) -> &str {
    let mut rest = dom.trim_start();
    while rest.starts_with("<!") || rest.starts_with("<?") {
        let end = if rest.starts_with("<!--") {
            rest.find("-->").map(|i| i + 3)
        } else {
            rest.find('>').map(|i| i + 1)
        };
        rest = rest[end.unwrap_or(rest.len())..].trim_start();
    }
    rest.find('>').map_or(rest, |i| &rest[..=i])
}

/// `label (1,234 samples, 56.78%)` -> (`label`, 1234).
fn title_count(title: &str) -> Option<(&str, u64)> {
    let (label, rest) = title.rsplit_once(" (")?;
    let count = rest.split_whitespace().next()?.replace(',', "");
    Some((label, count.parse().ok()?))
}

/// A length attribute such as `12.5%` or `12.5`, as a number.
fn length(tag: &str, name: &str) -> Option<f64> {
    attribute(tag, name)?.trim_end_matches('%').parse().ok()
}

/// `-f flamegraph` parses as SVG in Chromium, with a titled frame for each function of the
/// chain whose width matches its count, and draws: the screenshot is not blank and shows the
/// leaf frame's fill.
#[test]
fn flamegraph_svg_parses_and_draws_in_chromium() {
    let _turn = one_at_a_time();
    let browser = chromium();
    let interp = interpreter();
    let recorded = record(&interp, "chain.py", "flamegraph", "svg");
    let url = format!("file://{}", recorded.path.display());
    let dom = browser
        .dump_dom(&url, 2000)
        .unwrap_or_else(|e| panic!("chromium could not open the flame graph: {e}"));
    if let Err(e) = parsed_svg(&dom) {
        panic!("{e}: {}", &dom[..dom.len().min(2000)]);
    }

    let frames = svg_frames(&dom);
    let lines = marker_lines("chain.py");
    let total_frame = frames
        .iter()
        .find(|f| f.title.starts_with("all ("))
        .unwrap_or_else(|| panic!("no `all` frame: {frames:#?}"));
    let (_, total) = title_count(&total_frame.title).expect("the `all` frame's count");
    assert!(total >= MIN_SAMPLES, "only {total} samples");
    let full_width = length(&total_frame.rect, "width").expect("the `all` frame's width");
    let mut counts = Vec::new();
    for function in CHAIN {
        let marker = if function == "<module>" {
            "module"
        } else {
            function
        };
        let frame = frames
            .iter()
            .filter_map(|f| Some((f, title_count(&f.title)?)))
            .find(|(_, (label, _))| {
                parse_label(label).is_some_and(|p| {
                    p.function == function && p.file == "chain.py" && p.line == lines[marker]
                })
            })
            .unwrap_or_else(|| panic!("no frame for {function} in the flame graph: {frames:#?}"));
        let (f, (_, count)) = frame;
        let width = length(&f.rect, "width").expect("a frame's width");
        let expected = full_width * count as f64 / total as f64;
        assert!(
            (width - expected).abs() <= 0.01 * full_width + 0.01,
            "{function}: width {width} for {count}/{total} samples (expected {expected}): {f:?}"
        );
        counts.push((function, count, f));
    }
    // Root first: each function's frame holds at least its callee's samples.
    for pair in counts.windows(2) {
        assert!(
            pair[0].1 >= pair[1].1 && pair[1].1 > 0,
            "counts not nested: {:?} then {:?}",
            (pair[0].0, pair[0].1),
            (pair[1].0, pair[1].1)
        );
    }

    // The same SVG cut in half must fail the check: it can tell a document Chromium refused.
    let svg = std::fs::read(&recorded.path).expect("reading the flame graph");
    let broken = Recorded {
        path: temp_path("consumer-broken", "svg"),
    };
    std::fs::write(&broken.path, &svg[..svg.len() / 2]).unwrap();
    let broken_url = format!("file://{}", broken.path.display());
    let broken_dom = browser
        .dump_dom(&broken_url, 2000)
        .unwrap_or_else(|e| panic!("chromium could not open the truncated flame graph: {e}"));
    let err = parsed_svg(&broken_dom)
        .expect_err("the check passed on a truncated SVG: it cannot tell a refused file");
    eprintln!("truncated flame graph, as expected: {err}");

    let png = temp_path("consumer-flamegraph", "png");
    browser
        .screenshot(&url, &png, 2000)
        .unwrap_or_else(|e| panic!("chromium could not draw the flame graph: {e}"));
    let pixels = decode_rgb(&png);
    let _ = std::fs::remove_file(&png);
    let distinct: BTreeSet<[u8; 3]> = pixels.iter().copied().collect();
    assert!(
        distinct.len() > 3,
        "the screenshot is blank: {} colours",
        distinct.len()
    );
    let leaf = counts.last().unwrap().2;
    let fill = attribute(&leaf.rect, "fill").expect("the leaf frame's fill");
    let fill = rgb(&fill).unwrap_or_else(|| panic!("unreadable fill {fill:?}"));
    let painted = pixels.iter().filter(|p| close(**p, fill)).count();
    assert!(
        painted >= 100,
        "the leaf frame's fill {fill:?} is on {painted} pixels of the screenshot"
    );
    eprintln!(
        "flame graph: {} frames, {total} samples, {} colours, leaf fill on {painted} pixels",
        frames.len(),
        distinct.len()
    );
}

/// Every pixel of a PNG, as RGB.
fn decode_rgb(path: &Path) -> Vec<[u8; 3]> {
    let file = std::fs::File::open(path).expect("opening the screenshot");
    let mut decoder = png::Decoder::new(file);
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = decoder.read_info().expect("the screenshot is a PNG");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader
        .next_frame(&mut buf)
        .expect("decoding the screenshot");
    let channels = info.color_type.samples();
    assert!(channels >= 3, "a {:?} screenshot", info.color_type);
    buf[..info.buffer_size()]
        .chunks(channels)
        .map(|p| [p[0], p[1], p[2]])
        .collect()
}

/// `rgb(1,2,3)` -> [1, 2, 3].
fn rgb(fill: &str) -> Option<[u8; 3]> {
    let inner = fill.strip_prefix("rgb(")?.strip_suffix(')')?;
    let parts: Vec<u8> = inner
        .split(',')
        .map(|p| p.trim().parse().ok())
        .collect::<Option<_>>()?;
    parts.try_into().ok()
}

/// Within 2 of each other on every channel (the screenshot's colour conversion may round).
fn close(a: [u8; 3], b: [u8; 3]) -> bool {
    a.iter().zip(b).all(|(x, y)| x.abs_diff(y) <= 2)
}

/// Each `-f` value and the test (file, function) that opens it in a real consumer.
const CONSUMER_TESTS: [(&str, &str, &str); 5] = [
    (
        "flamegraph",
        "consumers.rs",
        "flamegraph_svg_parses_and_draws_in_chromium",
    ),
    (
        "speedscope",
        "consumers.rs",
        "speedscope_app_loads_the_recorded_profile",
    ),
    (
        "collapsed",
        "consumers.rs",
        "speedscope_app_reads_collapsed_stacks",
    ),
    (
        "pprof",
        "pprof.rs",
        "chain_types_period_stack_and_labels_on_every_interpreter",
    ),
    (
        "otlp",
        "otlp.rs",
        "record_otlp_writes_a_request_the_upstream_classes_read",
    ),
];

/// `pyebpf record --help` lists exactly the formats of [`CONSUMER_TESTS`], and each named test
/// exists: a new format fails here until a consumer reads it.
#[test]
fn every_format_has_a_consumer_test() {
    let out = Command::new(pyebpf_bin())
        .args(["record", "--help"])
        .output()
        .expect("running pyebpf record --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let formats = format_values(&help);
    let covered: BTreeSet<String> = CONSUMER_TESTS.iter().map(|t| t.0.to_string()).collect();
    assert_eq!(
        formats, covered,
        "`record --help`'s -f values and the formats with a consumer test differ"
    );
    for (format, file, test) in CONSUMER_TESTS {
        let source = match file {
            "consumers.rs" => include_str!("consumers.rs"),
            "pprof.rs" => include_str!("pprof.rs"),
            "otlp.rs" => include_str!("otlp.rs"),
            other => panic!("unknown test file {other}"),
        };
        assert!(
            source.contains(&format!("#[test]\nfn {test}()")),
            "{format}: no test {test} in tests/tests/{file}"
        );
    }
}

/// The values clap lists under `-f`'s `Possible values:` (`- name: help` lines).
fn format_values(help: &str) -> BTreeSet<String> {
    let section = help
        .split("\n  -f")
        .nth(1)
        .unwrap_or_else(|| panic!("no -f option in:\n{help}"));
    let section = section.split("\n  -").next().unwrap_or(section);
    let values: BTreeSet<String> = section
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .map(|v| v.split(':').next().unwrap().trim().to_string())
        .collect();
    assert!(
        !values.is_empty(),
        "no possible values under -f:\n{section}"
    );
    values
}
