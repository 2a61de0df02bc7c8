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
//! A stand-in thread ([`StandIn`]) covers for the loop's thread while the
//! app keeps it out of the runtime (a blocking call in an async view, a
//! long CPU-bound step): it checks every [`STAND_IN_CHECK`] and, once the
//! thread has not entered a turn for a whole check, runs the runtime itself
//! (`block_on` on a current-thread runtime takes its core when nobody holds
//! it) until the next turn begins. So accepting, the health path, timeouts,
//! pings and the loop watchdog go on as in dual mode. It takes no GIL, and
//! normally only wakes to look at two atomics.
//!
//! Once the server's main task has ended (a drain, a quick stop), the loop
//! should stop; if its thread has not begun a turn for [`GIVE_UP_AFTER`]
//! by then, the stand-in gives up on it ([`super::give_up`]): the
//! worker's last log lines, then the process ends. A stuck app must not
//! keep a stopped worker, or an orphan of a dead master, alive.

use std::future::{poll_fn, Future};
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::thread::JoinHandle as ThreadHandle;
use std::time::{Duration, Instant};

use futures_util::task::AtomicWaker;
use parking_lot::Mutex;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

use crate::server::give_up::{Exit, GIVE_UP_AFTER};
use crate::server::run::RunError;
use crate::worker::{Stop, Worker};

/// A turn's result bits, read by `skirr.serve.TokioSelector`.
pub(crate) const EVENTS: u8 = 1;
/// The Python selector's epoll fd was readable.
pub(crate) const FDS: u8 = 2;
/// The server's main task ended: the loop should stop.
pub(crate) const FINISHED: u8 = 4;

/// How often the stand-in looks at the loop's thread; a thread out of the
/// runtime for one to two of these is covered for. 100 ms: the health path
/// answers within ~0.2 s of a block, for ten wakes a second of an idle
/// thread.
pub(crate) const STAND_IN_CHECK: Duration = Duration::from_millis(100);

/// The loop thread's turns, as the stand-in sees them.
#[derive(Default)]
struct Turns {
    /// The loop's thread is in a turn (or waiting for the stand-in to hand
    /// the runtime back).
    inside: AtomicBool,
    /// Turns begun: unchanged over a check while not `inside` means the
    /// thread has been away for the whole check.
    begun: AtomicU64,
    /// The stand-in's `block_on`, woken when a turn begins.
    back: AtomicWaker,
    /// The stand-in should end (`Single::finish`).
    stop: AtomicBool,
    /// The server's main task has ended: the loop should stop.
    ended: AtomicBool,
    /// Times the stand-in ran the runtime (reported at exit).
    covers: AtomicU64,
}

impl Turns {
    /// A turn begins: the stand-in hands the runtime back. The turn ends
    /// when the returned guard drops.
    fn enter(&self) -> Inside<'_> {
        self.inside.store(true, Ordering::SeqCst);
        self.begun.fetch_add(1, Ordering::Relaxed);
        self.back.wake();
        Inside(self)
    }

    /// Whether the stand-in should give the runtime back (or, with the
    /// server ended, stop running it).
    fn wanted_back(&self) -> bool {
        self.inside.load(Ordering::SeqCst)
            || self.stop.load(Ordering::SeqCst)
            || self.ended.load(Ordering::SeqCst)
    }

    /// The server's main task ended.
    fn end(&self) {
        self.ended.store(true, Ordering::SeqCst);
        self.back.wake();
    }
}

/// Tells the stand-in the main task ended, however it ends.
struct Ended(Arc<Turns>);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// Leaves the turn however `turn` returns.
struct Inside<'a>(&'a Turns);

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.inside.store(false, Ordering::SeqCst);
    }
}

/// The stand-in thread (see the module docs); stopped and joined on drop.
struct StandIn {
    turns: Arc<Turns>,
    thread: Option<ThreadHandle<()>>,
}

impl StandIn {
    /// Starts the thread (`skirr-stand-in`). Errors: the thread could not
    /// be spawned (then single mode runs without one, as before).
    fn start(rt: Arc<Runtime>, turns: Arc<Turns>, exit: Exit) -> std::io::Result<Self> {
        let t = Arc::clone(&turns);
        let thread = std::thread::Builder::new()
            .name("skirr-stand-in".into())
            .stack_size(2 * 1024 * 1024)
            .spawn(move || {
                stand_in(&rt, &t);
                if !t.stop.load(Ordering::SeqCst) {
                    give_up(&t, exit);
                }
            })?;
        Ok(Self {
            turns,
            thread: Some(thread),
        })
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.turns.stop.store(true, Ordering::SeqCst);
        self.turns.back.wake();
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// The stand-in's loop: every [`STAND_IN_CHECK`], if the loop's thread has
/// not begun a turn since the last check and is not in one, runs the
/// runtime until a turn begins. Returns when stopped, or when the server
/// has ended and the loop's thread has stayed away for [`GIVE_UP_AFTER`].
fn stand_in(rt: &Runtime, turns: &Turns) {
    let mut seen = turns.begun.load(Ordering::Relaxed);
    // When the stand-in first saw the server ended with the loop away
    // (again after each turn).
    let mut ended_seen: Option<Instant> = None;
    loop {
        std::thread::park_timeout(STAND_IN_CHECK);
        if turns.stop.load(Ordering::SeqCst) {
            return;
        }
        let begun = turns.begun.load(Ordering::Relaxed);
        if begun != seen || turns.inside.load(Ordering::SeqCst) {
            seen = begun;
            ended_seen = None;
            continue;
        }
        if turns.ended.load(Ordering::SeqCst) {
            // Nothing left to run: only wait for the loop to stop.
            if ended_seen.get_or_insert_with(Instant::now).elapsed() >= GIVE_UP_AFTER {
                return;
            }
            continue;
        }
        turns.covers.fetch_add(1, Ordering::Relaxed);
        rt.block_on(poll_fn(|cx| {
            // Registered before the check: a turn that begins after it
            // wakes this future.
            turns.back.register(cx.waker());
            if turns.wanted_back() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }));
        turns.back.take();
        seen = turns.begun.load(Ordering::Relaxed);
    }
}

/// The server has ended and the loop has not come back for
/// [`GIVE_UP_AFTER`]: ends the process ([`Exit::now`]) unless, checked
/// with the GIL held, a turn has begun meanwhile or `Single::finish` has
/// begun (then the stand-in goes on).
fn give_up(turns: &Arc<Turns>, exit: Exit) {
    let t = Arc::clone(turns);
    let begun = t.begun.load(Ordering::SeqCst);
    exit.now(Box::new(move || {
        !t.stop.load(Ordering::SeqCst)
            && !t.inside.load(Ordering::SeqCst)
            && t.begun.load(Ordering::SeqCst) == begun
    }));
}

/// The runtime and the server's main task, between `Server.start` and
/// `Server.finish`.
pub(crate) struct Single {
    rt: Arc<Runtime>,
    turns: Arc<Turns>,
    /// `None` if its thread could not be spawned.
    stand_in: Option<StandIn>,
    main: Mutex<Option<JoinHandle<Result<(), RunError>>>>,
    result: Mutex<Option<Result<(), RunError>>>,
    /// The Python selector's epoll fd and its registration with Tokio.
    epoll: Mutex<Option<(RawFd, Arc<AsyncFd<OwnedFd>>)>>,
}

impl Single {
    /// Takes the runtime and spawns the main task (which runs from the
    /// first turn on).
    /// `exit` ends the process if the stand-in gives up on a loop that
    /// does not stop (see the module docs).
    pub(crate) fn new<F>(rt: Runtime, main: F, exit: Exit) -> Self
    where
        F: Future<Output = Result<(), RunError>> + Send + 'static,
    {
        let turns = Arc::new(Turns::default());
        let t = Arc::clone(&turns);
        let main = rt.spawn(async move {
            // Dropped when the task ends, panics included.
            let _ended = Ended(t);
            main.await
        });
        let rt = Arc::new(rt);
        let stand_in = match StandIn::start(Arc::clone(&rt), Arc::clone(&turns), exit) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(
                    "loop_mode single: no stand-in thread ({e}): a blocked loop blocks Tokio too"
                );
                None
            }
        };
        Self {
            rt,
            turns,
            stand_in,
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
        let _inside = self.turns.enter();
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
        // First: from here on this thread alone runs the runtime.
        drop(self.stand_in);
        let covers = self.turns.covers.load(Ordering::Relaxed);
        if covers > 0 {
            tracing::info!("the stand-in thread ran Tokio while the loop was away ({covers}x)");
        }
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
        // The stand-in's clone is gone with its thread.
        if let Ok(rt) = Arc::try_unwrap(self.rt) {
            rt.shutdown_timeout(Duration::from_millis(100));
        }
        res
    }
}
