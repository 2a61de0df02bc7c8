//! `health_path` (issue 19): a path the server answers itself, in Rust,
//! before any scope is built: no GIL, no app call, no access-log line, not
//! counted by `max_requests`, `limit_concurrency` or the loop watchdog's
//! refusals. `GET` or `HEAD` of exactly that path (no query string needed;
//! one is ignored) gets a small JSON body:
//!
//! * `200 {"status": "ok"}` while the worker serves;
//! * `503 {"status": "starting"}` until lifespan startup completes (the
//!   worker accepts during startup when a health path is set; other
//!   requests wait for startup to complete);
//! * `503 {"status": "draining"}` from a stop signal on (at once, through
//!   `drain_delay`, and while in-flight requests drain);
//! * `503 {"status": "loop stalled"}` while the loop watchdog holds the
//!   event loop blocked (see [`watchdog`](crate::worker::watchdog)).
//!
//! Other methods on the path reach the app as usual.

use std::sync::atomic::{AtomicU8, Ordering};

use http::StatusCode;
use tokio::sync::watch;

const STARTING: u8 = 0;
const SERVING: u8 = 1;
const DRAINING: u8 = 2;

/// The worker's phase as the health path reports it.
pub(crate) struct Health {
    /// The path (`health_path`), if set.
    path: Option<Box<str>>,
    phase: AtomicU8,
    /// `true` once startup completed (for requests held during startup).
    started: watch::Sender<bool>,
}

impl Health {
    /// `path`: the `health_path` option (`None`: off).
    pub(crate) fn new(path: Option<String>) -> Self {
        Self {
            path: path.map(String::into_boxed_str),
            phase: AtomicU8::new(STARTING),
            started: watch::channel(false).0,
        }
    }

    /// Whether a health path is set.
    pub(crate) fn enabled(&self) -> bool {
        self.path.is_some()
    }

    /// Lifespan startup completed: the worker serves.
    pub(crate) fn serving(&self) {
        let _ = self
            .phase
            .compare_exchange(STARTING, SERVING, Ordering::SeqCst, Ordering::SeqCst);
        self.started.send_replace(true);
    }

    /// The worker stops (from the stop signal on, for good).
    pub(crate) fn draining(&self) {
        self.phase.store(DRAINING, Ordering::SeqCst);
    }

    /// Waits until lifespan startup has completed (at once if it has).
    pub(crate) async fn until_started(&self) {
        let mut rx = self.started.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Whether startup is still running.
    pub(crate) fn is_starting(&self) -> bool {
        self.phase.load(Ordering::Relaxed) == STARTING
    }

    /// Whether this request is for the health path: `GET` or `HEAD` of it.
    pub(crate) fn matches(&self, method: &http::Method, path: &str) -> bool {
        self.path.as_deref() == Some(path)
            && (method == http::Method::GET || method == http::Method::HEAD)
    }

    /// The health answer's status and JSON body (`http::service` makes
    /// the response; hyper leaves the body out for `HEAD`).
    pub(crate) fn answer(&self, stalled: bool) -> (StatusCode, &'static [u8]) {
        match self.phase.load(Ordering::Relaxed) {
            STARTING => (
                StatusCode::SERVICE_UNAVAILABLE,
                br#"{"status": "starting"}"#,
            ),
            DRAINING => (
                StatusCode::SERVICE_UNAVAILABLE,
                br#"{"status": "draining"}"#,
            ),
            _ if stalled => (
                StatusCode::SERVICE_UNAVAILABLE,
                br#"{"status": "loop stalled"}"#,
            ),
            _ => (StatusCode::OK, br#"{"status": "ok"}"#),
        }
    }
}
