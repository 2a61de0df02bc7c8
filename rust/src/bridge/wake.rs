//! Python → Tokio wakeups, coalesced.
//!
//! Waking a Tokio task from a foreign thread costs a syscall (the runtime's
//! driver is unparked). Instead, the asyncio thread pushes the `Waker` of the
//! task that waits into [`Wakeups`]; only the first push after a dispatch
//! notifies the single dispatcher task, which then wakes every pending task
//! from inside the runtime, where a wake is a queue push.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Waker;

use parking_lot::Mutex;
use tokio::sync::Notify;

thread_local! {
    /// Set while the asyncio thread handles a batch of events: wakes are
    /// collected and flushed once when the batch ends.
    static DEFERRED: Cell<bool> = const { Cell::new(false) };
}

/// Pending wakeups for Tokio tasks, filled by the asyncio thread.
///
/// Bounded: each waiting Tokio task has at most one waker stored in its
/// exchange, and it is moved (not cloned) here.
#[derive(Default)]
pub(crate) struct Wakeups {
    wakers: Mutex<Vec<Waker>>,
    scheduled: AtomicBool,
    notify: Notify,
}

impl Wakeups {
    /// Schedules `waker` to be woken by the dispatcher task.
    pub(crate) fn wake(&self, waker: Waker) {
        self.wakers.lock().push(waker);
        if !DEFERRED.with(Cell::get) {
            self.kick();
        }
    }

    fn kick(&self) {
        if !self.scheduled.swap(true, Ordering::SeqCst) {
            self.notify.notify_one();
        }
    }

    fn flush(&self) {
        if !self.wakers.lock().is_empty() {
            self.kick();
        }
    }

    /// Defers wakes on this thread until the returned guard is dropped.
    pub(crate) fn defer(self: &Arc<Self>) -> DeferGuard {
        let was = DEFERRED.with(|d| d.replace(true));
        DeferGuard {
            wakeups: Arc::clone(self),
            was,
        }
    }

    /// The dispatcher: runs on the Tokio runtime until the runtime stops.
    pub(crate) async fn dispatch(self: Arc<Self>) {
        let mut batch = Vec::with_capacity(64);
        loop {
            self.notify.notified().await;
            self.scheduled.store(false, Ordering::SeqCst);
            std::mem::swap(&mut *self.wakers.lock(), &mut batch);
            for waker in batch.drain(..) {
                waker.wake();
            }
        }
    }
}

/// Restores immediate wakes and flushes what was deferred.
pub(crate) struct DeferGuard {
    wakeups: Arc<Wakeups>,
    was: bool,
}

impl Drop for DeferGuard {
    fn drop(&mut self) {
        DEFERRED.with(|d| d.set(self.was));
        if !self.was {
            self.wakeups.flush();
        }
    }
}
