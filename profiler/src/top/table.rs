//! What `top` shows, as pure data: per-process rows of own/total sample counts, by function
//! or by line, and the sorted, filtered view of them.
//!
//! What the numbers mean (the same as `py-spy top`):
//! - **%Own / %Total** cover the last refresh interval only: the share of that interval's
//!   Python samples (of every watched process) whose leaf frame is the row (%Own), or which
//!   have the row anywhere on the stack (%Total). A filter hides rows but does not change
//!   the denominator, so a row's numbers never depend on what else is shown.
//! - **OwnTime / TotalTime** are cumulative since `top` started: CPU seconds, each sample
//!   standing for one sampling period (1 / rate) of one CPU.
//! - "Total" counts a sample once per row even when the row occurs several times in the
//!   stack (recursion), so %Total never exceeds 100.
//!
//! Rows are per process: the same function in two processes is two rows. A row is a
//! function (its qualname, file and first line) or, in line mode, one line of a function.
//! Each row names the thread its samples came from (its `threading` name, see
//! `python::thread_names`), or how many threads they came from.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// One frame of a sample, as `top` needs it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Location {
    pub function: Arc<str>,
    /// Empty when the code object could not be read.
    pub file: Arc<str>,
    pub first_line: u32,
    pub line: u32,
}

/// Whether rows are functions or lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Granularity {
    Function,
    Line,
}

impl Granularity {
    pub(crate) fn toggled(self) -> Self {
        match self {
            Granularity::Function => Granularity::Line,
            Granularity::Line => Granularity::Function,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Granularity::Function => "function",
            Granularity::Line => "line",
        }
    }
}

/// The identity of a row.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RowKey {
    pub pid: u32,
    pub function: Arc<str>,
    pub file: Arc<str>,
    /// The function's first line (function rows) or the executing line (line rows).
    pub line: u32,
}

impl RowKey {
    /// `function (file:line)`, or the bare function name when the file is unknown.
    pub(crate) fn label(&self) -> String {
        let file = (!self.file.is_empty()).then_some(&*self.file);
        crate::aggregate::python_label(&self.function, file, self.line)
    }
}

/// Threads a row tells apart; past this it says "N+ threads".
const MAX_ROW_THREADS: usize = 8;
/// Thread names a table keeps; past this it starts over.
const MAX_NAMES: usize = 1 << 16;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Counts {
    own: u64,
    total: u64,
    own_interval: u64,
    total_interval: u64,
    /// The threads whose samples the row holds (at most [`MAX_ROW_THREADS`]).
    tids: Vec<u32>,
}

/// Rows of one granularity.
#[derive(Default)]
struct Level {
    index: HashMap<RowKey, u32>,
    keys: Vec<RowKey>,
    counts: Vec<Counts>,
}

impl Level {
    fn id(&mut self, key: RowKey) -> u32 {
        if let Some(&id) = self.index.get(&key) {
            return id;
        }
        let id = self.keys.len() as u32;
        self.keys.push(key.clone());
        self.counts.push(Counts::default());
        self.index.insert(key, id);
        id
    }

    /// `ids` are the sample's rows, leaf first; `tid` its thread.
    fn add(&mut self, ids: &mut Vec<u32>, tid: u32) {
        let Some(&leaf) = ids.first() else { return };
        let own = &mut self.counts[leaf as usize];
        own.own += 1;
        own.own_interval += 1;
        ids.sort_unstable();
        ids.dedup();
        for &id in ids.iter() {
            let c = &mut self.counts[id as usize];
            c.total += 1;
            c.total_interval += 1;
            if c.tids.len() < MAX_ROW_THREADS && !c.tids.contains(&tid) {
                c.tids.push(tid);
            }
        }
    }

    fn end_interval(&mut self) {
        for c in &mut self.counts {
            c.own_interval = 0;
            c.total_interval = 0;
        }
    }

    fn forget(&mut self, pid: u32) {
        if !self.keys.iter().any(|k| k.pid == pid) {
            return;
        }
        let old = std::mem::take(self);
        for (key, counts) in old.keys.into_iter().zip(old.counts) {
            if key.pid != pid {
                let id = self.id(key);
                self.counts[id as usize] = counts;
            }
        }
    }

    fn rows(
        &self,
        commands: &HashMap<u32, Arc<str>>,
        names: &HashMap<(u32, u32), Arc<str>>,
    ) -> Vec<Row> {
        self.keys
            .iter()
            .zip(&self.counts)
            .filter(|(_, c)| c.total > 0)
            .map(|(key, c)| Row {
                key: key.clone(),
                command: commands.get(&key.pid).cloned().unwrap_or_else(|| "".into()),
                thread: match c.tids[..] {
                    [tid] => names
                        .get(&(key.pid, tid))
                        .cloned()
                        .unwrap_or_else(|| tid.to_string().into()),
                    ref tids if tids.len() >= MAX_ROW_THREADS => {
                        format!("{MAX_ROW_THREADS}+ threads").into()
                    }
                    ref tids => format!("{} threads", tids.len()).into(),
                },
                own_interval: c.own_interval,
                total_interval: c.total_interval,
                own: c.own,
                total: c.total,
            })
            .collect()
    }
}

/// Sample counts since start and over the current interval, by function and by line.
#[derive(Default)]
pub(crate) struct Table {
    functions: Level,
    lines: Level,
    commands: HashMap<u32, Arc<str>>,
    /// (pid, tid) → the thread's name, for the rows' Thread column.
    names: HashMap<(u32, u32), Arc<str>>,
    interval_samples: u64,
    interval_threads: HashSet<(u32, u32)>,
    ids: Vec<u32>,
}

impl Table {
    /// Names thread `tid` of process `pid` in the Thread column (unnamed threads show their
    /// id).
    pub(crate) fn name_thread(&mut self, pid: u32, tid: u32, name: &Arc<str>) {
        if self.names.get(&(pid, tid)) != Some(name) {
            if self.names.len() >= MAX_NAMES {
                self.names.clear();
            }
            self.names.insert((pid, tid), name.clone());
        }
    }

    /// Adds one sample of thread `tid` of process `pid`; `frames` are leaf first.
    pub(crate) fn add(&mut self, pid: u32, tid: u32, command: &str, frames: &[Location]) {
        if frames.is_empty() {
            return;
        }
        self.commands.entry(pid).or_insert_with(|| command.into());
        self.interval_samples += 1;
        self.interval_threads.insert((pid, tid));
        let mut ids = std::mem::take(&mut self.ids);
        for (level, granularity) in [
            (&mut self.functions, Granularity::Function),
            (&mut self.lines, Granularity::Line),
        ] {
            ids.clear();
            for f in frames {
                let line = match granularity {
                    Granularity::Function => f.first_line,
                    Granularity::Line => f.line,
                };
                ids.push(level.id(RowKey {
                    pid,
                    function: f.function.clone(),
                    file: f.file.clone(),
                    line,
                }));
            }
            level.add(&mut ids, tid);
        }
        self.ids = ids;
    }

    /// Drops every row of a process that exited.
    pub(crate) fn forget(&mut self, pid: u32) {
        self.functions.forget(pid);
        self.lines.forget(pid);
        self.commands.remove(&pid);
        self.names.retain(|k, _| k.0 != pid);
    }

    /// The rows as they are now, and starts a new interval.
    pub(crate) fn end_interval(&mut self) -> Counted {
        let counted = Counted {
            functions: self.functions.rows(&self.commands, &self.names),
            lines: self.lines.rows(&self.commands, &self.names),
            interval_samples: self.interval_samples,
            threads: self.interval_threads.len(),
        };
        self.functions.end_interval();
        self.lines.end_interval();
        self.interval_samples = 0;
        self.interval_threads.clear();
        counted
    }
}

/// One row of a snapshot.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Row {
    pub key: RowKey,
    /// Short command line of the process.
    pub command: Arc<str>,
    /// The name of the thread the row's samples came from, or how many threads they came
    /// from.
    pub thread: Arc<str>,
    pub own_interval: u64,
    pub total_interval: u64,
    pub own: u64,
    pub total: u64,
}

/// The rows at the end of one interval.
#[derive(Clone, Debug, Default)]
pub(crate) struct Counted {
    pub functions: Vec<Row>,
    pub lines: Vec<Row>,
    /// Python samples in the interval.
    pub interval_samples: u64,
    /// Distinct threads sampled in the interval.
    pub threads: usize,
}

impl Counted {
    pub(crate) fn rows(&self, granularity: Granularity) -> &[Row] {
        match granularity {
            Granularity::Function => &self.functions,
            Granularity::Line => &self.lines,
        }
    }
}

/// A column to sort by, in display order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Column {
    Own,
    Total,
    OwnTime,
    TotalTime,
    Process,
    Thread,
    Function,
}

impl Column {
    pub(crate) const ALL: [Column; 7] = [
        Column::Own,
        Column::Total,
        Column::OwnTime,
        Column::TotalTime,
        Column::Process,
        Column::Thread,
        Column::Function,
    ];

    pub(crate) fn title(self) -> &'static str {
        match self {
            Column::Own => "%Own",
            Column::Total => "%Total",
            Column::OwnTime => "OwnTime",
            Column::TotalTime => "TotalTime",
            Column::Process => "Process",
            Column::Thread => "Thread",
            Column::Function => "Function (file:line)",
        }
    }

    pub(crate) fn index(self) -> usize {
        Column::ALL.iter().position(|&c| c == self).unwrap_or(0)
    }

    /// Numbers sort largest first, names A to Z.
    pub(crate) fn descending_by_default(self) -> bool {
        !matches!(self, Column::Process | Column::Thread | Column::Function)
    }

    pub(crate) fn next(self) -> Column {
        Column::ALL[(self.index() + 1) % Column::ALL.len()]
    }

    pub(crate) fn prev(self) -> Column {
        Column::ALL[(self.index() + Column::ALL.len() - 1) % Column::ALL.len()]
    }
}

impl From<crate::cli::TopSort> for Column {
    fn from(s: crate::cli::TopSort) -> Column {
        use crate::cli::TopSort;
        match s {
            TopSort::Own => Column::Own,
            TopSort::Total => Column::Total,
            TopSort::OwnTime => Column::OwnTime,
            TopSort::TotalTime => Column::TotalTime,
            TopSort::Function => Column::Function,
            TopSort::Process => Column::Process,
            TopSort::Thread => Column::Thread,
        }
    }
}

/// Which processes to show: a pid, or text found in the command (case-insensitive).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Filter {
    text: String,
    pid: Option<u32>,
}

impl Filter {
    /// `None` for blank text (no filter).
    pub(crate) fn new(text: &str) -> Option<Filter> {
        let text = text.trim();
        if text.is_empty() {
            return None;
        }
        Some(Filter {
            text: text.to_lowercase(),
            pid: text.parse().ok(),
        })
    }

    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    pub(crate) fn matches(&self, pid: u32, command: &str) -> bool {
        match self.pid {
            Some(p) => p == pid,
            None => command.to_lowercase().contains(&self.text),
        }
    }
}

/// How rows are chosen and ordered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ViewOptions {
    pub granularity: Granularity,
    pub sort: Column,
    pub descending: bool,
    pub filter: Option<Filter>,
}

impl ViewOptions {
    pub(crate) fn new(granularity: Granularity, sort: Column) -> ViewOptions {
        ViewOptions {
            granularity,
            sort,
            descending: sort.descending_by_default(),
            filter: None,
        }
    }

    /// Sorts by `column`; choosing the current column again reverses the order.
    pub(crate) fn sort_by(&mut self, column: Column) {
        if column == self.sort {
            self.descending = !self.descending;
        } else {
            self.sort = column;
            self.descending = column.descending_by_default();
        }
    }
}

fn compare(column: Column, a: &Row, b: &Row) -> Ordering {
    match column {
        Column::Own => a.own_interval.cmp(&b.own_interval),
        Column::Total => a.total_interval.cmp(&b.total_interval),
        Column::OwnTime => a.own.cmp(&b.own),
        Column::TotalTime => a.total.cmp(&b.total),
        Column::Process => a.key.pid.cmp(&b.key.pid),
        Column::Thread => a.thread.cmp(&b.thread),
        Column::Function => a
            .key
            .function
            .cmp(&b.key.function)
            .then_with(|| a.key.file.cmp(&b.key.file))
            .then_with(|| a.key.line.cmp(&b.key.line)),
    }
}

/// The rows to show, in order.
pub(crate) fn view<'a>(counted: &'a Counted, opts: &ViewOptions) -> Vec<&'a Row> {
    let mut rows: Vec<&Row> = counted
        .rows(opts.granularity)
        .iter()
        .filter(|r| {
            opts.filter
                .as_ref()
                .is_none_or(|f| f.matches(r.key.pid, &r.command))
        })
        .collect();
    rows.sort_by(|a, b| {
        let primary = compare(opts.sort, a, b);
        let primary = if opts.descending {
            primary.reverse()
        } else {
            primary
        };
        // Ties: the busiest first, then a stable order by name and process.
        primary
            .then_with(|| b.own_interval.cmp(&a.own_interval))
            .then_with(|| b.total.cmp(&a.total))
            .then_with(|| compare(Column::Function, a, b))
            .then_with(|| a.key.pid.cmp(&b.key.pid))
    });
    rows
}

/// `part` as a percentage of `whole` (0 when there is nothing to divide).
pub(crate) fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// CPU time of `samples` samples taken at `rate_hz`, the way `top` shows it.
pub(crate) fn format_time(samples: u64, rate_hz: u64) -> String {
    let secs = samples as f64 / rate_hz.max(1) as f64;
    if secs < 100.0 {
        format!("{secs:.2}s")
    } else if secs < 6000.0 {
        let s = secs as u64;
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        let m = secs as u64 / 60;
        format!("{}h{:02}m", m / 60, m % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(function: &str, first_line: u32, line: u32) -> Location {
        Location {
            function: function.into(),
            file: "app.py".into(),
            first_line,
            line,
        }
    }

    fn find<'a>(rows: &'a [Row], pid: u32, function: &str) -> &'a Row {
        rows.iter()
            .find(|r| r.key.pid == pid && &*r.key.function == function)
            .unwrap_or_else(|| panic!("no row {pid} {function} in {rows:#?}"))
    }

    #[test]
    fn own_is_the_leaf_total_is_anywhere() {
        let mut t = Table::default();
        let stack = [
            loc("leaf", 10, 12),
            loc("mid", 5, 6),
            loc("<module>", 1, 20),
        ];
        for _ in 0..3 {
            t.add(1, 1, "python app.py", &stack);
        }
        t.add(1, 1, "python app.py", &stack[1..]);
        let c = t.end_interval();
        assert_eq!(c.interval_samples, 4);
        let leaf = find(&c.functions, 1, "leaf");
        assert_eq!(
            (leaf.own, leaf.total, leaf.own_interval, leaf.total_interval),
            (3, 3, 3, 3)
        );
        let mid = find(&c.functions, 1, "mid");
        assert_eq!((mid.own, mid.total), (1, 4));
        let module = find(&c.functions, 1, "<module>");
        assert_eq!((module.own, module.total), (0, 4));
        assert_eq!(&*module.command, "python app.py");
    }

    #[test]
    fn recursion_counts_total_once_per_sample() {
        let mut t = Table::default();
        // fib → fib → fib → main, on different lines.
        let stack = [
            loc("fib", 3, 4),
            loc("fib", 3, 5),
            loc("fib", 3, 5),
            loc("main", 9, 10),
        ];
        t.add(7, 7, "py", &stack);
        t.add(7, 7, "py", &stack);
        let c = t.end_interval();
        let fib = find(&c.functions, 7, "fib");
        assert_eq!((fib.own, fib.total), (2, 2));
        // Per line: line 5 appears twice in each stack but counts once.
        let line5 = c.lines.iter().find(|r| r.key.line == 5).unwrap();
        assert_eq!((line5.own, line5.total), (0, 2));
        let line4 = c.lines.iter().find(|r| r.key.line == 4).unwrap();
        assert_eq!((line4.own, line4.total), (2, 2));
        assert!(percent(fib.total_interval, c.interval_samples) <= 100.0);
    }

    #[test]
    fn lines_split_a_function_and_functions_merge_lines() {
        let mut t = Table::default();
        t.add(1, 1, "py", &[loc("f", 10, 11)]);
        t.add(1, 1, "py", &[loc("f", 10, 12)]);
        t.add(1, 1, "py", &[loc("f", 10, 12)]);
        let c = t.end_interval();
        assert_eq!(c.functions.len(), 1);
        assert_eq!(c.functions[0].own, 3);
        assert_eq!(c.functions[0].key.line, 10);
        assert_eq!(c.functions[0].key.label(), "f (app.py:10)");
        let mut lines: Vec<(u32, u64)> = c.lines.iter().map(|r| (r.key.line, r.own)).collect();
        lines.sort();
        assert_eq!(lines, vec![(11, 1), (12, 2)]);
    }

    #[test]
    fn intervals_reset_but_cumulative_counts_stay() {
        let mut t = Table::default();
        t.add(1, 1, "py", &[loc("a", 1, 1)]);
        t.add(1, 2, "py", &[loc("a", 1, 1)]);
        let first = t.end_interval();
        assert_eq!(first.threads, 2);
        t.add(1, 1, "py", &[loc("b", 5, 5)]);
        let second = t.end_interval();
        assert_eq!((second.interval_samples, second.threads), (1, 1));
        let a = find(&second.functions, 1, "a");
        assert_eq!((a.own_interval, a.own), (0, 2));
        let b = find(&second.functions, 1, "b");
        assert_eq!((b.own_interval, b.own), (1, 1));
    }

    #[test]
    fn processes_are_separate_rows_and_forget_drops_them() {
        let mut t = Table::default();
        t.add(1, 1, "python one.py", &[loc("f", 1, 1)]);
        t.add(2, 2, "python two.py", &[loc("f", 1, 1)]);
        let c = t.end_interval();
        assert_eq!(c.functions.len(), 2);
        t.forget(1);
        t.add(2, 2, "python two.py", &[loc("f", 1, 1)]);
        let c = t.end_interval();
        assert_eq!(c.functions.len(), 1);
        assert_eq!(c.functions[0].key.pid, 2);
        assert_eq!(c.functions[0].own, 2);
        assert_eq!(c.lines.len(), 1);
    }

    #[test]
    fn empty_samples_are_ignored() {
        let mut t = Table::default();
        t.add(1, 1, "py", &[]);
        let c = t.end_interval();
        assert_eq!(c.interval_samples, 0);
        assert!(c.functions.is_empty());
    }

    fn sample_counted() -> Counted {
        let mut t = Table::default();
        for _ in 0..6 {
            t.add(
                10,
                10,
                "python3 busy.py",
                &[loc("hot", 1, 2), loc("<module>", 1, 9)],
            );
        }
        for _ in 0..3 {
            t.add(
                20,
                20,
                "python3 other.py",
                &[
                    loc("warm", 1, 2),
                    loc("caller", 4, 5),
                    loc("<module>", 1, 9),
                ],
            );
        }
        t.add(
            20,
            20,
            "python3 other.py",
            &[loc("caller", 4, 6), loc("<module>", 1, 9)],
        );
        t.end_interval()
    }

    fn names(rows: &[&Row]) -> Vec<String> {
        rows.iter()
            .map(|r| format!("{}:{}", r.key.pid, r.key.function))
            .collect()
    }

    #[test]
    fn view_sorts_by_each_column() {
        let c = sample_counted();
        let mut opts = ViewOptions::new(Granularity::Function, Column::Own);
        assert_eq!(names(&view(&c, &opts))[..2], ["10:hot", "20:warm"]);
        opts.sort_by(Column::Total);
        // Equal totals: the one with more own samples first.
        let v = names(&view(&c, &opts));
        assert_eq!(
            v[..4],
            ["10:hot", "10:<module>", "20:caller", "20:<module>"]
        );
        opts.sort_by(Column::Function);
        assert!(!opts.descending);
        let v = names(&view(&c, &opts));
        assert_eq!(
            v,
            [
                "10:<module>",
                "20:<module>",
                "20:caller",
                "10:hot",
                "20:warm"
            ]
        );
        opts.sort_by(Column::Function);
        assert!(opts.descending);
        assert_eq!(names(&view(&c, &opts))[0], "20:warm");
        opts.sort_by(Column::Process);
        assert_eq!(names(&view(&c, &opts))[0].split(':').next(), Some("10"));
        opts.sort_by(Column::OwnTime);
        assert_eq!(names(&view(&c, &opts))[0], "10:hot");
        opts.sort_by(Column::TotalTime);
        assert_eq!(names(&view(&c, &opts))[2], "20:caller");
    }

    #[test]
    fn filter_by_pid_or_command() {
        let c = sample_counted();
        let mut opts = ViewOptions::new(Granularity::Function, Column::Own);
        opts.filter = Filter::new("20");
        assert!(view(&c, &opts).iter().all(|r| r.key.pid == 20));
        opts.filter = Filter::new("BUSY");
        let v = view(&c, &opts);
        assert_eq!(v.len(), 2);
        assert!(v.iter().all(|r| r.key.pid == 10));
        opts.filter = Filter::new("nothing");
        assert!(view(&c, &opts).is_empty());
        assert_eq!(Filter::new("  "), None);
    }

    #[test]
    fn line_view_uses_line_rows() {
        let c = sample_counted();
        let opts = ViewOptions::new(Granularity::Line, Column::Own);
        let v = view(&c, &opts);
        assert!(v
            .iter()
            .any(|r| &*r.key.function == "caller" && r.key.line == 6));
        assert!(v
            .iter()
            .any(|r| &*r.key.function == "caller" && r.key.line == 5));
    }

    #[test]
    fn columns_cycle() {
        assert_eq!(Column::Own.prev(), Column::Function);
        assert_eq!(Column::Function.next(), Column::Own);
        for c in Column::ALL {
            assert_eq!(c.next().prev(), c);
        }
    }

    #[test]
    fn times_and_percentages() {
        assert_eq!(format_time(150, 100), "1.50s");
        assert_eq!(format_time(100 * 125, 100), "2m05s");
        assert_eq!(format_time(100 * 7260, 100), "2h01m");
        assert_eq!(percent(1, 0), 0.0);
        assert_eq!(percent(1, 4), 25.0);
    }
}
