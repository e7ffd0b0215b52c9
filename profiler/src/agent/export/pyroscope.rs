//! Grafana Pyroscope's push API: each service's profile of a window as pprof inside a
//! `PushRequest`, sent as a Connect unary call, `POST {base}/push.v1.PusherService/Push` with
//! `Content-Type: application/proto`. Its series carries the window's labels (see
//! `agent::window`). Retried as it always was: 408, 429 and every 5xx.

use base64::Engine;
use prost::Message;

use super::http::{HttpTarget, HttpTransport};
use super::queue::{ExportQueue, QueueConfig, RetryPolicy};
use super::{Exporter, Request};
use crate::agent::window::Cut;
use crate::output::pprof;
use crate::proto::push::v1 as push;
use crate::proto::types::v1 as types;

/// The Connect unary route of Pyroscope's `push.v1.PusherService.Push`.
pub(crate) const PUSH_PATH: &str = "/push.v1.PusherService/Push";

/// A `--pyroscope` URL, credentials or tenant the agent cannot use: bad usage, exit 2.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("--pyroscope {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("basic auth must be USER:PASSWORD")]
    BadAuth,
    #[error("tenant {0:?}: not a valid X-Scope-OrgID header value")]
    BadTenant(String),
}

impl From<TargetError> for crate::UsageError {
    fn from(err: TargetError) -> Self {
        crate::UsageError(err.to_string())
    }
}

/// Where and as whom to push.
#[derive(Clone)]
pub struct PushTarget {
    endpoint: String,
    /// `Basic …`, ready for the `Authorization` header.
    authorization: Option<String>,
    tenant: Option<String>,
}

impl std::fmt::Debug for PushTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushTarget")
            .field("endpoint", &self.endpoint)
            .field(
                "authorization",
                &self.authorization.as_ref().map(|_| "<redacted>"),
            )
            .field("tenant", &self.tenant)
            .finish()
    }
}

impl PushTarget {
    /// `url` is Pyroscope's base URL (`http://pyroscope:4040`, `https://host/prefix`), or the
    /// full push URL. Basic auth comes from `basic_auth` (`USER:PASSWORD`) or else from the URL's
    /// userinfo (`https://USER:PASSWORD@host`, percent-encoded), which is never sent in the URL.
    /// `tenant` becomes `X-Scope-OrgID` for a multi-tenant Pyroscope.
    pub fn new(
        url: &str,
        basic_auth: Option<&str>,
        tenant: Option<&str>,
    ) -> Result<PushTarget, TargetError> {
        let bad = |reason: &str| TargetError::BadUrl {
            url: redact_userinfo(url),
            reason: reason.into(),
        };
        let uri: ureq::http::Uri = url
            .parse()
            .map_err(|e: ureq::http::uri::InvalidUri| bad(&e.to_string()))?;
        let scheme = match uri.scheme_str() {
            Some(s @ ("http" | "https")) => s,
            _ => return Err(bad("the scheme must be http:// or https://")),
        };
        let authority = uri.authority().ok_or_else(|| bad("no host"))?.as_str();
        let (userinfo, host) = match authority.rsplit_once('@') {
            Some((userinfo, host)) => (Some(userinfo), host),
            None => (None, authority),
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        if uri.query().is_some() {
            return Err(bad("a query string has no place in the push URL"));
        }
        let path = uri.path().trim_end_matches('/');
        let path = path.strip_suffix(PUSH_PATH).unwrap_or(path);
        let endpoint = format!("{scheme}://{host}{path}{PUSH_PATH}");

        let credentials = match (basic_auth, userinfo) {
            (Some(auth), _) => {
                let (user, password) = auth.split_once(':').ok_or(TargetError::BadAuth)?;
                Some((user.to_string(), password.to_string()))
            }
            (None, Some(userinfo)) => {
                let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
                let decode = |s: &str| {
                    percent_encoding::percent_decode_str(s)
                        .decode_utf8()
                        .map(|s| s.into_owned())
                        .map_err(|_| bad("the user info is not UTF-8 once percent-decoded"))
                };
                Some((decode(user)?, decode(password)?))
            }
            (None, None) => None,
        };
        let authorization = credentials.map(|(user, password)| {
            let token =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            format!("Basic {token}")
        });
        let tenant = match tenant {
            Some(t) if t.is_empty() || ureq::http::HeaderValue::from_str(t).is_err() => {
                return Err(TargetError::BadTenant(t.to_string()));
            }
            t => t.map(str::to_string),
        };
        Ok(PushTarget {
            endpoint,
            authorization,
            tenant,
        })
    }
}

/// `url` with any userinfo replaced, for messages.
fn redact_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

impl PushTarget {
    /// The URL requests go to (no credentials in it).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// How the HTTP transport sends to this target.
    pub(crate) fn http(&self) -> HttpTarget {
        let mut headers = vec![
            ("Content-Type".to_string(), "application/proto".to_string()),
            ("Connect-Protocol-Version".to_string(), "1".to_string()),
        ];
        if let Some(auth) = &self.authorization {
            headers.push(("Authorization".to_string(), auth.clone()));
        }
        if let Some(tenant) = &self.tenant {
            headers.push(("X-Scope-OrgID".to_string(), tenant.clone()));
        }
        HttpTarget {
            endpoint: self.endpoint.clone(),
            headers,
            policy: RetryPolicy::Broad,
            on_success: None,
        }
    }
}

impl ExportQueue {
    /// A queue pushing to Pyroscope at `target`: the push as a library, which
    /// `profiler/tests/agent_push.rs` drives over real HTTP.
    pub fn new(target: PushTarget, config: QueueConfig) -> std::io::Result<ExportQueue> {
        let transport = HttpTransport::new(target.http(), config.timeout);
        ExportQueue::start(transport, config)
    }
}

/// One `PushRequest` per service per window.
pub(crate) struct Pyroscope;

impl Exporter for Pyroscope {
    fn name(&self) -> &'static str {
        "pyroscope"
    }

    fn encode(&mut self, cuts: &[Cut]) -> Vec<Request> {
        cuts.iter()
            .map(|cut| Request {
                body: push_request(cut),
                summary: format!("{} ({} samples)", cut.service, cut.profile.samples),
            })
            .collect()
    }
}

/// The `PushRequest` holding one service's profile of a window.
fn push_request(cut: &Cut) -> Vec<u8> {
    let mut raw_profile = Vec::new();
    // Writing to a Vec fails only on allocation failure, which aborts anyway.
    let _ = pprof::write(&cut.profile, "pyebpf agent", &mut raw_profile);
    push::PushRequest {
        series: vec![push::RawProfileSeries {
            labels: cut
                .labels
                .iter()
                .map(|(name, value)| types::LabelPair {
                    name: name.clone(),
                    value: value.clone(),
                })
                .collect(),
            samples: vec![push::RawSample {
                raw_profile,
                id: String::new(),
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        let t = PushTarget::new("http://pyroscope:4040", None, None).unwrap();
        assert_eq!(
            t.endpoint(),
            "http://pyroscope:4040/push.v1.PusherService/Push"
        );
        assert!(t.authorization.is_none() && t.tenant.is_none());

        let t = PushTarget::new("https://host/prefix/", Some("u:p:w"), Some("team-a")).unwrap();
        assert_eq!(
            t.endpoint(),
            "https://host/prefix/push.v1.PusherService/Push"
        );
        // base64("u:p:w")
        assert_eq!(t.authorization.as_deref(), Some("Basic dTpwOnc="));
        assert_eq!(t.tenant.as_deref(), Some("team-a"));

        let t = PushTarget::new(
            "http://user:p%40ss@h:1/push.v1.PusherService/Push",
            None,
            None,
        )
        .unwrap();
        assert_eq!(t.endpoint(), "http://h:1/push.v1.PusherService/Push");
        // base64("user:p@ss")
        assert_eq!(t.authorization.as_deref(), Some("Basic dXNlcjpwQHNz"));
        assert!(!format!("{t:?}").contains("dXNlcjpwQHNz"));

        // The flag wins over the URL.
        let t = PushTarget::new("http://a:b@h", Some("c:d"), None).unwrap();
        // base64("c:d")
        assert_eq!(t.authorization.as_deref(), Some("Basic Yzpk"));

        for bad in [
            "pyroscope:4040",
            "ftp://h",
            "http://",
            "http://h/?x=1",
            "",
            "http://a b",
        ] {
            assert!(PushTarget::new(bad, None, None).is_err(), "{bad}");
        }
        let err = PushTarget::new("ftp://me:secret@h", None, None).unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
        assert!(matches!(
            PushTarget::new("http://h", Some("nocolon"), None),
            Err(TargetError::BadAuth)
        ));
        assert!(matches!(
            PushTarget::new("http://h", None, Some("a\nb")),
            Err(TargetError::BadTenant(_))
        ));
        assert!(matches!(
            PushTarget::new("http://h", None, Some("")),
            Err(TargetError::BadTenant(_))
        ));
    }
}
