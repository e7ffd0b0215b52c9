//! What a process was told: the variables of its environment (as it was at exec) that name it.
//!
//! `OTEL_SERVICE_NAME`, then `service.name` in `OTEL_RESOURCE_ATTRIBUTES` (the OTel SDK's own
//! precedence), then `PYROSCOPE_APPLICATION_NAME` (what Pyroscope's Python SDK reads): an
//! operator who set these for tracing gets the same name on profiles. `FLASK_APP` and
//! `DJANGO_SETTINGS_MODULE` help [`super::launchers`] name an application; `HOSTNAME` is a
//! pod's name when the runtime says nothing better (see [`super::kubernetes`]).

use super::{cap, entries, ServiceSource, MAX_DERIVED_VALUE};

/// The variables of a process's environment that name it. Others are not kept.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Environ {
    pub otel_service_name: Option<String>,
    pub otel_resource_attributes: Option<String>,
    pub pyroscope_application_name: Option<String>,
    /// Flask's app, for `flask run` without `--app`.
    pub flask_app: Option<String>,
    /// Django's settings module, for `manage.py` and `django-admin` without `--settings`.
    pub django_settings_module: Option<String>,
    /// `HOSTNAME`: container runtimes set it to the container's host name, which Kubernetes
    /// makes the pod's name (unless the pod sets `hostname:`).
    pub hostname: Option<String>,
}

impl Environ {
    /// Parses `/proc/PID/environ` bytes (`KEY=value\0…`). Like `getenv`, the first of
    /// duplicate keys wins; entries that are not UTF-8 are skipped.
    pub fn parse(bytes: &[u8], truncated: bool) -> Environ {
        let mut env = Environ::default();
        for entry in entries(bytes, truncated) {
            let Ok(entry) = std::str::from_utf8(entry) else {
                continue;
            };
            let Some((key, value)) = entry.split_once('=') else {
                continue;
            };
            let slot = match key {
                "OTEL_SERVICE_NAME" => &mut env.otel_service_name,
                "OTEL_RESOURCE_ATTRIBUTES" => &mut env.otel_resource_attributes,
                "PYROSCOPE_APPLICATION_NAME" => &mut env.pyroscope_application_name,
                "FLASK_APP" => &mut env.flask_app,
                "DJANGO_SETTINGS_MODULE" => &mut env.django_settings_module,
                "HOSTNAME" => &mut env.hostname,
                _ => continue,
            };
            if slot.is_none() {
                *slot = Some(value.to_string());
            }
        }
        env
    }

    pub(crate) fn service_name(&self) -> Option<(String, ServiceSource)> {
        let named = |v: &Option<String>| {
            v.as_deref()
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(|v| cap(v, MAX_DERIVED_VALUE))
        };
        if let Some(name) = named(&self.otel_service_name) {
            return Some((name, ServiceSource::OtelServiceName));
        }
        if let Some(name) = self
            .otel_resource_attributes
            .as_deref()
            .and_then(|attrs| resource_attribute(attrs, "service.name"))
            .filter(|name| !name.is_empty())
        {
            return Some((
                cap(&name, MAX_DERIVED_VALUE),
                ServiceSource::OtelResourceAttributes,
            ));
        }
        // Pyroscope's SDKs accept `app{tag=value,…}`; the tags are not part of the name.
        let pyroscope = self
            .pyroscope_application_name
            .as_deref()
            .map(|v| v.split('{').next().unwrap_or(v).to_string());
        named(&pyroscope).map(|name| (name, ServiceSource::PyroscopeApplicationName))
    }
}

/// The value of `key` in an `OTEL_RESOURCE_ATTRIBUTES` value.
///
/// The OTel resource SDK spec: a W3C-Baggage-like list `key1=value1,key2=value2` without
/// `;` metadata, surrounding whitespace trimmed, `,` and `=` inside keys and values
/// percent-encoded, and "in case of any error, e.g. failure during the decoding process, the
/// entire environment variable value SHOULD be discarded". So a malformed list yields `None`
/// even when `key` itself is well-formed; the process is then named by the next source, as
/// its own SDK would name it `unknown_service`.
pub(crate) fn resource_attribute(attrs: &str, key: &str) -> Option<String> {
    let mut found = None;
    for member in attrs.split(',') {
        let member = member.trim();
        if member.is_empty() {
            continue;
        }
        let (k, v) = member.split_once('=')?;
        let k = percent_decode(k.trim())?;
        let v = percent_decode(v.trim())?;
        if k.is_empty() {
            return None;
        }
        // Later members override earlier ones, as a map built in order would.
        if k == key {
            found = Some(v);
        }
    }
    found
}

/// Percent-decodes `s`, refusing a `%` that does not start a valid escape and a result that
/// is not UTF-8 (the spec's decoding failures).
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
        }
    }
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(|d| d.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Environ {
        let mut bytes = Vec::new();
        for (k, v) in pairs {
            bytes.extend_from_slice(format!("{k}={v}\0").as_bytes());
        }
        Environ::parse(&bytes, false)
    }

    #[test]
    fn environment_names_first() {
        let all = env(&[
            ("PYROSCOPE_APPLICATION_NAME", "pyro"),
            ("OTEL_RESOURCE_ATTRIBUTES", "service.name=attrs"),
            ("OTEL_SERVICE_NAME", "checkout"),
        ]);
        let found = all.service_name().unwrap();
        assert_eq!(found, ("checkout".into(), ServiceSource::OtelServiceName));

        let attrs = env(&[
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment=prod, service.name = cart%20api ",
            ),
            ("PYROSCOPE_APPLICATION_NAME", "pyro"),
        ]);
        assert_eq!(
            attrs.service_name(),
            Some(("cart api".into(), ServiceSource::OtelResourceAttributes))
        );

        let pyro = env(&[("PYROSCOPE_APPLICATION_NAME", "ride-sharing-app{region=eu}")]);
        assert_eq!(
            pyro.service_name(),
            Some((
                "ride-sharing-app".into(),
                ServiceSource::PyroscopeApplicationName
            ))
        );

        // Empty or blank values name nothing.
        let blank = env(&[
            ("OTEL_SERVICE_NAME", "  "),
            ("PYROSCOPE_APPLICATION_NAME", ""),
        ]);
        assert_eq!(blank.service_name(), None);
    }

    #[test]
    fn resource_attributes_follow_the_spec() {
        assert_eq!(
            resource_attribute("service.name=a,service.name=b", "service.name").as_deref(),
            Some("b")
        );
        assert_eq!(
            resource_attribute("k=a%2Cb%3Dc,service.name=x%2Fy", "service.name").as_deref(),
            Some("x/y")
        );
        assert_eq!(
            resource_attribute("service.version=1", "service.name"),
            None
        );
        assert_eq!(resource_attribute("", "service.name"), None);
        // Any error discards the whole value.
        assert_eq!(
            resource_attribute("service.name=a,broken", "service.name"),
            None
        );
        assert_eq!(
            resource_attribute("service.name=a,k=%zz", "service.name"),
            None
        );
        assert_eq!(resource_attribute("service.name=%ff", "service.name"), None);
        assert_eq!(
            resource_attribute("service.name=a,=v", "service.name"),
            None
        );
        assert_eq!(
            resource_attribute("service.name=100%", "service.name"),
            None
        );
    }

    #[test]
    fn environ_parsing_is_bounded_and_forgiving() {
        let bytes =
            b"A=1\0OTEL_SERVICE_NAME=first\0\xff\xfe=x\0OTEL_SERVICE_NAME=second\0noequals\0";
        let env = Environ::parse(bytes, false);
        assert_eq!(env.otel_service_name.as_deref(), Some("first"));
        // A read cut inside the last entry drops it rather than take a prefix for the value.
        let cut = b"A=1\0OTEL_SERVICE_NAME=check";
        assert_eq!(Environ::parse(cut, true).otel_service_name, None);
        assert_eq!(
            Environ::parse(cut, false).otel_service_name.as_deref(),
            Some("check")
        );
        assert_eq!(Environ::parse(b"", false), Environ::default());
        assert_eq!(Environ::parse(b"\0\0\0", true), Environ::default());
    }

    #[test]
    fn long_values_are_cut_at_a_character() {
        let long = "é".repeat(MAX_DERIVED_VALUE);
        let found = env(&[("OTEL_SERVICE_NAME", &long)])
            .service_name()
            .unwrap()
            .0;
        assert!(found.len() <= MAX_DERIVED_VALUE && found.chars().all(|c| c == 'é'));
    }
}
