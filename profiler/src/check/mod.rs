//! `pyebpf check`: whether this host can run pyebpf, and what to do if not.
//!
//! Every line is one fact: ✔ (fine), ✘ (pyebpf cannot run until fixed; the fix follows) or ·
//! (information). The host's facts come from `/proc` and `/sys` ([`host`]); whether the BPF
//! programs load and attach is found out by doing it ([`sampler`]), never inferred from a
//! version number; then every Python process in sight is inspected the way `record` would
//! ([`processes`]). Ready means no ✘: exit code 0, else 1.
//!
//! [`preflight`] is the subset `record` and `top` run before they load anything.

mod host;
mod processes;
mod sampler;

use std::io::Write;

use anyhow::Result;
use serde::Serialize;

use crate::cli::CheckArgs;

/// How a fact bears on running pyebpf.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Status {
    /// ✔: as pyebpf needs it.
    Ok,
    /// ✘: pyebpf cannot run here until this is fixed.
    Fail,
    /// ·: worth knowing, decides nothing.
    Info,
}

impl Status {
    fn mark(self) -> &'static str {
        match self {
            Status::Ok => "✔",
            Status::Fail => "✘",
            Status::Info => "·",
        }
    }
}

/// One fact about the host.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Fact {
    /// Stable name for scripts: `kernel`, `btf`, `capabilities`, `perf_event_paranoid`,
    /// `lockdown`, `unprivileged_bpf_disabled`, `bpf_programs`.
    pub id: &'static str,
    pub status: Status,
    pub text: String,
    /// What to do about it; always present for `fail`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Fact {
    fn ok(id: &'static str, text: impl Into<String>) -> Fact {
        Fact {
            id,
            status: Status::Ok,
            text: text.into(),
            fix: None,
        }
    }

    fn info(id: &'static str, text: impl Into<String>) -> Fact {
        Fact {
            id,
            status: Status::Info,
            text: text.into(),
            fix: None,
        }
    }

    fn fail(id: &'static str, text: impl Into<String>, fix: impl Into<String>) -> Fact {
        Fact {
            id,
            status: Status::Fail,
            text: text.into(),
            fix: Some(fix.into()),
        }
    }
}

/// Everything `pyebpf check` found, as `--json` prints it.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    /// No fact is `fail`.
    pub ready: bool,
    pub host: Vec<Fact>,
    pub processes: processes::Processes,
}

impl Report {
    fn gather() -> Report {
        let mut facts = host::facts();
        facts.push(sampler::load_and_attach());
        let ready = facts.iter().all(|f| f.status != Status::Fail);
        Report {
            ready,
            host: facts,
            processes: processes::scan(),
        }
    }

    fn text(&self) -> String {
        let mut out = String::from("Host\n");
        for fact in &self.host {
            out.push_str(&format!("  {} {}\n", fact.status.mark(), fact.text));
            if let Some(fix) = &fact.fix {
                out.push_str(&format!("      fix: {fix}\n"));
            }
        }
        out.push('\n');
        out.push_str(&self.processes.text());
        out.push('\n');
        let problems = self
            .host
            .iter()
            .filter(|f| f.status == Status::Fail)
            .count();
        if self.ready {
            out.push_str("Ready: pyebpf can profile this host.\n");
        } else {
            out.push_str(&format!(
                "Not ready: {problems} problem{} (✘) to fix first.\n",
                if problems == 1 { "" } else { "s" }
            ));
        }
        out
    }
}

pub(crate) fn run(args: CheckArgs) -> Result<i32> {
    let report = Report::gather();
    let text = if args.json {
        serde_json::to_string_pretty(&report)? + "\n"
    } else {
        report.text()
    };
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => {}
        // `pyebpf check | head`: the reader saw what it wanted.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => return Err(e.into()),
    }
    Ok(if report.ready { 0 } else { 1 })
}

/// Checks `record` and `top` run before anything is loaded: privileges, then that every
/// requested pid is a CPython process pyebpf can profile. Both are usage errors (exit code 2).
pub(crate) fn preflight(pids: &[u32]) -> Result<()> {
    crate::privileges::check()?;
    let caches = crate::discovery::Caches::default();
    for &pid in pids {
        crate::discovery::inspect_requested(pid, &caches)?;
    }
    Ok(())
}

/// `err` on one line: the messages of its chain joined by ": ", each cut at its first line
/// break (a refused program's error carries the verifier's log, hundreds of lines).
fn one_line(err: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for e in err.chain() {
        let text = e.to_string();
        let lines = text.lines().count();
        let part = match text.lines().next() {
            Some(first) if lines > 1 => format!("{} [{} more lines]", first.trim_end(), lines - 1),
            Some(first) => first.to_string(),
            None => continue,
        };
        // Wrapping errors often repeat their source's message ("map error: failed to create
        // map X" over "failed to create map X"): say it once.
        if parts.last().is_some_and(|last| last.contains(&part)) {
            continue;
        }
        parts.push(part);
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_keeps_the_chain_and_drops_logs() {
        let err = anyhow::anyhow!("Verifier output: 0: (b7) r0 = 0\n1: (95) exit\nR0 bad")
            .context("the kernel refused the BPF program `sample`");
        assert_eq!(
            one_line(&err),
            "the kernel refused the BPF program `sample`: Verifier output: 0: (b7) r0 = 0 [2 more lines]"
        );
    }

    #[test]
    fn one_line_says_a_repeated_message_once() {
        let err = anyhow::Error::new(std::io::Error::from_raw_os_error(libc::EPERM))
            .context("failed to create map `X`")
            .context("map error: failed to create map `X`");
        assert_eq!(
            one_line(&err),
            "map error: failed to create map `X`: Operation not permitted (os error 1)"
        );
    }

    #[test]
    fn readiness_follows_the_marks() {
        let report = Report {
            ready: false,
            host: vec![
                Fact::ok("kernel", "kernel 6.1"),
                Fact::fail("btf", "no BTF", "boot a kernel with BTF"),
                Fact::info("lockdown", "unknown"),
            ],
            processes: processes::Processes::default(),
        };
        let text = report.text();
        assert!(
            text.contains("  ✘ no BTF\n      fix: boot a kernel with BTF\n"),
            "{text}"
        );
        assert!(text.contains("Not ready: 1 problem (✘)"), "{text}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["host"][1]["status"], "fail");
        assert_eq!(json["host"][0].get("fix"), None);
    }
}
