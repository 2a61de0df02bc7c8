//! Starts the application for a WebSocket handshake (asyncio thread): the
//! scope, the ASGI side's [`WebSocketProtocol`], the app's coroutine.

use std::sync::Arc;

use pyo3::prelude::*;

use super::service::WsRequest;
use crate::asgi::context::AppContext;
use crate::asgi::websocket::protocol::WebSocketProtocol;
use crate::bridge::owner::Owner;
use crate::bridge::queue::Job;
use crate::bridge::start::call_app;

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
