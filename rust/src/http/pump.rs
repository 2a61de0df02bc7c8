//! Moving a request body from the driver to the exchange: a small body
//! read whole before the app is called, a larger one pumped as the app
//! reads it (bounded by `body_buffer`), and the per-request deadlines
//! checked on the way. The body is any [`RequestBody`]: hyper's `Incoming`
//! on HTTP/1.1 and HTTP/2, a driver's own type elsewhere (HTTP/3); each is
//! its own monomorphised copy, with no boxing.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::StatusCode;
use http_body::Body;

use crate::asgi::http::exchange::Exchange;
use crate::http::activity::Expired;
use crate::http::ctx::ConnCtx;

/// A request body's error, boxed when it happens (only to be logged).
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request body as the service reads it: frames of [`Bytes`], an error
/// convertible to [`BoxError`]. hyper's `Incoming` is one; a driver not
/// built on hyper (HTTP/3) brings its own.
pub(crate) trait RequestBody:
    Body<Data = Bytes, Error: Into<BoxError>> + Unpin + Send + 'static
{
}

impl<B> RequestBody for B where B: Body<Data = Bytes, Error: Into<BoxError>> + Unpin + Send + 'static
{}

/// Reads a whole body of a known small length, before the app starts.
/// `Err` carries the answer: 400 for a body that fails, 408 when the
/// client stalls past `body_read_timeout`, 503 past
/// `response_start_timeout`.
pub(crate) async fn read_small_body<B: RequestBody>(
    body: &mut B,
    len: usize,
    conn: &ConnCtx,
) -> Result<Bytes, (StatusCode, &'static str)> {
    let mut first: Option<Bytes> = None;
    let mut rest: Option<BytesMut> = None;
    loop {
        let frame = poll_fn(|cx| {
            match conn.activity.take_expired() {
                Some(Expired::Body) => {
                    return Poll::Ready(Err((
                        StatusCode::REQUEST_TIMEOUT,
                        "request body not received in time",
                    )))
                }
                Some(Expired::ResponseStart) => {
                    return Poll::Ready(Err((
                        StatusCode::SERVICE_UNAVAILABLE,
                        crate::metrics::RESPONSE_START_REASON,
                    )))
                }
                None => {}
            }
            match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Pending if conn.activity.peer_eof() => {
                    Poll::Ready(Err((StatusCode::BAD_REQUEST, "request body incomplete")))
                }
                Poll::Pending => {
                    conn.activity.body_wait(true);
                    Poll::Pending
                }
                Poll::Ready(r) => {
                    conn.activity.body_wait(false);
                    Poll::Ready(Ok(r))
                }
            }
        })
        .await?;
        let Some(frame) = frame else { break };
        let frame = frame.map_err(|e| {
            let e: BoxError = e.into();
            tracing::debug!("request body read failed before dispatch: {e}");
            (StatusCode::BAD_REQUEST, "invalid request body")
        })?;
        let Ok(data) = frame.into_data() else {
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
///
/// A body that fails to parse (a bad chunk, a length cut short) rejects the
/// request with 400; the client going away does the same, unseen.
pub(crate) fn pump_body<B: RequestBody>(
    cx: &mut Context<'_>,
    exch: &Arc<Exchange>,
    incoming: &mut Option<B>,
    conn: &ConnCtx,
    expect_continue: bool,
) {
    let shared = &*conn.shared;
    while let Some(body) = incoming.as_mut() {
        if !exch.wants_body(shared, expect_continue) {
            conn.activity.body_wait(false);
            return;
        }
        match Pin::new(body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    if !data.is_empty() {
                        conn.activity.body_wait(false);
                        exch.push_body(data, shared);
                    }
                }
            }
            Poll::Ready(Some(Err(e))) => {
                let e: BoxError = e.into();
                tracing::debug!("request body read failed: {e}");
                *incoming = None;
                conn.activity.body_wait(false);
                exch.reject(StatusCode::BAD_REQUEST, "invalid request body", shared);
            }
            Poll::Ready(None) => {
                *incoming = None;
                conn.activity.body_wait(false);
                exch.end_body(shared);
            }
            Poll::Pending if conn.activity.peer_eof() => {
                // The client ended its side before the body's end.
                *incoming = None;
                conn.activity.body_wait(false);
                exch.reject(StatusCode::BAD_REQUEST, "request body incomplete", shared);
            }
            Poll::Pending => {
                conn.activity.body_wait(true);
                return;
            }
        }
    }
}

/// Answers a passed request deadline (see [`Activity`](crate::http::activity::Activity)).
pub(crate) fn check_deadlines(conn: &ConnCtx, exch: &Arc<Exchange>) {
    let Some(e) = conn.activity.take_expired() else {
        return;
    };
    let shared = &*conn.shared;
    match e {
        Expired::Body => {
            tracing::debug!(
                "request body from {:?} not received in time",
                conn.info.peer
            );
            exch.reject(
                StatusCode::REQUEST_TIMEOUT,
                "request body not received in time",
                shared,
            );
        }
        Expired::ResponseStart => {
            tracing::warn!(
                "the application did not start a response within {:?}: answered 503",
                shared.config.response_start_timeout
            );
            exch.reject(
                StatusCode::SERVICE_UNAVAILABLE,
                crate::metrics::RESPONSE_START_REASON,
                shared,
            );
        }
    }
}
