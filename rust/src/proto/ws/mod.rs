//! The WebSocket driver (RFC 6455), shared by both ways a WebSocket
//! starts: an HTTP/1.1 upgrade and an HTTP/2 extended CONNECT (RFC 8441).
//! The handshake itself is answered by `websocket::service`; the
//! application side is `websocket::protocol`. [`framed`] is the framing
//! (with permessage-deflate) the driver runs on.

pub(crate) mod driver;
pub(crate) mod framed;
