//! A request stream's deadlines on HTTP/3, as HTTP/2 keeps them per
//! stream: `body_read_timeout` (408) and `response_start_timeout` (503)
//! are recorded in the stream's own [`Activity`](crate::http::activity)
//! and answered by the service (see `pump::check_deadlines`), for that
//! request only; the connection and its other streams go on. Before
//! that, `header_read_timeout` bounds the request's HEADERS frame
//! ([`read_head`]).

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use ::h3::error::{Code, StreamError};
use ::h3::quic::{RecvStream as _, SendStream as _};

use tokio_util::sync::CancellationToken;

use super::Resolver;

use crate::http::activity::{deadline_at, Timeouts, Verdict};
use crate::http::ctx::ConnCtx;

/// Polls `work` (the service, then the response's writing) and, while it
/// waits, the request's deadlines: a passed one is recorded in `ctx`'s
/// activity and `work` is polled again at once, so the service sees it.
pub(crate) async fn watched<F: Future>(work: F, ctx: &ConnCtx, t: &Timeouts) -> F::Output {
    let mut work = pin!(work);
    let mut sleep = pin!(tokio::time::sleep_until(deadline_at(0)));
    let mut at = 0;
    poll_fn(|cx| loop {
        if let Poll::Ready(out) = work.as_mut().poll(cx) {
            return Poll::Ready(out);
        }
        match ctx.activity.check(t) {
            Verdict::Expire(e) => ctx.activity.expire(e),
            // Not returned for a stream: its activity never sees socket
            // writes, the only busy-time close (as on HTTP/2).
            Verdict::Close(_) => return Poll::Pending,
            Verdict::Next(next) => {
                if at != next {
                    sleep.as_mut().reset(deadline_at(next));
                    at = next;
                }
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
            }
        }
    })
    .await
}

/// Why a request stream brought no request: its HEADERS frame did not
/// complete within `header_read_timeout`, or h3 refused it.
pub(crate) enum NoHead {
    Timeout(Duration),
    Refused(StreamError),
}

impl std::fmt::Display for NoHead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoHead::Timeout(d) => write!(f, "no complete HEADERS frame within {d:?}: stream reset"),
            NoHead::Refused(e) => write!(f, "{e}"),
        }
    }
}

/// Reads a new request stream's head: its first frame, which must be
/// HEADERS, within `header_read_timeout` (`limits.0`; zero: no limit)
/// from the stream's opening (its first bytes), or within `drain_grace`
/// (`limits.1`; zero: off) from when `draining` is cancelled if that
/// comes first; then h3's checks of it. A stream whose HEADERS frame has
/// not arrived whole by then (a slowloris client, RFC 9114 §10.5) is reset
/// both ways with H3_REQUEST_REJECTED: the app never saw it, so the client
/// may retry it. Only this stream: the connection and its other requests
/// go on.
pub(crate) async fn read_head(
    mut resolver: Resolver,
    (limit, grace): (Duration, Duration),
    draining: &CancellationToken,
) -> Result<(http::Request<()>, super::body::Stream), NoHead> {
    // h3 0.0.8's `resolve_request()` owns the stream until the head is
    // read, so a deadline around it could only drop the stream (quinn then
    // ends it with a FIN, as if the response were empty). Its two steps
    // are public (`frame_stream`, doc-hidden, and `accept_with_frame`):
    // the first frame is read here, under the deadlines, and the stream
    // stays at hand to reset.
    // Polled once first: the stream was accepted for the bytes that
    // opened it, which usually hold the whole HEADERS frame, so the
    // deadlines' timer and drain watch are made only for a head that is
    // not there yet.
    let mut now = None;
    poll_fn(|cx| {
        if let Poll::Ready(frame) = resolver.frame_stream.poll_next(cx) {
            now = Some(frame);
        }
        Poll::Ready(())
    })
    .await;
    let frame = match now {
        Some(frame) => frame,
        None => {
            let first = poll_fn(|cx| resolver.frame_stream.poll_next(cx));
            let header_read = async {
                if limit.is_zero() {
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(limit).await;
                limit
            };
            let drain = async {
                draining.cancelled().await;
                if grace.is_zero() {
                    // `drain_grace` off: `header_read_timeout` still applies.
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(grace).await;
                grace
            };
            tokio::select! {
                frame = first => frame,
                waited = header_read => return Err(reject(&mut resolver, waited)),
                waited = drain => return Err(reject(&mut resolver, waited)),
            }
        }
    };
    let resolved = resolver.accept_with_frame(frame).map_err(NoHead::Refused)?;
    resolved.resolve().await.map_err(NoHead::Refused)
}

/// Resets a request stream whose head did not come in time (`waited`),
/// both ways. A read of it is pending: the receiving half is Skirr's own
/// ([`super::streams`]), which stops a stream in that state (`h3-quinn`'s
/// panicked).
fn reject(resolver: &mut Resolver, waited: Duration) -> NoHead {
    let code = Code::H3_REQUEST_REJECTED.value();
    resolver.frame_stream.stream.stop_sending(code);
    resolver.frame_stream.reset(code);
    NoHead::Timeout(waited)
}
