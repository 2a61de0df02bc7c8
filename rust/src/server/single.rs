//! Single-thread mode (`loop_mode = "single"`): the asyncio loop and the
//! Tokio runtime on one thread, the process's main thread.
//!
//! Python's selector for the loop (`skirr.serve.TokioSelector`, a standard
//! `selectors.EpollSelector` underneath) calls [`Single::turn`] instead of
//! waiting in `epoll_wait` itself. A turn runs the current-thread runtime
//! (`block_on`) until one of these is true, then returns:
//!
//! * the Python selector's epoll fd is readable (it is registered with
//!   Tokio's reactor as an `AsyncFd`: nested epoll), i.e. a Python fd is
//!   ready — the loop's self-pipe too, so `call_soon_threadsafe` from other
//!   threads and Python-level signal handlers end a turn;
//! * the bridge queue has events for Python (connection tasks ran inside
//!   the turn and queued requests): Python then runs `Server.drain` as if
//!   the eventfd had been readable;
//! * the loop's timeout passed (`None`: no timeout; `0`: one pass over the
//!   ready Tokio tasks and a non-blocking poll of the reactor);
//! * the server's main task (`run::run`) ended.
//!
//! Wakeups from Python to Tokio tasks are kept until the next turn, which
//! wakes them from inside the runtime (a local queue push, no syscall). The
//! GIL is released during a turn (`detach`): threads of the app (e.g.
//! `run_in_executor`) run while the loop waits, as with any selector.
//!
//! What this mode gives up: while the app blocks the loop, nothing of
//! Tokio runs either — no accepting, no health path, no timeouts or pings,
//! no loop watchdog (`loop_stall_timeout` is off in this mode).

use std::future::{poll_fn, Future};
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

use crate::server::run::RunError;
use crate::worker::{Stop, Worker};

/// A turn's result bits, read by `skirr.serve.TokioSelector`.
pub(crate) const EVENTS: u8 = 1;
/// The Python selector's epoll fd was readable.
pub(crate) const FDS: u8 = 2;
/// The server's main task ended: the loop should stop.
pub(crate) const FINISHED: u8 = 4;

/// The runtime and the server's main task, between `Server.start` and
/// `Server.finish`.
pub(crate) struct Single {
    rt: Runtime,
    main: Mutex<Option<JoinHandle<Result<(), RunError>>>>,
    result: Mutex<Option<Result<(), RunError>>>,
    /// The Python selector's epoll fd and its registration with Tokio.
    epoll: Mutex<Option<(RawFd, Arc<AsyncFd<OwnedFd>>)>>,
}

impl Single {
    /// Takes the runtime and spawns the main task (which runs from the
    /// first turn on).
    pub(crate) fn new<F>(rt: Runtime, main: F) -> Self
    where
        F: Future<Output = Result<(), RunError>> + Send + 'static,
    {
        let main = rt.spawn(main);
        Self {
            rt,
            main: Mutex::new(Some(main)),
            result: Mutex::new(None),
            epoll: Mutex::new(None),
        }
    }

    /// Registers `epfd` with the reactor (once; again if it changed).
    /// Inside the runtime.
    fn epoll(&self, epfd: RawFd) -> std::io::Result<Arc<AsyncFd<OwnedFd>>> {
        let mut e = self.epoll.lock();
        if let Some((fd, a)) = &*e {
            if *fd == epfd {
                return Ok(Arc::clone(a));
            }
        }
        *e = None;
        // A duplicate of Python's epoll fd (the same epoll instance): ours
        // to keep open for the registration's life, whatever Python does
        // with its own.
        // SAFETY: `epfd` is the selector's open epoll fd, handed in for
        // this call; it is only borrowed to be duplicated.
        let owned = unsafe { BorrowedFd::borrow_raw(epfd) }.try_clone_to_owned()?;
        // SAFETY: `owned` is open, and the same fd, until the AsyncFd
        // drops it.
        let a = unsafe { AsyncFd::register_with_interest(owned, Interest::READABLE) }?;
        let a = Arc::new(a);
        *e = Some((epfd, Arc::clone(&a)));
        Ok(a)
    }

    /// Polls the main task; stores its result once it ends.
    fn poll_main(&self, cx: &mut std::task::Context<'_>) -> bool {
        let mut main = self.main.lock();
        let Some(h) = main.as_mut() else {
            return true;
        };
        let Poll::Ready(r) = Pin::new(h).poll(cx) else {
            return false;
        };
        *main = None;
        *self.result.lock() = Some(r.unwrap_or_else(|e| {
            Err(RunError::Io(std::io::Error::other(format!(
                "the server task failed: {e}"
            ))))
        }));
        true
    }

    /// One turn (see the module docs): `timeout` as the selector's (`None`
    /// waits without bound). Returns [`EVENTS`] | [`FDS`] | [`FINISHED`].
    pub(crate) fn turn(
        &self,
        w: &Worker,
        epfd: RawFd,
        timeout: Option<Duration>,
    ) -> std::io::Result<u8> {
        self.rt.block_on(async {
            w.wakeups.wake_pending();
            let ep = self.epoll(epfd)?;
            let blocking = timeout != Some(Duration::ZERO);
            if !blocking {
                // One pass over the ready tasks and the reactor.
                tokio::task::yield_now().await;
            }
            let mut sleep = timeout
                .filter(|_| blocking)
                .map(|t| Box::pin(tokio::time::sleep(t)));
            let flags = poll_fn(|cx| {
                let mut flags = 0;
                if self.poll_main(cx) {
                    flags |= FINISHED;
                }
                if w.queue.has_events() {
                    flags |= EVENTS;
                }
                if let Poll::Ready(Ok(mut g)) = ep.poll_read_ready(cx) {
                    // Cleared before Python reads its epoll: what becomes
                    // ready after this sets it again.
                    g.clear_ready();
                    flags |= FDS;
                }
                if flags != 0 || !blocking {
                    return Poll::Ready(flags);
                }
                if let Some(s) = sleep.as_mut() {
                    if s.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(0);
                    }
                }
                w.queue.set_waiter(cx.waker());
                Poll::Pending
            })
            .await;
            Ok(flags)
        })
    }

    /// Ends single mode: stops the server if it still runs (quick: the loop
    /// no longer turns), lets the main task finish, shuts the runtime down.
    pub(crate) fn finish(self, w: &Worker) -> Result<(), RunError> {
        {
            let _in = self.rt.enter();
            *self.epoll.lock() = None;
        }
        let main = self.main.lock().take();
        if let Some(h) = main {
            w.request_stop(Stop::Quick("the event loop stopped"));
            let r = self.rt.block_on(h);
            *self.result.lock() = Some(r.unwrap_or_else(|e| {
                Err(RunError::Io(std::io::Error::other(format!(
                    "the server task failed: {e}"
                ))))
            }));
        }
        let res = self.result.lock().take().unwrap_or(Ok(()));
        self.rt.shutdown_timeout(Duration::from_millis(100));
        res
    }
}
