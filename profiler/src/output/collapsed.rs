//! Collapsed ("folded") stacks: `root;…;leaf count`, one line per distinct stack.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Write;

use crate::aggregate::Profile;

/// Makes a frame label safe for a collapsed line: `;` (the frame separator) becomes `,`,
/// control characters (line breaks) become spaces, surrounding whitespace is trimmed and an
/// empty label becomes `[unnamed]`.
pub(crate) fn sanitize(label: &str) -> Cow<'_, str> {
    let trimmed = label.trim();
    if trimmed.is_empty() {
        return Cow::Borrowed("[unnamed]");
    }
    if !trimmed.chars().any(|c| c == ';' || c.is_control()) {
        return Cow::Borrowed(trimmed);
    }
    let replaced: String = trimmed
        .chars()
        .map(|c| match c {
            ';' => ',',
            c if c.is_control() => ' ',
            c => c,
        })
        .collect();
    Cow::Owned(replaced.trim().to_string())
}

/// Collapsed lines (without the count) and their counts, heaviest first, ties by line.
///
/// Empty stacks and stacks with no samples are left out; stacks that become identical after
/// [`sanitize`] are merged.
pub(crate) fn stacks(profile: &Profile) -> Vec<(String, u64)> {
    let mut lines: Vec<(String, u64)> = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut merged = false;
    for (stack, count) in profile.stacks() {
        if stack.is_empty() || count == 0 {
            continue;
        }
        let mut line = String::new();
        for (i, &id) in stack.iter().enumerate() {
            if i > 0 {
                line.push(';');
            }
            line.push_str(&sanitize(&profile.frame(id).label()));
        }
        match seen.get(&line) {
            Some(&i) => {
                lines[i].1 += count;
                merged = true;
            }
            None => {
                seen.insert(line.clone(), lines.len());
                lines.push((line, count));
            }
        }
    }
    if merged {
        lines.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    }
    lines
}

/// Writes `profile` as collapsed stacks, one `\n`-terminated line per stack.
pub(crate) fn write(profile: &Profile, out: &mut dyn Write) -> anyhow::Result<()> {
    for (stack, count) in stacks(profile) {
        writeln!(out, "{stack} {count}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::FrameKind;
    use crate::output::test_support::{self, frame, labels};

    /// Parses collapsed text back into (frames, count) pairs.
    fn parse(text: &str) -> Vec<(Vec<String>, u64)> {
        text.lines()
            .map(|line| {
                let (stack, count) = line.rsplit_once(' ').expect("no count");
                let frames = stack.split(';').map(str::to_string).collect();
                (frames, count.parse().expect("count is not a number"))
            })
            .collect()
    }

    fn render(profile: &Profile) -> String {
        let mut out = Vec::new();
        write(profile, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn round_trips() {
        let profile = test_support::two_processes();
        let text = render(&profile);
        let parsed = parse(&text);

        let expected: Vec<(Vec<String>, u64)> = profile
            .stacks()
            .into_iter()
            .map(|(stack, count)| {
                let frames = labels(&profile, stack)
                    .iter()
                    .map(|l| sanitize(l).into_owned())
                    .collect();
                (frames, count)
            })
            .collect();
        assert_eq!(parsed, expected);
        assert_eq!(parsed.iter().map(|(_, c)| c).sum::<u64>(), profile.samples);
        // Five distinct stacks (the two `odd` stacks were added twice and merged).
        assert_eq!(parsed.len(), 5);
        assert_eq!(parsed[0].1, 40);
        assert_eq!(
            parsed[0].0,
            [
                "python3 (100)",
                "thread 100 (MainThread)",
                "main (/srv/app.py:10)",
                "work (/srv/app.py:20)"
            ]
        );
    }

    #[test]
    fn semicolons_do_not_split_frames() {
        let profile = test_support::two_processes();
        let text = render(&profile);
        let odd = parse(&text)
            .into_iter()
            .find(|(frames, _)| frames.last().unwrap().starts_with("odd"))
            .expect("odd stack missing");
        assert_eq!(
            odd.0,
            [
                "wor,ker (200)",
                "thread 201 (pool-1)",
                "odd (/tmp/a,b/odd.py:3)"
            ]
        );
        assert_eq!(odd.1, 23);
    }

    #[test]
    fn sanitize_cases() {
        assert_eq!(sanitize("plain (a.py:1)"), "plain (a.py:1)");
        assert_eq!(sanitize("a;b;c"), "a,b,c");
        assert_eq!(sanitize("line\nbreak\r"), "line break");
        assert_eq!(sanitize("  "), "[unnamed]");
        assert_eq!(sanitize(""), "[unnamed]");
    }

    #[test]
    fn deterministic_and_merges_sanitized_duplicates() {
        let mut profile = Profile::default();
        let a = profile.intern(frame(FrameKind::Process, "x;y"));
        let b = profile.intern(frame(FrameKind::Process, "x,y"));
        let c = profile.intern(frame(FrameKind::Truncated, "[truncated]"));
        profile.add(&[a, c], 2);
        profile.add(&[b, c], 3);
        profile.add(&[c], 4);
        profile.add(&[], 9);
        let text = render(&profile);
        assert_eq!(text, "x,y;[truncated] 5\n[truncated] 4\n");
        assert_eq!(text, render(&profile));
    }

    #[test]
    fn empty_profile_writes_nothing() {
        assert_eq!(render(&Profile::default()), "");
    }
}
