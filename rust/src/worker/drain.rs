//! What a drain does besides finishing the requests in progress, so that
//! it lasts as long as the work in progress needs and no longer
//! (`drain_grace`):
//!
//! * a request head not complete when the drain began gets `drain_grace`
//!   to complete (not `header_read_timeout`), then its connection closes;
//!   a new connection that has sent nothing gets the same;
//! * a response its client takes no bytes of for `drain_grace` during the
//!   drain is abandoned (as `send_timeout` would, sooner);
//! * an open WebSocket gets a close frame when `drain_grace` has passed:
//!   1012 ("service restart") when the worker recycles itself
//!   (`max_requests`: another worker, or its replacement, will serve the
//!   reconnection), 1001 ("going away") when a signal stopped it (the
//!   master may be shutting down).
//!
//! The timers themselves run in each connection (`http::activity`,
//! `proto::ws::driver`); this module holds the policy and the facts they
//! share.

use std::sync::atomic::{AtomicBool, Ordering};

use tungstenite::protocol::frame::coding::CloseCode;

/// The facts of a worker's drain that its connections read.
#[derive(Default)]
pub(crate) struct DrainFacts {
    /// The drain is a `max_requests` recycle (not a signal).
    recycle: AtomicBool,
}

impl DrainFacts {
    /// The coming drain is a `max_requests` recycle.
    pub(crate) fn set_recycle(&self) {
        self.recycle.store(true, Ordering::Relaxed);
    }

    /// The close code and reason an open WebSocket gets once `drain_grace`
    /// has passed (RFC 6455 §7.4.1, and IANA's registry for 1012).
    pub(crate) fn websocket_close(&self) -> (CloseCode, &'static str) {
        if self.recycle.load(Ordering::Relaxed) {
            (CloseCode::Restart, "service restart")
        } else {
            (CloseCode::Away, "server shutting down")
        }
    }
}
