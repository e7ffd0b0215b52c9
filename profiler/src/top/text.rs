//! Plain-text snapshots of `top`, for scripts and pipes: the same columns as the live view.
//!
//! Each snapshot starts with a `pyebpf top:` summary line, then a header line and one line per
//! row, and ends with a blank line.

use std::fmt::Write;

use super::table::{self, Column, ViewOptions};
use super::Snapshot;

/// Widths of the fixed columns (%Own, %Total, OwnTime, TotalTime, Process, Thread).
pub(crate) const WIDTHS: [usize; 6] = [7, 7, 9, 9, 26, 16];

/// One line of the table: four right-aligned columns, two left-aligned, then the function,
/// unpadded.
fn write_line(out: &mut String, cells: &[impl std::fmt::Display; 7]) {
    let _ = writeln!(
        out,
        "{:>w0$} {:>w1$} {:>w2$} {:>w3$}  {:<w4$} {:<w5$} {}",
        cells[0],
        cells[1],
        cells[2],
        cells[3],
        cells[4],
        cells[5],
        cells[6],
        w0 = WIDTHS[0],
        w1 = WIDTHS[1],
        w2 = WIDTHS[2],
        w3 = WIDTHS[3],
        w4 = WIDTHS[4],
        w5 = WIDTHS[5],
    );
}

/// One snapshot as text.
pub(crate) fn snapshot(snap: &Snapshot, opts: &ViewOptions) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "pyebpf top: {}", snap.summary());
    let _ = writeln!(
        out,
        "aggregated by {}, sorted by {}{}",
        opts.granularity.name(),
        opts.sort.title(),
        if opts.descending { " (descending)" } else { "" }
    );
    let titles = Column::ALL.map(|c| c.title());
    write_line(&mut out, &titles);
    let rows = table::view(&snap.counted, opts);
    if rows.is_empty() {
        let _ = writeln!(out, "(no Python samples yet)");
    }
    for row in rows {
        write_line(&mut out, &super::cells(row, snap));
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::top::table::{Granularity, Location, Table};

    #[test]
    fn rows_have_every_column() {
        let mut t = Table::default();
        let f = |name: &str, line| Location {
            function: name.into(),
            file: "/srv/app.py".into(),
            first_line: line,
            line: line + 1,
        };
        for _ in 0..3 {
            t.add(42, 42, "python3 app.py", &[f("hot", 10), f("<module>", 1)]);
        }
        t.add(42, 42, "python3 app.py", &[f("<module>", 1)]);
        let snap = Snapshot {
            counted: t.end_interval(),
            interval: Duration::from_secs(1),
            elapsed: Duration::from_secs(1),
            rate_hz: 100,
            processes: 1,
            python_share: Some(0.5),
            dropped_interval: 0,
            dropped_total: 0,
            note: None,
        };
        let text = snapshot(&snap, &ViewOptions::new(Granularity::Function, Column::Own));
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("pyebpf top: "), "{text}");
        assert!(
            lines[0].contains("4 samples/s") && lines[0].contains("50.0% in Python"),
            "{text}"
        );
        assert!(lines[2].contains("%Own") && lines[2].contains("Function (file:line)"));
        assert!(
            lines[3].contains("75.0%") && lines[3].contains("hot (/srv/app.py:10)"),
            "{text}"
        );
        assert!(
            lines[3].contains("42 python3 app.py") && lines[3].contains("0.03s"),
            "{text}"
        );
        assert!(lines[4].contains("<module> (/srv/app.py:1)") && lines[4].contains("100.0%"));
        assert!(text.ends_with("\n\n"));
    }
}
