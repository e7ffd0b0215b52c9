//! Push to Grafana Pyroscope: a bounded queue of encoded requests, drained by one thread that
//! retries.
//!
//! The agent cuts a window, someone encodes it as a `PushRequest`, and [`Pusher::push`] takes
//! the bytes without waiting: the sampling loop must never stall on a slow or dead backend.
//! One thread (`pyebpf-push`) sends them in order as a Connect unary call, `POST
//! {base}/push.v1.PusherService/Push` with `Content-Type: application/proto`, through `ureq`: a
//! blocking client on a thread of its own keeps DNS, TLS and retry sleeps off the agent's
//! current-thread tokio runtime, and needs no second runtime. A push every few seconds does not
//! need async I/O.
//!
//! Failures. Connection errors, timeouts, 5xx, 408 and 429 are retried: the request goes back
//! to the head of the queue, and the next attempt waits an exponential backoff with jitter
//! ([`Backoff`]), or what the server asked for in `Retry-After` (capped at
//! [`MAX_RETRY_AFTER`]). The backoff is the backend's, not the request's: while it is down
//! nothing is sent, and the first success resets it. A request that failed
//! [`PushConfig::max_attempts`] times is given up (`failed_exhausted`). Any other status (4xx:
//! bad auth, wrong tenant, a request the backend refuses) is not retried, since the same bytes
//! would be refused again (`failed_rejected`); each status is logged once, not once per window.
//!
//! Bounds. The queue holds at most [`PushConfig::max_queued`] requests and
//! [`PushConfig::max_queued_bytes`] bytes, plus the one being sent. When a new request does not
//! fit, the **oldest** ones are dropped (`dropped_queue_full`): during an outage the recent
//! windows are the ones worth having when the backend comes back (and the oldest are the first
//! a backend refuses as too old), and the queue becomes a sliding window over the last minutes.
//! A request larger than the byte cap is dropped at once (`dropped_too_large`). A response is
//! read up to [`MAX_RESPONSE_BODY`] bytes, headers up to ureq's 64 KiB; nothing a server says
//! can make this module panic or grow.
//!
//! Shutdown. [`Pusher::flush`] (SIGTERM) keeps sending until the queue is empty or the deadline
//! passes, and returns what was left; a backoff of our own is cut short for it (it is the last
//! chance), a server's `Retry-After` is not.

use std::collections::{BTreeSet, VecDeque};
use std::io::Read;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;

/// The Connect unary route of Pyroscope's `push.v1.PusherService.Push`.
pub(crate) const PUSH_PATH: &str = "/push.v1.PusherService/Push";
/// The longest `Retry-After` honoured; a longer one (or a date years ahead) is cut to this.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);
/// Bytes of a response body read: enough for a Connect error's JSON message.
pub(crate) const MAX_RESPONSE_BODY: u64 = 4096;
/// Bytes of an error text kept for logs and `/metrics`.
const MAX_ERROR_TEXT: usize = 512;

// ---------------------------------------------------------------------------------------------
// Where to push

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

    /// The URL requests go to (no credentials in it).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
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

// ---------------------------------------------------------------------------------------------
// Policy

/// Exponential backoff with "equal jitter": the `n`th consecutive failure waits a random time
/// between half and all of `min(max, initial × 2ⁿ)`. The jitter keeps a fleet of agents that
/// lost the backend together from coming back in lockstep; the floor of one half keeps a
/// failing backend from being hammered by near-zero draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The wait after `failures` consecutive failed attempts (1 for the first).
    pub fn delay(&self, failures: u32, rng: &mut fastrand::Rng) -> Duration {
        let doublings = failures.saturating_sub(1).min(32);
        let full = self
            .initial
            .saturating_mul(1u32 << doublings.min(31))
            .min(self.max);
        let half = u64::try_from(full.as_nanos() / 2).unwrap_or(u64::MAX);
        Duration::from_nanos(half.saturating_add(rng.u64(0..=half)))
    }
}

/// Queue bounds, retries and timeouts of a [`Pusher`].
#[derive(Clone, Debug)]
pub struct PushConfig {
    /// Per request, connecting and reading the answer included.
    pub timeout: Duration,
    /// Requests waiting, at most.
    pub max_queued: usize,
    /// Bytes of requests waiting, at most; also the largest request accepted.
    pub max_queued_bytes: usize,
    /// Attempts per request before it is given up (at least 1).
    pub max_attempts: u32,
    pub backoff: Backoff,
}

impl Default for PushConfig {
    /// A window every 15 s makes a few requests of tens of KiB: 32 MiB holds many minutes of
    /// an outage for a busy host, and 5 attempts with the default backoff span about a minute.
    fn default() -> Self {
        PushConfig {
            timeout: Duration::from_secs(10),
            max_queued: 1024,
            max_queued_bytes: 32 << 20,
            max_attempts: 5,
            backoff: Backoff::default(),
        }
    }
}

/// What went wrong with one attempt that is worth another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cause {
    /// No connection, or it broke (refused, reset, DNS, TLS, a garbled response).
    Connect,
    /// No answer within the timeout, or a 408.
    Timeout,
    /// 5xx.
    Server,
    /// 429.
    Throttled,
}

/// How one attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Sent,
    Retry {
        cause: Cause,
        /// What `Retry-After` asked for.
        after: Option<Duration>,
        error: String,
    },
    /// Not worth another attempt: a 4xx, or a request ureq cannot make. `status` 0 when no
    /// response came.
    Reject {
        status: u16,
        error: String,
    },
}

/// The outcome of a response with `status`.
pub(crate) fn classify(status: u16, retry_after: Option<Duration>, error: String) -> Outcome {
    match status {
        200..=299 => Outcome::Sent,
        408 => Outcome::Retry {
            cause: Cause::Timeout,
            after: retry_after,
            error,
        },
        429 => Outcome::Retry {
            cause: Cause::Throttled,
            after: retry_after,
            error,
        },
        500..=599 => Outcome::Retry {
            cause: Cause::Server,
            after: retry_after,
            error,
        },
        _ => Outcome::Reject { status, error },
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

/// A failed response, for logs: a Connect error's `code: message`, else the start of the body.
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
        Err(_) => String::from_utf8_lossy(body).into_owned(),
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

fn cap(s: &str) -> String {
    if s.len() <= MAX_ERROR_TEXT {
        return s.to_string();
    }
    let mut end = MAX_ERROR_TEXT;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

// ---------------------------------------------------------------------------------------------
// The queue

struct Item {
    body: Vec<u8>,
    /// What the request holds, for logs (`3 series: shop, cart, …`).
    summary: String,
    attempts: u32,
}

/// Requests waiting, oldest first, within a count and a byte bound.
struct Queue {
    items: VecDeque<Item>,
    bytes: usize,
    max_items: usize,
    max_bytes: usize,
}

/// What had to go to make room.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Evicted {
    items: u64,
    bytes: u64,
}

impl Queue {
    fn new(max_items: usize, max_bytes: usize) -> Queue {
        Queue {
            items: VecDeque::new(),
            bytes: 0,
            max_items: max_items.max(1),
            max_bytes,
        }
    }

    fn push_back(&mut self, item: Item) -> Evicted {
        self.bytes += item.body.len();
        self.items.push_back(item);
        self.evict()
    }

    /// A request that is to be retried: it is the oldest, so it is the first to go if the queue
    /// filled up while it was out.
    fn push_front(&mut self, item: Item) -> Evicted {
        self.bytes += item.body.len();
        self.items.push_front(item);
        self.evict()
    }

    fn pop_front(&mut self) -> Option<Item> {
        let item = self.items.pop_front()?;
        self.bytes -= item.body.len();
        Some(item)
    }

    fn evict(&mut self) -> Evicted {
        let mut evicted = Evicted::default();
        while self.items.len() > self.max_items || self.bytes > self.max_bytes {
            let Some(old) = self.pop_front() else { break };
            evicted.items += 1;
            evicted.bytes += old.body.len() as u64;
        }
        evicted
    }
}

// ---------------------------------------------------------------------------------------------
// Counters

/// Attempts that failed and were worth another, by cause.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct AttemptErrors {
    pub connect: u64,
    pub timeout: u64,
    pub server: u64,
    pub throttled: u64,
}

/// What the pusher did, for `/metrics`. Counters only grow; `queued*` and `in_flight` are now.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PushStats {
    /// Requests the backend accepted, and their bytes.
    pub ok: u64,
    pub ok_bytes: u64,
    /// Requests refused with a status that retrying cannot change (4xx other than 408/429).
    pub failed_rejected: u64,
    /// Requests given up after `max_attempts` retryable failures.
    pub failed_exhausted: u64,
    /// Attempts that were followed by another.
    pub retried: u64,
    pub attempt_errors: AttemptErrors,
    /// Requests dropped to make room (the oldest), and requests larger than the whole queue.
    pub dropped_queue_full: u64,
    pub dropped_too_large: u64,
    /// Bytes of all dropped requests.
    pub dropped_bytes: u64,
    pub queued: usize,
    pub queued_bytes: usize,
    /// A request is being sent (it is not in `queued`).
    pub in_flight: bool,
    pub last_error: Option<String>,
    /// When `last_error` happened, in seconds since the Unix epoch.
    pub last_error_unix_seconds: Option<u64>,
}

impl PushStats {
    /// `failed_total{reason=…}`.
    pub fn failed(&self) -> [(&'static str, u64); 2] {
        [
            ("rejected", self.failed_rejected),
            ("retries_exhausted", self.failed_exhausted),
        ]
    }

    /// `dropped_total{reason=…}`.
    pub fn dropped(&self) -> [(&'static str, u64); 2] {
        [
            ("queue_full", self.dropped_queue_full),
            ("too_large", self.dropped_too_large),
        ]
    }
}

/// What a [`Pusher::flush`] could not send before its deadline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Leftover {
    pub requests: usize,
    pub bytes: usize,
}

/// What [`Pusher::push`] did with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queued {
    /// Queued; `evicted` older requests were dropped to make room.
    Queued { evicted: u64 },
    /// Larger than the whole queue: dropped.
    TooLarge,
}

// ---------------------------------------------------------------------------------------------
// The pusher

/// Sends one request; the HTTP one in production, a script in tests.
pub(crate) trait Transport: Send + 'static {
    fn send(&mut self, body: &[u8], timeout: Duration) -> Outcome;
    fn endpoint(&self) -> &str;
}

struct State {
    queue: Queue,
    /// Bytes of the request being sent.
    in_flight: Option<usize>,
    stats: PushStats,
    /// Consecutive failed attempts: the backend's, for the backoff.
    failures: u32,
    /// No attempt before this.
    retry_at: Option<Instant>,
    /// `retry_at` is what the server asked for, which a flush honours.
    retry_at_from_server: bool,
    flush_deadline: Option<Instant>,
    shutdown: bool,
    /// Statuses already logged (at most the 1000 three-digit codes, and 0).
    logged_statuses: BTreeSet<u16>,
    /// Drops are going on; logged when they start, not for each.
    overflowing: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when a request is queued, an attempt ends, a flush starts or ends, shutdown.
    changed: Condvar,
    config: PushConfig,
}

impl Shared {
    /// The state; a panic elsewhere while holding it leaves counters that are still counters.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A bounded, retrying push queue with its sending thread. Dropping it stops the thread after
/// its current attempt, without waiting for it.
pub struct Pusher {
    shared: Arc<Shared>,
    endpoint: String,
}

impl Pusher {
    /// Starts the sending thread for `target`.
    pub fn new(target: PushTarget, config: PushConfig) -> std::io::Result<Pusher> {
        Pusher::with_transport(HttpTransport::new(target, &config), config)
    }

    pub(crate) fn with_transport(
        transport: impl Transport,
        mut config: PushConfig,
    ) -> std::io::Result<Pusher> {
        config.max_attempts = config.max_attempts.max(1);
        let endpoint = transport.endpoint().to_string();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: Queue::new(config.max_queued, config.max_queued_bytes),
                in_flight: None,
                stats: PushStats::default(),
                failures: 0,
                retry_at: None,
                retry_at_from_server: false,
                flush_deadline: None,
                shutdown: false,
                logged_statuses: BTreeSet::new(),
                overflowing: false,
            }),
            changed: Condvar::new(),
            config,
        });
        let worker = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("pyebpf-push".into())
            .spawn(move || run(&worker, transport))?;
        Ok(Pusher { shared, endpoint })
    }

    /// Queues an encoded request; never blocks on the network. `summary` says what it holds,
    /// for logs.
    pub fn push(&self, body: Vec<u8>, summary: impl Into<String>) -> Queued {
        let mut state = self.shared.lock();
        let len = body.len();
        if len > self.shared.config.max_queued_bytes {
            state.stats.dropped_too_large += 1;
            state.stats.dropped_bytes += len as u64;
            log::warn!(
                "push to {}: dropped {} ({len} bytes): larger than the whole queue ({} bytes)",
                self.endpoint,
                summary.into(),
                self.shared.config.max_queued_bytes
            );
            return Queued::TooLarge;
        }
        let evicted = state.queue.push_back(Item {
            body,
            summary: summary.into(),
            attempts: 0,
        });
        note_evicted(&mut state, evicted, &self.endpoint);
        self.shared.changed.notify_all();
        Queued::Queued {
            evicted: evicted.items,
        }
    }

    /// The counters now.
    pub fn stats(&self) -> PushStats {
        let state = self.shared.lock();
        let mut stats = state.stats.clone();
        stats.queued = state.queue.items.len();
        stats.queued_bytes = state.queue.bytes;
        stats.in_flight = state.in_flight.is_some();
        stats
    }

    /// Where requests go.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Sends what is queued until it is all sent or `deadline` passes, and returns what was
    /// left (a request still being sent at the deadline counts as left). Blocks: call it from
    /// `spawn_blocking`, or when the runtime has nothing else to do (shutdown).
    pub fn flush(&self, deadline: Instant) -> Leftover {
        let mut state = self.shared.lock();
        state.flush_deadline = Some(deadline);
        if !state.retry_at_from_server {
            state.retry_at = None;
        }
        self.shared.changed.notify_all();
        loop {
            if state.queue.items.is_empty() && state.in_flight.is_none() {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            state = self
                .shared
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        state.flush_deadline = None;
        self.shared.changed.notify_all();
        Leftover {
            requests: state.queue.items.len() + usize::from(state.in_flight.is_some()),
            bytes: state.queue.bytes + state.in_flight.unwrap_or(0),
        }
    }
}

impl Drop for Pusher {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.changed.notify_all();
    }
}

fn note_evicted(state: &mut State, evicted: Evicted, endpoint: &str) {
    if evicted.items == 0 {
        return;
    }
    state.stats.dropped_queue_full += evicted.items;
    state.stats.dropped_bytes += evicted.bytes;
    if !state.overflowing {
        state.overflowing = true;
        log::warn!(
            "push to {endpoint}: queue full, dropping the oldest requests (counted in \
             dropped_queue_full) until the backend keeps up"
        );
    }
}

/// The sending thread: one request at a time, oldest first.
fn run(shared: &Shared, mut transport: impl Transport) {
    let config = &shared.config;
    let mut rng = fastrand::Rng::new();
    let mut state = shared.lock();
    loop {
        if state.shutdown {
            return;
        }
        let now = Instant::now();
        let wait = if state.queue.items.is_empty() {
            Some(None)
        } else if let Some(at) = state.retry_at.filter(|&at| at > now) {
            Some(Some(at - now))
        } else if state.flush_deadline.is_some_and(|d| d <= now) {
            // The flush is over; it clears its deadline and wakes us.
            Some(None)
        } else {
            None
        };
        if let Some(timeout) = wait {
            state = match timeout {
                None => shared
                    .changed
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(t) => {
                    shared
                        .changed
                        .wait_timeout(state, t)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
            continue;
        }
        // A flush has only until its deadline.
        let timeout = state
            .flush_deadline
            .map_or(config.timeout, |d| config.timeout.min(d - now));
        let Some(mut item) = state.queue.pop_front() else {
            continue;
        };
        state.in_flight = Some(item.body.len());
        drop(state);

        let outcome = transport.send(&item.body, timeout);
        item.attempts += 1;

        state = shared.lock();
        state.in_flight = None;
        settle(
            &mut state,
            item,
            outcome,
            config,
            &mut rng,
            transport.endpoint(),
        );
        shared.changed.notify_all();
    }
}

/// Counts an attempt's outcome and decides what becomes of its request.
fn settle(
    state: &mut State,
    item: Item,
    outcome: Outcome,
    config: &PushConfig,
    rng: &mut fastrand::Rng,
    endpoint: &str,
) {
    let stats = &mut state.stats;
    match outcome {
        Outcome::Sent => {
            stats.ok += 1;
            stats.ok_bytes += item.body.len() as u64;
            if state.failures > 0 {
                log::info!(
                    "push to {endpoint} works again after {} failed attempts",
                    state.failures
                );
            }
            log::debug!("pushed {} ({} bytes)", item.summary, item.body.len());
            state.failures = 0;
            state.retry_at = None;
            state.retry_at_from_server = false;
            state.overflowing = false;
        }
        Outcome::Retry {
            cause,
            after,
            error,
        } => {
            let counter = match cause {
                Cause::Connect => &mut stats.attempt_errors.connect,
                Cause::Timeout => &mut stats.attempt_errors.timeout,
                Cause::Server => &mut stats.attempt_errors.server,
                Cause::Throttled => &mut stats.attempt_errors.throttled,
            };
            *counter += 1;
            record_error(stats, &error);
            state.failures = state.failures.saturating_add(1);
            let delay = match after {
                Some(after) => after.min(MAX_RETRY_AFTER),
                None => config.backoff.delay(state.failures, rng),
            };
            state.retry_at = Some(Instant::now() + delay);
            state.retry_at_from_server = after.is_some();
            if state.failures == 1 {
                log::warn!(
                    "push to {endpoint} failed: {error}; retrying with backoff (queue bounded \
                     to {} requests, {} bytes)",
                    config.max_queued,
                    config.max_queued_bytes
                );
            } else {
                log::debug!("push to {endpoint} failed again: {error}; next try in {delay:?}");
            }
            if item.attempts >= config.max_attempts {
                stats.failed_exhausted += 1;
                log::warn!(
                    "push to {endpoint}: gave up on {} after {} attempts: {error}",
                    item.summary,
                    item.attempts
                );
            } else {
                stats.retried += 1;
                let evicted = state.queue.push_front(item);
                note_evicted(state, evicted, endpoint);
            }
        }
        Outcome::Reject { status, error } => {
            stats.failed_rejected += 1;
            record_error(stats, &error);
            // The backend answered: it is up, so no backoff.
            state.failures = 0;
            state.retry_at = None;
            state.retry_at_from_server = false;
            if state.logged_statuses.insert(status) {
                log::warn!(
                    "push to {endpoint} refused {}: {error}; not retried (each status is \
                     logged once, all are counted in failed_rejected)",
                    item.summary
                );
            }
        }
    }
}

fn record_error(stats: &mut PushStats, error: &str) {
    stats.last_error = Some(cap(error));
    stats.last_error_unix_seconds = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs());
}

// ---------------------------------------------------------------------------------------------
// HTTP

struct HttpTransport {
    agent: ureq::Agent,
    target: PushTarget,
}

impl HttpTransport {
    fn new(target: PushTarget, config: &PushConfig) -> HttpTransport {
        let agent = ureq::Agent::config_builder()
            // Statuses are outcomes here, not errors.
            .http_status_as_error(false)
            // A push API does not redirect; following one could send credentials elsewhere.
            .max_redirects(0)
            .timeout_global(Some(config.timeout))
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
        let mut request = self
            .agent
            .post(&self.target.endpoint)
            .header("Content-Type", "application/proto")
            .header("Connect-Protocol-Version", "1");
        if let Some(auth) = &self.target.authorization {
            request = request.header("Authorization", auth);
        }
        if let Some(tenant) = &self.target.tenant {
            request = request.header("X-Scope-OrgID", tenant);
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
        classify(status, retry_after, describe_response(status, &text))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn item(bytes: usize, tag: u8) -> Item {
        Item {
            body: vec![tag; bytes],
            summary: format!("#{tag}"),
            attempts: 0,
        }
    }

    fn tags(q: &Queue) -> Vec<u8> {
        q.items
            .iter()
            .map(|i| i.body.first().copied().unwrap_or(0))
            .collect()
    }

    #[test]
    fn queue_drops_the_oldest_by_count() {
        let mut q = Queue::new(3, 1 << 20);
        for tag in 1..=3 {
            assert_eq!(q.push_back(item(10, tag)), Evicted::default());
        }
        assert_eq!(
            q.push_back(item(10, 4)),
            Evicted {
                items: 1,
                bytes: 10
            }
        );
        assert_eq!(tags(&q), [2, 3, 4]);
        assert_eq!(q.bytes, 30);
    }

    #[test]
    fn queue_drops_the_oldest_by_bytes() {
        let mut q = Queue::new(100, 100);
        q.push_back(item(40, 1));
        q.push_back(item(40, 2));
        assert_eq!(
            q.push_back(item(50, 3)),
            Evicted {
                items: 1,
                bytes: 40
            }
        );
        assert_eq!(tags(&q), [2, 3]);
        assert_eq!(
            q.push_back(item(100, 4)),
            Evicted {
                items: 2,
                bytes: 90
            }
        );
        assert_eq!((tags(&q), q.bytes), (vec![4], 100));
    }

    #[test]
    fn a_requeued_request_is_the_oldest() {
        let mut q = Queue::new(2, 1 << 20);
        q.push_back(item(1, 1));
        let out = q.pop_front().unwrap();
        q.push_back(item(1, 2));
        q.push_back(item(1, 3));
        // Full while it was out: it goes first.
        assert_eq!(q.push_front(out), Evicted { items: 1, bytes: 1 });
        assert_eq!(tags(&q), [2, 3]);
        let out = q.pop_front().unwrap();
        assert_eq!(q.push_front(out), Evicted::default());
        assert_eq!(tags(&q), [2, 3]);
    }

    #[test]
    fn backoff_grows_jitters_and_caps() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(2),
        };
        let mut rng = fastrand::Rng::with_seed(1);
        for (failures, full_ms) in [
            (1, 100),
            (2, 200),
            (3, 400),
            (5, 1600),
            (6, 2000),
            (60, 2000),
        ] {
            let full = Duration::from_millis(full_ms);
            let mut seen = BTreeSet::new();
            for _ in 0..200 {
                let d = b.delay(failures, &mut rng);
                assert!(d >= full / 2 && d <= full, "{failures}: {d:?}");
                seen.insert(d);
            }
            assert!(seen.len() > 100, "jittered");
        }
        assert!(b.delay(u32::MAX, &mut rng) <= b.max);
        let huge = Backoff {
            initial: Duration::MAX,
            max: Duration::MAX,
        };
        let _ = huge.delay(40, &mut rng);
    }

    #[test]
    fn statuses() {
        let e = || String::from("x");
        assert_eq!(classify(200, None, e()), Outcome::Sent);
        assert_eq!(classify(204, None, e()), Outcome::Sent);
        for (status, cause) in [
            (500, Cause::Server),
            (502, Cause::Server),
            (503, Cause::Server),
            (429, Cause::Throttled),
            (408, Cause::Timeout),
        ] {
            assert!(
                matches!(classify(status, None, e()), Outcome::Retry { cause: c, .. } if c == cause),
                "{status}"
            );
        }
        for status in [100, 301, 400, 401, 403, 404, 413, 999] {
            assert!(
                matches!(classify(status, None, e()), Outcome::Reject { .. }),
                "{status}"
            );
        }
    }

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
        let long = describe_response(500, &[b'x'; 4096]);
        assert!(long.len() <= MAX_ERROR_TEXT + 4);
        let _ = describe_response(500, &[0xff; 100]);
    }

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

    /// Bodies a [`Scripted`] transport was given, and when.
    type Sent = Arc<Mutex<Vec<(Vec<u8>, Instant)>>>;

    /// A transport that plays a script of outcomes and records what it was given.
    #[derive(Clone, Default)]
    struct Scripted {
        script: Arc<Mutex<VecDeque<Outcome>>>,
        sent: Sent,
        /// Blocks every send this long.
        delay: Duration,
    }

    impl Scripted {
        fn new(script: impl IntoIterator<Item = Outcome>) -> Scripted {
            Scripted {
                script: Arc::new(Mutex::new(script.into_iter().collect())),
                ..Scripted::default()
            }
        }

        fn sent(&self) -> Vec<Vec<u8>> {
            self.sent
                .lock()
                .unwrap()
                .iter()
                .map(|(b, _)| b.clone())
                .collect()
        }
    }

    impl Transport for Scripted {
        fn send(&mut self, body: &[u8], _timeout: Duration) -> Outcome {
            self.sent
                .lock()
                .unwrap()
                .push((body.to_vec(), Instant::now()));
            std::thread::sleep(self.delay);
            self.script
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Outcome::Sent)
        }

        fn endpoint(&self) -> &str {
            "scripted"
        }
    }

    fn unavailable() -> Outcome {
        classify(503, None, "HTTP 503".into())
    }

    fn refused() -> Outcome {
        Outcome::Retry {
            cause: Cause::Connect,
            after: None,
            error: "connection refused".into(),
        }
    }

    fn fast() -> PushConfig {
        PushConfig {
            timeout: Duration::from_secs(1),
            max_queued: 4,
            max_queued_bytes: 1000,
            max_attempts: 5,
            backoff: Backoff {
                initial: Duration::from_millis(5),
                max: Duration::from_millis(20),
            },
        }
    }

    fn settled(pusher: &Pusher) -> PushStats {
        let left = pusher.flush(Instant::now() + Duration::from_secs(10));
        assert_eq!(left, Leftover::default());
        pusher.stats()
    }

    #[test]
    fn retries_until_it_is_sent() {
        let t = Scripted::new([unavailable(), refused(), unavailable()]);
        let pusher = Pusher::with_transport(t.clone(), fast()).unwrap();
        pusher.push(b"one".to_vec(), "one");
        let stats = settled(&pusher);
        assert_eq!(t.sent(), vec![b"one".to_vec(); 4]);
        assert_eq!((stats.ok, stats.ok_bytes, stats.retried), (1, 3, 3));
        assert_eq!(
            (stats.attempt_errors.server, stats.attempt_errors.connect),
            (2, 1)
        );
        assert_eq!(stats.failed(), [("rejected", 0), ("retries_exhausted", 0)]);
        assert_eq!(stats.last_error.as_deref(), Some("HTTP 503"));
        assert!(stats.last_error_unix_seconds.is_some());
        assert_eq!(
            (stats.queued, stats.queued_bytes, stats.in_flight),
            (0, 0, false)
        );
    }

    #[test]
    fn gives_up_after_max_attempts_and_goes_on() {
        let t = Scripted::new(std::iter::repeat_n(unavailable(), 5));
        let pusher = Pusher::with_transport(t.clone(), fast()).unwrap();
        pusher.push(b"doomed".to_vec(), "doomed");
        pusher.push(b"next".to_vec(), "next");
        let stats = settled(&pusher);
        assert_eq!((stats.failed_exhausted, stats.retried, stats.ok), (1, 4, 1));
        assert_eq!(t.sent().last().unwrap(), b"next");
    }

    #[test]
    fn rejections_are_not_retried() {
        let t = Scripted::new([
            classify(400, None, "HTTP 400: bad".into()),
            classify(400, None, "HTTP 400: bad".into()),
            classify(401, None, "HTTP 401".into()),
        ]);
        let pusher = Pusher::with_transport(t.clone(), fast()).unwrap();
        for i in 0..4u8 {
            pusher.push(vec![i], format!("#{i}"));
        }
        let stats = settled(&pusher);
        assert_eq!((stats.failed_rejected, stats.ok, stats.retried), (3, 1, 0));
        assert_eq!(t.sent().len(), 4);
        assert_eq!(stats.last_error.as_deref(), Some("HTTP 401"));
    }

    #[test]
    fn retry_after_is_honoured() {
        let wait = Duration::from_millis(300);
        let t = Scripted::new([classify(429, Some(wait), "HTTP 429".into())]);
        let pusher = Pusher::with_transport(t.clone(), fast()).unwrap();
        pusher.push(b"x".to_vec(), "x");
        let stats = settled(&pusher);
        assert_eq!((stats.attempt_errors.throttled, stats.ok), (1, 1));
        let sent = t.sent.lock().unwrap();
        assert!(sent[1].1 - sent[0].1 >= wait, "{:?}", sent[1].1 - sent[0].1);
    }

    #[test]
    fn a_down_backend_keeps_memory_bounded() {
        let t = Scripted::new(std::iter::repeat_n(refused(), 1000));
        let mut config = fast();
        config.max_attempts = 1000;
        let pusher = Pusher::with_transport(t.clone(), config).unwrap();
        for i in 0..20u8 {
            pusher.push(vec![i; 100], format!("#{i}"));
        }
        assert_eq!(pusher.push(vec![0; 1001], "huge"), Queued::TooLarge);
        let stats = pusher.stats();
        assert!(stats.queued <= 4 && stats.queued_bytes <= 400, "{stats:?}");
        // 20 pushed, at most 4 waiting and 1 out: the rest were dropped, oldest first.
        assert!(stats.dropped_queue_full >= 15, "{stats:?}");
        assert_eq!(stats.dropped_too_large, 1);
        assert_eq!(stats.dropped_bytes, stats.dropped_queue_full * 100 + 1001);
        // A flush against a dead backend returns at its deadline with what is left.
        let start = Instant::now();
        let left = pusher.flush(start + Duration::from_millis(200));
        assert!(start.elapsed() < Duration::from_secs(2));
        assert!((1..=5).contains(&left.requests), "{left:?}");
        assert_eq!(left.bytes, left.requests * 100);
        assert_eq!(pusher.stats().ok, 0);
    }

    #[test]
    fn flush_sends_what_is_queued() {
        let mut t = Scripted::new([]);
        t.delay = Duration::from_millis(20);
        let pusher = Pusher::with_transport(t.clone(), fast()).unwrap();
        for i in 0..4u8 {
            pusher.push(vec![i], "x");
        }
        assert_eq!(
            pusher.flush(Instant::now() + Duration::from_secs(5)),
            Leftover::default()
        );
        assert_eq!(t.sent(), (0..4u8).map(|i| vec![i]).collect::<Vec<_>>());
        // A flush that cannot wait reports the rest.
        for i in 0..4u8 {
            pusher.push(vec![i], "x");
        }
        let left = pusher.flush(Instant::now());
        assert!(left.requests >= 3, "{left:?}");
    }

    #[test]
    fn flush_cuts_our_own_backoff_short() {
        let t = Scripted::new([refused()]);
        let mut config = fast();
        config.backoff = Backoff {
            initial: Duration::from_secs(600),
            max: Duration::from_secs(600),
        };
        let pusher = Pusher::with_transport(t.clone(), config).unwrap();
        pusher.push(b"last".to_vec(), "last");
        while pusher.stats().retried == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        // Ten minutes of backoff, but SIGTERM is the last chance.
        assert_eq!(
            pusher.flush(Instant::now() + Duration::from_secs(5)),
            Leftover::default()
        );
        assert_eq!(pusher.stats().ok, 1);
    }

    #[test]
    fn dropping_the_pusher_stops_its_thread() {
        let t = Scripted::new([]);
        let pusher = Pusher::with_transport(t.clone(), fast()).unwrap();
        let shared = Arc::clone(&pusher.shared);
        drop(pusher);
        // The thread lets go of the shared state when it ends.
        let start = Instant::now();
        while Arc::strong_count(&shared) > 1 {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "thread still running"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
