//! The ASGI side of an HTTP exchange, shared by every HTTP version: the
//! exchange between the connection and the app (`exchange`, `response`),
//! the app's `receive`/`send` (`protocol`), the `http.*` messages
//! (`message`, `zerocopy`) and the access log (`access`). It names no
//! Tokio-side type: the drivers and `crate::http` use it, not the reverse.

pub(crate) mod access;
pub(crate) mod exchange;
pub(crate) mod message;
pub(crate) mod protocol;
pub(crate) mod response;
pub(crate) mod zerocopy;
