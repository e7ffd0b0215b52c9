//! Decoder for the CPython 3.11+ location table (`co_linetable`, PEP 626 / PEP 657).
//!
//! The table is a sequence of entries. Each entry starts with a byte whose top bit is set:
//!
//! | bit 7 | bits 3–6 | bits 0–2                 |
//! |-------|----------|--------------------------|
//! |   1   |  code    | length − 1 (code units)  |
//!
//! followed by zero or more bytes whose top bit is clear. By `code`:
//!
//! * `15` — no location; nothing follows. The running line is unchanged.
//! * `14` — long form: signed varint line delta, varint end-line delta, varint column + 1,
//!   varint end-column + 1.
//! * `13` — no columns: signed varint line delta.
//! * `10..=12` — one-line forms: line delta is `code − 10`; then one column byte and one
//!   end-column byte.
//! * `0..=9` — short forms: line delta 0; one byte of column data.
//!
//! Varints are little-endian groups of 6 bits, with `0x40` meaning "another group follows".
//! Signed varints keep the sign in bit 0 of the unsigned value (`v >> 1`, negated if odd).
//!
//! Only start lines are kept: the profiler needs `lasti → line`. The running line starts at
//! `co_firstlineno` and each entry's delta is added to it (a "no location" entry adds zero).

/// Code of an entry carrying no location at all.
const CODE_NONE: u8 = 15;
/// Code of the long form (all four fields as varints).
const CODE_LONG: u8 = 14;
/// Code of the form carrying a line delta but no columns.
const CODE_NO_COLUMNS: u8 = 13;
/// First of the one-line forms (10, 11, 12 → line delta 0, 1, 2).
const CODE_ONE_LINE0: u8 = 10;

/// Varints longer than this many 6-bit groups (36 bits) are treated as malformed: CPython
/// only stores 32-bit values.
const MAX_VARINT_GROUPS: u32 = 6;

/// One run of code units sharing a start line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Range {
    /// One past the last code unit of the run; the run starts at the previous range's end
    /// (or 0).
    end: u32,
    /// Start line of every instruction in the run, `None` when they have no location.
    line: Option<u32>,
}

/// A decoded location table: code-unit ranges sorted by offset, each with its start line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LineTable {
    ranges: Vec<Range>,
}

/// A cursor over the table bytes that refuses to run past the end or into the next entry.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    /// The next byte of the current entry; `None` at the end or at the next entry's start.
    fn continuation_byte(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.pos)?;
        if b & 0x80 != 0 {
            return None;
        }
        self.pos += 1;
        Some(b)
    }

    fn varint(&mut self) -> Option<u64> {
        let mut value: u64 = 0;
        for group in 0..MAX_VARINT_GROUPS {
            let b = self.continuation_byte()?;
            value |= u64::from(b & 0x3f) << (group * 6);
            if b & 0x40 == 0 {
                return Some(value);
            }
        }
        None
    }

    fn signed_varint(&mut self) -> Option<i64> {
        let v = self.varint()?;
        let magnitude = (v >> 1) as i64; // at most 35 bits: cannot wrap
        Some(if v & 1 != 0 { -magnitude } else { magnitude })
    }
}

impl LineTable {
    /// Decodes `table` (the bytes of `co_linetable`) for a code object whose `co_firstlineno`
    /// is `first_line`. Decoding stops at the first malformed entry (a start byte without the
    /// top bit, a truncated entry, an oversized varint, a line out of range); everything
    /// decoded before it is kept. Never panics; runs in time linear in `table.len()`.
    pub fn parse(table: &[u8], first_line: u32) -> LineTable {
        let mut ranges: Vec<Range> = Vec::new();
        let mut reader = Reader {
            bytes: table,
            pos: 0,
        };
        let mut line = i64::from(first_line);
        let mut end: u32 = 0;

        while let Some(&first) = table.get(reader.pos) {
            if first & 0x80 == 0 {
                break;
            }
            reader.pos += 1;
            let code = (first >> 3) & 0x0f;
            let length = u32::from(first & 0x07) + 1;

            let delta = match code {
                CODE_NONE => Some(0),
                CODE_LONG => (|| {
                    let delta = reader.signed_varint()?;
                    reader.varint()?; // end line delta
                    reader.varint()?; // column + 1
                    reader.varint()?; // end column + 1
                    Some(delta)
                })(),
                CODE_NO_COLUMNS => reader.signed_varint(),
                CODE_ONE_LINE0..=12 => (|| {
                    reader.continuation_byte()?; // column
                    reader.continuation_byte()?; // end column
                    Some(i64::from(code - CODE_ONE_LINE0))
                })(),
                _ => reader.continuation_byte().map(|_| 0),
            };
            let Some(delta) = delta else { break };
            let new_line = line + delta;
            if i32::try_from(new_line).is_err() {
                break;
            }
            line = new_line;
            let Some(new_end) = end.checked_add(length) else {
                break;
            };
            end = new_end;

            // CPython reports a line of -1 as "no line"; other negative lines cannot be
            // represented either.
            let entry_line = if code == CODE_NONE {
                None
            } else {
                u32::try_from(line).ok()
            };
            match ranges.last_mut() {
                Some(last) if last.line == entry_line => last.end = end,
                _ => ranges.push(Range {
                    end,
                    line: entry_line,
                }),
            }
        }
        ranges.shrink_to_fit();
        LineTable { ranges }
    }

    /// Start line of the instruction at code-unit index `lasti` (2-byte units from the start
    /// of `co_code_adaptive`), or `None` when it has no location or lies past the table.
    pub fn line_at(&self, lasti: u32) -> Option<u32> {
        let idx = self.ranges.partition_point(|r| r.end <= lasti);
        self.ranges.get(idx)?.line
    }

    /// Number of code units the table covers.
    pub fn len_code_units(&self) -> u32 {
        self.ranges.last().map_or(0, |r| r.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(code: u8, length: u32) -> u8 {
        assert!((1..=8).contains(&length));
        0x80 | (code << 3) | (length as u8 - 1)
    }

    fn varint(out: &mut Vec<u8>, mut v: u32) {
        while v >= 0x40 {
            out.push(0x40 | (v & 0x3f) as u8);
            v >>= 6;
        }
        out.push(v as u8);
    }

    fn svarint(out: &mut Vec<u8>, v: i32) {
        let u = if v < 0 {
            ((v.unsigned_abs()) << 1) | 1
        } else {
            (v as u32) << 1
        };
        varint(out, u);
    }

    #[test]
    fn empty() {
        let t = LineTable::parse(&[], 10);
        assert_eq!(t.len_code_units(), 0);
        assert_eq!(t.line_at(0), None);
    }

    #[test]
    fn every_form() {
        let mut b = Vec::new();
        // RESUME-like: no columns, delta 0 → line 10, 1 unit.
        b.push(entry(CODE_NO_COLUMNS, 1));
        svarint(&mut b, 0);
        // one-line form, delta +1 → 11, 3 units.
        b.extend([entry(11, 3), 4, 20]);
        // short form → still 11, 2 units.
        b.extend([entry(2, 2), 0x35]);
        // long form, delta +1000 → 1011, 8 units.
        b.push(entry(CODE_LONG, 8));
        svarint(&mut b, 1000);
        varint(&mut b, 2);
        varint(&mut b, 200);
        varint(&mut b, 5000);
        // no location, 2 units.
        b.push(entry(CODE_NONE, 2));
        // long form, delta -1005 → 6, 1 unit.
        b.push(entry(CODE_LONG, 1));
        svarint(&mut b, -1005);
        varint(&mut b, 0);
        varint(&mut b, 1);
        varint(&mut b, 1);
        // one-line form delta 2 → 8.
        b.extend([entry(12, 1), 0, 1]);
        let t = LineTable::parse(&b, 10);
        assert_eq!(t.len_code_units(), 18);
        let want: Vec<Option<u32>> = [
            vec![Some(10)],
            vec![Some(11); 5],
            vec![Some(1011); 8],
            vec![None; 2],
            vec![Some(6)],
            vec![Some(8)],
        ]
        .concat();
        for (i, w) in want.iter().enumerate() {
            assert_eq!(t.line_at(i as u32), *w, "index {i}");
        }
        assert_eq!(t.line_at(18), None);
        assert_eq!(t.line_at(u32::MAX), None);
        // Ranges with equal lines were merged.
        assert_eq!(t.ranges.len(), 6);
    }

    #[test]
    fn none_entry_keeps_running_line() {
        let b = [entry(CODE_NONE, 1), entry(11, 1), 0, 1];
        let t = LineTable::parse(&b, 5);
        assert_eq!(t.line_at(0), None);
        assert_eq!(t.line_at(1), Some(6));
    }

    #[test]
    fn stops_at_malformed() {
        // Second entry is truncated (no column bytes): only the first is kept.
        let b = [entry(10, 2), 1, 2, entry(11, 1), 3];
        let t = LineTable::parse(&b, 1);
        assert_eq!(t.len_code_units(), 2);
        assert_eq!(t.line_at(1), Some(1));
        assert_eq!(t.line_at(2), None);
        // A start byte without the top bit.
        let t = LineTable::parse(&[entry(CODE_NONE, 1), 0x12, entry(CODE_NONE, 1)], 1);
        assert_eq!(t.len_code_units(), 1);
        // A varint that never ends.
        let t = LineTable::parse(
            &[
                entry(CODE_NO_COLUMNS, 1),
                0x7f,
                0x7f,
                0x7f,
                0x7f,
                0x7f,
                0x7f,
                0x7f,
            ],
            1,
        );
        assert_eq!(t.len_code_units(), 0);
        // A line going below i32::MIN / above i32::MAX.
        let mut b = vec![entry(CODE_NO_COLUMNS, 1)];
        svarint(&mut b, i32::MAX);
        let t = LineTable::parse(&b, 10);
        assert_eq!(t.len_code_units(), 0);
    }

    #[test]
    fn negative_line_is_no_line() {
        let mut b = vec![entry(CODE_NO_COLUMNS, 1)];
        svarint(&mut b, -2);
        b.extend([entry(11, 1), 0, 0]);
        let t = LineTable::parse(&b, 1);
        assert_eq!(t.line_at(0), None);
        assert_eq!(t.line_at(1), Some(0));
    }

    #[test]
    fn garbage_never_panics() {
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..20_000u32 {
            let len = (next() % 300) as usize;
            // Alternate between fully random bytes and mostly-well-formed start bytes.
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    let r = next();
                    if round % 2 == 0 || r % 4 != 0 {
                        r as u8
                    } else {
                        0x80 | (r >> 8) as u8
                    }
                })
                .collect();
            let first = if next() % 4 == 0 { next() as u32 } else { 1 };
            let t = LineTable::parse(&bytes, first);
            // At most 8 code units per byte of input.
            assert!(u64::from(t.len_code_units()) <= 8 * bytes.len() as u64);
            assert!(t.ranges.len() <= bytes.len());
            assert!(t.ranges.windows(2).all(|w| w[0].end < w[1].end));
            for _ in 0..8 {
                let _ = t.line_at(next() as u32 % (t.len_code_units() + 2));
            }
            let _ = t.line_at(u32::MAX);
        }
    }
}
