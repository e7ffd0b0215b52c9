//! Facts about the host that decide whether pyebpf can run: kernel, BTF, capabilities and the
//! sysctls and security settings that gate BPF and perf events.

use super::Fact;
use crate::privileges::{Capabilities, CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, CAP_SYS_PTRACE};

/// The oldest kernel pyebpf's programs are verified on (`cargo xtask vm-test`).
const OLDEST_TESTED: (u32, u32) = (6, 1);
const BTF: &str = "/sys/kernel/btf/vmlinux";
const LOCKDOWN: &str = "/sys/kernel/security/lockdown";

pub(super) fn facts() -> Vec<Fact> {
    let caps = Capabilities::effective();
    vec![
        kernel(),
        btf(),
        capabilities(caps),
        perf_event_paranoid(caps),
        lockdown(),
        unprivileged_bpf(),
    ]
}

fn kernel() -> Fact {
    let release = match std::fs::read_to_string("/proc/sys/kernel/osrelease") {
        Ok(r) => r.trim().to_string(),
        Err(e) => return Fact::info("kernel", format!("kernel release unknown ({e})")),
    };
    let arch = std::env::consts::ARCH;
    let (major, minor) = OLDEST_TESTED;
    match parse_release(&release) {
        Some(v) if v >= OLDEST_TESTED => Fact::ok(
            "kernel",
            format!("kernel {release} ({arch}); pyebpf is tested on {major}.{minor} and newer"),
        ),
        _ => Fact::info(
            "kernel",
            format!(
                "kernel {release} ({arch}) is older than {major}.{minor}, the oldest pyebpf is \
                 tested on: the BPF line below says whether it works here"
            ),
        ),
    }
}

/// `(6, 18)` from `6.18.44-fc-v782`.
fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

fn btf() -> Fact {
    match std::fs::metadata(BTF) {
        Ok(meta) => Fact::ok(
            "btf",
            format!("kernel BTF: {BTF} ({} KiB)", meta.len() / 1024),
        ),
        Err(e) => Fact::fail(
            "btf",
            format!("no kernel BTF: {BTF}: {e}"),
            "boot a kernel built with CONFIG_DEBUG_INFO_BTF=y (distribution kernels are, since \
             about 2021): pyebpf takes kernel struct layouts and hooks from it",
        ),
    }
}

fn capabilities(caps: Capabilities) -> Fact {
    let missing = caps.missing();
    if !missing.is_empty() {
        return Fact::fail(
            "capabilities",
            format!(
                "capabilities: missing {} (pyebpf needs CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE, or root)",
                missing.join(", ")
            ),
            crate::privileges::fix(),
        );
    }
    let mut held = Vec::new();
    for (cap, name) in [
        (CAP_BPF, "CAP_BPF"),
        (CAP_PERFMON, "CAP_PERFMON"),
        (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
        (CAP_SYS_PTRACE, "CAP_SYS_PTRACE"),
    ] {
        if caps.has(cap) {
            held.push(name);
        }
    }
    Fact::ok("capabilities", format!("capabilities: {}", held.join(", ")))
}

fn perf_event_paranoid(caps: Capabilities) -> Fact {
    const ID: &str = "perf_event_paranoid";
    let value = match read_sysctl("kernel/perf_event_paranoid") {
        Ok(v) => v,
        Err(e) => return Fact::info(ID, format!("kernel.perf_event_paranoid unknown ({e})")),
    };
    if caps.can_perfmon() {
        return Fact::ok(
            ID,
            format!("kernel.perf_event_paranoid = {value}: no effect, pyebpf has CAP_PERFMON"),
        );
    }
    // Without CAP_PERFMON the sysctl decides who may open system-wide perf events, but the
    // sampler's BPF program type needs CAP_PERFMON whatever it says.
    match value.parse::<i32>() {
        Ok(v) if v <= 0 => Fact::info(
            ID,
            format!(
                "kernel.perf_event_paranoid = {value}: allows system-wide perf events without \
                 CAP_PERFMON, but the BPF sampler still needs CAP_PERFMON"
            ),
        ),
        _ => Fact::fail(
            ID,
            format!(
                "kernel.perf_event_paranoid = {value}: without CAP_PERFMON, sampling every CPU \
                 is refused"
            ),
            "grant CAP_PERFMON (see capabilities): with it this setting does not matter, and \
             the BPF sampler needs it anyway",
        ),
    }
}

fn lockdown() -> Fact {
    const ID: &str = "lockdown";
    let text = match std::fs::read_to_string(LOCKDOWN) {
        Ok(t) => t,
        Err(_) if !securityfs_mounted() => {
            return Fact::info(
                ID,
                "kernel lockdown: unknown, securityfs is not mounted (`mount -t securityfs \
                 securityfs /sys/kernel/security` shows it)",
            )
        }
        Err(e) => {
            return Fact::ok(
                ID,
                format!("kernel lockdown: not in this kernel ({LOCKDOWN}: {e})"),
            )
        }
    };
    match parse_lockdown(&text) {
        Some("confidentiality") => Fact::fail(
            ID,
            "kernel lockdown = confidentiality: the kernel refuses BPF programs that read kernel \
             memory",
            "boot without `lockdown=confidentiality` (the level can only be raised while the \
             system runs); `integrity`, the Secure Boot default, is fine",
        ),
        Some(mode) => Fact::ok(
            ID,
            format!("kernel lockdown = {mode}: BPF may read the memory pyebpf needs"),
        ),
        None => Fact::info(
            ID,
            format!("kernel lockdown: unrecognized {LOCKDOWN}: {}", text.trim()),
        ),
    }
}

/// The bracketed mode of `none [integrity] confidentiality`.
fn parse_lockdown(text: &str) -> Option<&str> {
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(&text[start..end])
}

fn securityfs_mounted() -> bool {
    std::fs::read_to_string("/proc/self/mounts").is_ok_and(|m| {
        m.lines()
            .any(|l| l.split_whitespace().nth(2) == Some("securityfs"))
    })
}

fn unprivileged_bpf() -> Fact {
    const ID: &str = "unprivileged_bpf_disabled";
    match read_sysctl("kernel/unprivileged_bpf_disabled") {
        Ok(v) => Fact::info(
            ID,
            format!(
                "kernel.unprivileged_bpf_disabled = {v}: {}; pyebpf needs CAP_BPF either way",
                if v == "0" {
                    "unprivileged users may load some BPF programs"
                } else {
                    "only processes with CAP_BPF may load BPF programs"
                }
            ),
        ),
        Err(e) => Fact::info(
            ID,
            format!("kernel.unprivileged_bpf_disabled unknown ({e})"),
        ),
    }
}

fn read_sysctl(name: &str) -> std::io::Result<String> {
    Ok(std::fs::read_to_string(format!("/proc/sys/{name}"))?
        .trim()
        .to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases() {
        assert_eq!(parse_release("6.18.44-fc-v782"), Some((6, 18)));
        assert_eq!(parse_release("6.1.0-50-amd64"), Some((6, 1)));
        assert_eq!(parse_release("5.15.0"), Some((5, 15)));
        assert_eq!(parse_release("garbage"), None);
        assert!(parse_release("6.1.0").unwrap() >= OLDEST_TESTED);
        assert!(parse_release("5.19.2").unwrap() < OLDEST_TESTED);
    }

    #[test]
    fn lockdown_modes() {
        assert_eq!(
            parse_lockdown("[none] integrity confidentiality\n"),
            Some("none")
        );
        assert_eq!(
            parse_lockdown("none integrity [confidentiality]\n"),
            Some("confidentiality")
        );
        assert_eq!(parse_lockdown("none integrity"), None);
    }

    #[test]
    fn capabilities_name_what_is_missing() {
        let none = Capabilities::from_bits(0);
        let fact = capabilities(none);
        assert_eq!(fact.status, super::super::Status::Fail);
        assert!(fact.text.contains("CAP_BPF") && fact.text.contains("CAP_SYS_PTRACE"));
        assert!(fact.fix.unwrap().contains("setcap"));
        let admin = Capabilities::from_bits(1 << CAP_SYS_ADMIN | 1 << CAP_SYS_PTRACE);
        assert_eq!(capabilities(admin).status, super::super::Status::Ok);
        assert_eq!(perf_event_paranoid(admin).status, super::super::Status::Ok);
    }
}
