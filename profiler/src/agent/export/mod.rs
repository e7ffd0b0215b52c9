//! Exporters: where the agent's windows go. One [`Exporter`] per backend encodes a cut window
//! as requests; each runs behind its own bounded, retrying [`queue::ExportQueue`] over the one
//! HTTP [`queue::Transport`], and `/metrics` counts each under its [`Exporter::name`]
//! (`backend="pyroscope"`, `backend="otlp"`). A new backend is one file here: an `Exporter`
//! and the [`http::HttpTarget`] it sends to.
//!
//! - [`pyroscope`]: pprof inside Pyroscope's `PushRequest`, one per service.
//! - [`otlp`]: one OTLP `ExportProfilesServiceRequest` per window, every process in it.

pub(crate) mod http;
pub(crate) mod otlp;
pub(crate) mod pyroscope;
pub(crate) mod queue;

use std::time::Instant;

use crate::agent::window::Cut;
use queue::{ExportQueue, ExportStats, Leftover, QueueConfig};

/// One encoded request and what it holds, for logs.
pub(crate) struct Request {
    pub body: Vec<u8>,
    pub summary: String,
}

/// A backend's encoding of the agent's windows.
pub(crate) trait Exporter: Send {
    /// The `backend` label of its counters in `/metrics`.
    fn name(&self) -> &'static str;

    /// The requests carrying one window: every service's profile cut at its end.
    fn encode(&mut self, cuts: &[Cut]) -> Vec<Request>;

    /// Entries of the last window's dictionary, for formats that have one (OTLP).
    fn dictionary(&self) -> Option<DictionaryStats> {
        None
    }
}

/// The size of an exporter's per-window dictionary, and what its bound folded away.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DictionaryStats {
    /// Entries of all tables of the last window's dictionary.
    pub entries: u64,
    /// Samples whose stack was replaced because the dictionary was full, over all windows.
    pub over_limit_samples: u64,
}

/// An exporter and its queue.
pub(crate) struct Export {
    exporter: Box<dyn Exporter>,
    queue: ExportQueue,
}

impl Export {
    /// Starts the queue's thread, sending through HTTP to `target`.
    pub(crate) fn start(
        exporter: Box<dyn Exporter>,
        target: http::HttpTarget,
        config: QueueConfig,
    ) -> std::io::Result<Export> {
        let transport = http::HttpTransport::new(target, config.timeout);
        Ok(Export {
            exporter,
            queue: ExportQueue::start(transport, config)?,
        })
    }

    pub(crate) fn name(&self) -> &'static str {
        self.exporter.name()
    }

    pub(crate) fn endpoint(&self) -> &str {
        self.queue.endpoint()
    }

    /// Encodes a window and queues its requests; never blocks on the network.
    pub(crate) fn export(&mut self, cuts: &[Cut]) {
        for request in self.exporter.encode(cuts) {
            self.queue.push(request.body, request.summary);
        }
    }

    pub(crate) fn stats(&self) -> ExporterStats {
        ExporterStats {
            name: self.exporter.name(),
            queue: self.queue.stats(),
            dictionary: self.exporter.dictionary(),
        }
    }

    /// Flushes every exporter's queue at once (each sends on its own thread), until all are
    /// empty or `deadline`; what each left, in order. See [`ExportQueue::flush`].
    pub(crate) fn flush_all(exports: &[Export], deadline: Instant) -> Vec<Leftover> {
        std::thread::scope(|scope| {
            let flushes: Vec<_> = exports
                .iter()
                .map(|e| {
                    let queue = &e.queue;
                    scope.spawn(move || queue.flush(deadline))
                })
                .collect();
            flushes
                .into_iter()
                .map(|f| f.join().unwrap_or_default())
                .collect()
        })
    }
}

/// One exporter's counters, for `/metrics` and the last line.
#[derive(Clone, Debug)]
pub(crate) struct ExporterStats {
    pub name: &'static str,
    pub queue: ExportStats,
    pub dictionary: Option<DictionaryStats>,
}
