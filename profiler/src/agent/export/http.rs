//! The HTTP [`Transport`] every exporter sends through: one `POST` of an encoded body with the
//! exporter's headers, through `ureq` (blocking, on the queue's own thread; rustls for HTTPS).
//!
//! A response is read up to [`MAX_RESPONSE_BODY`] bytes, headers up to ureq's 64 KiB; its
//! status becomes an [`Outcome`] under the exporter's [`RetryPolicy`], `Retry-After` included.
//! Redirects are not followed: a push API does not redirect, and following one could send
//! credentials elsewhere.

use std::io::Read;
use std::time::{Duration, SystemTime};

use super::queue::{cap, classify, Cause, Outcome, RetryPolicy, Transport, MAX_RETRY_AFTER};

/// Bytes of a response body read: enough for an error's message or OTLP's `partial_success`.
pub(crate) const MAX_RESPONSE_BODY: u64 = 4096;

/// Reads a 2xx body; `Some` is the outcome it stands for instead of `Sent`.
pub(crate) type ReadSuccess = fn(&[u8]) -> Option<Outcome>;

/// Where and how to send: everything but the body.
#[derive(Clone)]
pub(crate) struct HttpTarget {
    /// The URL requests go to (no credentials in it).
    pub endpoint: String,
    /// Sent with every request; may hold credentials, so `Debug` shows only their names.
    pub headers: Vec<(String, String)>,
    pub policy: RetryPolicy,
    /// Reads a 2xx body: `Some` turns the success into another outcome (OTLP's
    /// `partial_success`).
    pub on_success: Option<ReadSuccess>,
}

impl std::fmt::Debug for HttpTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("HttpTarget")
            .field("endpoint", &self.endpoint)
            .field("headers", &names)
            .field("policy", &self.policy)
            .finish()
    }
}

pub(crate) struct HttpTransport {
    agent: ureq::Agent,
    target: HttpTarget,
}

impl HttpTransport {
    pub(crate) fn new(target: HttpTarget, timeout: Duration) -> HttpTransport {
        let agent = ureq::Agent::config_builder()
            // Statuses are outcomes here, not errors.
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_global(Some(timeout))
            .user_agent(concat!("pyebpf/", env!("CARGO_PKG_VERSION")))
            // One backend, one request at a time.
            .max_idle_connections(1)
            .max_idle_connections_per_host(1)
            .build()
            .into();
        HttpTransport { agent, target }
    }
}

impl Transport for HttpTransport {
    fn endpoint(&self) -> &str {
        &self.target.endpoint
    }

    fn send(&mut self, body: &[u8], timeout: Duration) -> Outcome {
        let mut request = self.agent.post(&self.target.endpoint);
        for (name, value) in &self.target.headers {
            request = request.header(name, value);
        }
        let result = request
            .config()
            .timeout_global(Some(timeout))
            .build()
            .send(body);
        let mut response = match result {
            Ok(response) => response,
            Err(err) => return transport_error(&err),
        };
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        let mut text = Vec::new();
        // Read what a message needs; the connection is dropped rather than drained past it.
        let _ = response
            .body_mut()
            .as_reader()
            .take(MAX_RESPONSE_BODY)
            .read_to_end(&mut text);
        if (200..=299).contains(&status) {
            if let Some(outcome) = self.target.on_success.and_then(|read| read(&text)) {
                return outcome;
            }
        }
        classify(
            self.target.policy,
            status,
            retry_after,
            describe_response(status, &text),
        )
    }
}

fn transport_error(err: &ureq::Error) -> Outcome {
    let error = cap(&err.to_string());
    let cause = match err {
        ureq::Error::Timeout(_) => Cause::Timeout,
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => Cause::Timeout,
        // A request that cannot be made will not be made by trying again.
        ureq::Error::BadUri(_)
        | ureq::Error::Http(_)
        | ureq::Error::InvalidProxyUrl
        | ureq::Error::RequireHttpsOnly(_) => return Outcome::Reject { status: 0, error },
        _ => Cause::Connect,
    };
    Outcome::Retry {
        cause,
        after: None,
        error,
    }
}

/// A `Retry-After` value: delay-seconds or an HTTP-date (RFC 9110 §10.2.3). A date in the past
/// means now; anything else is `None` and the backoff decides.
pub(crate) fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // More digits than a u64 holds is still "a long time".
        return Some(
            value
                .parse::<u64>()
                .map(Duration::from_secs)
                .unwrap_or(MAX_RETRY_AFTER),
        );
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// `google.rpc.Status`, the body of an OTLP/HTTP error (only the fields a log line needs).
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

/// A failed response, for logs: a Connect error's `code: message` (Pyroscope), an OTLP
/// `Status` message, else the start of the body.
fn describe_response(status: u16, body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct ConnectError {
        code: Option<String>,
        message: Option<String>,
    }
    let detail = match serde_json::from_slice::<ConnectError>(body) {
        Ok(ConnectError { code, message }) => [code, message]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(": "),
        Err(_) => match <RpcStatus as prost::Message>::decode(body) {
            Ok(s) if !s.message.is_empty() => s.message,
            _ => String::from_utf8_lossy(body).into_owned(),
        },
    };
    // One line for the log: newlines, NULs and runs of blanks become one space.
    let detail = detail
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    if detail.is_empty() {
        format!("HTTP {status}")
    } else {
        cap(&format!("HTTP {status}: {detail}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::export::queue::MAX_ERROR_TEXT;

    #[test]
    fn retry_after_values() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(
            parse_retry_after("99999999999999999999999999", now),
            Some(MAX_RETRY_AFTER)
        );
        for junk in ["", "-1", "1.5", "soon", "\u{0}"] {
            assert_eq!(parse_retry_after(junk, now), None, "{junk:?}");
        }
    }

    #[test]
    fn responses_are_described_briefly() {
        assert_eq!(
            describe_response(
                400,
                br#"{"code":"invalid_argument","message":"no service_name"}"#
            ),
            "HTTP 400: invalid_argument: no service_name"
        );
        assert_eq!(describe_response(503, b""), "HTTP 503");
        assert_eq!(
            describe_response(502, b"bad\ngateway\x00"),
            "HTTP 502: bad gateway"
        );
        let status = prost::Message::encode_to_vec(&RpcStatus {
            code: 3,
            message: "no resource".into(),
        });
        assert_eq!(describe_response(400, &status), "HTTP 400: no resource");
        let long = describe_response(500, &[b'x'; 4096]);
        assert!(long.len() <= MAX_ERROR_TEXT + 4);
        let _ = describe_response(500, &[0xff; 100]);
    }
}
