//! The WebSocket driver (RFC 6455), shared by both ways a WebSocket
//! starts: an HTTP/1.1 upgrade and an HTTP/2 extended CONNECT (RFC 8441).
//! The handshake itself is answered by [`service`], which starts the
//! application (`asgi::websocket::start`); the application side is
//! `asgi::websocket::protocol`.
//! [`framed`] is the framing (with permessage-deflate) the driver runs on.

pub(crate) mod driver;
pub(crate) mod framed;
pub(crate) mod service;
