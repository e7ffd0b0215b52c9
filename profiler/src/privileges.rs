//! Checks, before anything is loaded, that we may load BPF programs, open perf events and
//! read other processes' memory; otherwise one line says what is missing and how to fix it.

pub(crate) const CAP_SYS_PTRACE: u32 = 19;
pub(crate) const CAP_SYS_ADMIN: u32 = 21;
pub(crate) const CAP_PERFMON: u32 = 38;
pub(crate) const CAP_BPF: u32 = 39;

/// This process's effective capability set (`CapEff:` of `/proc/self/status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Capabilities(u64);

impl Capabilities {
    pub(crate) fn effective() -> Capabilities {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        Capabilities(
            status
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
                .unwrap_or(0),
        )
    }

    #[cfg(test)]
    pub(crate) fn from_bits(bits: u64) -> Capabilities {
        Capabilities(bits)
    }

    pub(crate) fn has(self, cap: u32) -> bool {
        self.0 & (1 << cap) != 0
    }

    /// CAP_SYS_ADMIN stands in for CAP_BPF and CAP_PERFMON (kernels before 5.8 knew only it).
    pub(crate) fn can_perfmon(self) -> bool {
        self.has(CAP_PERFMON) || self.has(CAP_SYS_ADMIN)
    }

    pub(crate) fn can_bpf(self) -> bool {
        self.has(CAP_BPF) || self.has(CAP_SYS_ADMIN)
    }

    /// The capabilities pyebpf lacks, by name; empty when it has what it needs.
    pub(crate) fn missing(self) -> Vec<&'static str> {
        let mut missing = Vec::new();
        if !self.can_bpf() {
            missing.push("CAP_BPF");
        }
        if !self.can_perfmon() {
            missing.push("CAP_PERFMON");
        }
        if !self.has(CAP_SYS_PTRACE) {
            missing.push("CAP_SYS_PTRACE");
        }
        missing
    }
}

/// The capabilities pyebpf lacks, by name; empty when it has what it needs.
pub(crate) fn missing() -> Vec<&'static str> {
    Capabilities::effective().missing()
}

/// How to give pyebpf its capabilities.
pub(crate) fn fix() -> String {
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "pyebpf".into());
    format!(
        "run it with sudo, or grant them once with `sudo setcap cap_bpf,cap_perfmon,cap_sys_ptrace+ep {exe}`"
    )
}

/// `Err` with the one-line explanation when privileges are missing.
pub(crate) fn check() -> Result<(), crate::UsageError> {
    let missing = missing();
    if missing.is_empty() {
        return Ok(());
    }
    Err(crate::UsageError(format!(
        "pyebpf needs root or the capabilities CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE (missing: {}): {}",
        missing.join(", "),
        fix()
    )))
}
