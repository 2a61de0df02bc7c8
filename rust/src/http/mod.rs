//! HTTP semantics shared by every HTTP version, bridged to ASGI's HTTP
//! protocol. The wire drivers (`proto::h1`, `proto::h2`) build a
//! [`ctx::ConnCtx`] per connection (per stream on HTTP/2) and call
//! [`service::handle`] per request, which knows no wire protocol.
//!
//! Data flow: a driver drives hyper → [`service`] checks the head and turns
//! it into an [`service::HttpRequest`] for the asyncio thread →
//! [`scope`] builds the scope there, [`protocol`] gives the app `receive` and
//! `send` → [`message`] validates what it sends → [`exchange`] carries it
//! back → [`body`] feeds it to hyper, which writes the wire.

pub(crate) mod activity;
pub(crate) mod body;
pub(crate) mod compress;
pub(crate) mod ctx;
pub(crate) mod headscan;
pub(crate) mod interim;
pub(crate) mod io;
pub(crate) mod pump;
pub(crate) mod scope;
pub(crate) mod service;

use std::sync::Arc;

use pyo3::prelude::*;

use crate::asgi::context::AppContext;
use crate::asgi::http::protocol::HttpProtocol;
use crate::bridge::owner::Owner;
use crate::bridge::queue::{Event, Job};
use crate::bridge::start::call_app;
use crate::http::service::HttpRequest;

/// Starts the application for a request (on the asyncio thread).
///
/// Never raises: a failure before the app runs is logged and answered 500.
pub(crate) fn start(py: Python<'_>, ctx: &Arc<AppContext>, req: Box<HttpRequest>) {
    let head = req.parts.method == http::Method::HEAD;
    // Interim responses reach HTTP/1.1 clients and HTTP/2 streams (see
    // `interim`), not HTTP/1.0 clients.
    let interim = req.conn.sends_interim(req.parts.version);
    let built = scope::http_scope(py, ctx, &req);
    // `No` is the exchange's default: its lock is taken only for a `TE: trailers`.
    let trailers =
        crate::asgi::http::exchange::TrailersWanted::of(req.parts.version, &req.parts.headers);
    if trailers != crate::asgi::http::exchange::TrailersWanted::No {
        req.exch.lock().trailers = trailers;
    }
    let HttpRequest {
        parts,
        exch,
        received,
        ..
    } = *req;
    // The app sees only the scope: the head goes back to the Tokio side.
    ctx.shared.wakeups.retire(parts);
    let scope = match built {
        Ok(s) => s,
        Err(e) => {
            ctx.log_error(py, "could not build the HTTP scope", Some(&e));
            let proto = HttpProtocol::new(exch, Arc::clone(ctx), head, interim, received, None);
            proto.on_error(py, e);
            return;
        }
    };
    let keep_scope = ctx.access_log.is_some().then(|| scope.clone().unbind());
    if ctx.shared.config.server_timing {
        exch.lock().app_started = Some(std::time::Instant::now());
    }
    let proto = match Py::new(
        py,
        HttpProtocol::new(exch, Arc::clone(ctx), head, interim, received, keep_scope),
    ) {
        Ok(p) => p,
        Err(e) => {
            ctx.log_error(py, "could not create the HTTP protocol", Some(&e));
            return;
        }
    };
    let run = || -> PyResult<()> {
        let b = proto.bind(py);
        let receive = b.getattr(pyo3::intern!(py, "receive"))?;
        let send = b.getattr(pyo3::intern!(py, "send"))?;
        let coro = call_app(py, ctx.app.bind(py), [scope.into_any(), receive, send])?;
        crate::bridge::start::start(py, &ctx.loop_ctx, coro, Owner::new(proto.clone_ref(py)))
    };
    if let Err(e) = run() {
        proto.get().on_error(py, e);
    }
}

/// Writes the access-log line of a request the server answered before
/// the app saw it (on the asyncio thread).
pub(crate) fn log_rejected(
    py: Python<'_>,
    ctx: &Arc<AppContext>,
    req: &HttpRequest,
    status: u16,
    bytes: u64,
) {
    match scope::http_scope(py, ctx, req) {
        Ok(scope) => crate::asgi::http::access::write_access(
            py,
            ctx,
            &scope.unbind(),
            status,
            py.None(),
            bytes,
            req.received,
        ),
        Err(e) => ctx.log_error(py, "could not build the HTTP scope", Some(&e)),
    }
}

impl Job for HttpRequest {
    fn run(self: Box<Self>, py: Python<'_>) {
        let ctx = Arc::clone(&self.conn.listener.app);
        match self.rejected {
            Some((status, bytes)) => log_rejected(py, &ctx, &self, status, bytes),
            None => start(py, &ctx, self),
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
            self.rejected = Some((503, REASON.len() as u64));
            shared.queue.push(Event::Run(self));
        }
    }
}
