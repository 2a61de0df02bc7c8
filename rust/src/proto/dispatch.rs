//! One request, whatever the driver: `http::service::handle` checks the
//! head and serves HTTP; a WebSocket handshake goes to the handshake
//! service given here, so that the protocol-neutral HTTP service never
//! names the WebSocket side.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use http::request::Parts;
use http::{Request, Response};

use crate::http::body::ResponseBody;
use crate::http::ctx::{BusyGuard, ConnCtx};
use crate::http::pump::RequestBody;

/// Serves one request on `conn` (the drivers' service; `B`: the driver's
/// request body, hyper's `Incoming` on HTTP/1.1 and HTTP/2). A plain
/// function returning the service's future: no wrapper state machine.
pub(crate) fn handle<B: RequestBody>(
    req: Request<B>,
    conn: Arc<ConnCtx>,
) -> impl Future<Output = Result<Response<ResponseBody>, Infallible>> + Send {
    crate::http::service::handle(req, conn, websocket)
}

/// The WebSocket handshake service (boxed: one allocation per handshake,
/// none per HTTP request).
fn websocket(
    parts: Parts,
    conn: Arc<ConnCtx>,
    busy: BusyGuard,
) -> Pin<Box<dyn Future<Output = Response<ResponseBody>> + Send>> {
    Box::pin(crate::proto::ws::service::handle(parts, conn, busy))
}
