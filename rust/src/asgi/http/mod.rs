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

use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::prelude::*;

use crate::asgi::conn::ConnInfo;
use crate::asgi::context::AppContext;
use crate::asgi::http::exchange::Exchange;
use crate::asgi::http::protocol::HttpProtocol;
use crate::asgi::scope::http_scope;

/// Starts the application for a request (on the asyncio thread): `parts`
/// is its head, `exch` the exchange with its connection `conn`; `interim`:
/// whether interim responses can reach its client; `received`: when the
/// head was parsed (for the access log).
///
/// Never raises: a failure before the app runs is logged and answered 500.
pub(crate) fn start(
    py: Python<'_>,
    ctx: &Arc<AppContext>,
    parts: http::request::Parts,
    exch: Arc<Exchange>,
    conn: &ConnInfo,
    interim: bool,
    received: Option<Instant>,
) {
    let head = parts.method == http::Method::HEAD;
    let built = http_scope(py, ctx, &parts, conn, interim);
    // The exchange's trailers verdict (`TE: trailers`) was set by the
    // Tokio side before the request was queued.
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
        exch.lock().app_started = Some(Instant::now());
    }
    let proto = HttpProtocol::new(exch, Arc::clone(ctx), head, interim, received, keep_scope);
    static METHODS: crate::asgi::start::Methods = crate::asgi::start::Methods::new();
    crate::asgi::start::call(
        py,
        ctx,
        scope,
        proto,
        &METHODS,
        "could not create the HTTP protocol",
    );
}

/// Writes the access-log line of a request the server answered before
/// the app saw it (on the asyncio thread): `status` and body `bytes` as
/// sent, `took` from the head's arrival to the answer (fixed when
/// answered: the line may be written much later).
pub(crate) fn log_rejected(
    py: Python<'_>,
    ctx: &Arc<AppContext>,
    parts: &http::request::Parts,
    conn: &ConnInfo,
    interim: bool,
    (status, bytes): (u16, u64),
    took: Option<Duration>,
) {
    match http_scope(py, ctx, parts, conn, interim) {
        Ok(scope) => access::write_access(py, ctx, &scope.unbind(), status, py.None(), bytes, took),
        Err(e) => ctx.log_error(py, "could not build the HTTP scope", Some(&e)),
    }
}
