//! The protocol-neutral ASGI side: what every wire protocol's exchange
//! shares — the application context, a connection's scope facts
//! ([`conn::ConnInfo`]), the scopes built from a request head and those
//! facts ([`scope`]), the app's start ([`start`]); see `http`, `websocket`
//! and `lifespan` for the exchanges themselves.

pub(crate) mod conn;
pub(crate) mod context;
pub(crate) mod http;
pub(crate) mod lifespan;
pub(crate) mod message;
pub(crate) mod scope;
pub(crate) mod start;
pub(crate) mod websocket;
