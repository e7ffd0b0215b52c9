//! One bounded queue of encoded requests per exporter, drained by one thread that retries.
//!
//! The agent cuts a window, the exporter encodes it, and [`ExportQueue::push`] takes the bytes
//! without waiting: the sampling loop must never stall on a slow or dead backend. One thread
//! per exporter (`pyebpf-export`) sends them in order through a [`Transport`] (HTTP in
//! production, see `http.rs`): a blocking client on a thread of its own keeps DNS, TLS and
//! retry sleeps off the agent's current-thread tokio runtime, and needs no second runtime. A
//! request every few seconds does not need async I/O.
//!
//! Failures. Connection errors and timeouts are retried, and so are the statuses the
//! exporter's [`RetryPolicy`] names: OTLP's 429, 502, 503 and 504, or for Pyroscope (as
//! before) 408, 429 and every 5xx. The request goes back to the head of the queue, and the
//! next attempt waits an exponential backoff with jitter ([`Backoff`]), or what the server
//! asked for in `Retry-After` (capped at [`MAX_RETRY_AFTER`]). The backoff is the backend's,
//! not the request's: while it is down nothing is sent, and the first success resets it. A
//! request that failed [`QueueConfig::max_attempts`] times is given up (`failed_exhausted`).
//! Any other status (4xx: bad auth, wrong tenant, a request the backend refuses) is not
//! retried, since the same bytes would be refused again (`failed_rejected`); each status is
//! logged once, not once per window.
//!
//! Bounds. The queue holds at most [`QueueConfig::max_queued`] requests and
//! [`QueueConfig::max_queued_bytes`] bytes, plus the one being sent. When a new request does
//! not fit, the **oldest** ones are dropped (`dropped_queue_full`): during an outage the recent
//! windows are the ones worth having when the backend comes back (and the oldest are the first
//! a backend refuses as too old), and the queue becomes a sliding window over the last minutes.
//! A request larger than the byte cap is dropped at once (`dropped_too_large`). Nothing a
//! server says can make this module panic or grow.
//!
//! Shutdown. [`ExportQueue::flush`] (SIGTERM) keeps sending until the queue is empty or the
//! deadline passes, and returns what was left; a backoff of our own is cut short for it (it is
//! the last chance), a server's `Retry-After` is not.

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

/// The longest `Retry-After` honoured; a longer one (or a date years ahead) is cut to this.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);
/// The key of partial successes in `State::logged_statuses` (no HTTP status is 1).
const PARTIAL: u16 = 1;
/// Bytes of an error text kept for logs and `/metrics`.
pub(crate) const MAX_ERROR_TEXT: usize = 512;

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

/// Queue bounds, retries and timeouts of a [`ExportQueue`].
#[derive(Clone, Debug)]
pub struct QueueConfig {
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

impl Default for QueueConfig {
    /// A window every 15 s makes a few requests of tens of KiB: 32 MiB holds many minutes of
    /// an outage for a busy host, and 5 attempts with the default backoff span about a minute.
    fn default() -> Self {
        QueueConfig {
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
    /// Accepted, but the backend says it kept only part of it (OTLP's `partial_success`):
    /// counted as sent, and in `partial`.
    Partial {
        /// Items the backend says it rejected (OTLP: profiles); 0 when it only warns.
        rejected: u64,
        error: String,
    },
    Retry {
        cause: Cause,
        /// What `Retry-After` asked for.
        after: Option<Duration>,
        error: String,
    },
    /// Not worth another attempt: a 4xx, or a request the client cannot make. `status` 0 when
    /// no response came.
    Reject {
        status: u16,
        error: String,
    },
}

/// Which statuses are worth another attempt; every other non-2xx is a rejection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RetryPolicy {
    /// 408, 429 and every 5xx: what the Pyroscope push has always retried.
    Broad,
    /// 429, 502, 503 and 504, as the OTLP/HTTP specification lists them.
    Otlp,
}

impl RetryPolicy {
    fn retries(self, status: u16) -> bool {
        match self {
            RetryPolicy::Broad => matches!(status, 408 | 429 | 500..=599),
            RetryPolicy::Otlp => matches!(status, 429 | 502 | 503 | 504),
        }
    }
}

/// The outcome of a response with `status` under `policy`.
pub(crate) fn classify(
    policy: RetryPolicy,
    status: u16,
    retry_after: Option<Duration>,
    error: String,
) -> Outcome {
    if (200..=299).contains(&status) {
        return Outcome::Sent;
    }
    if !policy.retries(status) {
        return Outcome::Reject { status, error };
    }
    let cause = match status {
        408 => Cause::Timeout,
        429 => Cause::Throttled,
        _ => Cause::Server,
    };
    Outcome::Retry {
        cause,
        after: retry_after,
        error,
    }
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
pub struct ExportStats {
    /// Requests the backend accepted, and their bytes.
    pub ok: u64,
    pub ok_bytes: u64,
    /// Requests the backend accepted only in part (OTLP's `partial_success`; also in `ok`),
    /// and the items it said it rejected.
    pub partial: u64,
    pub partial_rejected: u64,
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

impl ExportStats {
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

/// What a [`ExportQueue::flush`] could not send before its deadline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Leftover {
    pub requests: usize,
    pub bytes: usize,
}

/// What [`ExportQueue::push`] did with a request.
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
    stats: ExportStats,
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
    config: QueueConfig,
}

impl Shared {
    /// The state; a panic elsewhere while holding it leaves counters that are still counters.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A bounded, retrying push queue with its sending thread. Dropping it stops the thread after
/// its current attempt, without waiting for it.
pub struct ExportQueue {
    shared: Arc<Shared>,
    endpoint: String,
}

impl ExportQueue {
    /// Starts the sending thread, which sends through `transport`.
    pub(crate) fn start(
        transport: impl Transport,
        mut config: QueueConfig,
    ) -> std::io::Result<ExportQueue> {
        config.max_attempts = config.max_attempts.max(1);
        let endpoint = transport.endpoint().to_string();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: Queue::new(config.max_queued, config.max_queued_bytes),
                in_flight: None,
                stats: ExportStats::default(),
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
            .name("pyebpf-export".into())
            .spawn(move || run(&worker, transport))?;
        Ok(ExportQueue { shared, endpoint })
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
                "export to {}: dropped {} ({len} bytes): larger than the whole queue ({} bytes)",
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
    pub fn stats(&self) -> ExportStats {
        let state = self.shared.lock();
        let mut stats = state.stats.clone();
        stats.queued = state.queue.items.len();
        stats.queued_bytes = state.queue.bytes;
        stats.in_flight = state.in_flight.is_some();
        stats
    }

    /// Where requests go.
    pub(crate) fn endpoint(&self) -> &str {
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

impl Drop for ExportQueue {
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
            "export to {endpoint}: queue full, dropping the oldest requests (counted in \
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
    config: &QueueConfig,
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
                    "export to {endpoint} works again after {} failed attempts",
                    state.failures
                );
            }
            log::debug!("pushed {} ({} bytes)", item.summary, item.body.len());
            state.failures = 0;
            state.retry_at = None;
            state.retry_at_from_server = false;
            state.overflowing = false;
        }
        Outcome::Partial { rejected, error } => {
            stats.partial += 1;
            stats.partial_rejected += rejected;
            record_error(stats, &error);
            if state.logged_statuses.insert(PARTIAL) {
                log::warn!(
                    "export to {endpoint}: the backend kept only part of {}: {error} (logged \
                     once; counted in export_partial_success_total)",
                    item.summary
                );
            }
            settle(state, item, Outcome::Sent, config, rng, endpoint);
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
                    "export to {endpoint} failed: {error}; retrying with backoff (queue bounded \
                     to {} requests, {} bytes)",
                    config.max_queued,
                    config.max_queued_bytes
                );
            } else {
                log::debug!("export to {endpoint} failed again: {error}; next try in {delay:?}");
            }
            if item.attempts >= config.max_attempts {
                stats.failed_exhausted += 1;
                log::warn!(
                    "export to {endpoint}: gave up on {} after {} attempts: {error}",
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
                    "export to {endpoint} refused {}: {error}; not retried (each status is \
                     logged once, all are counted in failed_rejected)",
                    item.summary
                );
            }
        }
    }
}

fn record_error(stats: &mut ExportStats, error: &str) {
    stats.last_error = Some(cap(error));
    stats.last_error_unix_seconds = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs());
}

pub(crate) fn cap(s: &str) -> String {
    if s.len() <= MAX_ERROR_TEXT {
        return s.to_string();
    }
    let mut end = MAX_ERROR_TEXT;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
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
        assert_eq!(classify(RetryPolicy::Broad, 200, None, e()), Outcome::Sent);
        assert_eq!(classify(RetryPolicy::Broad, 204, None, e()), Outcome::Sent);
        for (status, cause) in [
            (500, Cause::Server),
            (502, Cause::Server),
            (503, Cause::Server),
            (429, Cause::Throttled),
            (408, Cause::Timeout),
        ] {
            assert!(
                matches!(classify(RetryPolicy::Broad, status, None, e()), Outcome::Retry { cause: c, .. } if c == cause),
                "{status}"
            );
        }
        for status in [100, 301, 400, 401, 403, 404, 413, 999] {
            assert!(
                matches!(
                    classify(RetryPolicy::Broad, status, None, e()),
                    Outcome::Reject { .. }
                ),
                "{status}"
            );
        }
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
        classify(RetryPolicy::Broad, 503, None, "HTTP 503".into())
    }

    fn refused() -> Outcome {
        Outcome::Retry {
            cause: Cause::Connect,
            after: None,
            error: "connection refused".into(),
        }
    }

    fn fast() -> QueueConfig {
        QueueConfig {
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

    fn settled(pusher: &ExportQueue) -> ExportStats {
        let left = pusher.flush(Instant::now() + Duration::from_secs(10));
        assert_eq!(left, Leftover::default());
        pusher.stats()
    }

    #[test]
    fn otlp_retries_only_what_its_specification_lists() {
        let e = || String::from("x");
        for status in [429, 502, 503, 504] {
            assert!(
                matches!(
                    classify(RetryPolicy::Otlp, status, None, e()),
                    Outcome::Retry { .. }
                ),
                "{status}"
            );
        }
        for status in [400, 401, 404, 408, 413, 500, 501, 505] {
            assert!(
                matches!(
                    classify(RetryPolicy::Otlp, status, None, e()),
                    Outcome::Reject { .. }
                ),
                "{status}"
            );
        }
        assert_eq!(classify(RetryPolicy::Otlp, 200, None, e()), Outcome::Sent);
    }

    #[test]
    fn a_partial_success_is_sent_and_counted() {
        let t = Scripted::new([Outcome::Partial {
            rejected: 2,
            error: "2 profiles had no samples".into(),
        }]);
        let queue = ExportQueue::start(t.clone(), fast()).unwrap();
        queue.push(b"x".to_vec(), "x");
        let stats = settled(&queue);
        assert_eq!((stats.ok, stats.partial, stats.partial_rejected), (1, 1, 2));
        assert_eq!(stats.retried, 0);
        assert_eq!(
            stats.last_error.as_deref(),
            Some("2 profiles had no samples")
        );
    }

    #[test]
    fn retries_until_it_is_sent() {
        let t = Scripted::new([unavailable(), refused(), unavailable()]);
        let pusher = ExportQueue::start(t.clone(), fast()).unwrap();
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
        let pusher = ExportQueue::start(t.clone(), fast()).unwrap();
        pusher.push(b"doomed".to_vec(), "doomed");
        pusher.push(b"next".to_vec(), "next");
        let stats = settled(&pusher);
        assert_eq!((stats.failed_exhausted, stats.retried, stats.ok), (1, 4, 1));
        assert_eq!(t.sent().last().unwrap(), b"next");
    }

    #[test]
    fn rejections_are_not_retried() {
        let t = Scripted::new([
            classify(RetryPolicy::Broad, 400, None, "HTTP 400: bad".into()),
            classify(RetryPolicy::Broad, 400, None, "HTTP 400: bad".into()),
            classify(RetryPolicy::Broad, 401, None, "HTTP 401".into()),
        ]);
        let pusher = ExportQueue::start(t.clone(), fast()).unwrap();
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
        let t = Scripted::new([classify(
            RetryPolicy::Broad,
            429,
            Some(wait),
            "HTTP 429".into(),
        )]);
        let pusher = ExportQueue::start(t.clone(), fast()).unwrap();
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
        let pusher = ExportQueue::start(t.clone(), config).unwrap();
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
        let pusher = ExportQueue::start(t.clone(), fast()).unwrap();
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
        let pusher = ExportQueue::start(t.clone(), config).unwrap();
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
        let pusher = ExportQueue::start(t.clone(), fast()).unwrap();
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
