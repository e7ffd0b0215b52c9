//! A BPF program the kernel refused, told in one line.
//!
//! The verifier explains a refusal in a log that runs to thousands of lines; on a terminal it
//! buries the one line that matters. So the whole log goes to a file, and the error names the
//! program, the kernel, the verifier's verdict (the last line that isn't a statistic) and the
//! file.

use std::path::PathBuf;

use aya::programs::ProgramError;

#[derive(Debug)]
pub(crate) struct LoadError {
    pub program: String,
    pub kernel: String,
    /// What the verifier's log ends with, or the syscall error when there is no log.
    pub verdict: String,
    /// Where the full verifier log was written (`None`: no log, or it could not be written).
    pub log_file: Option<PathBuf>,
}

impl LoadError {
    pub(crate) fn from_program(program: &str, err: ProgramError) -> anyhow::Error {
        let kernel = kernel_release();
        let (verdict, log) = match &err {
            ProgramError::LoadError {
                io_error,
                verifier_log,
            } => {
                let log = verifier_log.to_string();
                let verdict = verdict(&log).unwrap_or_else(|| io_error.to_string());
                (verdict, Some(log).filter(|l| !l.trim().is_empty()))
            }
            other => (other.to_string(), None),
        };
        let log_file = log.and_then(|log| write_log(program, &kernel, &log));
        LoadError {
            program: program.to_string(),
            kernel,
            verdict,
            log_file,
        }
        .into()
    }
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Linux {} refused the BPF program `{}`: {}",
            self.kernel, self.program, self.verdict
        )?;
        match &self.log_file {
            Some(path) => write!(f, " (full verifier log: {})", path.display()),
            None => Ok(()),
        }
    }
}

impl std::error::Error for LoadError {}

/// `uname -r`.
pub(super) fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|r| r.trim().to_string())
        .unwrap_or_else(|_| "(unknown kernel)".into())
}

/// The verifier's verdict: the last log line that is not one of its closing statistics.
fn verdict(log: &str) -> Option<String> {
    const STATISTICS: [&str; 4] = [
        "verification time",
        "stack depth",
        "processed ",
        "max_states_per_insn",
    ];
    log.lines()
        .map(str::trim)
        .rfind(|l| {
            !l.is_empty()
                && !l.starts_with(':')
                && !l.starts_with("; ")
                && !STATISTICS.iter().any(|s| l.starts_with(s))
        })
        .map(str::to_string)
}

fn write_log(program: &str, kernel: &str, log: &str) -> Option<PathBuf> {
    let path = std::env::temp_dir().join(format!(
        "pyebpf-verifier-{program}-{kernel}-{}.log",
        std::process::id()
    ));
    std::fs::write(&path, log).ok()?;
    Some(path)
}

#[cfg(test)]
mod tests {
    use super::verdict;

    #[test]
    fn verdict_is_the_last_real_line() {
        let log = "reg type unsupported for arg#0 function sample#9\n\
            607: (85) call bpf_ringbuf_output#130\n\
            R3 unbounded memory access, use 'var &= const' or 'if (var < const)'\n\
            verification time 79808 usec\n\
            stack depth 152+0+8+120+0\n\
            processed 1235 insns (limit 1000000) max_states_per_insn 2 total_states 77\n";
        assert_eq!(
            verdict(log).as_deref(),
            Some("R3 unbounded memory access, use 'var &= const' or 'if (var < const)'")
        );
        assert_eq!(verdict("\n\n"), None);
    }
}
