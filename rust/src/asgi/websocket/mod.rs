//! WebSockets (RFC 6455) bridged to the ASGI WebSocket protocol (spec 2.5),
//! with the `websocket.http.response` denial extension: the ASGI side.
//!
//! Data flow: [`handshake`](crate::wire::handshake) recognises and validates an upgrade request →
//! `proto::ws::service` hands it to the app and waits for its decision; nothing is
//! written until the app accepts (101 with its subprotocol and headers),
//! closes (403) or answers with its own HTTP response → once upgraded,
//! `proto::ws::driver` runs `proto::ws::framed` (framing, permessage-deflate,
//! fragmentation, ping/pong, the close handshake) and moves messages through [`shared::WsShared`], with bounded
//! queues both ways → [`protocol`] gives the app `receive` and `send`.

pub(crate) mod protocol;
pub(crate) mod shared;

use std::sync::Arc;

use pyo3::prelude::*;

use crate::asgi::conn::ConnInfo;
use crate::asgi::context::AppContext;
use crate::asgi::scope::websocket_scope;
use protocol::WebSocketProtocol;
use shared::WsShared;

/// Starts the application for a WebSocket handshake (asyncio thread):
/// `parts` is its head, `ws` the state shared with its connection `conn`,
/// `subprotocols` the client's offers in order.
///
/// Never raises: a failure before the app runs is logged and answered 500.
pub(crate) fn start(
    py: Python<'_>,
    ctx: &Arc<AppContext>,
    parts: &http::request::Parts,
    ws: &Arc<WsShared>,
    conn: &ConnInfo,
    subprotocols: &[String],
) {
    let proto = WebSocketProtocol::new(Arc::clone(ws), Arc::clone(ctx));
    let scope = match websocket_scope(py, ctx, parts, conn, subprotocols) {
        Ok(s) => s,
        Err(e) => {
            proto.on_error(py, e);
            return;
        }
    };
    static METHODS: crate::asgi::start::Methods = crate::asgi::start::Methods::new();
    crate::asgi::start::call(
        py,
        ctx,
        scope,
        proto,
        &METHODS,
        "could not create the WebSocket protocol",
    );
}
