//! Tokio → Python event queue.
//!
//! The queue is bounded by construction rather than by a counter: every
//! connection has at most one request event in flight, each exchange is
//! enqueued for attention at most once at a time (see
//! `Exchange::needs_python`), log records are capped (see
//! [`PyQueue::push_log`]), and a forwarded signal waits at most once.

use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Waker;

use nix::sys::eventfd::{EfdFlags, EventFd};
use parking_lot::Mutex;

use pyo3::Python;

/// Most log records waiting for the asyncio thread; further records are
/// counted and reported in one line once the queue drains.
const MAX_PENDING_LOGS: usize = 1024;

/// In batching mode, a queue this long is announced at once instead of at
/// the runtime's next park: it bounds the wait of the first event.
const FLUSH_AT: usize = 64;

/// One log line for Python's `logging`.
pub(crate) struct LogRecord {
    /// A `logging` level: 10 DEBUG, 20 INFO, 30 WARNING, 40 ERROR.
    pub(crate) level: u8,
    pub(crate) message: String,
}

/// Work a protocol hands the asyncio thread: a new request to start, a
/// lifespan command, an access-log line. It carries its own context, so the
/// queue names no protocol.
pub(crate) trait Job: Send {
    /// Does the work (asyncio thread, from the loop's reader callback).
    fn run(self: Box<Self>, py: Python<'_>);

    /// Whether this is a request no app call has started for, which the
    /// loop watchdog answers itself while the loop is stalled (see
    /// [`PyQueue::take_unstarted`]).
    fn refusable(&self) -> bool {
        false
    }

    /// Answers a [`refusable`](Job::refusable) request without the app
    /// (a Tokio thread); may queue its access-log line.
    fn refuse(self: Box<Self>) {}
}

/// Something with news for Python waiters (an HTTP exchange, a WebSocket):
/// queued at most once at a time.
pub(crate) trait Wake: Send + Sync {
    /// Clears its "queued" mark, before [`wake`](Wake::wake): news that
    /// arrives meanwhile queues it again.
    fn unqueue(&self);

    /// Hands the news to the waiters (asyncio thread).
    fn wake(self: Arc<Self>, py: Python<'_>);
}

/// Work for the asyncio thread.
pub(crate) enum Event {
    /// A request to start, a lifespan command, an access-log line.
    Run(Box<dyn Job>),
    /// An exchange or a WebSocket has news for a Python waiter (body data,
    /// space for a response chunk, or the client went away).
    Wake(Arc<dyn Wake>),
    /// A log line from a Tokio thread, to be written through Python logging.
    Log(LogRecord),
    /// Reopen log files (SIGUSR1).
    ReopenLogs,
    /// A signal the app registered with `loop.add_signal_handler` arrived
    /// (at most one per signal number in the queue: see the worker's
    /// signal forwarding).
    Signal(i32),
}

/// A multi-producer queue drained by the asyncio loop's reader callback.
pub(crate) struct PyQueue {
    events: Mutex<Vec<Event>>,
    /// True from the first push after a drain until the next drain: only
    /// that first push pays for the eventfd write.
    notified: AtomicBool,
    efd: EventFd,
    /// Announce events when the Tokio thread is about to park (see
    /// [`PyQueue::flush`]) rather than on every push, so one wakeup of the
    /// asyncio thread carries every request that arrived in one tick.
    batching: bool,
    pending_logs: AtomicUsize,
    dropped_logs: AtomicUsize,
    /// The batch the asyncio thread took and is handling, one event at a
    /// time ([`PyQueue::next_taken`]): kept here, not on that thread's
    /// stack, so the loop watchdog can answer the requests in it the app
    /// has not started if the loop blocks midway ([`PyQueue::take_unstarted`]).
    taken: Mutex<VecDeque<Event>>,
    /// Single-thread mode (`loop_mode = "single"`): the loop's selector
    /// runs the runtime on this same thread and waits on [`PyQueue::waiter`]
    /// instead of the eventfd, which is never written.
    single: bool,
    /// In single mode, the selector's wait (`server::single`) while it is
    /// pending: announcing events wakes it.
    waiter: Mutex<Option<Waker>>,
}

impl PyQueue {
    /// Creates the queue and its non-blocking eventfd.
    ///
    /// Errors: the `eventfd(2)` failure (e.g. `EMFILE`).
    /// `single`: announce events to [`PyQueue::set_waiter`]'s waker instead
    /// of the eventfd (one thread runs both sides).
    pub(crate) fn new(batching: bool, single: bool) -> std::io::Result<Self> {
        let efd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?;
        Ok(Self {
            events: Mutex::new(Vec::with_capacity(256)),
            notified: AtomicBool::new(false),
            efd,
            batching,
            pending_logs: AtomicUsize::new(0),
            dropped_logs: AtomicUsize::new(0),
            taken: Mutex::new(VecDeque::with_capacity(256)),
            single,
            waiter: Mutex::new(None),
        })
    }

    /// The file descriptor the asyncio loop watches for readability.
    pub(crate) fn fd(&self) -> RawFd {
        self.efd.as_fd().as_raw_fd()
    }

    /// Queues an event. Without batching, wakes the asyncio thread at once
    /// (if not already woken); with batching, only once the queue is long.
    pub(crate) fn push(&self, event: Event) {
        let len = {
            let mut q = self.events.lock();
            q.push(event);
            q.len()
        };
        if !self.batching || len >= FLUSH_AT {
            self.notify();
        }
    }

    /// Wakes the asyncio thread if events wait: called by the Tokio thread
    /// just before it parks (`on_thread_park`), i.e. once per tick.
    pub(crate) fn flush(&self) {
        if !self.events.lock().is_empty() {
            self.notify();
        }
    }

    /// Whether events wait to be taken (single mode's selector checks it
    /// before it waits).
    pub(crate) fn has_events(&self) -> bool {
        !self.events.lock().is_empty()
    }

    /// Single mode: `waker` is woken when events are next announced.
    pub(crate) fn set_waiter(&self, waker: &Waker) {
        let mut w = self.waiter.lock();
        match &*w {
            Some(old) if old.will_wake(waker) => {}
            _ => *w = Some(waker.clone()),
        }
    }

    fn notify(&self) {
        if self.single {
            // Same thread: the selector's wait is woken (a runtime unpark),
            // once per batch as below.
            if !self.notified.swap(true, Ordering::Relaxed) {
                if let Some(w) = self.waiter.lock().take() {
                    w.wake();
                }
            }
            return;
        }
        if !self.notified.swap(true, Ordering::SeqCst) {
            // EAGAIN only if the counter would overflow, which needs 2^64
            // unread writes: the reader is already woken in that case.
            let _ = self.efd.write(1);
        }
    }

    /// Queues a log record unless too many are already waiting.
    pub(crate) fn push_log(&self, record: LogRecord) {
        if self.pending_logs.fetch_add(1, Ordering::Relaxed) >= MAX_PENDING_LOGS {
            self.pending_logs.fetch_sub(1, Ordering::Relaxed);
            self.dropped_logs.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.push(Event::Log(record));
    }

    /// Called for each log record taken off the queue.
    pub(crate) fn log_taken(&self) {
        self.pending_logs.fetch_sub(1, Ordering::Relaxed);
    }

    /// How many log records were dropped since the last call.
    pub(crate) fn take_dropped_logs(&self) -> usize {
        self.dropped_logs.swap(0, Ordering::Relaxed)
    }

    /// Moves every queued event into `out` (which must be empty).
    ///
    /// Runs on the asyncio thread. The flag is cleared *before* the swap, so
    /// a push racing with this call either lands in this batch or wakes the
    /// loop again: no event is ever left without a wakeup.
    pub(crate) fn take_into(&self, out: &mut Vec<Event>) {
        debug_assert!(out.is_empty());
        if !self.single {
            let _ = self.efd.read();
        }
        self.notified.store(false, Ordering::SeqCst);
        std::mem::swap(&mut *self.events.lock(), out);
    }

    /// Takes every queued event as the batch to handle (asyncio thread);
    /// `scratch` is an empty buffer kept between calls.
    pub(crate) fn take_batch(&self, scratch: &mut Vec<Event>) {
        self.take_into(scratch);
        self.taken.lock().extend(scratch.drain(..));
    }

    /// The batch's next event (asyncio thread).
    pub(crate) fn next_taken(&self) -> Option<Event> {
        self.taken.lock().pop_front()
    }

    /// Moves every queued log record, queued or in the batch being
    /// handled, into `out`: for a thread other than the asyncio one that
    /// writes them while the loop is stuck (the watchdog's stall warning,
    /// a worker's last lines). Other events stay where they are.
    pub(crate) fn take_logs(&self, out: &mut Vec<LogRecord>) {
        self.sift(|e| match e {
            Event::Log(record) => {
                self.log_taken();
                out.push(record);
                None
            }
            other => Some(other),
        });
    }

    /// Moves every [refusable](Job::refusable) job (a request no app call
    /// has started for), queued or in the batch being handled, into `out`
    /// (the Tokio side, when the loop is stalled: the asyncio thread takes
    /// each event from under the same locks, so a request is either started
    /// or taken here, never both). Boxed as in `Event`: each may go back
    /// into the queue as its access-log line without a new allocation.
    pub(crate) fn take_unstarted(&self, out: &mut Vec<Box<dyn Job>>) {
        self.sift(|e| match e {
            Event::Run(job) if job.refusable() => {
                out.push(job);
                None
            }
            other => Some(other),
        });
    }

    /// Passes every event, in the batch being handled and then in the
    /// queue, to `pick`, which keeps it (returns it, order kept) or takes
    /// it (returns `None`); under the locks the asyncio thread takes
    /// events from.
    fn sift(&self, mut pick: impl FnMut(Event) -> Option<Event>) {
        {
            let mut taken = self.taken.lock();
            let old = std::mem::take(&mut *taken);
            taken.extend(old.into_iter().filter_map(&mut pick));
        }
        let mut events = self.events.lock();
        let old = std::mem::take(&mut *events);
        events.extend(old.into_iter().filter_map(&mut pick));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(q: &PyQueue) -> bool {
        // A non-blocking read succeeds only if the eventfd was written.
        let mut buf = [0u8; 8];
        nix::unistd::read(&q.efd, &mut buf).is_ok()
    }

    #[test]
    fn unbatched_push_notifies_once_until_drained() {
        let q = PyQueue::new(false, false).unwrap();
        q.push(Event::ReopenLogs);
        q.push(Event::ReopenLogs);
        assert!(pending(&q));
        assert!(
            !pending(&q),
            "the second push must not write the eventfd again"
        );
        let mut out = Vec::new();
        q.take_into(&mut out);
        assert_eq!(out.len(), 2);
        q.push(Event::ReopenLogs);
        assert!(pending(&q), "after a drain the next push notifies again");
    }

    #[test]
    fn batched_push_waits_for_flush_or_threshold() {
        let q = PyQueue::new(true, false).unwrap();
        q.push(Event::ReopenLogs);
        assert!(!pending(&q), "batched: no wakeup per push");
        q.flush();
        assert!(pending(&q), "flush (runtime park) announces the batch");
        let mut out = Vec::new();
        q.take_into(&mut out);
        for _ in 0..FLUSH_AT {
            q.push(Event::ReopenLogs);
        }
        assert!(
            pending(&q),
            "a long queue is announced without waiting for a park"
        );
    }

    #[test]
    fn single_mode_wakes_the_waiter_not_the_eventfd() {
        struct Flag(AtomicBool);
        impl std::task::Wake for Flag {
            fn wake(self: Arc<Self>) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let q = PyQueue::new(true, true).unwrap();
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        q.set_waiter(&Waker::from(Arc::clone(&flag)));
        q.push(Event::ReopenLogs);
        assert!(q.has_events());
        assert!(!flag.0.load(Ordering::SeqCst), "batched until the park");
        q.flush();
        assert!(flag.0.load(Ordering::SeqCst), "the park wakes the turn");
        assert!(!pending(&q), "the eventfd is never written");
        let mut out = Vec::new();
        q.take_into(&mut out);
        assert_eq!(out.len(), 1);
        assert!(!q.has_events());
    }

    #[test]
    fn flush_of_an_empty_queue_does_nothing() {
        let q = PyQueue::new(true, false).unwrap();
        q.flush();
        assert!(!pending(&q));
    }
}
