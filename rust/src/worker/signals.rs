//! Signals the app asks for with `loop.add_signal_handler()`.
//!
//! The asyncio loop runs in its own thread, where Python cannot install
//! signal handlers (`set_wakeup_fd` works only in the main thread, and the
//! main thread is inside the Tokio runtime). So Skirr's loop forwards such a
//! registration here (see `skirr.serve`): the signal is caught by Tokio, and
//! each delivery becomes an [`Event::Signal`] that the loop's reader hands
//! to the Python dispatcher, which runs the app's callback with
//! `loop.call_soon`. The signals Skirr acts on itself ([`OWNED`]) cannot be
//! forwarded.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::task::{Context, Poll};

use parking_lot::Mutex;
use pyo3::prelude::*;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::mpsc;

use crate::bridge::queue::{Event, PyQueue};

/// Signals the worker handles itself (see `run::watch_signals`).
pub(crate) const OWNED: [i32; 5] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGABRT,
];

/// Forwarded signals not yet taken by the signal task: at most one per
/// signal number (Python dedups registrations), so this bounds the channel.
const MAX_SIGNALS: usize = 64;

/// Per-worker forwarding state; see the module docs.
pub(crate) struct Forwarding {
    /// The runtime, once it runs: signals are registered from the asyncio
    /// thread through it, so a registration is in force (and its errors
    /// known) when `add_signal_handler` returns.
    runtime: OnceLock<tokio::runtime::Handle>,
    tx: mpsc::Sender<(i32, Signal)>,
    rx: Mutex<Option<mpsc::Receiver<(i32, Signal)>>>,
    /// Bit `n` set: an `Event::Signal(n)` waits in the queue. Further
    /// deliveries meanwhile coalesce into it, as POSIX signals do.
    queued: AtomicU64,
    /// `dispatch(signum)` on the loop's thread.
    pub(crate) dispatch: OnceLock<Py<PyAny>>,
}

impl Default for Forwarding {
    fn default() -> Self {
        let (tx, rx) = mpsc::channel(MAX_SIGNALS);
        Self {
            runtime: OnceLock::new(),
            tx,
            rx: Mutex::new(Some(rx)),
            queued: AtomicU64::new(0),
            dispatch: OnceLock::new(),
        }
    }
}

fn bit(signum: i32) -> u64 {
    1u64 << (signum.clamp(0, 63) as u32)
}

impl Forwarding {
    /// The runtime is up (called once, when it starts).
    pub(crate) fn attach(&self, rt: tokio::runtime::Handle) {
        let _ = self.runtime.set(rt);
    }

    /// The signal task's end of the channel (taken once).
    pub(crate) fn take_receiver(&self) -> Option<mpsc::Receiver<(i32, Signal)>> {
        self.rx.lock().take()
    }

    /// Starts catching `signum` for the app.
    ///
    /// Errors (one line): a signal Skirr handles itself, one that cannot
    /// be caught (`SIGKILL`, `SIGSTOP`, and the fault signals Tokio
    /// refuses), a runtime that is not running.
    pub(crate) fn forward(&self, signum: i32) -> Result<(), String> {
        if OWNED.contains(&signum) {
            return Err(format!("signal {signum} is handled by Skirr"));
        }
        if !(1..64).contains(&signum) {
            return Err(format!("signal {signum} is out of range"));
        }
        let rt = self
            .runtime
            .get()
            .ok_or_else(|| "the server is not running".to_owned())?;
        let _in_runtime = rt.enter();
        let stream = signal(SignalKind::from_raw(signum))
            .map_err(|e| format!("signal {signum} cannot be caught: {e}"))?;
        self.tx
            .try_send((signum, stream))
            .map_err(|_| "too many signals registered at once".to_owned())
    }

    /// A forwarded signal arrived (Tokio thread): queue it for the loop,
    /// unless it already waits there.
    pub(crate) fn arrived(&self, signum: i32, queue: &PyQueue) {
        if self.queued.fetch_or(bit(signum), Ordering::AcqRel) & bit(signum) == 0 {
            queue.push(Event::Signal(signum));
        }
    }

    /// The loop took `Event::Signal(signum)` (asyncio thread): runs the
    /// dispatcher; its errors are logged by the caller.
    pub(crate) fn deliver(&self, py: Python<'_>, signum: i32) -> PyResult<()> {
        self.queued.fetch_and(!bit(signum), Ordering::AcqRel);
        match self.dispatch.get() {
            Some(d) => d.call1(py, (signum,)).map(drop),
            None => Ok(()),
        }
    }
}

/// Polls the forwarded signal streams: the number of one that fired.
pub(crate) fn poll_forwarded(streams: &mut [(i32, Signal)], cx: &mut Context<'_>) -> Poll<i32> {
    for (n, s) in streams.iter_mut() {
        if let Poll::Ready(Some(())) = s.poll_recv(cx) {
            return Poll::Ready(*n);
        }
    }
    Poll::Pending
}
