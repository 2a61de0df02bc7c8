//! Giving up on an event loop that does not stop: the server has ended (a
//! drain, a quick stop, an orphan's stop) but the app keeps the loop's
//! thread (a blocking call, a busy loop, a C call that holds the GIL).
//!
//! The worker then writes its last log lines and ends the process with
//! `_exit(0)`: status 0 as after any finished drain, and no interpreter
//! shutdown, which would run `atexit` handlers (Python's, OpenSSL's) under
//! a thread still inside Python and, in dual mode, unwind that thread
//! through pyo3's frames at `Py_Finalize` (an abort, status 134).
//!
//! Used by single mode's stand-in thread ([`super::single`]) and, in dual
//! mode, by [`ExitGuard`] when the GIL never comes back to the main thread
//! after the server ended (the Python side gives up itself otherwise, see
//! `skirr.serve`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::Thread;
use std::time::{Duration, Instant};

use pyo3::Python;

use crate::bridge::context::LoopCtx;
use crate::bridge::queue::PyQueue;

/// How long the loop may keep its thread once the server has ended: 5 s,
/// as `skirr.serve.LOOP_JOIN_TIMEOUT`.
pub(crate) const GIVE_UP_AFTER: Duration = Duration::from_secs(5);

/// How long the last lines wait for the GIL before the final one goes to
/// stderr instead and the process exits anyway.
const GIL_WAIT: Duration = Duration::from_secs(1);

/// The final log line.
pub(crate) fn last_line() -> String {
    format!(
        "the event loop did not stop within {}s of the server's end \
         (the app blocks its thread): exiting",
        GIVE_UP_AFTER.as_secs()
    )
}

/// Whether the loop is still away; read with the GIL held, so the app's
/// thread cannot run Python between the answer and the exit.
pub(crate) type StillAway = Box<dyn Fn() -> bool + Send>;

/// Ends the process with its last lines; see the module docs.
pub(crate) struct Exit {
    loop_ctx: Arc<LoopCtx>,
    queue: Arc<PyQueue>,
}

impl Exit {
    pub(crate) fn new(loop_ctx: Arc<LoopCtx>, queue: Arc<PyQueue>) -> Self {
        Self { loop_ctx, queue }
    }

    /// From a thread that holds no GIL: a thread of its own takes the GIL,
    /// checks `still_away`, writes the queued lines and [`last_line`] and
    /// exits. Returns only if `still_away` said no (the loop came back).
    /// If the GIL does not come within 1 s, the line goes to stderr
    /// (`skirr: ...`) and the process exits from here.
    pub(crate) fn now(self, still_away: StillAway) {
        let (answer, wait) = std::sync::mpsc::sync_channel::<()>(1);
        let Self { loop_ctx, queue } = self;
        let writer = std::thread::Builder::new()
            .name("skirr-last-words".into())
            .spawn(move || {
                Python::attach(|py| {
                    if !still_away() {
                        return;
                    }
                    crate::logging::write_queued(py, &queue, &loop_ctx);
                    loop_ctx.log(py, 30, &last_line());
                    exit_now();
                });
                let _ = answer.send(());
            });
        match writer.map(|_| wait.recv_timeout(GIL_WAIT)) {
            Ok(Ok(())) => {}
            // The GIL stays taken (or no thread): the app's thread cannot
            // run Python either.
            _ => {
                eprintln!("skirr: {}", last_line());
                exit_now();
            }
        }
    }
}

/// `_exit(0)`: see the module docs.
fn exit_now() -> ! {
    // SAFETY: ends the process at once; nothing runs after it.
    unsafe { libc::_exit(0) }
}

/// Dual mode: armed when the server ends on the main thread, disarmed when
/// that thread has the GIL again (then Python gives up on the loop itself).
/// If it is still armed [`GIVE_UP_AFTER`] + 2 s later, the app holds the
/// GIL for good: [`Exit::now`].
pub(crate) struct ExitGuard {
    disarmed: Arc<AtomicBool>,
    /// The guard's thread, unparked on disarm.
    thread: Option<Thread>,
}

impl ExitGuard {
    /// Starts the guard's thread; without one (spawn failed) it guards
    /// nothing.
    pub(crate) fn arm(exit: Exit) -> Self {
        let disarmed = Arc::new(AtomicBool::new(false));
        let d = Arc::clone(&disarmed);
        let thread = std::thread::Builder::new()
            .name("skirr-exit-guard".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                let until = Instant::now() + GIVE_UP_AFTER + Duration::from_secs(2);
                while !d.load(Ordering::SeqCst) {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        exit.now(Box::new(move || !d.load(Ordering::SeqCst)));
                        return;
                    }
                    std::thread::park_timeout(left);
                }
            })
            .ok()
            .map(|t| t.thread().clone());
        Self { disarmed, thread }
    }
}

impl Drop for ExitGuard {
    /// Disarms without joining: the caller holds the GIL, which a guard
    /// firing at this very moment would wait for.
    fn drop(&mut self) {
        self.disarmed.store(true, Ordering::SeqCst);
        if let Some(t) = &self.thread {
            t.unpark();
        }
    }
}
