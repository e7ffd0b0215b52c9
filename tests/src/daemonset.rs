//! `packaging/kubernetes/daemonset.yaml` read into the Kubernetes API's own types
//! (k8s-openapi), and translated into the `podman run` flags that run the image the way the
//! DaemonSet runs it.
//!
//! The translation refuses any setting it does not know: each field of the pod spec, the
//! container and its security context is either translated to a flag, or named here as one
//! that does not apply to a single podman container (scheduling, probes, ports), or the
//! translation fails. So a setting added to the manifest cannot be left out of the test that
//! runs the image: the test fails until it is translated here.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, PodSpec, Probe, SecurityContext};

/// The manifest's path in the repository.
pub fn path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging/kubernetes/daemonset.yaml")
}

/// The manifest's text.
pub fn text() -> String {
    std::fs::read_to_string(path()).expect("reading packaging/kubernetes/daemonset.yaml")
}

/// The manifest as a DaemonSet.
pub fn load() -> DaemonSet {
    serde_norway::from_str(&text()).expect("daemonset.yaml is not a DaemonSet")
}

/// How podman runs the image as the DaemonSet would.
#[derive(Debug, Default)]
pub struct PodmanRun {
    /// Flags between `podman run` and the image.
    pub flags: Vec<String>,
    /// The image the manifest names.
    pub image: String,
    /// What follows the image: the container's `args` (its `command` becomes
    /// `--entrypoint`).
    pub args: Vec<String>,
    /// The HTTP probes' paths and ports, for the test to query.
    pub probes: Vec<(String, String)>,
    /// `terminationGracePeriodSeconds`.
    pub grace_seconds: i64,
}

/// The `podman run` flags of the manifest's one container, with the downward API's
/// `spec.nodeName` given as `node_name`.
pub fn podman_run(ds: &DaemonSet, node_name: &str) -> Result<PodmanRun, String> {
    let mut spec: PodSpec = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .ok_or("no pod spec")?;
    let mut run = PodmanRun::default();
    let mut flag = |f: String| run.flags.push(f);
    if spec.host_pid.take() == Some(true) {
        flag("--pid=host".into());
    }
    if spec.host_ipc.take() == Some(true) {
        flag("--ipc=host".into());
    }
    // The pod's own network namespace. Without a CNI network here that is podman's
    // `--network=none`: the agent's port is reached inside that namespace, as a kubelet's
    // probe reaches the pod's address.
    flag(match spec.host_network.take() {
        Some(true) => "--network=host".into(),
        _ => "--network=none".into(),
    });
    let grace = spec.termination_grace_period_seconds.take().unwrap_or(30);
    flag(format!("--stop-timeout={grace}"));
    let mut volumes = BTreeMap::new();
    for volume in spec.volumes.take().unwrap_or_default() {
        let host = volume
            .host_path
            .as_ref()
            .ok_or_else(|| format!("volume {}: only hostPath volumes translate", volume.name))?;
        volumes.insert(volume.name.clone(), host.path.clone());
    }
    // Not for one container on one machine: which nodes, and the API server token.
    spec.node_selector.take();
    spec.tolerations.take();
    if spec.automount_service_account_token.take() == Some(true) {
        return Err("automountServiceAccountToken: true has no podman equivalent".into());
    }
    let mut containers = std::mem::take(&mut spec.containers);
    let rest = serde_json::to_value(&spec).map_err(|e| e.to_string())?;
    if rest != serde_json::json!({ "containers": [] }) {
        return Err(format!("pod spec fields not translated: {rest}"));
    }
    if containers.len() != 1 {
        return Err(format!("{} containers, expected 1", containers.len()));
    }
    let mut c: Container = containers.remove(0);
    run.image = c.image.take().ok_or("no image")?;
    if let Some(command) = c.command.take() {
        let (entry, args) = command.split_first().ok_or("empty command")?;
        flag(format!("--entrypoint={entry}"));
        run.args.extend(args.iter().cloned());
    }
    run.args.extend(c.args.take().unwrap_or_default());
    let mut env: Vec<(String, String)> = Vec::new();
    for var in c.env.take().unwrap_or_default() {
        let value = match (&var.value, &var.value_from) {
            (Some(value), None) => expand(value, &env),
            (None, Some(from)) => match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                Some("spec.nodeName") => node_name.to_string(),
                other => {
                    return Err(format!(
                        "env {}: valueFrom {other:?} not translated",
                        var.name
                    ))
                }
            },
            _ => return Err(format!("env {}: neither a value nor a valueFrom", var.name)),
        };
        env.push((var.name.clone(), value));
    }
    for (name, value) in &env {
        flag(format!("--env={name}={value}"));
    }
    for mount in c.volume_mounts.take().unwrap_or_default() {
        let host = volumes
            .get(&mount.name)
            .ok_or_else(|| format!("volumeMount {} names no volume", mount.name))?;
        let mode = if mount.read_only == Some(true) {
            "ro"
        } else {
            "rw"
        };
        flag(format!("--volume={host}:{}:{mode}", mount.mount_path));
    }
    if let Some(resources) = c.resources.take() {
        let limits = resources.limits.unwrap_or_default();
        if let Some(cpu) = limits.get("cpu") {
            flag(format!("--cpus={}", cpu_cores(&cpu.0)?));
        }
        if let Some(memory) = limits.get("memory") {
            flag(format!("--memory={}", memory_bytes(&memory.0)?));
        }
    }
    for probe in [c.readiness_probe.take(), c.liveness_probe.take()]
        .into_iter()
        .flatten()
    {
        run.probes.push(http_probe(&probe, &c)?);
    }
    // The port is the agent's own: nothing to publish in a private network namespace.
    c.ports.take();
    // Pulling is the registry's business; the test's image is local.
    c.image_pull_policy.take();
    if let Some(sc) = c.security_context.take() {
        security_flags(sc, &mut flag)?;
    }
    c.name.clear();
    let rest = serde_json::to_value(&c).map_err(|e| e.to_string())?;
    if rest != serde_json::json!({ "name": "" }) {
        return Err(format!("container fields not translated: {rest}"));
    }
    run.grace_seconds = grace;
    Ok(run)
}

fn security_flags(mut sc: SecurityContext, flag: &mut impl FnMut(String)) -> Result<(), String> {
    if sc.privileged.take() == Some(true) {
        flag("--privileged".into());
    }
    if sc.allow_privilege_escalation.take() == Some(false) {
        flag("--security-opt=no-new-privileges".into());
    }
    if sc.read_only_root_filesystem.take() == Some(true) {
        // Kubernetes mounts no tmpfs of its own on a read-only root; podman would.
        flag("--read-only".into());
        flag("--read-only-tmpfs=false".into());
    }
    if let Some(uid) = sc.run_as_user.take() {
        flag(format!("--user={uid}"));
        if sc.run_as_non_root.take() == Some(true) && uid == 0 {
            return Err("runAsNonRoot with runAsUser 0".into());
        }
    }
    if let Some(caps) = sc.capabilities.take() {
        for cap in caps.drop.unwrap_or_default() {
            flag(format!("--cap-drop={}", cap.to_lowercase()));
        }
        for cap in caps.add.unwrap_or_default() {
            flag(format!("--cap-add=CAP_{cap}"));
        }
    }
    if let Some(profile) = sc.seccomp_profile.take() {
        match profile.type_.as_str() {
            // podman's default profile is the runtime default.
            "RuntimeDefault" => {}
            "Unconfined" => flag("--security-opt=seccomp=unconfined".into()),
            other => return Err(format!("seccompProfile {other} not translated")),
        }
    }
    if let Some(profile) = sc.app_armor_profile.take() {
        match profile.type_.as_str() {
            "RuntimeDefault" => {}
            "Unconfined" => flag("--security-opt=apparmor=unconfined".into()),
            other => return Err(format!("appArmorProfile {other} not translated")),
        }
    }
    let rest = serde_json::to_value(&sc).map_err(|e| e.to_string())?;
    if rest != serde_json::json!({}) {
        return Err(format!("securityContext fields not translated: {rest}"));
    }
    Ok(())
}

/// Kubernetes' `$(VAR)` references to variables defined before, in an env value.
fn expand(value: &str, defined: &[(String, String)]) -> String {
    let mut out = value.to_string();
    for (name, v) in defined {
        out = out.replace(&format!("$({name})"), v);
    }
    out
}

/// `250m` → `0.25`, `2` → `2`.
fn cpu_cores(quantity: &str) -> Result<String, String> {
    match quantity.strip_suffix('m') {
        Some(milli) => milli
            .parse::<u64>()
            .map(|m| format!("{}", m as f64 / 1000.0))
            .map_err(|_| format!("cpu {quantity}")),
        None => quantity
            .parse::<f64>()
            .map(|c| c.to_string())
            .map_err(|_| format!("cpu {quantity}")),
    }
}

/// `160Mi` → bytes.
fn memory_bytes(quantity: &str) -> Result<u64, String> {
    for (suffix, unit) in [("Ki", 1u64 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30)] {
        if let Some(n) = quantity.strip_suffix(suffix) {
            return n
                .parse::<u64>()
                .map(|n| n * unit)
                .map_err(|_| format!("memory {quantity}"));
        }
    }
    quantity.parse().map_err(|_| format!("memory {quantity}"))
}

/// (path, port) of an HTTP probe, a named port resolved to its number.
fn http_probe(probe: &Probe, c: &Container) -> Result<(String, String), String> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let get = probe
        .http_get
        .as_ref()
        .ok_or("a probe that is not httpGet")?;
    let port = match &get.port {
        IntOrString::Int(n) => n.to_string(),
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .map(|p| p.container_port.to_string())
            .ok_or_else(|| format!("probe port {name} is no container port"))?,
    };
    Ok((get.path.clone().unwrap_or_else(|| "/".into()), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(cpu_cores("250m").unwrap(), "0.25");
        assert_eq!(cpu_cores("2").unwrap(), "2");
        assert_eq!(memory_bytes("160Mi").unwrap(), 160 << 20);
        assert!(memory_bytes("lots").is_err());
        assert_eq!(
            expand("node=$(NODE_NAME)", &[("NODE_NAME".into(), "n1".into())]),
            "node=n1"
        );
    }

    #[test]
    fn an_unknown_setting_is_refused() {
        let mut ds = load();
        let spec = ds.spec.as_mut().unwrap().template.spec.as_mut().unwrap();
        spec.dns_policy = Some("ClusterFirstWithHostNet".into());
        let err = podman_run(&ds, "n").unwrap_err();
        assert!(err.contains("dnsPolicy"), "{err}");

        let mut ds = load();
        let spec = ds.spec.as_mut().unwrap().template.spec.as_mut().unwrap();
        let sc = spec.containers[0].security_context.as_mut().unwrap();
        sc.proc_mount = Some("Unmasked".into());
        let err = podman_run(&ds, "n").unwrap_err();
        assert!(err.contains("procMount"), "{err}");
    }
}
