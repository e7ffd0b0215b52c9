//! The agent's pusher against real HTTP on 127.0.0.1: an axum server that answers like a
//! Pyroscope that is unavailable for a while, throttles, refuses, or is not there at all, and a
//! raw socket that answers garbage. Bodies must arrive byte-identical, with the Connect headers,
//! basic auth and tenant; failures must be retried, counted, bounded, and never panic.

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use profiler::agent::push::{Backoff, Leftover, PushConfig, PushTarget, Pusher};

/// One request as the server saw it.
#[derive(Clone, Debug)]
struct Received {
    path: String,
    headers: HeaderMap,
    body: Vec<u8>,
    at: Instant,
}

/// One scripted answer: status, headers, body.
type Answer = (u16, Vec<(&'static str, &'static str)>, &'static str);

/// How the server answers, one entry per request; 200 once the script is spent.
#[derive(Clone, Default)]
struct Backend {
    script: Arc<Mutex<VecDeque<Answer>>>,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Backend {
    fn answering(script: impl IntoIterator<Item = Answer>) -> Backend {
        Backend {
            script: Arc::new(Mutex::new(script.into_iter().collect())),
            ..Backend::default()
        }
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

async fn push(
    State(backend): State<Backend>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    backend.received.lock().unwrap().push(Received {
        path: uri.path().to_string(),
        headers,
        body: body.to_vec(),
        at: Instant::now(),
    });
    let next = backend.script.lock().unwrap().pop_front();
    let (status, headers, body) = next.unwrap_or((200, vec![], ""));
    let mut response = (StatusCode::from_u16(status).unwrap(), body.to_string()).into_response();
    for (name, value) in headers {
        response.headers_mut().insert(name, value.parse().unwrap());
    }
    response
}

/// Serves `backend` on 127.0.0.1 from a thread of its own; lives until the test process ends.
fn serve(backend: Backend) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let app = axum::Router::new()
                .fallback(axum::routing::post(push))
                .with_state(backend);
            axum::serve(listener, app).await.unwrap();
        });
    });
    addr
}

fn fast(max_queued: usize, max_attempts: u32) -> PushConfig {
    PushConfig {
        timeout: Duration::from_secs(5),
        max_queued,
        max_queued_bytes: 1 << 20,
        max_attempts,
        backoff: Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(100),
        },
    }
}

/// Bytes that are not UTF-8 and not text, as a gzipped pprof inside protobuf would be.
fn body(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

fn flushed(pusher: &Pusher) {
    assert_eq!(
        pusher.flush(Instant::now() + Duration::from_secs(20)),
        Leftover::default()
    );
}

#[test]
fn retries_503_then_delivers_byte_identical_bodies_with_headers() {
    let backend = Backend::answering([
        (
            503,
            vec![],
            r#"{"code":"unavailable","message":"ingester ring not ready"}"#,
        ),
        (503, vec![], ""),
        (503, vec![], ""),
    ]);
    let addr = serve(backend.clone());
    let target = PushTarget::new(
        &format!("http://tenant-user:s%3Acret%40@{addr}/pyroscope/"),
        None,
        Some("team-a"),
    )
    .unwrap();
    assert_eq!(
        target.endpoint(),
        format!("http://{addr}/pyroscope/push.v1.PusherService/Push")
    );
    let pusher = Pusher::new(target, fast(16, 5)).unwrap();
    let bodies = [body(1, 70_000), body(2, 1), body(3, 5000)];
    for (i, b) in bodies.iter().enumerate() {
        pusher.push(b.clone(), format!("window {i}"));
    }
    flushed(&pusher);

    let received = backend.received();
    // The first body three times (503s), then each once, in order.
    assert_eq!(received.len(), 6);
    let got: Vec<&[u8]> = received.iter().map(|r| r.body.as_slice()).collect();
    let want: Vec<&[u8]> = [0, 0, 0, 0, 1, 2]
        .iter()
        .map(|&i| bodies[i].as_slice())
        .collect();
    assert!(got == want, "bodies differ or arrive out of order");
    for r in &received {
        assert_eq!(r.path, "/pyroscope/push.v1.PusherService/Push");
        assert_eq!(r.headers["content-type"], "application/proto");
        assert_eq!(r.headers["connect-protocol-version"], "1");
        assert_eq!(r.headers["x-scope-orgid"], "team-a");
        // base64("tenant-user:s:cret@"): the URL's userinfo, percent-decoded.
        assert_eq!(
            r.headers["authorization"],
            "Basic dGVuYW50LXVzZXI6czpjcmV0QA=="
        );
        assert!(r.headers["user-agent"]
            .to_str()
            .unwrap()
            .starts_with("pyebpf/"));
    }
    // Backoff between the retries, not a tight loop.
    assert!(received[1].at - received[0].at >= Duration::from_millis(10));

    let stats = pusher.stats();
    assert_eq!(
        (stats.ok, stats.retried, stats.attempt_errors.server),
        (3, 3, 3)
    );
    assert_eq!(
        stats.ok_bytes,
        bodies.iter().map(|b| b.len() as u64).sum::<u64>()
    );
    assert_eq!(stats.failed(), [("rejected", 0), ("retries_exhausted", 0)]);
    assert_eq!(stats.dropped(), [("queue_full", 0), ("too_large", 0)]);
    assert_eq!(stats.last_error.as_deref(), Some("HTTP 503"));
}

#[test]
fn honours_retry_after_and_does_not_retry_4xx() {
    let backend = Backend::answering([
        (429, vec![("retry-after", "1")], "slow down"),
        (
            401,
            vec![],
            r#"{"code":"unauthenticated","message":"bad token"}"#,
        ),
        (401, vec![], ""),
    ]);
    let addr = serve(backend.clone());
    let target = PushTarget::new(&format!("http://{addr}"), Some("u:p"), None).unwrap();
    let pusher = Pusher::new(target, fast(16, 5)).unwrap();
    pusher.push(body(1, 10), "throttled, then sent");
    pusher.push(body(2, 10), "refused");
    pusher.push(body(3, 10), "refused too");
    pusher.push(body(4, 10), "sent");
    flushed(&pusher);

    let received = backend.received();
    assert_eq!(received.len(), 5, "{received:?}");
    assert!(
        received[1].at - received[0].at >= Duration::from_millis(950),
        "Retry-After: 1 waited only {:?}",
        received[1].at - received[0].at
    );
    assert!(received
        .iter()
        .all(|r| r.headers.get("x-scope-orgid").is_none()));
    let stats = pusher.stats();
    assert_eq!(stats.ok, 2);
    assert_eq!(stats.failed_rejected, 2);
    assert_eq!((stats.retried, stats.attempt_errors.throttled), (1, 1));
    assert_eq!(stats.last_error.as_deref(), Some("HTTP 401"));
}

#[test]
fn a_backend_that_stays_down_is_given_up_on() {
    let backend = Backend::answering(std::iter::repeat_n((500, vec![], "boom"), 3));
    let addr = serve(backend.clone());
    let pusher = Pusher::new(
        PushTarget::new(&format!("http://{addr}"), None, None).unwrap(),
        fast(16, 3),
    )
    .unwrap();
    pusher.push(body(1, 100), "doomed");
    pusher.push(body(2, 100), "fine");
    flushed(&pusher);
    let stats = pusher.stats();
    assert_eq!((stats.failed_exhausted, stats.retried, stats.ok), (1, 2, 1));
    assert_eq!(stats.last_error.as_deref(), Some("HTTP 500: boom"));
    assert_eq!(backend.received().len(), 4);
}

#[test]
fn connection_refused_is_retried_bounded_and_counted() {
    // A port that was just free: nothing listens there.
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let pusher = Pusher::new(
        PushTarget::new(&format!("http://{addr}"), None, None).unwrap(),
        PushConfig {
            max_queued_bytes: 10_000,
            ..fast(4, 1000)
        },
    )
    .unwrap();
    for i in 0..50u8 {
        pusher.push(body(i, 1000), format!("window {i}"));
    }
    let stats = pusher.stats();
    assert!(stats.queued <= 4 && stats.queued_bytes <= 4000, "{stats:?}");
    assert!(stats.dropped_queue_full >= 45, "{stats:?}");
    assert_eq!(stats.dropped_bytes, stats.dropped_queue_full * 1000);
    assert_eq!(
        pusher.push(body(0, 10_001), "too big"),
        profiler::agent::push::Queued::TooLarge
    );

    // Let it fail a few times, then flush at SIGTERM: it returns at the deadline with the rest.
    std::thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    let left = pusher.flush(start + Duration::from_millis(500));
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert!((1..=5).contains(&left.requests), "{left:?}");
    let stats = pusher.stats();
    assert_eq!(stats.ok, 0);
    assert!(stats.attempt_errors.connect >= 2, "{stats:?}");
    assert!(stats.retried >= 2, "{stats:?}");
    assert!(stats.last_error.is_some());
}

/// A server that answers anything but HTTP, or too much of it: every attempt fails or
/// succeeds, none panics, none reads without bound.
#[test]
fn garbage_answers_never_panic() {
    use std::io::{Read, Write};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let answers: Vec<Vec<u8>> = vec![
        b"not http at all\r\n\r\n".to_vec(),
        b"HTTP/1.1 200\r\n".to_vec(), // cut short
        b"HTTP/1.1 999 Weird\r\ncontent-length: 0\r\n\r\n".to_vec(),
        b"HTTP/1.1 503 x\r\nretry-after: soon\r\ncontent-length: 3\r\n\r\n\xff\x00\xfe".to_vec(),
        [
            &b"HTTP/1.1 400 x\r\ncontent-length: 10000000\r\n\r\n"[..],
            &vec![b'y'; 1 << 20][..],
        ]
        .concat(),
        b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_vec(),
    ];
    let count = answers.len();
    std::thread::spawn(move || {
        for answer in answers {
            let Ok((mut stream, _)) = listener.accept() else {
                return;
            };
            stream
                .set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let mut buf = [0u8; 65536];
            let _ = stream.read(&mut buf);
            let _ = stream.write_all(&answer);
        }
    });
    let pusher = Pusher::new(
        PushTarget::new(&format!("http://{addr}"), None, None).unwrap(),
        fast(16, 1),
    )
    .unwrap();
    for i in 0..count as u8 {
        pusher.push(body(i, 100), format!("#{i}"));
    }
    // One attempt each (max_attempts 1): every request ends sent, refused or given up.
    flushed(&pusher);
    let stats = pusher.stats();
    assert_eq!(
        stats.ok + stats.failed_rejected + stats.failed_exhausted,
        count as u64,
        "{stats:?}"
    );
    assert!(
        stats.failed_rejected + stats.failed_exhausted >= 5,
        "{stats:?}"
    );
    assert!(
        stats.last_error.as_ref().is_some_and(|e| e.len() < 600),
        "{stats:?}"
    );
}
