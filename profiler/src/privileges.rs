//! Checks, before anything is loaded, that we may load BPF programs, open perf events and
//! read other processes' memory; otherwise one line says what is missing and how to fix it.

const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

fn effective_caps() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0)
}

/// The capabilities pyebpf lacks, by name; empty when it has what it needs.
pub fn missing() -> Vec<&'static str> {
    let caps = effective_caps();
    let has = |cap: u32| caps & (1 << cap) != 0;
    let admin = has(CAP_SYS_ADMIN);
    let mut missing = Vec::new();
    if !has(CAP_BPF) && !admin {
        missing.push("CAP_BPF");
    }
    if !has(CAP_PERFMON) && !admin {
        missing.push("CAP_PERFMON");
    }
    if !has(CAP_SYS_PTRACE) {
        missing.push("CAP_SYS_PTRACE");
    }
    missing
}

/// `Err` with the one-line explanation when privileges are missing.
pub fn check() -> Result<(), crate::UsageError> {
    let missing = missing();
    if missing.is_empty() {
        return Ok(());
    }
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "pyebpf".into());
    Err(crate::UsageError(format!(
        "pyebpf needs root or the capabilities CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE (missing: {}): run it with sudo, or grant them once with `sudo setcap cap_bpf,cap_perfmon,cap_sys_ptrace+ep {exe}`",
        missing.join(", ")
    )))
}
