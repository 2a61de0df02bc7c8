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
