//! `dump`'s text output, py-spy's shape: a process header, then each thread with its frames,
//! most recent call first.

use std::fmt::Write;

use super::native::NativeDump;
use super::snapshot::{NameSource, ProcessDump, ThreadDump, ThreadState};

pub(super) fn render(dumps: &[ProcessDump]) -> String {
    let mut out = String::new();
    for (i, p) in dumps.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let ns = p
            .ns_pid
            .map(|n| format!(", pid {n} in its namespace"))
            .unwrap_or_default();
        let _ = writeln!(out, "Process {}{ns}: {}", p.pid, p.command);
        let build = if p.free_threaded {
            ", free-threaded (no GIL)"
        } else {
            ""
        };
        let _ = writeln!(out, "Python v{}{build} ({})", p.python_version, p.binary);
        for t in &p.threads {
            out.push('\n');
            thread(&mut out, t);
        }
        if let Some(tasks) = &p.tasks {
            let _ = writeln!(out, "\nTasks (asyncio): {}", tasks.len());
            super::tasks::render(&mut out, tasks);
        }
    }
    out
}

fn thread(out: &mut String, t: &ThreadDump) {
    let state = match t.state {
        ThreadState::Running => "on CPU".to_string(),
        ThreadState::Idle => format!("idle ({})", t.os_state),
        ThreadState::Gone => "exited".to_string(),
    };
    let gil = match t.holds_gil {
        Some(true) => ", holds the GIL",
        _ => "",
    };
    let os_name = match t.name_source {
        NameSource::Threading if t.os_name != t.name && !t.os_name.is_empty() => {
            format!(" ({})", t.os_name)
        }
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "Thread {} \"{}\"{os_name}: {state}{gil}",
        t.tid, t.name
    );
    if !t.consistent {
        let _ = writeln!(
            out,
            "    (changed while read, in each of {} copies: these frames may mix two moments)",
            t.attempts
        );
    }
    if let Some(ms) = t.locals_read_after_ms {
        let _ = writeln!(
            out,
            "    (variables read {ms} ms after these frames were taken)"
        );
    }
    if let Some(e) = &t.error {
        let _ = writeln!(out, "    <stack unavailable: {e}>");
    } else if t.frames.is_empty() && t.state != ThreadState::Gone {
        out.push_str("    <no Python frames>\n");
    }
    for f in &t.frames {
        let _ = writeln!(out, "    {} ({}:{})", f.function, f.file, f.line);
        if let Some(why) = &f.locals_unavailable {
            let _ = writeln!(out, "        <no variables: {why}>");
        }
        let Some(locals) = &f.locals else { continue };
        for (title, args) in [("Arguments:", true), ("Locals:", false)] {
            let mut these = locals.iter().filter(|l| l.arg == args).peekable();
            if these.peek().is_none() {
                continue;
            }
            let _ = writeln!(out, "        {title}");
            for l in these {
                let _ = writeln!(out, "            {}: {}", l.name, l.value);
            }
        }
    }
    if t.truncated {
        out.push_str("    <deeper frames not shown>\n");
    }
    match &t.native {
        None => {}
        Some(NativeDump::Unavailable(why)) => {
            let _ = writeln!(out, "    native: unavailable: {why}");
        }
        Some(NativeDump::Sampled { frames }) => {
            out.push_str("    native (the same sample as the frames above):\n");
            for f in frames {
                let _ = match (&f.file, f.line) {
                    (Some(file), Some(line)) => {
                        writeln!(out, "        {} ({file}:{line})", f.function)
                    }
                    (Some(module), None) => writeln!(out, "        {} [{module}]", f.function),
                    _ => writeln!(out, "        {}", f.function),
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dump::snapshot::FrameDump;
    use crate::python::objects::Local;

    fn frame(function: &str, line: u32, locals: Option<Vec<Local>>) -> FrameDump {
        FrameDump {
            function: function.into(),
            file: "app.py".into(),
            line,
            locals,
            locals_unavailable: None,
        }
    }

    #[test]
    fn threads_frames_and_locals() {
        let local = |name: &str, value: &str, arg| Local {
            name: name.into(),
            value: value.into(),
            arg,
        };
        let dump = ProcessDump {
            pid: 10,
            ns_pid: None,
            command: "python3 app.py".into(),
            python_version: "3.12.1".into(),
            free_threaded: false,
            binary: "/usr/bin/python3.12".into(),
            threads: vec![ThreadDump {
                tid: 11,
                ns_tid: None,
                name: "worker".into(),
                name_source: NameSource::Threading,
                os_name: "python3.12".into(),
                state: ThreadState::Running,
                os_state: "R".into(),
                holds_gil: Some(true),
                frames: vec![
                    frame(
                        "spin",
                        5,
                        Some(vec![local("n", "3", true), local("total", "'x'", false)]),
                    ),
                    frame("main", 9, Some(vec![])),
                ],
                truncated: false,
                consistent: false,
                source: Some(crate::dump::snapshot::Source::Userspace),
                taken_ms: Some(1.5),
                attempts: 16,
                locals_read_after_ms: None,
                error: None,
                native: Some(NativeDump::Unavailable("off-CPU".into())),
            }],
            error: None,
            tasks: None,
        };
        assert_eq!(
            render(&[dump]),
            "Process 10: python3 app.py\n\
             Python v3.12.1 (/usr/bin/python3.12)\n\
             \n\
             Thread 11 \"worker\" (python3.12): on CPU, holds the GIL\n    \
             (changed while read, in each of 16 copies: these frames may mix two moments)\n    \
             spin (app.py:5)\n        \
             Arguments:\n            \
             n: 3\n        \
             Locals:\n            \
             total: 'x'\n    \
             main (app.py:9)\n    \
             native: unavailable: off-CPU\n"
        );
    }
}
