//! `limit_concurrency` (issue 19): at most N HTTP requests in progress per
//! worker, from their hand-over to the app until their response is written
//! (or dropped). One more is answered `503` with `Retry-After` (on HTTP/2,
//! for that stream only), in the access log, and never reaches the app.
//! The health path and WebSockets are not counted: a WebSocket handshake is
//! never refused by it, and an open WebSocket never holds a slot.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The body of the `503` for a request over the limit.
pub(crate) const REASON: &str = "the server is at its concurrency limit: retry";

/// The count of requests in progress against `limit_concurrency`.
pub(crate) struct Concurrency {
    /// 0: no limit.
    limit: usize,
    in_flight: Arc<AtomicUsize>,
}

/// One request's place under the limit, given back when dropped.
pub(crate) struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Concurrency {
    /// `limit`: the `limit_concurrency` option (0: no limit).
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            limit,
            in_flight: Arc::default(),
        }
    }

    /// A slot, or `None` when `limit` requests are in progress. `Ok(None)`
    /// without a limit (nothing is counted then).
    pub(crate) fn acquire(&self) -> Result<Option<Slot>, ()> {
        if self.limit == 0 {
            return Ok(None);
        }
        let prev = self.in_flight.fetch_add(1, Ordering::AcqRel);
        if prev >= self.limit {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(());
        }
        Ok(Some(Slot(Arc::clone(&self.in_flight))))
    }
}
