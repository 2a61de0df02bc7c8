//! One request, whatever the driver: the head checks (`http::service::admit`),
//! then the WebSocket handshake service or the HTTP service. Here rather
//! than in `http/`, so that the protocol-neutral HTTP service never names
//! the WebSocket side.

use std::convert::Infallible;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;

use crate::http::body::ResponseBody;
use crate::http::ctx::ConnCtx;
use crate::http::service::{self, Admission};

/// Serves one request on `conn` (the drivers' hyper service).
pub(crate) async fn handle(
    req: Request<Incoming>,
    conn: Arc<ConnCtx>,
) -> Result<Response<ResponseBody>, Infallible> {
    let admitted = match service::admit(req, conn).await {
        Admission::Answered(resp) => return Ok(resp),
        Admission::Admitted(a) => a,
    };
    if admitted.is_websocket() {
        let (parts, conn, busy) = admitted.into_websocket();
        return Ok(crate::websocket::service::handle(parts, conn, busy).await);
    }
    service::serve(admitted).await
}
