//! The Tokio side of a handshake: hand it to the app, wait for the app's
//! decision, then answer — 101 on HTTP/1.1 or 200 to an HTTP/2 extended
//! CONNECT (RFC 8441 §5), and start the driver; 403; or the app's own HTTP
//! response. Nothing reaches the wire before the app has decided. The
//! protocol's driver (`proto::h1`, `proto::h2`) finds the accepted
//! WebSocket in `ConnCtx::upgrade` once the response is out.

use std::future::poll_fn;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::request::Parts;
use http::{Response, StatusCode};
use http_body::Body;
use hyper::upgrade::OnUpgrade;

use crate::asgi::http::exchange::{BodyOut, Exchange};
use crate::asgi::websocket::shared::{Decision, WsShared, ABNORMAL};
use crate::bridge::queue::{Event, Job};
use crate::http::body::ResponseBody;
use crate::http::ctx::{BusyGuard, ConnCtx};
use crate::http::service::{Answered, HttpRequest};
use crate::wire::handshake;
use crate::wire::ws_extension;
use crate::worker::Worker;

/// A handshake on its way to the application.
pub(crate) struct WsRequest {
    pub(crate) parts: Parts,
    pub(crate) ws: Arc<WsShared>,
    pub(crate) conn: Arc<ConnCtx>,
    /// The client's `Sec-WebSocket-Protocol` offers, in order.
    pub(crate) subprotocols: Vec<String>,
}

impl Job for WsRequest {
    fn run(self: Box<Self>, py: pyo3::Python<'_>) {
        let ctx = std::sync::Arc::clone(self.conn.info.app());
        crate::asgi::websocket::start(
            py,
            &ctx,
            &self.parts,
            &self.ws,
            &self.conn.info,
            &self.subprotocols,
        );
    }
}

/// Tells the app the client left if the handshake is dropped undecided
/// (hyper drops it when the client disconnects).
struct LeftGuard<'a> {
    ws: &'a Arc<WsShared>,
    shared: &'a Worker,
    armed: bool,
}

impl Drop for LeftGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.ws.close(ABNORMAL, String::new(), self.shared);
        }
    }
}

fn respond(resp: Response<Bytes>, mut busy: BusyGuard) -> Response<ResponseBody> {
    busy.responded(resp.status());
    resp.map(|b| ResponseBody::full(b, busy))
}

/// Serves a WebSocket handshake; see the module docs. With the access log
/// on, the answer gets one line, as an HTTP response's: the status on the
/// wire (101, or 200 to an HTTP/2 extended CONNECT; 403; the app's own
/// response; Skirr's 400/426/500) and the body bytes, timed from the head
/// to the answer. A session's end is not logged (its close code reaches
/// the app; a line per session would double a chat server's log).
pub(crate) async fn handle(
    parts: Parts,
    conn: Arc<ConnCtx>,
    busy: BusyGuard,
) -> Response<ResponseBody> {
    let logged = conn
        .shared
        .config
        .access_log
        .then(|| (head_copy(&parts), Instant::now()));
    let resp = decide(parts, Arc::clone(&conn), busy).await;
    if let Some((parts, received)) = logged {
        let bytes = resp.body().size_hint().exact().unwrap_or(0);
        conn.shared.queue.push(Event::Run(Box::new(HttpRequest {
            parts,
            exch: Arc::new(Exchange::default()),
            conn: Arc::clone(&conn),
            received: Some(received),
            rejected: Some(Answered::now(resp.status().as_u16(), bytes, Some(received))),
        })));
    }
    resp
}

/// What the access-log line needs of a request head (`Parts` is not
/// `Clone`: its extensions are not).
fn head_copy(p: &Parts) -> Parts {
    let (mut c, ()) = http::Request::new(()).into_parts();
    c.method = p.method.clone();
    c.uri = p.uri.clone();
    c.version = p.version;
    c.headers = p.headers.clone();
    c
}

/// Puts Skirr's `Sec-WebSocket-Extensions` answer first. Fields the app
/// passed in `websocket.accept` stay after it, as uvicorn sends them (its
/// websockets and wsproto implementations negotiate permessage-deflate
/// themselves and append the app's headers): the app cannot turn Skirr's
/// compression off per connection, only the `ws_per_message_deflate`
/// option does.
fn add_extension(headers: &mut http::HeaderMap, value: String) {
    let Ok(ours) = http::HeaderValue::try_from(value) else {
        return;
    };
    let name = http::header::SEC_WEBSOCKET_EXTENSIONS;
    let apps: Vec<_> = headers.get_all(&name).iter().cloned().collect();
    headers.insert(&name, ours);
    for v in apps {
        headers.append(&name, v);
    }
}

/// The handshake's answer: the app's decision, or Skirr's refusal.
async fn decide(
    mut parts: Parts,
    conn: Arc<ConnCtx>,
    mut busy: BusyGuard,
) -> Response<ResponseBody> {
    let shared = Arc::clone(&conn.shared);
    let h2 = parts.version == http::Version::HTTP_2;
    let checked = if h2 {
        handshake::validate_h2(&parts).map(|()| None)
    } else {
        handshake::validate(&parts).map(Some)
    };
    let accept_key = match checked {
        Ok(k) => k,
        Err(r) => return respond(handshake::plain(r.status, r.message), busy),
    };
    // The upgrade is taken over by the connection task (see proto::h1),
    // not through hyper's `OnUpgrade`; on HTTP/2 the driver took it first.
    drop(parts.extensions.remove::<OnUpgrade>());
    let subprotocols = handshake::subprotocols(&parts.headers);
    // permessage-deflate (RFC 7692): settled now, answered if the app
    // accepts.
    let deflate = if shared.config.ws_per_message_deflate {
        ws_extension::negotiate(
            &parts.headers,
            ws_extension::DeflateConfig {
                window_bits: shared.config.ws_deflate_window_bits,
                context_takeover: shared.config.ws_deflate_context_takeover,
            },
        )
    } else {
        None
    };
    let ws = Arc::new(WsShared::default());
    let mut guard = LeftGuard {
        ws: &ws,
        shared: &shared,
        armed: true,
    };
    ws.attach(conn.info.app());
    shared.queue.push(Event::Run(Box::new(WsRequest {
        parts,
        ws: Arc::clone(&ws),
        conn: Arc::clone(&conn),
        subprotocols,
    })));
    let decision = poll_fn(|cx| ws.poll_decision(cx)).await;
    guard.armed = false;
    drop(guard);

    match decision {
        Decision::Accept {
            subprotocol,
            headers,
        } => {
            let switched = match &accept_key {
                Some(key) => handshake::switching_protocols(key, subprotocol.as_deref(), headers),
                None => handshake::connect_accepted(subprotocol.as_deref(), headers),
            };
            let (status, headers) = match switched {
                Ok((status, mut headers)) => {
                    if let Some((agreed, value)) = deflate {
                        add_extension(&mut headers, value);
                        ws.lock().deflate = Some(agreed);
                    }
                    // Once hyper has written the 101 (the 200) it hands the
                    // socket (the stream) to the protocol's driver, which
                    // runs the WebSocket.
                    *conn.upgrade.lock() = Some(Arc::clone(&ws));
                    (status, headers)
                }
                Err(e) => {
                    tracing::error!("cannot accept the WebSocket: {e}");
                    ws.close(ABNORMAL, String::new(), &shared);
                    return respond(
                        handshake::plain(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "Internal Server Error",
                        ),
                        busy,
                    );
                }
            };
            busy.responded(status);
            let mut resp = Response::new(ResponseBody::full(Bytes::new(), busy));
            *resp.status_mut() = status;
            *resp.headers_mut() = headers;
            resp
        }
        Decision::Deny => respond(handshake::plain(StatusCode::FORBIDDEN, ""), busy),
        Decision::Respond(head) => {
            let body = match head.body {
                BodyOut::Full(b) => b,
                BodyOut::Stream | BodyOut::File { .. } => Bytes::new(),
            };
            busy.responded(head.status);
            let mut resp = Response::new(ResponseBody::full(body, busy));
            crate::http::service::set_status(&mut resp, head.status);
            *resp.headers_mut() = head.headers;
            resp
        }
    }
}
