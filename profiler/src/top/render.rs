//! The live view of `top` (ratatui + crossterm): state, keys and drawing.
//!
//! Keys: `1`–`6` or `←` `→` / `<` `>` choose the sort column (the same column again reverses),
//! `r` reverses, `p` or space pauses/resumes the display (sampling goes on), `/` filters by
//! process (type a pid or part of the command, Enter applies, empty Enter clears, Esc
//! cancels), `l` toggles per-line / per-function rows, `↑` `↓` PgUp PgDn Home scroll, `q`,
//! Esc or Ctrl-C quit. The terminal is restored on quit, on errors and on panics.

use std::io::Stdout;
use std::sync::Once;
use std::time::Duration;

use anyhow::{Context, Result};
use crossterm::event::{Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::backend::CrosstermBackend;
use ratatui::layout::{Alignment, Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row as TableRow, Table as TableWidget, Wrap};
use ratatui::{Frame, Terminal};
use tokio::sync::mpsc;

use super::table::{self, Column, Filter, RowKey, ViewOptions};
use super::{cells, text, Snapshot};

/// Below this size the table cannot be read; a message is shown instead.
pub(crate) const MIN_WIDTH: u16 = 70;
pub(crate) const MIN_HEIGHT: u16 = 8;

const HELP: &[(&str, &str)] = &[
    ("q", "quit"),
    ("1-7 ←→", "sort"),
    ("r", "reverse"),
    ("space", "pause"),
    ("/", "filter process"),
    ("l", "lines/functions"),
    ("↑↓", "scroll"),
];

/// What the driver should do after an input event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    Nothing,
    Redraw,
    Quit,
}

/// Everything the screen shows, and the keys that change it. No terminal inside: testable.
pub(crate) struct Ui {
    pub opts: ViewOptions,
    pub paused: bool,
    /// The filter being typed, while `/` is active.
    pub editing: Option<String>,
    /// The snapshot on screen.
    pub snapshot: Snapshot,
    /// The newest snapshot, received while paused.
    pending: Option<Snapshot>,
    pub scroll: usize,
    /// The latest warning (e.g. an unsupported interpreter found by the scan).
    pub message: Option<String>,
    pub delay: Duration,
    pub rate_hz: u64,
    /// Whether any snapshot arrived yet.
    started: bool,
}

impl Ui {
    pub(crate) fn new(opts: ViewOptions, delay: Duration, rate_hz: u64) -> Ui {
        Ui {
            opts,
            paused: false,
            editing: None,
            snapshot: Snapshot {
                rate_hz,
                ..Snapshot::default()
            },
            pending: None,
            scroll: 0,
            message: None,
            delay,
            rate_hz,
            started: false,
        }
    }

    /// A new interval ended: show it, unless paused.
    pub(crate) fn update(&mut self, snap: Snapshot) {
        self.started = true;
        if self.paused {
            self.pending = Some(snap);
        } else {
            self.snapshot = snap;
        }
    }

    pub(crate) fn on_event(&mut self, event: &Event) -> Action {
        match event {
            Event::Key(key) if key.kind != KeyEventKind::Release => self.on_key(key),
            Event::Resize(..) => Action::Redraw,
            _ => Action::Nothing,
        }
    }

    pub(crate) fn on_key(&mut self, key: &KeyEvent) -> Action {
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Action::Quit;
        }
        if let Some(text) = &mut self.editing {
            match key.code {
                KeyCode::Enter => {
                    self.opts.filter = Filter::new(text);
                    self.editing = None;
                    self.scroll = 0;
                }
                KeyCode::Esc => self.editing = None,
                KeyCode::Backspace => {
                    text.pop();
                }
                KeyCode::Char(c) if text.chars().count() < 64 => text.push(c),
                _ => return Action::Nothing,
            }
            return Action::Redraw;
        }
        match key.code {
            KeyCode::Char('q') | KeyCode::Char('Q') | KeyCode::Esc => return Action::Quit,
            KeyCode::Char(c @ '1'..='7') => {
                let index = c as usize - '1' as usize;
                self.opts.sort_by(Column::ALL[index]);
            }
            KeyCode::Left | KeyCode::Char('<') => self.opts.sort_by(self.opts.sort.prev()),
            KeyCode::Right | KeyCode::Char('>') => self.opts.sort_by(self.opts.sort.next()),
            KeyCode::Char('r') => self.opts.descending = !self.opts.descending,
            KeyCode::Char('p') | KeyCode::Char(' ') => {
                self.paused = !self.paused;
                if !self.paused {
                    if let Some(snap) = self.pending.take() {
                        self.snapshot = snap;
                    }
                }
            }
            KeyCode::Char('/') => self.editing = Some(String::new()),
            KeyCode::Char('l') => {
                self.opts.granularity = self.opts.granularity.toggled();
                self.scroll = 0;
            }
            KeyCode::Up | KeyCode::Char('k') => self.scroll = self.scroll.saturating_sub(1),
            KeyCode::Down | KeyCode::Char('j') => self.scroll += 1,
            KeyCode::PageUp => self.scroll = self.scroll.saturating_sub(10),
            KeyCode::PageDown => self.scroll += 10,
            KeyCode::Home => self.scroll = 0,
            _ => return Action::Nothing,
        }
        Action::Redraw
    }

    pub(crate) fn draw(&self, frame: &mut Frame) {
        let area = frame.area();
        if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
            let text = format!(
                "Terminal too small ({}x{}): pyebpf top needs at least {MIN_WIDTH}x{MIN_HEIGHT}. Enlarge it, or press q to quit.",
                area.width, area.height
            );
            frame.render_widget(Paragraph::new(text).wrap(Wrap { trim: true }), area);
            return;
        }
        let [title, stats, status, body, help] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(1),
            Constraint::Length(1),
            Constraint::Min(2),
            Constraint::Length(1),
        ])
        .areas(area);
        self.draw_title(frame, title);
        frame.render_widget(Paragraph::new(self.snapshot.summary()), stats);
        self.draw_status(frame, status);
        self.draw_table(frame, body);
        let bold = Style::new().add_modifier(Modifier::BOLD);
        let mut spans = Vec::new();
        for (i, (key, what)) in HELP.iter().enumerate() {
            if i > 0 {
                spans.push(Span::raw("  "));
            }
            spans.push(Span::styled(*key, bold));
            spans.push(Span::raw(format!(" {what}")));
        }
        frame.render_widget(Paragraph::new(Line::from(spans)), help);
    }

    fn draw_title(&self, frame: &mut Frame, area: Rect) {
        let mut spans = vec![
            Span::styled(
                " pyebpf top ",
                Style::new().add_modifier(Modifier::BOLD | Modifier::REVERSED),
            ),
            Span::raw(format!(
                " sampling at {} Hz, refreshing every {:.1}s",
                self.rate_hz,
                self.delay.as_secs_f64()
            )),
        ];
        if self.paused {
            spans.push(Span::raw("  "));
            spans.push(Span::styled(
                " PAUSED ",
                Style::new().add_modifier(Modifier::BOLD | Modifier::REVERSED),
            ));
        }
        frame.render_widget(Paragraph::new(Line::from(spans)), area);
    }

    fn draw_status(&self, frame: &mut Frame, area: Rect) {
        if let Some(text) = &self.editing {
            let prompt = "Filter by pid or command (Enter applies, empty clears, Esc cancels): ";
            let line = format!("{prompt}{text}");
            frame.render_widget(Paragraph::new(line.as_str()), area);
            let x = area.x + (line.chars().count() as u16).min(area.width.saturating_sub(1));
            frame.set_cursor_position((x, area.y));
            return;
        }
        let order = if self.opts.descending { "▼" } else { "▲" };
        let filter = match &self.opts.filter {
            Some(f) => format!("\"{}\"", f.text()),
            None => "none".into(),
        };
        let mut line = format!(
            "by {} · sort {} {order} · filter {filter}",
            self.opts.granularity.name(),
            self.opts.sort.title(),
        );
        if let Some(note) = &self.snapshot.note {
            line.push_str(" · ");
            line.push_str(note);
        }
        if let Some(message) = &self.message {
            line.push_str(" · ");
            line.push_str(message);
        }
        frame.render_widget(Paragraph::new(line), area);
    }

    fn draw_table(&self, frame: &mut Frame, area: Rect) {
        let widths = text::WIDTHS;
        let fixed: u16 = widths.iter().map(|&w| w as u16).sum::<u16>() + widths.len() as u16;
        let function_width = area.width.saturating_sub(fixed).max(10) as usize;
        let header = TableRow::new(Column::ALL.iter().enumerate().map(|(i, &c)| {
            let mut title = c.title().to_string();
            let mut style = Style::new().add_modifier(Modifier::BOLD);
            if c == self.opts.sort {
                title.push(if self.opts.descending { '▼' } else { '▲' });
                style = style.add_modifier(Modifier::REVERSED);
            }
            let line = Line::from(title);
            Cell::from(if i < 4 {
                line.alignment(Alignment::Right)
            } else {
                line
            })
            .style(style)
        }));
        let rows = table::view(&self.snapshot.counted, &self.opts);
        let visible = area.height.saturating_sub(1) as usize;
        let first = self.scroll.min(rows.len().saturating_sub(visible));
        let mut lines: Vec<TableRow> = rows
            .iter()
            .skip(first)
            .take(visible)
            .map(|row| {
                let [own, total, own_time, total_time, process, thread, _] =
                    cells(row, &self.snapshot);
                let right = |s: String| Cell::from(Line::from(s).alignment(Alignment::Right));
                TableRow::new(vec![
                    right(own),
                    right(total),
                    right(own_time),
                    right(total_time),
                    Cell::from(process),
                    Cell::from(thread),
                    Cell::from(fit_label(&row.key, function_width)),
                ])
            })
            .collect();
        if rows.is_empty() {
            let text = if !self.started {
                format!("collecting samples for {:.1}s…", self.delay.as_secs_f64())
            } else if self.opts.filter.is_some() {
                "no process matches the filter (press / then Enter to clear it)".into()
            } else {
                "no Python samples yet: is a Python process busy?".into()
            };
            lines.push(TableRow::new(vec![
                Cell::default(),
                Cell::default(),
                Cell::default(),
                Cell::default(),
                Cell::default(),
                Cell::default(),
                Cell::from(text),
            ]));
        }
        let mut constraints: Vec<Constraint> = widths
            .iter()
            .map(|&w| Constraint::Length(w as u16))
            .collect();
        constraints.push(Constraint::Fill(1));
        let widget = TableWidget::new(lines, constraints)
            .header(header)
            .column_spacing(1);
        frame.render_widget(widget, area);
    }
}

/// `function (file:line)` in at most `width` characters: a long path loses its beginning
/// first, so the function, the file name and the line stay readable.
pub(crate) fn fit_label(key: &RowKey, width: usize) -> String {
    let label = key.label();
    if label.chars().count() <= width {
        return label;
    }
    if !key.file.is_empty() {
        let suffix = format!(":{})", key.line);
        let fixed = key.function.chars().count() + 3 + suffix.len();
        if width >= fixed + 6 {
            let keep = width - fixed;
            let file: Vec<char> = key.file.chars().collect();
            let tail: String = file[file.len().saturating_sub(keep)..].iter().collect();
            return format!("{} (…{tail}{suffix}", key.function);
        }
    }
    let mut cut: String = label.chars().take(width.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// The terminal in raw mode on the alternate screen, restored when dropped or on a panic.
pub(crate) struct Live {
    terminal: Terminal<CrosstermBackend<Stdout>>,
    keys: mpsc::UnboundedReceiver<Event>,
    ui: Ui,
    log_level: log::LevelFilter,
}

fn restore_terminal() {
    let _ = crossterm::terminal::disable_raw_mode();
    let _ = crossterm::execute!(
        std::io::stdout(),
        crossterm::terminal::LeaveAlternateScreen,
        crossterm::cursor::Show
    );
}

impl Live {
    pub(crate) fn start(opts: ViewOptions, delay: Duration, rate_hz: u64) -> Result<Live> {
        static HOOK: Once = Once::new();
        HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                restore_terminal();
                previous(info);
            }));
        });
        crossterm::terminal::enable_raw_mode().context("putting the terminal in raw mode")?;
        let entered = crossterm::execute!(
            std::io::stdout(),
            crossterm::terminal::EnterAlternateScreen,
            crossterm::cursor::Hide
        );
        if let Err(e) = entered {
            restore_terminal();
            return Err(e).context("switching to the alternate screen");
        }
        let terminal = match Terminal::new(CrosstermBackend::new(std::io::stdout())) {
            Ok(t) => t,
            Err(e) => {
                restore_terminal();
                return Err(e).context("setting up the terminal");
            }
        };
        // Log lines would tear the screen; warnings go to the status line instead.
        let log_level = log::max_level();
        log::set_max_level(log::LevelFilter::Off);
        let (tx, keys) = mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("top-input".into())
            .spawn(move || {
                while let Ok(event) = crossterm::event::read() {
                    if tx.send(event).is_err() {
                        break;
                    }
                }
            })
            .context("starting the input thread")?;
        let mut live = Live {
            terminal,
            keys,
            ui: Ui::new(opts, delay, rate_hz),
            log_level,
        };
        live.draw()?;
        Ok(live)
    }

    /// The terminal's events, for the driver to wait on (taken once).
    pub(crate) fn take_keys(&mut self) -> mpsc::UnboundedReceiver<Event> {
        let (_, none) = mpsc::unbounded_channel();
        std::mem::replace(&mut self.keys, none)
    }

    pub(crate) fn handle(&mut self, event: Event) -> Result<Action> {
        let action = self.ui.on_event(&event);
        if action == Action::Redraw {
            self.draw()?;
        }
        Ok(action)
    }

    pub(crate) fn update(&mut self, snap: Snapshot) -> Result<()> {
        self.ui.update(snap);
        self.draw()
    }

    pub(crate) fn warn(&mut self, message: String) {
        self.ui.message = Some(message);
    }

    fn draw(&mut self) -> Result<()> {
        let ui = &self.ui;
        self.terminal
            .draw(|frame| ui.draw(frame))
            .context("drawing the screen")?;
        Ok(())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        restore_terminal();
        log::set_max_level(self.log_level);
    }
}

#[cfg(test)]
mod tests {
    use ratatui::backend::TestBackend;

    use super::*;
    use crate::top::table::{Granularity, Location, Table};

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    fn snapshot() -> Snapshot {
        let mut t = Table::default();
        let f = |name: &str, line| Location {
            function: name.into(),
            file: "/srv/work/app.py".into(),
            first_line: line,
            line: line + 2,
        };
        for _ in 0..9 {
            t.add(
                111,
                111,
                "python3 busy.py",
                &[f("hot", 10), f("<module>", 1)],
            );
        }
        t.add(
            222,
            222,
            "python3 calm.py",
            &[f("calm", 20), f("<module>", 1)],
        );
        Snapshot {
            counted: t.end_interval(),
            interval: Duration::from_secs(1),
            elapsed: Duration::from_secs(3),
            rate_hz: 100,
            processes: 2,
            python_share: Some(0.25),
            ..Snapshot::default()
        }
    }

    fn screen(ui: &Ui, width: u16, height: u16) -> String {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        terminal.draw(|f| ui.draw(f)).unwrap();
        let buffer = terminal.backend().buffer().clone();
        let mut out = String::new();
        for y in 0..buffer.area.height {
            for x in 0..buffer.area.width {
                out.push_str(buffer[(x, y)].symbol());
            }
            out.push('\n');
        }
        out
    }

    fn ui() -> Ui {
        let mut ui = Ui::new(
            ViewOptions::new(Granularity::Function, Column::Own),
            Duration::from_secs(1),
            100,
        );
        ui.update(snapshot());
        ui
    }

    #[test]
    fn table_shows_columns_and_rows() {
        let ui = ui();
        let s = screen(&ui, 120, 12);
        assert!(
            s.contains("%Own▼") && s.contains("TotalTime") && s.contains("Function (file:line)"),
            "{s}"
        );
        assert!(
            s.contains("hot (/srv/work/app.py:10)") && s.contains("111 python3 busy.py"),
            "{s}"
        );
        assert!(s.contains("90.0%"), "{s}");
        assert!(
            s.contains("10 samples/s") && s.contains("25.0% in Python"),
            "{s}"
        );
        assert!(s.contains("q quit"), "{s}");
        let hot = s.lines().position(|l| l.contains("hot (")).unwrap();
        let calm = s.lines().position(|l| l.contains("calm (")).unwrap();
        assert!(hot < calm);
    }

    #[test]
    fn too_small_shows_a_message() {
        let s = screen(&ui(), 40, 6);
        assert!(s.contains("Terminal too small"), "{s}");
        assert!(!s.contains("%Own"));
    }

    #[test]
    fn keys_sort_filter_pause_and_quit() {
        let mut ui = ui();
        assert_eq!(ui.on_key(&key(KeyCode::Char('7'))), Action::Redraw);
        assert_eq!(ui.opts.sort, Column::Function);
        assert!(!ui.opts.descending);
        let s = screen(&ui, 120, 12);
        let module = s.lines().position(|l| l.contains("<module> (")).unwrap();
        let hot = s.lines().position(|l| l.contains("hot (")).unwrap();
        assert!(module < hot, "{s}");
        ui.on_key(&key(KeyCode::Right));
        assert_eq!(ui.opts.sort, Column::Own);

        ui.on_key(&key(KeyCode::Char('/')));
        for c in "calm".chars() {
            ui.on_key(&key(KeyCode::Char(c)));
        }
        assert!(screen(&ui, 120, 12).contains("Filter by pid or command"));
        ui.on_key(&key(KeyCode::Enter));
        let s = screen(&ui, 120, 12);
        assert!(s.contains("calm (") && !s.contains("hot ("), "{s}");
        ui.on_key(&key(KeyCode::Char('/')));
        ui.on_key(&key(KeyCode::Char('1')));
        ui.on_key(&key(KeyCode::Char('1')));
        ui.on_key(&key(KeyCode::Char('1')));
        ui.on_key(&key(KeyCode::Enter));
        let s = screen(&ui, 120, 12);
        assert!(!s.contains("calm (") && s.contains("hot ("), "{s}");
        ui.on_key(&key(KeyCode::Char('/')));
        ui.on_key(&key(KeyCode::Enter));
        assert_eq!(ui.opts.filter, None);

        ui.on_key(&key(KeyCode::Char('l')));
        assert_eq!(ui.opts.granularity, Granularity::Line);
        assert!(screen(&ui, 120, 12).contains("hot (/srv/work/app.py:12)"));

        ui.on_key(&key(KeyCode::Char(' ')));
        assert!(ui.paused);
        assert!(screen(&ui, 120, 12).contains("PAUSED"));
        let mut later = snapshot();
        later.processes = 7;
        ui.update(later);
        assert_eq!(ui.snapshot.processes, 2);
        ui.on_key(&key(KeyCode::Char('p')));
        assert_eq!(ui.snapshot.processes, 7);

        assert_eq!(ui.on_key(&key(KeyCode::Char('q'))), Action::Quit);
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(ui.on_key(&ctrl_c), Action::Quit);
        assert_eq!(ui.on_event(&Event::Resize(80, 20)), Action::Redraw);
    }

    #[test]
    fn long_paths_lose_their_beginning() {
        let key = RowKey {
            pid: 1,
            function: "handler".into(),
            file: "/usr/lib/python3/site-packages/framework/server.py".into(),
            line: 42,
        };
        let fitted = fit_label(&key, 40);
        assert_eq!(fitted.chars().count(), 40, "{fitted}");
        assert!(
            fitted.starts_with("handler (…") && fitted.ends_with("server.py:42)"),
            "{fitted}"
        );
        assert_eq!(fit_label(&key, 200), key.label());
        assert_eq!(fit_label(&key, 8).chars().count(), 8);
    }
}
