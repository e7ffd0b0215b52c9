//! Checks `profiler::python::linetable` against every interpreter's own `co_positions()`:
//! `tests/workloads/dump_positions.py` dumps the location tables of a few thousand real code
//! objects with the start line of each code unit, and the decoder must agree on every one.

use profiler::python::linetable::LineTable;
use serde_json::Value;

/// Fewer code objects than this per interpreter means the dump went wrong.
const MIN_CODE_OBJECTS: usize = 200;

fn decode_hex(hex: &str) -> Result<Vec<u8>, String> {
    if !hex.len().is_multiple_of(2) {
        return Err(format!("odd-length hex string ({} chars)", hex.len()));
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(|e| format!("bad hex at {i}: {e}")))
        .collect()
}

/// Per-interpreter totals.
#[derive(Default)]
struct Counts {
    code_objects: usize,
    code_units: usize,
    with_line: usize,
}

/// Checks one JSON line; returns the mismatches found (at most one per kind per code object).
fn check_record(record: &Value, counts: &mut Counts) -> Result<Vec<String>, String> {
    let name = record["name"].as_str().ok_or("missing name")?;
    let first_line = record["firstlineno"]
        .as_u64()
        .ok_or("missing firstlineno")?;
    let first_line = u32::try_from(first_line).map_err(|_| "firstlineno out of range")?;
    let table = decode_hex(record["linetable"].as_str().ok_or("missing linetable")?)?;
    let lines = record["lines"].as_array().ok_or("missing lines")?;

    let decoded = LineTable::parse(&table, first_line);
    let mut mismatches = Vec::new();
    if decoded.len_code_units() as usize != lines.len() {
        mismatches.push(format!(
            "{name}: table covers {} code units, co_positions() gave {}",
            decoded.len_code_units(),
            lines.len()
        ));
    }
    let mut first_bad: Option<(usize, Option<u32>, Option<u32>)> = None;
    let mut bad_units = 0usize;
    for (i, expected) in lines.iter().enumerate() {
        let expected = match expected {
            Value::Null => None,
            v => Some(
                v.as_u64()
                    .and_then(|l| u32::try_from(l).ok())
                    .ok_or_else(|| format!("{name}: unexpected line value {v} at {i}"))?,
            ),
        };
        let got = decoded.line_at(i as u32);
        if got != expected {
            bad_units += 1;
            first_bad.get_or_insert((i, expected, got));
        }
        counts.code_units += 1;
        counts.with_line += usize::from(expected.is_some());
    }
    if let Some((i, expected, got)) = first_bad {
        let hex = record["linetable"].as_str().unwrap_or_default();
        let shown = if hex.len() > 96 { &hex[..96] } else { hex };
        mismatches.push(format!(
            "{name} (firstlineno {first_line}): code unit {i}: expected {expected:?}, got \
             {got:?} ({bad_units} of {} code units wrong); linetable ({} bytes) {shown}{}",
            lines.len(),
            table.len(),
            if shown.len() < hex.len() { "…" } else { "" }
        ));
    }
    counts.code_objects += 1;
    Ok(mismatches)
}

#[test]
fn linetable_matches_co_positions() {
    let interpreters = tests::interpreters_logged();
    assert!(
        !interpreters.is_empty(),
        "no CPython 3.11+ interpreter found"
    );
    let script = tests::workloads_dir().join("dump_positions.py");

    let mut failures = Vec::new();
    for interp in &interpreters {
        let out = interp
            .command(&script, &[])
            .output()
            .unwrap_or_else(|e| panic!("{}: cannot run dump_positions.py: {e}", interp.label));
        assert!(
            out.status.success(),
            "{}: dump_positions.py failed ({}):\n{}",
            interp.label,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).expect("dump is UTF-8");

        let mut counts = Counts::default();
        let mut mismatches = Vec::new();
        for (n, line) in stdout.lines().enumerate() {
            let record: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}: bad JSON on line {}: {e}", interp.label, n + 1));
            match check_record(&record, &mut counts) {
                Ok(m) => mismatches.extend(m),
                Err(e) => panic!("{}: bad record on line {}: {e}", interp.label, n + 1),
            }
        }
        eprintln!(
            "{} ({}.{}): checked {} code objects, {} code units ({} with a line, {} without), \
             {} mismatches",
            interp.label,
            interp.version.0,
            interp.version.1,
            counts.code_objects,
            counts.code_units,
            counts.with_line,
            counts.code_units - counts.with_line,
            mismatches.len()
        );
        for m in mismatches.iter().take(20) {
            eprintln!("  mismatch: {m}");
        }
        if !mismatches.is_empty() {
            failures.push(format!(
                "{}: {} mismatches, first: {}",
                interp.label,
                mismatches.len(),
                mismatches[0]
            ));
        }
        if counts.code_objects < MIN_CODE_OBJECTS {
            failures.push(format!(
                "{}: only {} code objects checked (want at least {MIN_CODE_OBJECTS})",
                interp.label, counts.code_objects
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
