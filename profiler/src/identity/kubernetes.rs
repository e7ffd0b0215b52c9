//! Which pod a container belongs to, from the node alone: no API server, no RBAC, no collector.
//!
//! Each of namespace, pod, pod UID and container name comes from the first of these that has
//! it:
//! 1. **The OCI bundle's annotations** (`config.json`, found by [`super::container`]). The
//!    kubelet labels every container with `io.kubernetes.pod.name`, `…pod.namespace`,
//!    `…pod.uid` and `io.kubernetes.container.name`; CRI-O copies those labels into the
//!    annotations (`internal/factory/container/container.go`), and podman writes any
//!    `--annotation` there. containerd's CRI writes its own: `io.kubernetes.cri.sandbox-name`,
//!    `…sandbox-namespace`, `…sandbox-uid`, `…container-name` (`pkg/cri/annotations`).
//! 2. **The cgroup path**: the pod UID (see [`super::container::parse_cgroup`]).
//! 3. **The process itself**, for a container known to be in a pod: its `HOSTNAME` (the pod's
//!    name, unless the pod sets `hostname:`) and the namespace file Kubernetes mounts with the
//!    service-account token (`/var/run/secrets/kubernetes.io/serviceaccount/namespace`, read
//!    through `/proc/PID/root`). This is what the container says of itself, so it only fills
//!    what the runtime did not say, and must look like a Kubernetes name.
//!
//! A bundle is hostile input like any file of another process: it is parsed with serde into
//! only the annotations above (others are skipped without being kept), from at most
//! [`super::container::MAX_BUNDLE_BYTES`], and every value is cut to
//! [`super::MAX_DERIVED_VALUE`] bytes.

use serde::Deserialize;

use super::{cap, read_capped, MAX_DERIVED_VALUE};

/// The service-account namespace file, inside the container.
const NAMESPACE_FILE: &str = "var/run/secrets/kubernetes.io/serviceaccount/namespace";
/// A namespace is a DNS label: at most 63 bytes (and a newline).
const NAMESPACE_READ_CAP: usize = 256;

/// Where a container sits in Kubernetes; every field is optional and comes from the first
/// source that has it (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Kubernetes {
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub pod_uid: Option<String>,
    /// The container's name in the pod spec.
    pub container: Option<String>,
}

impl Kubernetes {
    pub fn is_empty(&self) -> bool {
        *self == Kubernetes::default()
    }

    /// Fills what is still unknown from `other`; what is known stays.
    pub(crate) fn fill(&mut self, other: Kubernetes) {
        let Kubernetes {
            namespace,
            pod,
            pod_uid,
            container,
        } = other;
        self.namespace = self.namespace.take().or(namespace);
        self.pod = self.pod.take().or(pod);
        self.pod_uid = self.pod_uid.take().or(pod_uid);
        self.container = self.container.take().or(container);
    }
}

/// The annotations of a bundle that place a container in a pod. Serde skips every other key
/// (without keeping it) and every other field of the config.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Annotations {
    #[serde(rename = "io.kubernetes.pod.name")]
    pod_name: Option<String>,
    #[serde(rename = "io.kubernetes.pod.namespace")]
    pod_namespace: Option<String>,
    #[serde(rename = "io.kubernetes.pod.uid")]
    pod_uid: Option<String>,
    #[serde(rename = "io.kubernetes.container.name")]
    container_name: Option<String>,
    #[serde(rename = "io.kubernetes.cri.sandbox-name")]
    sandbox_name: Option<String>,
    #[serde(rename = "io.kubernetes.cri.sandbox-namespace")]
    sandbox_namespace: Option<String>,
    #[serde(rename = "io.kubernetes.cri.sandbox-uid")]
    sandbox_uid: Option<String>,
    #[serde(rename = "io.kubernetes.cri.container-name")]
    cri_container_name: Option<String>,
}

/// The part of an OCI runtime `config.json` read here.
#[derive(Debug, Deserialize)]
struct Config {
    #[serde(default)]
    annotations: Option<Annotations>,
}

/// A bundle that is not an OCI config (not JSON, or annotations that are not strings).
#[derive(Debug, thiserror::Error)]
#[error("not an OCI runtime config: {0}")]
pub(crate) struct MalformedBundle(#[from] serde_json::Error);

/// What a bundle's `config.json` says about the pod: CRI-O/podman's annotations first, then
/// containerd's, field by field.
pub(crate) fn from_bundle(config: &[u8]) -> Result<Kubernetes, MalformedBundle> {
    let config: Config = serde_json::from_slice(config)?;
    let a = config.annotations.unwrap_or_default();
    let value = |first: Option<String>, second: Option<String>| {
        first
            .filter(|v| !v.trim().is_empty())
            .or(second)
            .map(|v| cap(v.trim(), MAX_DERIVED_VALUE))
            .filter(|v| !v.is_empty())
    };
    Ok(Kubernetes {
        namespace: value(a.pod_namespace, a.sandbox_namespace),
        pod: value(a.pod_name, a.sandbox_name),
        pod_uid: value(a.pod_uid, a.sandbox_uid).map(|u| u.to_ascii_lowercase()),
        container: value(a.container_name, a.cri_container_name),
    })
}

/// What a process in a pod says of itself: its pod's name from `hostname` (its `HOSTNAME`) and
/// its namespace from the service-account file under its root, each only when it has the shape
/// of a Kubernetes name. `Err` when the namespace file exists but cannot be read.
pub(crate) fn from_process(
    pid: u32,
    hostname: Option<&str>,
) -> (Kubernetes, Result<(), std::io::Error>) {
    let mut found = Kubernetes {
        pod: hostname.filter(|h| is_dns_subdomain(h)).map(str::to_string),
        ..Kubernetes::default()
    };
    let path = format!("/proc/{pid}/root/{NAMESPACE_FILE}");
    let read = match read_capped(&path, NAMESPACE_READ_CAP) {
        Ok(file) => {
            let text = String::from_utf8_lossy(&file.bytes);
            found.namespace = Some(text.trim())
                .filter(|n| !file.truncated && is_dns_label(n))
                .map(str::to_string);
            Ok(())
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(err),
    };
    (found, read)
}

/// RFC 1123 label, as Kubernetes names namespaces: 1–63 of `a-z0-9-`, alphanumeric at both
/// ends.
fn is_dns_label(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1123 subdomain, as Kubernetes names pods: at most 253 bytes of dot-separated labels.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crio_and_podman_annotations() {
        let config = br#"{"ociVersion":"1.0.2","process":{"args":["python3"]},
            "annotations":{"io.kubernetes.pod.name":"web-7d9f","io.kubernetes.pod.namespace":"shop",
            "io.kubernetes.pod.uid":"1F2E3D4C-5B6A-4978-8695-A4B3C2D1E0F9",
            "io.kubernetes.container.name":"api","io.container.manager":"libpod",
            "io.kubernetes.cri-o.Labels":"{\"a\":1}","other":{"nested":[1,2,3]}}}"#;
        assert_eq!(
            from_bundle(config).unwrap(),
            Kubernetes {
                namespace: Some("shop".into()),
                pod: Some("web-7d9f".into()),
                pod_uid: Some("1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9".into()),
                container: Some("api".into()),
            }
        );
    }

    #[test]
    fn containerd_cri_annotations() {
        let config = br#"{"annotations":{"io.kubernetes.cri.container-type":"container",
            "io.kubernetes.cri.sandbox-id":"446c65ab","io.kubernetes.cri.sandbox-name":"hostname-lb-64df67bd8b-xmzhv",
            "io.kubernetes.cri.sandbox-namespace":"default","io.kubernetes.cri.sandbox-uid":"005f082b-5fd9-4650-8ef4-473e63bc2d13",
            "io.kubernetes.cri.container-name":"hostname","io.kubernetes.cri.image-name":"docker.io/x:latest"}}"#;
        let k = from_bundle(config).unwrap();
        assert_eq!(k.namespace.as_deref(), Some("default"));
        assert_eq!(k.pod.as_deref(), Some("hostname-lb-64df67bd8b-xmzhv"));
        assert_eq!(
            k.pod_uid.as_deref(),
            Some("005f082b-5fd9-4650-8ef4-473e63bc2d13")
        );
        assert_eq!(k.container.as_deref(), Some("hostname"));
    }

    #[test]
    fn no_or_empty_annotations_are_nothing() {
        for config in [
            &br#"{}"#[..],
            br#"{"annotations":null}"#,
            br#"{"annotations":{}}"#,
            br#"{"annotations":{"io.kubernetes.pod.name":"  "}}"#,
            br#"{"ociVersion":"1.0.2","annotations":{"io.container.manager":"libpod"}}"#,
        ] {
            assert!(from_bundle(config).unwrap().is_empty());
        }
    }

    #[test]
    fn hostile_bundles_are_refused_or_cut() {
        for config in [
            &b""[..],
            b"null",
            b"[1,2]",
            br#"{"annotations":{"io.kubernetes.pod.name":7}}"#,
            br#"{"annotations":{"io.kubernetes.pod.name":"a","io.kubernetes.pod.name":"b"}}"#,
            br#"{"annotations":{"#,
        ] {
            assert!(
                from_bundle(config).is_err(),
                "{:?}",
                String::from_utf8_lossy(config)
            );
        }
        // Deeply nested skipped values: skipped without recursion (no stack overflow), and
        // nothing found in them.
        for key in ["x", "annotations"] {
            let deep = format!(
                "{{\"{key}\":{}{}}}",
                "[".repeat(100_000),
                "]".repeat(100_000)
            );
            assert!(from_bundle(deep.as_bytes()).map_or(true, |k| k.is_empty()));
        }
        let long = format!(
            r#"{{"annotations":{{"io.kubernetes.pod.name":"{}"}}}}"#,
            "é".repeat(MAX_DERIVED_VALUE)
        );
        let pod = from_bundle(long.as_bytes()).unwrap().pod.unwrap();
        assert!(pod.len() <= MAX_DERIVED_VALUE);
    }

    #[test]
    fn what_is_known_stays() {
        let mut k = Kubernetes {
            pod: Some("from-bundle".into()),
            ..Default::default()
        };
        k.fill(Kubernetes {
            pod: Some("from-hostname".into()),
            namespace: Some("ns".into()),
            ..Default::default()
        });
        assert_eq!(k.pod.as_deref(), Some("from-bundle"));
        assert_eq!(k.namespace.as_deref(), Some("ns"));
    }

    #[test]
    fn names_must_look_like_kubernetes_names() {
        assert!(is_dns_label("kube-system"));
        assert!(!is_dns_label("Kube"));
        assert!(!is_dns_label("-a"));
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(is_dns_subdomain("web-7d9f-abcde"));
        assert!(is_dns_subdomain("a.b-c"));
        assert!(!is_dns_subdomain("a..b"));
        assert!(!is_dns_subdomain("9a63b4449e45 "));
    }

    #[test]
    fn this_process_is_in_no_pod() {
        let (k, read) = from_process(std::process::id(), Some("Not_A_Name"));
        assert!(read.is_ok());
        assert_eq!(k.pod, None);
    }
}
