//! The protocol-neutral ASGI side: what every wire protocol's exchange
//! shares (the application context; see `http`, `websocket` and `lifespan`
//! for the exchanges themselves).

pub(crate) mod context;
pub(crate) mod lifespan;
pub(crate) mod message;
