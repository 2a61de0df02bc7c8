//! What a connection is doing, for its timers.
//!
//! hyper's own `header_read_timeout` starts whenever it waits for a request
//! head, so it also ends idle keep-alive connections; a server needs
//! distinct limits for an idle connection, a trickled head, a stalled
//! request body and (optionally) an app slow to start its response.
//! [`Activity`] records the phase with relaxed atomics and one timer per
//! connection checks it lazily: the clock is read on phase changes and when
//! the timer fires, never per byte.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use crate::config::Config;

pub(crate) use crate::worker::clock::{clock_ms, deadline_at};

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u128::from(u64::MAX / 4)) as u64
}

/// The connection timeouts, in milliseconds; 0 disables the last two.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    pub(crate) keepalive: u64,
    pub(crate) header: u64,
    pub(crate) body: u64,
    pub(crate) response_start: u64,
    /// `send_timeout`: a response the socket accepts nothing of.
    pub(crate) send: u64,
    /// `drain_grace` (see `server::drain`).
    pub(crate) drain_grace: u64,
}

impl Timeouts {
    pub(crate) fn new(cfg: &Config) -> Self {
        Timeouts {
            keepalive: ms(cfg.keepalive_timeout),
            header: ms(cfg.header_read_timeout),
            body: ms(cfg.body_read_timeout),
            response_start: ms(cfg.response_start_timeout),
            send: ms(cfg.send_timeout),
            drain_grace: ms(cfg.drain_grace),
        }
    }
}

/// A request deadline that passed; the request's service answers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expired {
    /// The client sent no body bytes for `body_read_timeout` (408).
    Body = 1,
    /// The app did not start its response in `response_start_timeout` (503).
    ResponseStart = 2,
}

/// What the connection timer should do.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Check again at this [`clock_ms`] time.
    Next(u64),
    /// Close the connection, for this reason.
    Close(&'static str),
    /// The current request's deadline passed (see [`Activity::take_expired`]).
    Expire(Expired),
}

/// A connection's phase. See the module docs.
#[derive(Default)]
pub(crate) struct Activity {
    /// A request is being served (from its head until its body is written).
    busy: AtomicBool,
    /// Bytes of a new request arrived while idle; the head is incomplete.
    reading_head: AtomicBool,
    /// When the current phase began (`clock_ms`): idle, head, or request.
    since_ms: AtomicU64,
    /// The app waits for request-body bytes the client has not sent.
    awaiting_body: AtomicBool,
    /// When the current wait for body bytes began.
    body_since_ms: AtomicU64,
    /// The response head has been handed to hyper.
    responded: AtomicBool,
    /// An [`Expired`] deadline not yet answered (0: none).
    expired: AtomicU8,
    /// A request has started on this connection.
    served: AtomicBool,
    /// The client shut its sending side down (a read returned end of
    /// stream).
    peer_eof: AtomicBool,
    /// The request in progress is plain HTTP (not a WebSocket handshake,
    /// whose client leaving must reach the app at once).
    plain_http: AtomicBool,
    /// The client ended its side and the app, told so, gave the request
    /// up without a response: the connection closes, writing nothing.
    abandoned: AtomicBool,
    /// Since when a write to the socket is pending ([`clock_ms`], at
    /// least 1); 0 while writes go through (see `send_timeout`).
    write_blocked_ms: AtomicU64,
    /// The head being read has a field line over
    /// `limit_request_field_size` (see `http::headscan`).
    field_too_long: AtomicBool,
    /// When this connection learned of the drain ([`clock_ms`], at least
    /// 1); 0: not draining.
    drain_ms: AtomicU64,
}

impl Activity {
    pub(crate) fn new() -> Self {
        let a = Activity::default();
        a.since_ms.store(clock_ms(), Ordering::Relaxed);
        a
    }

    /// The worker drains: `drain_grace` runs from now. True the first time.
    pub(crate) fn drain_begun(&self) -> bool {
        self.drain_ms
            .compare_exchange(0, clock_ms().max(1), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// Whether the response head has gone to hyper (see
    /// [`Activity::responded`]).
    pub(crate) fn has_responded(&self) -> bool {
        self.responded.load(Ordering::Relaxed)
    }

    /// See [`Activity::take_field_too_long`].
    pub(crate) fn set_field_too_long(&self, v: bool) {
        self.field_too_long.store(v, Ordering::Relaxed);
    }

    /// Whether the head just parsed had a field line over
    /// `limit_request_field_size`, counted as received (once).
    pub(crate) fn take_field_too_long(&self) -> bool {
        self.field_too_long.swap(false, Ordering::Relaxed)
    }

    /// Bytes arrived on the socket.
    pub(crate) fn on_bytes(&self) {
        if !self.busy.load(Ordering::Relaxed) && !self.reading_head.load(Ordering::Relaxed) {
            self.reading_head.store(true, Ordering::Relaxed);
            self.since_ms.store(clock_ms(), Ordering::Relaxed);
        }
    }

    pub(crate) fn start_request(&self) {
        self.since_ms.store(clock_ms(), Ordering::Relaxed);
        self.served.store(true, Ordering::Relaxed);
        self.busy.store(true, Ordering::Relaxed);
        self.reading_head.store(false, Ordering::Relaxed);
        self.awaiting_body.store(false, Ordering::Relaxed);
        self.responded.store(false, Ordering::Relaxed);
        self.expired.store(0, Ordering::Relaxed);
    }

    /// Whether an end of stream now comes while a request is in progress:
    /// its response is still owed (a half close), and a body it cuts
    /// short is answered 400 by the service.
    pub(crate) fn awaits_response(&self) -> bool {
        self.busy.load(Ordering::Relaxed) && self.plain_http.load(Ordering::Relaxed)
    }

    /// Whether the request in progress is plain HTTP (see
    /// [`Activity::awaits_response`]).
    pub(crate) fn set_plain_http(&self, plain: bool) {
        self.plain_http.store(plain, Ordering::Relaxed);
    }

    /// See [`Activity::is_abandoned`].
    pub(crate) fn abandon(&self) {
        self.abandoned.store(true, Ordering::Relaxed);
    }

    /// The request in progress was given up after the client ended its
    /// side: the HTTP/1.1 driver closes the connection.
    pub(crate) fn is_abandoned(&self) -> bool {
        self.abandoned.load(Ordering::Relaxed)
    }

    pub(crate) fn end_request(&self) {
        self.since_ms.store(clock_ms(), Ordering::Relaxed);
        self.busy.store(false, Ordering::Relaxed);
    }

    /// A new connection whose first request has not started: its client
    /// has sent, or is sending, a request that a draining server still
    /// serves (closing it would lose the request: only idle keep-alive
    /// connections are closed at once).
    pub(crate) fn is_fresh(&self) -> bool {
        !self.served.load(Ordering::Relaxed) && !self.busy.load(Ordering::Relaxed)
    }

    /// The client's sending side is shut (see [`Activity::peer_eof`]).
    pub(crate) fn on_eof(&self) {
        self.peer_eof.store(true, Ordering::Relaxed);
    }

    /// Whether the client has shut its sending side down.
    pub(crate) fn peer_eof(&self) -> bool {
        self.peer_eof.load(Ordering::Relaxed)
    }

    /// A request is being served (its head parsed, its response not yet
    /// fully written).
    pub(crate) fn is_busy(&self) -> bool {
        self.busy.load(Ordering::Relaxed)
    }

    /// Whether the request body is awaited from the client right now.
    pub(crate) fn body_wait(&self, waiting: bool) {
        if self.awaiting_body.load(Ordering::Relaxed) != waiting {
            if waiting {
                self.body_since_ms.store(clock_ms(), Ordering::Relaxed);
            }
            self.awaiting_body.store(waiting, Ordering::Relaxed);
        }
    }

    /// A write to the socket could not proceed (the client reads
    /// nothing, its receive window is full): the wait starts now unless
    /// it already had.
    pub(crate) fn write_blocked(&self) {
        if self.write_blocked_ms.load(Ordering::Relaxed) == 0 {
            self.write_blocked_ms
                .store(clock_ms().max(1), Ordering::Relaxed);
        }
    }

    /// A write to the socket went through: the client is reading.
    pub(crate) fn write_ok(&self) {
        if self.write_blocked_ms.load(Ordering::Relaxed) != 0 {
            self.write_blocked_ms.store(0, Ordering::Relaxed);
        }
    }

    /// The response head went to hyper.
    pub(crate) fn responded(&self) {
        self.responded.store(true, Ordering::Relaxed);
    }

    /// A passed deadline of the current request, once.
    pub(crate) fn take_expired(&self) -> Option<Expired> {
        if self.expired.load(Ordering::Relaxed) == 0 {
            return None;
        }
        match self.expired.swap(u8::MAX, Ordering::Relaxed) {
            1 => Some(Expired::Body),
            2 => Some(Expired::ResponseStart),
            _ => None,
        }
    }

    /// Records a passed deadline for the service to answer.
    pub(crate) fn expire(&self, e: Expired) {
        let _ = self
            .expired
            .compare_exchange(0, e as u8, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Whether the connection has been idle (no request, no partial head)
    /// for at least `d`.
    pub(crate) fn idle_for(&self, d: Duration) -> bool {
        !self.busy.load(Ordering::Relaxed)
            && !self.reading_head.load(Ordering::Relaxed)
            && clock_ms().saturating_sub(self.since_ms.load(Ordering::Relaxed)) >= ms(d)
    }

    /// What the timer should do now.
    pub(crate) fn check(&self, t: &Timeouts) -> Verdict {
        self.check_at(clock_ms(), t)
    }

    pub(crate) fn check_at(&self, now: u64, t: &Timeouts) -> Verdict {
        let since = self.since_ms.load(Ordering::Relaxed);
        // The drain's grace (`server::drain`): from when it began.
        let drain = self.drain_ms.load(Ordering::Relaxed);
        let drain_grace = (drain != 0 && t.drain_grace > 0).then_some(t.drain_grace);
        if self.busy.load(Ordering::Relaxed) {
            let mut next = now + t.keepalive.max(1);
            if let Some(grace) = drain_grace {
                // A client that reads nothing must not hold the drain: a
                // write blocked for `grace` (counted from the drain at the
                // earliest) closes the connection. Checked every `grace`.
                next = next.min(now + grace.max(100));
                let blocked = self.write_blocked_ms.load(Ordering::Relaxed);
                if blocked != 0 {
                    let due = blocked.max(drain) + grace;
                    if now >= due {
                        return Verdict::Close("drain: response not accepted in time");
                    }
                    next = next.min(due);
                }
            }
            if self.expired.load(Ordering::Relaxed) != 0 {
                return Verdict::Next(next);
            }
            if t.body > 0 && self.awaiting_body.load(Ordering::Relaxed) {
                let due = self.body_since_ms.load(Ordering::Relaxed) + t.body;
                if now >= due {
                    return Verdict::Expire(Expired::Body);
                }
                next = next.min(due);
            }
            // The socket has taken no bytes of the response for
            // `send_timeout`: the client is gone or hostile. (Noticed when
            // the timer fires next: up to one keep-alive period late.)
            let blocked = self.write_blocked_ms.load(Ordering::Relaxed);
            if t.send > 0 && blocked != 0 {
                let due = blocked + t.send;
                if now >= due {
                    return Verdict::Close("response not accepted in time");
                }
                next = next.min(due);
            }
            if t.response_start > 0 && !self.responded.load(Ordering::Relaxed) {
                let due = since + t.response_start;
                if now >= due {
                    return Verdict::Expire(Expired::ResponseStart);
                }
                next = next.min(due);
            }
            return Verdict::Next(next);
        }
        let reading_head = self.reading_head.load(Ordering::Relaxed);
        let (limit, reason) = if reading_head {
            (t.header, "request head not received in time")
        } else {
            (t.keepalive, "keep-alive idle timeout")
        };
        let mut due = since + limit;
        if let Some(grace) = drain_grace {
            // A head not complete when the drain began (a new connection's
            // included) gets `grace`, not `header_read_timeout`. An idle
            // keep-alive connection has its own, shorter, drain window
            // (`http::ctx::DRAIN_IDLE`).
            if reading_head || !self.served.load(Ordering::Relaxed) {
                let by = drain + grace;
                if now >= by {
                    return Verdict::Close("drain: request head not complete in time");
                }
                due = due.min(by);
            }
        }
        if now >= due {
            Verdict::Close(reason)
        } else {
            Verdict::Next(due)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timeouts = Timeouts {
        keepalive: 1000,
        header: 5000,
        body: 3000,
        response_start: 0,
        send: 4000,
        drain_grace: 2000,
    };

    fn since(a: &Activity) -> u64 {
        a.since_ms.load(Ordering::Relaxed)
    }

    #[test]
    fn idle_connection_times_out_after_keepalive() {
        let a = Activity::new();
        assert!(matches!(a.check_at(since(&a) + 500, &T), Verdict::Next(_)));
        assert_eq!(
            a.check_at(since(&a) + 1000, &T),
            Verdict::Close("keep-alive idle timeout")
        );
    }

    #[test]
    fn a_started_head_gets_the_header_timeout_instead() {
        let a = Activity::new();
        a.on_bytes();
        let t0 = since(&a);
        assert!(matches!(a.check_at(t0 + 2000, &T), Verdict::Next(_)));
        assert_eq!(
            a.check_at(t0 + 6000, &T),
            Verdict::Close("request head not received in time")
        );
    }

    #[test]
    fn a_busy_connection_never_closes_on_idle() {
        let a = Activity::new();
        a.start_request();
        assert!(matches!(
            a.check_at(since(&a) + 60_000, &T),
            Verdict::Next(_)
        ));
        a.end_request();
        assert!(matches!(a.check_at(since(&a) + 10, &T), Verdict::Next(_)));
    }

    #[test]
    fn a_stalled_body_expires_once() {
        let a = Activity::new();
        a.start_request();
        a.body_wait(true);
        let t0 = a.body_since_ms.load(Ordering::Relaxed);
        assert_eq!(a.check_at(t0 + 2000, &T), Verdict::Next(t0 + 3000));
        assert_eq!(a.check_at(t0 + 3000, &T), Verdict::Expire(Expired::Body));
        a.expire(Expired::Body);
        assert_eq!(a.take_expired(), Some(Expired::Body));
        assert_eq!(a.take_expired(), None);
        assert!(matches!(a.check_at(t0 + 9000, &T), Verdict::Next(_)));
        a.body_wait(false);
    }

    #[test]
    fn a_write_blocked_past_send_timeout_closes_a_busy_connection() {
        let a = Activity::new();
        a.start_request();
        a.write_blocked();
        let t0 = a.write_blocked_ms.load(Ordering::Relaxed);
        assert_eq!(a.check_at(t0 + 3500, &T), Verdict::Next(t0 + 4000));
        a.write_ok();
        a.write_blocked();
        let t1 = a.write_blocked_ms.load(Ordering::Relaxed);
        assert_eq!(
            a.check_at(t1 + 4000, &T),
            Verdict::Close("response not accepted in time")
        );
        let off = Timeouts { send: 0, ..T };
        assert!(matches!(a.check_at(t1 + 4000, &off), Verdict::Next(_)));
    }

    #[test]
    fn response_start_deadline_only_until_the_head_is_sent() {
        let t = Timeouts {
            response_start: 2000,
            ..T
        };
        let a = Activity::new();
        a.start_request();
        let t0 = since(&a);
        assert_eq!(
            a.check_at(t0 + 2000, &t),
            Verdict::Expire(Expired::ResponseStart)
        );
        a.responded();
        assert!(matches!(a.check_at(t0 + 2000, &t), Verdict::Next(_)));
    }

    #[test]
    fn a_drain_bounds_heads_and_stalled_writes_by_its_grace() {
        let t = Timeouts {
            header: 30_000,
            send: 60_000,
            ..T
        };
        let head = Activity::new();
        head.on_bytes();
        assert!(head.drain_begun());
        assert!(!head.drain_begun(), "once");
        let d = head.drain_ms.load(Ordering::Relaxed);
        assert_eq!(head.check_at(d + 1000, &t), Verdict::Next(d + 2000));
        assert_eq!(
            head.check_at(d + 2000, &t),
            Verdict::Close("drain: request head not complete in time")
        );
        // Off: the header timeout alone.
        let off = Timeouts {
            drain_grace: 0,
            ..t
        };
        assert!(matches!(head.check_at(d + 2000, &off), Verdict::Next(_)));

        let busy = Activity::new();
        busy.start_request();
        busy.write_blocked();
        busy.drain_begun();
        let d = busy.drain_ms.load(Ordering::Relaxed);
        assert!(matches!(busy.check_at(d + 1500, &t), Verdict::Next(_)));
        assert_eq!(
            busy.check_at(d + 2000, &t),
            Verdict::Close("drain: response not accepted in time")
        );
        // A client that reads keeps its response going.
        busy.write_ok();
        assert!(matches!(busy.check_at(d + 5000, &t), Verdict::Next(_)));
    }
}
