//! Every live connection of a worker, so the server can order them to
//! drain, send WebSocket "going away" closes, or abort.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::Waker;

use parking_lot::Mutex;

use crate::worker::clock::clock_ms;

/// What the server asks of a connection.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub(crate) enum Order {
    Serve = 0,
    /// Finish the in-flight response, then close. Open WebSockets carry on.
    Drain = 1,
    /// The drain deadline passed: WebSockets send close 1001 ("going
    /// away"); HTTP connections close at once.
    GoingAway = 2,
    /// Close at once.
    Abort = 3,
}

/// A connection's stop signal: an atomic the connection reads when polled
/// (one load per wake, instead of polling cancellation futures), plus its
/// task's waker so the server can wake it when the order changes.
#[derive(Default)]
struct ConnSignal {
    order: AtomicU8,
    waker: Mutex<Option<Waker>>,
    /// When the connection joined ([`clock_ms`]).
    since_ms: u64,
    /// A WebSocket: never retired for a newcomer (`server::admission`).
    websocket: AtomicBool,
}

impl ConnSignal {
    fn order(&self) -> Order {
        match self.order.load(Ordering::Acquire) {
            0 => Order::Serve,
            1 => Order::Drain,
            2 => Order::GoingAway,
            _ => Order::Abort,
        }
    }
}

#[derive(Default)]
struct Registry {
    next: u64,
    order: u8,
    live: HashMap<u64, Arc<ConnSignal>>,
}

/// Every live connection of a worker, so that a drain or an abort reaches
/// each of them. Touched once when a connection opens and once when it
/// closes; never per request.
#[derive(Default)]
pub(crate) struct Connections {
    inner: Mutex<Registry>,
}

/// A connection's membership in [`Connections`]; leaves on drop.
pub(crate) struct Member<'a> {
    conns: &'a Connections,
    id: u64,
    signal: Arc<ConnSignal>,
}

impl Member<'_> {
    /// The current order for this connection.
    pub(crate) fn order(&self) -> Order {
        self.signal.order()
    }

    /// The connection became a WebSocket (see `server::admission`).
    pub(crate) fn mark_websocket(&self) {
        self.signal.websocket.store(true, Ordering::Relaxed);
    }

    /// Stores the task's waker so an order can wake it (call once: a Tokio
    /// task's waker stays valid for the task's life).
    pub(crate) fn register(&self, waker: &Waker) {
        *self.signal.waker.lock() = Some(waker.clone());
    }
}

impl Drop for Member<'_> {
    fn drop(&mut self) {
        self.conns.inner.lock().live.remove(&self.id);
    }
}

impl Connections {
    /// Registers a connection (HTTP or WebSocket) for the server's orders.
    pub(crate) fn join(&self) -> Member<'_> {
        let mut r = self.inner.lock();
        r.next += 1;
        let id = r.next;
        let signal = Arc::new(ConnSignal {
            order: AtomicU8::new(r.order),
            waker: Mutex::new(None),
            since_ms: clock_ms(),
            websocket: AtomicBool::new(false),
        });
        r.live.insert(id, Arc::clone(&signal));
        Member {
            conns: self,
            id,
            signal,
        }
    }

    /// Sends an order to every connection, current and future.
    pub(crate) fn order_all(&self, order: Order) {
        let mut r = self.inner.lock();
        r.order = r.order.max(order as u8);
        for signal in r.live.values() {
            signal.order.fetch_max(order as u8, Ordering::AcqRel);
            // Wake by reference: a later order must be able to wake it too.
            if let Some(w) = signal.waker.lock().as_ref() {
                w.wake_by_ref();
            }
        }
    }

    /// Orders the HTTP connections (not WebSockets) still serving that
    /// joined at least `hold` ago to drain — finish the current response,
    /// with `Connection: close` — so newcomers get their slots
    /// (`server::admission`). Returns how many.
    pub(crate) fn retire_oldest(&self, hold: std::time::Duration) -> usize {
        let r = self.inner.lock();
        if r.order != Order::Serve as u8 {
            return 0;
        }
        let before = clock_ms().saturating_sub(hold.as_millis() as u64);
        let mut n = 0;
        for signal in r.live.values() {
            if signal.since_ms <= before
                && !signal.websocket.load(Ordering::Relaxed)
                && signal
                    .order
                    .compare_exchange(
                        Order::Serve as u8,
                        Order::Drain as u8,
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            {
                n += 1;
                if let Some(w) = signal.waker.lock().as_ref() {
                    w.wake_by_ref();
                }
            }
        }
        n
    }

    /// How many connections are open.
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().live.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_order_wakes_the_connection() {
        use std::sync::atomic::AtomicUsize;
        use std::task::Wake;

        struct Counter(AtomicUsize);
        impl Wake for Counter {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let counter = Arc::new(Counter(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&counter));
        let conns = Connections::default();
        let m = conns.join();
        m.register(&waker);
        conns.order_all(Order::Drain);
        assert_eq!(m.order(), Order::Drain);
        conns.order_all(Order::GoingAway);
        assert_eq!(m.order(), Order::GoingAway);
        assert_eq!(
            counter.0.load(Ordering::SeqCst),
            2,
            "the second order must wake too"
        );
        let late = conns.join();
        assert_eq!(
            late.order(),
            Order::GoingAway,
            "a later connection gets the order"
        );
        drop(m);
        drop(late);
        assert_eq!(conns.len(), 0);
    }

    #[test]
    fn retiring_skips_websockets_young_and_already_ordered_connections() {
        let conns = Connections::default();
        let old = conns.join();
        let ws = conns.join();
        ws.mark_websocket();
        assert_eq!(conns.retire_oldest(std::time::Duration::ZERO), 1);
        assert_eq!(old.order(), Order::Drain);
        assert_eq!(ws.order(), Order::Serve, "a WebSocket is never retired");
        assert_eq!(conns.retire_oldest(std::time::Duration::ZERO), 0, "once");
        let young = conns.join();
        assert_eq!(conns.retire_oldest(std::time::Duration::from_secs(3600)), 0);
        assert_eq!(young.order(), Order::Serve);
        conns.order_all(Order::Drain);
        assert_eq!(
            conns.retire_oldest(std::time::Duration::ZERO),
            0,
            "draining already"
        );
    }
}
