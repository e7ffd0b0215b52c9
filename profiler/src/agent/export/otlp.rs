//! OTLP profiles to an OpenTelemetry Collector (or any OTLP receiver): each window as one
//! `ExportProfilesServiceRequest` (see `output::otlp` for what is in it), sent over OTLP/HTTP
//! with protobuf, `POST {endpoint}/v1development/profiles`, gzipped unless told otherwise.
//!
//! Configuration: `--otlp [URL]` turns it on; the standard variables do the rest, the
//! profiles-specific one before the general one, as the OTLP exporter specification says:
//! - endpoint: `--otlp URL` (a base URL, like `OTEL_EXPORTER_OTLP_ENDPOINT`), else
//!   `OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT` (used as it is), else
//!   `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1development/profiles`, else
//!   `http://localhost:4318/v1development/profiles`;
//! - `OTEL_EXPORTER_OTLP_HEADERS` and `..._PROFILES_HEADERS` (`k=v,k2=v2`, values
//!   percent-decoded; the profiles ones win);
//! - `OTEL_EXPORTER_OTLP_[PROFILES_]COMPRESSION`: `gzip` (the default here) or `none`;
//! - `OTEL_EXPORTER_OTLP_[PROFILES_]TIMEOUT`: milliseconds per request (10000);
//! - `OTEL_EXPORTER_OTLP_[PROFILES_]PROTOCOL`: only `http/protobuf` (gRPC is not spoken);
//! - `OTEL_RESOURCE_ATTRIBUTES`: attributes of the agent's host (`k8s.node.name=…`), given to
//!   every process's resource under the process's own.
//!
//! Retries follow the specification: 429, 502, 503 and 504 (with `Retry-After`), and
//! connection failures; any other status drops the request and counts it. A `partial_success`
//! in a 200 is logged once and counted (`export_partial_success_total{backend="otlp"}`).

use std::io::Write;
use std::time::Duration;

use flate2::write::GzEncoder;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceResponse;
use prost::Message;

use super::http::HttpTarget;
use super::queue::{Outcome, RetryPolicy};
use super::{DictionaryStats, Exporter, Request};
use crate::agent::window::{Cut, WindowProcess};
use crate::identity::OperatorLabels;
use crate::output::otlp::{attribute_of, Attributes, Encoder, Place, ProcessFacts, Value};

/// The OTLP/HTTP path of the profiles signal.
pub(crate) const PROFILES_PATH: &str = "/v1development/profiles";
/// Where an OTLP/HTTP exporter sends when nothing says otherwise.
pub(crate) const DEFAULT_ENDPOINT: &str = "http://localhost:4318";
/// Per request, when `OTEL_EXPORTER_OTLP_TIMEOUT` does not say.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// A setting the agent cannot use: bad usage, exit 2.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OtlpError {
    #[error("{source_name} {url:?}: {reason}")]
    BadUrl {
        source_name: String,
        url: String,
        reason: String,
    },
    #[error("{var}: {reason}")]
    BadVariable { var: &'static str, reason: String },
}

/// How to reach the receiver, and what every resource carries.
#[derive(Clone, Debug)]
pub(crate) struct OtlpSettings {
    pub endpoint: String,
    /// The operator's headers (may hold credentials: never logged).
    pub headers: Vec<(String, String)>,
    pub gzip: bool,
    pub timeout: Duration,
    /// `OTEL_RESOURCE_ATTRIBUTES`.
    pub host: Attributes,
}

impl OtlpSettings {
    /// `flag` is `--otlp`'s value (empty when given without one); `env` reads a variable.
    pub(crate) fn new(
        flag: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<OtlpSettings, OtlpError> {
        let var = |general: &'static str, profiles: &'static str| match env(profiles)
            .filter(|v| !v.trim().is_empty())
        {
            Some(v) => Some((profiles, v)),
            None => env(general)
                .filter(|v| !v.trim().is_empty())
                .map(|v| (general, v)),
        };
        let endpoint = if !flag.is_empty() {
            signal_url(flag, "--otlp")?
        } else if let Some(url) =
            env("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT").filter(|v| !v.trim().is_empty())
        {
            check_url(url.trim(), "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT")?
        } else if let Some(url) =
            env("OTEL_EXPORTER_OTLP_ENDPOINT").filter(|v| !v.trim().is_empty())
        {
            signal_url(url.trim(), "OTEL_EXPORTER_OTLP_ENDPOINT")?
        } else {
            format!("{DEFAULT_ENDPOINT}{PROFILES_PATH}")
        };
        if let Some((name, protocol)) = var(
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL",
        ) {
            if protocol.trim() != "http/protobuf" {
                return Err(OtlpError::BadVariable {
                    var: name,
                    reason: format!(
                        "{:?}: pyebpf sends OTLP/HTTP with protobuf only; set http/protobuf \
                         and the receiver's HTTP endpoint (port 4318 on a Collector)",
                        protocol.trim()
                    ),
                });
            }
        }
        let mut headers: Vec<(String, String)> = Vec::new();
        for name in [
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_PROFILES_HEADERS",
        ] {
            let Some(text) = env(name) else { continue };
            for (key, value) in key_values(&text, name)? {
                if ureq::http::HeaderName::from_bytes(key.as_bytes()).is_err()
                    || ureq::http::HeaderValue::from_str(&value).is_err()
                {
                    return Err(OtlpError::BadVariable {
                        var: name,
                        reason: format!("{key:?} is not a valid HTTP header"),
                    });
                }
                headers.retain(|(k, _)| !k.eq_ignore_ascii_case(&key));
                headers.push((key, value));
            }
        }
        let gzip = match var(
            "OTEL_EXPORTER_OTLP_COMPRESSION",
            "OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION",
        ) {
            None => true,
            Some((_, v)) if v.trim() == "gzip" => true,
            Some((_, v)) if v.trim() == "none" => false,
            Some((name, v)) => {
                return Err(OtlpError::BadVariable {
                    var: name,
                    reason: format!("{v:?}: use gzip or none"),
                })
            }
        };
        let timeout = match var(
            "OTEL_EXPORTER_OTLP_TIMEOUT",
            "OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT",
        ) {
            None => DEFAULT_TIMEOUT,
            Some((name, v)) => match v.trim().parse::<u64>() {
                Ok(ms) if (1..=600_000).contains(&ms) => Duration::from_millis(ms),
                _ => {
                    return Err(OtlpError::BadVariable {
                        var: name,
                        reason: format!(
                            "{v:?}: milliseconds per request, from 1 to 600000 (10000 by default)"
                        ),
                    })
                }
            },
        };
        let mut host = Attributes::new();
        if let Some(text) = env("OTEL_RESOURCE_ATTRIBUTES") {
            for (key, value) in key_values(&text, "OTEL_RESOURCE_ATTRIBUTES")? {
                host.insert(key, Value::Str(value.into()));
            }
        }
        Ok(OtlpSettings {
            endpoint,
            headers,
            gzip,
            timeout,
            host,
        })
    }

    /// How the HTTP transport sends.
    pub(crate) fn http(&self) -> HttpTarget {
        let mut headers = vec![(
            "Content-Type".to_string(),
            "application/x-protobuf".to_string(),
        )];
        if self.gzip {
            headers.push(("Content-Encoding".to_string(), "gzip".to_string()));
        }
        headers.extend(self.headers.iter().cloned());
        HttpTarget {
            endpoint: self.endpoint.clone(),
            headers,
            policy: RetryPolicy::Otlp,
            on_success: Some(partial_success),
        }
    }
}

/// `url` checked: http or https, a host, no credentials, no query.
fn check_url(url: &str, source_name: &str) -> Result<String, OtlpError> {
    let bad = |reason: &str| OtlpError::BadUrl {
        source_name: source_name.to_string(),
        url: url
            .split_once('@')
            .map_or(url.to_string(), |(_, host)| format!("***@{host}")),
        reason: reason.to_string(),
    };
    let uri: ureq::http::Uri = url
        .parse()
        .map_err(|e: ureq::http::uri::InvalidUri| bad(&e.to_string()))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(bad("the scheme must be http:// or https://"));
    }
    let authority = uri.authority().ok_or_else(|| bad("no host"))?.as_str();
    if authority.contains('@') {
        return Err(bad(
            "credentials go in OTEL_EXPORTER_OTLP_HEADERS (Authorization=...), not in the URL",
        ));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    if uri.query().is_some() {
        return Err(bad("a query string has no place in the endpoint"));
    }
    Ok(url.to_string())
}

/// A base URL with the profiles path appended (kept when it is there already).
fn signal_url(base: &str, source_name: &str) -> Result<String, OtlpError> {
    let base = check_url(base, source_name)?;
    let base = base.trim_end_matches('/');
    Ok(if base.ends_with(PROFILES_PATH) {
        base.to_string()
    } else {
        format!("{base}{PROFILES_PATH}")
    })
}

/// `k=v,k2=v2` as the OTel variables write it (W3C baggage octets; values percent-encoded).
fn key_values(text: &str, var: &'static str) -> Result<Vec<(String, String)>, OtlpError> {
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let bad = |reason: &str| OtlpError::BadVariable {
            var,
            reason: format!("{reason}; write key=value pairs separated by commas"),
        };
        let (key, value) = item.split_once('=').ok_or_else(|| {
            bad(&format!(
                "{:?} has no '='",
                item.split('=').next().unwrap_or("")
            ))
        })?;
        let key = key.trim();
        if key.is_empty() {
            return Err(bad("an entry has no key"));
        }
        let value = percent_encoding::percent_decode_str(value.trim())
            .decode_utf8()
            .map_err(|_| bad(&format!("the value of {key:?} is not UTF-8 once decoded")))?;
        out.push((key.to_string(), value.into_owned()));
    }
    Ok(out)
}

/// Reads a 200's `ExportProfilesServiceResponse`: a `partial_success` that rejected profiles
/// or says something is worth a log line and a count.
fn partial_success(body: &[u8]) -> Option<Outcome> {
    let partial = ExportProfilesServiceResponse::decode(body)
        .ok()?
        .partial_success?;
    if partial.rejected_profiles == 0 && partial.error_message.is_empty() {
        return None;
    }
    let message = if partial.error_message.is_empty() {
        "no message".to_string()
    } else {
        partial.error_message
    };
    Some(Outcome::Partial {
        rejected: u64::try_from(partial.rejected_profiles).unwrap_or(0),
        error: format!(
            "partial success: {} profiles rejected: {message}",
            partial.rejected_profiles
        ),
    })
}

/// One `ExportProfilesServiceRequest` per window.
pub(crate) struct Otlp {
    host: Attributes,
    operator: Attributes,
    gzip: bool,
    dictionary: DictionaryStats,
}

impl Otlp {
    /// `hostname` becomes `host.name` unless `OTEL_RESOURCE_ATTRIBUTES` says it; the operator's
    /// `--label`s override every process's attributes, under their semantic-convention names.
    pub(crate) fn new(settings: &OtlpSettings, hostname: &str, operator: &OperatorLabels) -> Otlp {
        let mut host = Attributes::new();
        if !hostname.is_empty() {
            host.insert("host.name".into(), Value::Str(hostname.into()));
        }
        host.extend(settings.host.clone());
        let operator = operator
            .iter()
            .filter_map(|(name, value)| {
                let (key, _) = attribute_of(name, Place::Resource)?;
                Some((key.to_string(), Value::Str(value.into())))
            })
            .collect();
        Otlp {
            host,
            operator,
            gzip: settings.gzip,
            dictionary: DictionaryStats::default(),
        }
    }
}

/// What the OTLP resource needs of a window's process.
pub(crate) fn facts(process: &WindowProcess) -> ProcessFacts {
    ProcessFacts {
        executable: process.executable.clone(),
        python_version: process.identity.python_version.clone(),
    }
}

impl Exporter for Otlp {
    fn name(&self) -> &'static str {
        "otlp"
    }

    fn encode(&mut self, cuts: &[Cut]) -> Vec<Request> {
        let mut encoder = Encoder::new(self.host.clone(), self.operator.clone());
        for cut in cuts {
            encoder.add(&cut.profile, Some(&cut.service), &|pid| {
                cut.processes.get(&pid).map(facts)
            });
        }
        let (request, stats) = encoder.finish();
        self.dictionary.entries = stats.entries;
        self.dictionary.over_limit_samples += stats.over_limit_samples;
        if stats.resources == 0 {
            return Vec::new();
        }
        let mut body = request.encode_to_vec();
        if self.gzip {
            let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
            // Writing to a Vec fails only on allocation failure, which aborts anyway.
            let _ = gz.write_all(&body);
            body = gz.finish().unwrap_or_default();
        }
        vec![Request {
            body,
            summary: format!(
                "a window of {} processes ({} samples)",
                stats.resources, stats.samples
            ),
        }]
    }

    fn dictionary(&self) -> Option<DictionaryStats> {
        Some(self.dictionary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings(flag: &str, vars: &[(&str, &str)]) -> Result<OtlpSettings, OtlpError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        OtlpSettings::new(flag, &|name| vars.get(name).cloned())
    }

    #[test]
    fn endpoints_follow_the_specification() {
        let e = |flag, vars: &[(&str, &str)]| settings(flag, vars).unwrap().endpoint;
        assert_eq!(e("", &[]), "http://localhost:4318/v1development/profiles");
        assert_eq!(
            e("http://collector:4318/", &[]),
            "http://collector:4318/v1development/profiles"
        );
        assert_eq!(
            e("https://c/otlp/v1development/profiles", &[]),
            "https://c/otlp/v1development/profiles"
        );
        let general = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://gen:4318/base");
        let profiles = (
            "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
            "http://prof:1/custom",
        );
        assert_eq!(
            e("", &[general]),
            "http://gen:4318/base/v1development/profiles"
        );
        // The signal's own endpoint is used as it is, and wins over the general one.
        assert_eq!(e("", &[general, profiles]), "http://prof:1/custom");
        // The flag wins over both.
        assert_eq!(
            e("http://flag:2", &[general, profiles]),
            "http://flag:2/v1development/profiles"
        );
        for bad in [
            "collector:4318",
            "ftp://c",
            "http://u:p@c",
            "http://c/?a=1",
            "http://",
        ] {
            assert!(settings(bad, &[]).is_err(), "{bad}");
        }
        let err = settings("http://user:secret@c", &[])
            .unwrap_err()
            .to_string();
        assert!(!err.contains("secret") && err.contains("HEADERS"), "{err}");
    }

    #[test]
    fn headers_compression_timeout_and_resource() {
        let s = settings(
            "",
            &[
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "Authorization=Basic%20abc, x-team = a ",
                ),
                ("OTEL_EXPORTER_OTLP_PROFILES_HEADERS", "X-Team=b"),
                ("OTEL_EXPORTER_OTLP_COMPRESSION", "none"),
                ("OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT", "2500"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "x"),
                (
                    "OTEL_RESOURCE_ATTRIBUTES",
                    "k8s.node.name=node-1,deployment.environment=prod%2Ceu",
                ),
            ],
        )
        .unwrap();
        assert_eq!(
            s.headers,
            [
                ("Authorization".to_string(), "Basic abc".to_string()),
                ("X-Team".to_string(), "b".to_string())
            ]
        );
        assert!(!s.gzip);
        assert_eq!(s.timeout, Duration::from_millis(2500));
        assert_eq!(
            s.host.get("k8s.node.name"),
            Some(&Value::Str("node-1".into()))
        );
        assert_eq!(
            s.host.get("deployment.environment"),
            Some(&Value::Str("prod,eu".into()))
        );
        let http = s.http();
        assert_eq!(http.policy, RetryPolicy::Otlp);
        assert!(!http.headers.iter().any(|(k, _)| k == "Content-Encoding"));
        assert!(!format!("{http:?}").contains("abc"));

        let gz = settings("", &[]).unwrap();
        assert!(gz.gzip && gz.timeout == DEFAULT_TIMEOUT);
        assert!(gz
            .http()
            .headers
            .contains(&("Content-Encoding".into(), "gzip".into())));

        for vars in [
            [("OTEL_EXPORTER_OTLP_HEADERS", "novalue")],
            [("OTEL_EXPORTER_OTLP_HEADERS", "bad key=1")],
            [("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd")],
            [("OTEL_EXPORTER_OTLP_TIMEOUT", "0")],
            [("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
            [("OTEL_RESOURCE_ATTRIBUTES", "=x")],
        ] {
            let err = settings("", &vars).unwrap_err().to_string();
            assert!(err.starts_with(vars[0].0), "{err}");
        }
        assert!(settings("", &[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")]).is_ok());
    }

    #[test]
    fn partial_success_is_read_from_the_response() {
        use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesPartialSuccess;
        let body = |rejected, message: &str| {
            ExportProfilesServiceResponse {
                partial_success: Some(ExportProfilesPartialSuccess {
                    rejected_profiles: rejected,
                    error_message: message.into(),
                }),
            }
            .encode_to_vec()
        };
        assert_eq!(partial_success(&[]), None);
        assert_eq!(partial_success(&body(0, "")), None);
        assert_eq!(partial_success(b"\xff\xff garbage"), None);
        match partial_success(&body(3, "too old")) {
            Some(Outcome::Partial { rejected, error }) => {
                assert_eq!(rejected, 3);
                assert!(error.contains("too old"), "{error}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            partial_success(&body(0, "a warning")),
            Some(Outcome::Partial { rejected: 0, .. })
        ));
    }
}
