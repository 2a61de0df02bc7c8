//! A request stream's deadlines on HTTP/3, as HTTP/2 keeps them per
//! stream: `body_read_timeout` (408) and `response_start_timeout` (503)
//! are recorded in the stream's own [`Activity`](crate::http::activity)
//! and answered by the service (see `pump::check_deadlines`), for that
//! request only; the connection and its other streams go on.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::Poll;

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
