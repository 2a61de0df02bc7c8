//! HTTP semantics shared by every HTTP version, bridged to ASGI's HTTP
//! protocol. The wire drivers (`proto::h1`, `proto::h2`) build a
//! [`ctx::ConnCtx`] per connection (per stream on HTTP/2) and call
//! [`service::handle`] per request, which knows no wire protocol.
//!
//! Data flow: a driver drives hyper → [`service`] checks the head and turns
//! it into an [`service::HttpRequest`] for the asyncio thread → there
//! `asgi::http::start` builds the scope (`asgi::scope`, from the head and
//! the connection's `asgi::conn::ConnInfo`) and gives the app `receive` and
//! `send` (`asgi::http::protocol`) → `asgi::http::message` validates what
//! it sends → `asgi::http::exchange` carries it back → [`body`] feeds it
//! to hyper, which writes the wire.

pub(crate) mod activity;
pub(crate) mod body;
pub(crate) mod compress;
pub(crate) mod ctx;
pub(crate) mod fields;
pub(crate) mod headscan;
pub(crate) mod interim;
pub(crate) mod io;
pub(crate) mod pump;
pub(crate) mod service;

use std::sync::Arc;

use pyo3::prelude::*;

use crate::bridge::queue::{Event, Job};
use crate::http::service::HttpRequest;

impl Job for HttpRequest {
    fn run(self: Box<Self>, py: Python<'_>) {
        let ctx = Arc::clone(self.conn.info.app());
        // Interim responses reach HTTP/1.1 clients and HTTP/2 streams (see
        // `interim`), not HTTP/1.0 clients.
        let interim = self.conn.sends_interim(self.parts.version);
        let HttpRequest {
            parts,
            exch,
            conn,
            received,
            rejected,
        } = *self;
        match rejected {
            Some(a) => crate::asgi::http::log_rejected(
                py,
                &ctx,
                &parts,
                &conn.info,
                interim,
                (a.status, a.bytes),
                a.took,
            ),
            None => crate::asgi::http::start(py, &ctx, parts, exch, &conn.info, interim, received),
        }
    }

    fn refusable(&self) -> bool {
        self.rejected.is_none()
    }

    fn refuse(mut self: Box<Self>) {
        use crate::worker::watchdog::REASON;
        let shared = Arc::clone(&self.conn.shared);
        shared.metrics.refused(crate::metrics::Limit::LoopStall);
        self.exch
            .reject(http::StatusCode::SERVICE_UNAVAILABLE, REASON, &shared);
        if shared.config.access_log && shared.watchdog.may_log_refusal() {
            // Logged when the loop runs again (or lost with the worker).
            self.rejected = Some(crate::http::service::Answered::now(
                503,
                REASON.len() as u64,
                self.received,
            ));
            shared.queue.push(Event::Run(self));
        }
    }
}
