//! The hyper service: one call per request head.
//!
//! It never touches Python. It queues an [`HttpRequest`] for the asyncio
//! thread, then waits for the response head while reading the request body
//! into the exchange as far as the app's buffer allows. Small bodies with a
//! known length are read *before* the app starts, so the common upload
//! completes its first `receive()` without waiting.

use std::convert::Infallible;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http::header::EXPECT;
use http::{Request, Response};
use http_body::Body;
use hyper::body::Incoming;

use crate::bridge::queue::Event;
use crate::http::body::{ResponseBody, StreamBody};
use crate::http::conn::{BusyGuard, ConnCtx};
use crate::http::exchange::{BodyOut, Exchange};
use crate::server::Shared;

/// A request on its way to the application.
pub(crate) struct HttpRequest {
    pub(crate) parts: http::request::Parts,
    pub(crate) exch: Arc<Exchange>,
    pub(crate) conn: Arc<ConnCtx>,
    /// When the head was parsed (for the access log's duration); only
    /// read from the clock when access logging is on.
    pub(crate) received: Option<Instant>,
}

/// Marks the exchange gone if the service future is dropped before the
/// response head was handed to hyper (hyper drops it when the client
/// disconnects mid-request).
struct GoneGuard<'a> {
    exch: &'a Arc<Exchange>,
    shared: &'a Shared,
    armed: bool,
}

impl Drop for GoneGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.exch.mark_gone(self.shared);
        }
    }
}

fn expects_continue(parts: &http::request::Parts) -> bool {
    parts
        .headers
        .get(EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// Reads a whole body of a known small length.
async fn read_small_body(body: &mut Incoming, len: usize) -> Result<Bytes, hyper::Error> {
    let mut first: Option<Bytes> = None;
    let mut rest: Option<BytesMut> = None;
    while let Some(frame) = poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        match (&mut first, &mut rest) {
            (None, _) => first = Some(data),
            (Some(f), None) => {
                let mut buf = BytesMut::with_capacity(len);
                buf.extend_from_slice(f);
                buf.extend_from_slice(&data);
                rest = Some(buf);
            }
            (Some(_), Some(buf)) => buf.extend_from_slice(&data),
        }
    }
    Ok(match rest {
        Some(buf) => buf.freeze(),
        None => first.unwrap_or_default(),
    })
}

/// Reads request body into the exchange while the app has room for it.
pub(crate) fn pump_body(
    cx: &mut Context<'_>,
    exch: &Arc<Exchange>,
    incoming: &mut Option<Incoming>,
    shared: &Shared,
    expect_continue: bool,
) {
    while let Some(body) = incoming.as_mut() {
        if !exch.wants_body(shared, expect_continue) {
            return;
        }
        match Pin::new(body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    if !data.is_empty() {
                        exch.push_body(data, shared);
                    }
                }
            }
            Poll::Ready(Some(Err(e))) => {
                tracing::debug!("request body read failed: {e}");
                *incoming = None;
                exch.mark_gone(shared);
            }
            Poll::Ready(None) => {
                *incoming = None;
                exch.end_body(shared);
            }
            Poll::Pending => return,
        }
    }
}

/// Serves one request: see the module docs.
pub(crate) async fn handle(
    req: Request<Incoming>,
    conn: Arc<ConnCtx>,
) -> Result<Response<ResponseBody>, Infallible> {
    let received = conn.shared.config.access_log.then(Instant::now);
    let busy = BusyGuard::new(&conn);
    let shared = &*conn.shared;
    shared.count_request();
    let (parts, mut body) = req.into_parts();
    if crate::websocket::handshake::is_upgrade(&parts) {
        return Ok(crate::websocket::service::handle(parts, conn, busy).await);
    }
    let bodyless = body.is_end_stream();
    // `Expect` only matters for a request with a body.
    let expect_continue = !bodyless && expects_continue(&parts);

    let prefetch = shared.config.body_prefetch as u64;
    let (exch, mut incoming) = if bodyless {
        (Arc::new(Exchange::with_complete_body(Bytes::new())), None)
    } else {
        match body.size_hint().exact() {
            Some(len) if !expect_continue && len <= prefetch => {
                match read_small_body(&mut body, len as usize).await {
                    Ok(data) => (Arc::new(Exchange::with_complete_body(data)), None),
                    Err(e) => {
                        // The client failed mid-body: hyper closes the
                        // connection; the app never sees this request.
                        tracing::debug!("request body read failed before dispatch: {e}");
                        return Ok(ResponseBody::bad_request(busy));
                    }
                }
            }
            _ => (Arc::new(Exchange::default()), Some(body)),
        }
    };

    let mut guard = GoneGuard {
        exch: &exch,
        shared,
        armed: true,
    };
    shared.queue.push(Event::Http(Box::new(HttpRequest {
        parts,
        exch: Arc::clone(&exch),
        conn: Arc::clone(&conn),
        received,
    })));
    let head = poll_fn(|cx| {
        pump_body(cx, &exch, &mut incoming, shared, expect_continue);
        exch.poll_head(cx)
    })
    .await;
    guard.armed = false;
    drop(guard);

    let body = match head.body {
        BodyOut::Full(data) => ResponseBody::full(data, busy),
        BodyOut::Stream => ResponseBody::stream(
            StreamBody::new(exch, incoming, Arc::clone(&conn), expect_continue),
            busy,
        ),
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = head.status;
    *resp.headers_mut() = head.headers;
    Ok(resp)
}
