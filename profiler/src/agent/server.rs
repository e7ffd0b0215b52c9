//! The agent's HTTP endpoints (axum): `/debug/pprof/profile`, `/metrics`, `/healthz`.
//!
//! Handlers hold no profiler state: each request becomes a [`Request`] on the driver's input
//! channel and waits for the sampling loop's answer, so a scrape sees exactly what the loop
//! has, and `/healthz` answering means the loop itself is turning. At most
//! [`MAX_IN_FLIGHT`] requests wait at once; more get 503 at once.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot, Semaphore};

/// Requests waiting for the loop at once.
pub(crate) const MAX_IN_FLIGHT: usize = 16;
/// Longest profile a pull may ask for.
pub(crate) const MAX_SECONDS: u64 = 300;
/// What `go tool pprof` and Go's `net/http/pprof` take when `seconds` is absent.
const DEFAULT_SECONDS: u64 = 30;
/// How long `/healthz` and `/metrics` wait for the loop.
const LOOP_TIMEOUT: Duration = Duration::from_secs(5);

/// What a pull wants profiled.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Filter {
    pub pid: Option<u32>,
    pub service: Option<String>,
}

/// A request handed to the sampling loop.
pub(crate) enum Request {
    /// A pprof of the next `seconds`, or why not.
    Profile {
        seconds: u64,
        filter: Filter,
        reply: oneshot::Sender<Result<Vec<u8>, String>>,
    },
    Metrics(oneshot::Sender<String>),
    Health(oneshot::Sender<()>),
}

#[derive(Clone)]
struct Shared {
    loop_tx: mpsc::UnboundedSender<Request>,
    in_flight: Arc<Semaphore>,
}

#[derive(Deserialize)]
struct ProfileQuery {
    seconds: Option<String>,
    pid: Option<String>,
    service: Option<String>,
}

/// Binds `addr` and serves until the runtime ends. Requests arrive on the returned channel.
pub(crate) async fn serve(
    addr: &str,
) -> std::io::Result<(mpsc::UnboundedReceiver<Request>, String)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?.to_string();
    let (loop_tx, rx) = mpsc::unbounded_channel();
    let shared = Shared {
        loop_tx,
        in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
    };
    let app = Router::new()
        .route("/debug/pprof/profile", get(profile))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .with_state(shared);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            log::error!("agent HTTP server stopped: {e}");
        }
    });
    Ok((rx, local))
}

fn text(status: StatusCode, body: impl Into<String>) -> Response {
    let mut body = body.into();
    body.push('\n');
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

fn busy() -> Response {
    text(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("busy: {MAX_IN_FLIGHT} requests already waiting"),
    )
}

fn loop_gone() -> Response {
    text(
        StatusCode::SERVICE_UNAVAILABLE,
        "the sampling loop is not answering",
    )
}

/// `seconds`, `pid`, `service` of a pull; a bad value is the client's error, with the fix.
fn parse(query: ProfileQuery) -> Result<(u64, Filter), String> {
    let seconds = match query.seconds.as_deref() {
        None | Some("") => DEFAULT_SECONDS,
        Some(s) => match s.parse::<u64>() {
            Ok(n) if (1..=MAX_SECONDS).contains(&n) => n,
            _ => {
                return Err(format!(
                    "seconds={s:?}: give a whole number of seconds from 1 to {MAX_SECONDS}"
                ))
            }
        },
    };
    let pid = match query.pid.as_deref() {
        None | Some("") => None,
        Some(p) => Some(
            p.parse::<u32>()
                .map_err(|_| format!("pid={p:?}: give a process id, e.g. pid=1234"))?,
        ),
    };
    let service = query.service.filter(|s| !s.is_empty());
    Ok((seconds, Filter { pid, service }))
}

async fn profile(State(shared): State<Shared>, Query(query): Query<ProfileQuery>) -> Response {
    let (seconds, filter) = match parse(query) {
        Ok(q) => q,
        Err(e) => return text(StatusCode::BAD_REQUEST, e),
    };
    let Ok(_permit) = shared.in_flight.try_acquire() else {
        return busy();
    };
    let (reply, answer) = oneshot::channel();
    if shared
        .loop_tx
        .send(Request::Profile {
            seconds,
            filter,
            reply,
        })
        .is_err()
    {
        return loop_gone();
    }
    match answer.await {
        Ok(Ok(pprof)) => (
            [
                (header::CONTENT_TYPE, "application/octet-stream"),
                (
                    header::CONTENT_DISPOSITION,
                    "attachment; filename=\"profile.pb.gz\"",
                ),
            ],
            pprof,
        )
            .into_response(),
        Ok(Err(why)) => text(StatusCode::SERVICE_UNAVAILABLE, why),
        Err(_) => loop_gone(),
    }
}

async fn ask<T>(shared: &Shared, request: impl FnOnce(oneshot::Sender<T>) -> Request) -> Option<T> {
    let _permit = shared.in_flight.try_acquire().ok()?;
    let (reply, answer) = oneshot::channel();
    shared.loop_tx.send(request(reply)).ok()?;
    tokio::time::timeout(LOOP_TIMEOUT, answer).await.ok()?.ok()
}

async fn metrics(State(shared): State<Shared>) -> Response {
    match ask(&shared, Request::Metrics).await {
        Some(body) => {
            ([(header::CONTENT_TYPE, super::metrics::CONTENT_TYPE)], body).into_response()
        }
        None => loop_gone(),
    }
}

async fn healthz(State(shared): State<Shared>) -> Response {
    match ask(&shared, Request::Health).await {
        Some(()) => text(StatusCode::OK, "ok"),
        None => loop_gone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(seconds: Option<&str>, pid: Option<&str>, service: Option<&str>) -> ProfileQuery {
        ProfileQuery {
            seconds: seconds.map(Into::into),
            pid: pid.map(Into::into),
            service: service.map(Into::into),
        }
    }

    #[test]
    fn queries() {
        assert_eq!(parse(q(None, None, None)).unwrap(), (30, Filter::default()));
        assert_eq!(
            parse(q(Some("5"), Some("42"), Some("api"))).unwrap(),
            (
                5,
                Filter {
                    pid: Some(42),
                    service: Some("api".into())
                }
            )
        );
        for bad in ["0", "301", "-1", "1.5", "x"] {
            assert!(parse(q(Some(bad), None, None)).is_err(), "{bad}");
        }
        assert!(parse(q(None, Some("me"), None))
            .unwrap_err()
            .contains("pid=\"me\""));
    }
}
