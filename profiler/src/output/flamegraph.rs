//! SVG flame graphs, drawn by inferno from the collapsed stacks.
//!
//! Python frames use inferno's Python palette (red for application code, yellow for the standard
//! library, aqua for `site-packages`), chosen deterministically from the label so that the same
//! profile always gives the same picture. Process, thread and truncated frames get fixed colors
//! of their own: blue, green and grey.

use std::io::Write;

use anyhow::Context;
use inferno::flamegraph::color::{Color, MultiPalette, Palette, PaletteMap};
use inferno::flamegraph::{self as inferno_fg, Options};

use crate::aggregate::{FrameKind, Profile};
use crate::output::collapsed;

/// Fill color of process frames.
pub(crate) const PROCESS_COLOR: Color = Color {
    r: 100,
    g: 130,
    b: 215,
};
/// Fill color of thread frames.
pub(crate) const THREAD_COLOR: Color = Color {
    r: 120,
    g: 195,
    b: 110,
};
/// Fill color of native frames (`--native`): blue, apart from the warm Python palette.
pub(crate) const NATIVE_COLOR: Color = Color {
    r: 110,
    g: 160,
    b: 220,
};
/// Fill color of `<task NAME>` frames (`--async`).
pub(crate) const TASK_COLOR: Color = Color {
    r: 120,
    g: 200,
    b: 140,
};
/// Fill color of truncated frames.
pub(crate) const TRUNCATED_COLOR: Color = Color {
    r: 175,
    g: 175,
    b: 175,
};

fn fixed_color(kind: FrameKind) -> Option<Color> {
    match kind {
        FrameKind::Process => Some(PROCESS_COLOR),
        FrameKind::Thread => Some(THREAD_COLOR),
        FrameKind::Truncated => Some(TRUNCATED_COLOR),
        FrameKind::Native => Some(NATIVE_COLOR),
        FrameKind::Task => Some(TASK_COLOR),
        FrameKind::Python => None,
    }
}

/// Writes `profile` as an SVG flame graph. Fails, without writing anything, when the profile has
/// no non-empty stack to draw.
pub(crate) fn write(profile: &Profile, title: &str, out: &mut dyn Write) -> anyhow::Result<()> {
    let stacks = collapsed::stacks(profile);
    anyhow::ensure!(!stacks.is_empty(), "no samples to draw a flame graph from");
    let total: u64 = stacks.iter().map(|(_, count)| count).sum();
    let lines: Vec<String> = stacks
        .into_iter()
        .map(|(stack, count)| format!("{stack} {count}"))
        .collect();

    // Colors keyed by the (sanitized) label, as inferno sees it.
    let mut palette_map = PaletteMap::default();
    for frame in profile.frames() {
        if let Some(color) = fixed_color(frame.kind) {
            palette_map.insert(collapsed::sanitize(&frame.label()), color);
        }
    }

    let mut options = Options::default();
    options.title = title.to_string();
    options.subtitle = Some(format!(
        "{total} {}",
        if total == 1 { "sample" } else { "samples" }
    ));
    options.count_name = "samples".to_string();
    options.colors = Palette::Multi(MultiPalette::Python);
    options.deterministic = true;
    options.palette_map = Some(&mut palette_map);

    inferno_fg::from_lines(&mut options, lines.iter().map(String::as_str), out)
        .context("drawing the flame graph")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::test_support;

    fn render(profile: &Profile, title: &str) -> String {
        let mut out = Vec::new();
        write(profile, title, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    fn fill(color: Color) -> String {
        format!("fill=\"rgb({},{},{})\"", color.r, color.g, color.b)
    }

    #[test]
    fn svg_has_title_labels_and_counts() {
        let profile = test_support::two_processes();
        let svg = render(&profile, "pyebpf record: 2 processes, 100 samples");
        assert!(
            svg.starts_with("<?xml") || svg.starts_with("<svg"),
            "{}",
            &svg[..80]
        );
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("pyebpf record: 2 processes, 100 samples"));
        assert!(svg.contains("100 samples"));
        for label in [
            "python3 (100)",
            "wor,ker (200)",
            "thread 100 (MainThread)",
            "main (/srv/app.py:10)",
            "work (/srv/app.py:20)",
            "odd (/tmp/a,b/odd.py:3)",
            "[truncated]",
        ] {
            assert!(svg.contains(label), "label {label:?} missing from the SVG");
        }
        // The count name shows up in the frames' tooltips.
        assert!(
            svg.contains("all (100 samples, 100%)"),
            "root tooltip missing"
        );
        assert!(
            svg.contains("work (/srv/app.py:20) (40 samples, 40.00%)"),
            "frame tooltip missing"
        );
    }

    #[test]
    fn kinds_have_distinct_colors() {
        let profile = test_support::two_processes();
        let svg = render(&profile, "t");
        for color in [PROCESS_COLOR, THREAD_COLOR, TRUNCATED_COLOR] {
            assert!(svg.contains(&fill(color)), "{} not used", fill(color));
        }
        let single = render(&test_support::single(), "t");
        for color in [PROCESS_COLOR, THREAD_COLOR, TRUNCATED_COLOR] {
            assert!(
                !single.contains(&fill(color)),
                "{} used for Python frames",
                fill(color)
            );
        }
    }

    #[test]
    fn deterministic() {
        let profile = test_support::two_processes();
        assert_eq!(render(&profile, "t"), render(&profile, "t"));
    }

    #[test]
    fn title_is_escaped() {
        let svg = render(&test_support::single(), "a <b> & c");
        assert!(svg.contains("a &lt;b&gt; &amp; c"));
        assert!(!svg.contains("a <b>"));
    }

    #[test]
    fn empty_profile_is_an_error() {
        let mut out = Vec::new();
        assert!(write(&Profile::default(), "t", &mut out).is_err());
        assert!(out.is_empty());
    }
}
