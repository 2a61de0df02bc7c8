//! Python → Tokio wakeups, coalesced.
//!
//! Waking a Tokio task from a foreign thread costs a syscall (the runtime's
//! driver is unparked) and, on a busy core, a context switch. Instead, the
//! asyncio thread pushes the `Waker` of the task that waits into
//! [`Wakeups`], and the batch is handed over once:
//!
//! * inside the loop's reader callback (`Server.drain`), at its end;
//! * elsewhere (an app that completes after awaiting), by a flush scheduled
//!   with `loop.call_soon`, which runs after every callback already ready in
//!   this loop iteration: one handover per iteration, however many
//!   responses completed in it.
//!
//! The handover notifies a single dispatcher task, which wakes every pending
//! task from inside the runtime, where a wake is a queue push.
//!
//! In single-thread mode (`loop_mode = "single"`) nothing is scheduled:
//! the loop's selector runs the runtime itself and wakes what is pending at
//! the start of each turn ([`Wakeups::wake_pending`]), from inside it.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Waker;

use parking_lot::Mutex;
use pyo3::prelude::*;
use tokio::sync::Notify;

thread_local! {
    /// Set while the asyncio thread handles a batch of events.
    static DEFERRED: Cell<bool> = const { Cell::new(false) };
}

/// Pending wakeups for Tokio tasks, filled by the asyncio thread.
///
/// Bounded: each waiting Tokio task has at most one waker stored in its
/// exchange, and it is moved (not cloned) here.
pub(crate) struct Wakeups {
    wakers: Mutex<Vec<Waker>>,
    /// The dispatcher was notified and has not taken the batch yet.
    scheduled: AtomicBool,
    notify: Notify,
    /// `(loop.call_soon, flusher)`: how a flush is scheduled on the loop.
    call_soon: OnceLock<(Py<PyAny>, Py<PyAny>)>,
    /// A flush is scheduled on the loop and has not run yet.
    flush_pending: AtomicBool,
    /// Request heads the asyncio thread is done with, dropped by the
    /// dispatcher. Their header values share hyper's read buffer, which
    /// the Tokio thread allocated: freed there, it returns to that
    /// thread's allocator cache for the next request's read instead of
    /// crossing threads (bench/NOTES.md, entry 23).
    spent: Mutex<Vec<http::request::Parts>>,
    /// Single-thread mode: see the module docs.
    single: bool,
}

/// Calls [`Wakeups::flush`]; what `loop.call_soon` runs.
#[pyclass(frozen, module = "skirr._skirr")]
pub(crate) struct Flusher(Arc<Wakeups>);

#[pymethods]
impl Flusher {
    fn __call__(&self) {
        self.0.flush_pending.store(false, Ordering::Relaxed);
        self.0.flush();
    }
}

impl Wakeups {
    /// Wakeups for two threads, or for one (`single`: see the module docs).
    pub(crate) fn new(single: bool) -> Self {
        Self {
            wakers: Mutex::default(),
            scheduled: AtomicBool::new(false),
            notify: Notify::new(),
            call_soon: OnceLock::new(),
            flush_pending: AtomicBool::new(false),
            spent: Mutex::default(),
            single,
        }
    }

    /// Single mode: wakes every task Python woke since the last turn (the
    /// selector, inside the runtime, where a wake is a local queue push).
    pub(crate) fn wake_pending(&self) {
        // A wake here only pushes onto the runtime's local queue: nothing
        // re-enters this lock.
        for waker in self.wakers.lock().drain(..) {
            waker.wake();
        }
    }

    /// Connects the wakeups to the asyncio loop that schedules flushes.
    pub(crate) fn attach_loop(
        self: &Arc<Self>,
        py: Python<'_>,
        event_loop: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let call_soon = event_loop.getattr("call_soon")?.unbind();
        let flusher = Py::new(py, Flusher(Arc::clone(self)))?.into_any();
        let _ = self.call_soon.set((call_soon, flusher));
        Ok(())
    }

    /// Schedules `waker` to be woken by the dispatcher task. Called on the
    /// asyncio thread only.
    pub(crate) fn wake(&self, waker: Waker) {
        self.wakers.lock().push(waker);
        if self.single
            || DEFERRED.with(Cell::get)
            || self.flush_pending.swap(true, Ordering::Relaxed)
        {
            return;
        }
        let scheduled = self.call_soon.get().is_some_and(|(call_soon, flusher)| {
            Python::attach(|py| call_soon.bind(py).call1((flusher.bind(py),)).is_ok())
        });
        if !scheduled {
            self.flush_pending.store(false, Ordering::Relaxed);
            self.kick();
        }
    }

    fn kick(&self) {
        if !self.scheduled.swap(true, Ordering::SeqCst) {
            self.notify.notify_one();
        }
    }

    /// Hands a request head over to be dropped on the Tokio side, with the
    /// batch's wakes; outside a batch it is dropped here. Bounded: only a
    /// batch pushes, and the batch's end hands them over.
    pub(crate) fn retire(&self, parts: http::request::Parts) {
        // One thread: dropped here, where it was allocated.
        if !self.single && DEFERRED.with(Cell::get) {
            self.spent.lock().push(parts);
        }
    }

    fn flush(&self) {
        // Single mode: the next turn wakes them from inside the runtime;
        // kicking the dispatcher from here (outside it) would cost a
        // remote schedule and an unpark (an eventfd write) per batch.
        if self.single {
            return;
        }
        if !self.wakers.lock().is_empty() || !self.spent.lock().is_empty() {
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
        let mut spent = Vec::with_capacity(64);
        loop {
            self.notify.notified().await;
            self.scheduled.store(false, Ordering::SeqCst);
            std::mem::swap(&mut *self.wakers.lock(), &mut batch);
            std::mem::swap(&mut *self.spent.lock(), &mut spent);
            spent.clear();
            for waker in batch.drain(..) {
                waker.wake();
            }
        }
    }
}

/// Restores immediate scheduling and hands over what was deferred.
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
