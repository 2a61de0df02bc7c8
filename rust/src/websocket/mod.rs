//! WebSockets (RFC 6455) bridged to the ASGI WebSocket protocol (spec 2.5),
//! with the `websocket.http.response` denial extension.
//!
//! Data flow: [`handshake`](crate::wire::handshake) recognises and validates an upgrade request →
//! [`service`] hands it to the app and waits for its decision; nothing is
//! written until the app accepts (101 with its subprotocol and headers),
//! closes (403) or answers with its own HTTP response → once upgraded,
//! `proto::ws::driver` runs `proto::ws::framed` (framing, permessage-deflate,
//! fragmentation, ping/pong, the close handshake) and moves messages
//! through [`shared::WsShared`], with bounded
//! queues both ways → [`protocol`] gives the app `receive` and `send`.

pub(crate) use crate::wire::handshake;
pub(crate) mod protocol;
pub(crate) mod service;
pub(crate) mod shared;

use std::sync::Arc;

use pyo3::prelude::*;

use crate::asgi::context::AppContext;
use crate::bridge::owner::Owner;
use crate::bridge::queue::Job;
use crate::bridge::start::call_app;
use crate::websocket::protocol::WebSocketProtocol;
use crate::websocket::service::WsRequest;

/// Starts the application for a WebSocket handshake (asyncio thread).
///
/// Never raises: a failure before the app runs is logged and answered 500.
pub(crate) fn start(py: Python<'_>, ctx: &Arc<AppContext>, req: Box<WsRequest>) {
    let proto = WebSocketProtocol::new(Arc::clone(&req.ws), Arc::clone(ctx));
    let scope = match crate::http::scope::websocket_scope(
        py,
        ctx,
        &req.parts,
        &req.conn,
        &req.subprotocols,
    ) {
        Ok(s) => s,
        Err(e) => {
            proto.on_error(py, e);
            return;
        }
    };
    let proto = match Py::new(py, proto) {
        Ok(p) => p,
        Err(e) => {
            ctx.log_error(py, "could not create the WebSocket protocol", Some(&e));
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

impl Job for WsRequest {
    fn run(self: Box<Self>, py: Python<'_>) {
        let ctx = Arc::clone(&self.conn.listener.app);
        start(py, &ctx, self);
    }
}
