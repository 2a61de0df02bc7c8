//! The loop watchdog (issue 17, item 1): a worker whose asyncio loop is
//! blocked (a `time.sleep` or a CPU-bound call in an async view) stops
//! taking work it cannot do.
//!
//! * The loop side calls [`Watchdog::turned`] from a timer that runs every
//!   [`Watchdog::tick_interval`] (`skirr.serve` schedules it with
//!   `loop.call_later`): a late timer is a loop that does not turn.
//! * The Tokio side ([`Watchdog::run`]) checks the stamp as often. Once the
//!   loop has not turned for `loop_stall_timeout`, the worker is *stalled*:
//!   - acceptors on a listening socket the workers share stop calling
//!     `accept`, so the kernel hands new connections to the other workers
//!     (their epoll wakes too, and the first `accept` wins). A socket of
//!     this worker's own (`SO_REUSEPORT`: Gunicorn's `reuse_port`, one
//!     socket per worker) keeps being accepted: the kernel keeps hashing
//!     new connections to it whatever this worker does, and connections
//!     left in its queue would wait for the loop, or be reset if the
//!     master kills the worker; accepted, each gets a `503` at once;
//!   - requests read but not yet handed to the app (queued for the loop,
//!     or in the batch the loop took before it blocked) are answered `503`
//!     with `Retry-After` and `Connection: close`: the app never saw them,
//!     so any client may retry them, POSTs included;
//!   - requests that arrive meanwhile on open connections get the same.
//! * When the loop turns again, the worker accepts again.
//!
//! Nothing here takes the GIL: the stamp is an atomic written by the loop.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use tokio::sync::watch;

use crate::worker::clock::clock_ms;
use crate::worker::Worker;

/// The body of the watchdog's `503` (one line, as the server's other
/// answers).
pub(crate) const REASON: &str = "the server's event loop is blocked: retry";

/// `Retry-After` of the watchdog's `503`, in seconds (RFC 9110 §10.2.3):
/// another worker can take the retry at once.
const RETRY_AFTER_SECS: &str = "1";

/// Whether the loop runs, as seen from the Tokio side; see the module docs.
pub(crate) struct Watchdog {
    /// The bound in ms; 0: the watchdog is off.
    bound_ms: u64,
    /// [`clock_ms`] of the loop's last turn.
    last_turn: AtomicU64,
    /// Fast copy of the state, read per request.
    stalled: AtomicBool,
    /// The state, for acceptors to wait on: `true` while stalled.
    state: watch::Sender<bool>,
    /// Longest time between two turns outside stalls (ms: the tick
    /// interval plus the loop's lateness), and how many stalls there were:
    /// logged at exit, for choosing the bound.
    longest_gap: AtomicU64,
    stalls: AtomicU64,
    /// Refusals queued for the access log in this stall, and those left
    /// out past [`MAX_LOGGED_REFUSALS`].
    logged: AtomicU64,
    unlogged: AtomicU64,
}

/// Most access-log lines of refused requests queued during one stall: the
/// queue waits for the loop, so a long stall on a busy `reuse_port` socket
/// would otherwise hold a request head per refusal. The rest are counted
/// and reported in one line when the loop runs again.
const MAX_LOGGED_REFUSALS: u64 = 1024;

impl Watchdog {
    /// A watchdog with `bound` (`loop_stall_timeout`; zero: off).
    pub(crate) fn new(bound: Duration) -> Self {
        Self {
            bound_ms: bound.as_millis().min(u128::from(u64::MAX / 4)) as u64,
            last_turn: AtomicU64::new(0),
            stalled: AtomicBool::new(false),
            state: watch::channel(false).0,
            longest_gap: AtomicU64::new(0),
            stalls: AtomicU64::new(0),
            logged: AtomicU64::new(0),
            unlogged: AtomicU64::new(0),
        }
    }

    /// Whether the watchdog is on.
    pub(crate) fn enabled(&self) -> bool {
        self.bound_ms > 0
    }

    /// How often the loop stamps its turn and the Tokio side checks: a
    /// quarter of the bound, between 10 and 250 ms.
    pub(crate) fn tick_interval(&self) -> Duration {
        Duration::from_millis((self.bound_ms / 4).clamp(10, 250))
    }

    /// The loop turned: called on the asyncio thread.
    pub(crate) fn turned(&self) {
        let now = clock_ms();
        let prev = self.last_turn.swap(now, Ordering::Relaxed);
        if prev != 0 && !self.is_stalled() {
            self.longest_gap
                .fetch_max(now.saturating_sub(prev), Ordering::Relaxed);
        }
    }

    /// Whether the loop is stalled now (always false when off).
    pub(crate) fn is_stalled(&self) -> bool {
        self.stalled.load(Ordering::Relaxed)
    }

    /// The state to wait on (see [`Gate`]).
    pub(crate) fn subscribe(&self) -> watch::Receiver<bool> {
        self.state.subscribe()
    }

    /// Checks the loop until the runtime stops: see the module docs.
    pub(crate) async fn run(shared: Arc<Worker>) {
        let w = &shared.watchdog;
        if !w.enabled() {
            return;
        }
        w.turned();
        let mut tick = tokio::time::interval(w.tick_interval());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let gap = clock_ms().saturating_sub(w.last_turn.load(Ordering::Relaxed));
            if gap >= w.bound_ms {
                if !w.stalled.swap(true, Ordering::SeqCst) {
                    w.stalls.fetch_add(1, Ordering::Relaxed);
                    w.state.send_replace(true);
                    // Written now, not when the loop runs again.
                    tracing::warn!(
                        write_now = true,
                        "the event loop has not run for {gap} ms (loop_stall_timeout {} ms): \
                         not accepting on shared sockets; requests not yet in the app get 503",
                        w.bound_ms
                    );
                }
                // Again at every check: requests queued since the last.
                refuse_queued(&shared);
            } else {
                if w.stalled.swap(false, Ordering::SeqCst) {
                    w.state.send_replace(false);
                    w.logged.store(0, Ordering::Relaxed);
                    let unlogged = w.unlogged.swap(0, Ordering::Relaxed);
                    tracing::warn!(
                        "the event loop runs again: accepting{}",
                        if unlogged > 0 {
                            format!(
                                " ({unlogged} requests answered 503 meanwhile are not in the \
                                 access log: more than {MAX_LOGGED_REFUSALS})"
                            )
                        } else {
                            String::new()
                        }
                    );
                }
            }
        }
    }

    /// Whether a refused request's access-log line may be queued (see
    /// [`MAX_LOGGED_REFUSALS`]); counts it either way.
    pub(crate) fn may_log_refusal(&self) -> bool {
        if self.logged.fetch_add(1, Ordering::Relaxed) < MAX_LOGGED_REFUSALS {
            return true;
        }
        self.unlogged.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// One line for the log at exit: the longest gap between the loop's
    /// turns outside stalls, and the stalls.
    pub(crate) fn summary(&self) -> Option<String> {
        self.enabled().then(|| {
            format!(
                "loop watchdog: longest time between two turns {} ms (a turn every {} ms), {} stall(s)",
                self.longest_gap.load(Ordering::Relaxed),
                self.tick_interval().as_millis(),
                self.stalls.load(Ordering::Relaxed)
            )
        })
    }
}

/// Answers `503` to every request the loop has not handed to the app.
fn refuse_queued(shared: &Worker) {
    let mut refused = Vec::new();
    shared.queue.take_unstarted(&mut refused);
    for job in refused {
        job.refuse();
    }
}

/// Adds `Retry-After` to the server's own answer when it is the
/// watchdog's.
pub(crate) fn mark_refusal(reason: &str, headers: &mut HeaderMap) {
    if reason == REASON {
        retry_after(headers);
    }
}

/// Adds `Retry-After` to a refusal (this one or `limit_concurrency`'s).
pub(crate) fn retry_after(headers: &mut HeaderMap) {
    headers.insert(
        http::header::RETRY_AFTER,
        HeaderValue::from_static(RETRY_AFTER_SECS),
    );
}

/// An acceptor's view of the watchdog: on a socket the workers share,
/// accepting pauses while the loop is stalled.
pub(crate) struct Gate {
    rx: Option<watch::Receiver<bool>>,
}

impl Gate {
    /// The gate of one listening socket: shut while stalled unless the
    /// socket is this worker's own (`SO_REUSEPORT`), or the watchdog is off.
    pub(crate) fn new(shared: &Worker, fd: std::os::fd::BorrowedFd<'_>) -> Self {
        let own = nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::ReusePort)
            .unwrap_or(false);
        Gate {
            rx: (shared.watchdog.enabled() && !own).then(|| shared.watchdog.subscribe()),
        }
    }

    /// Returns once accepting may go on.
    pub(crate) async fn open(&mut self) {
        if let Some(rx) = &mut self.rx {
            let _ = rx.wait_for(|stalled| !*stalled).await;
        }
    }

    /// Returns once accepting must pause (never, for an open-only gate).
    pub(crate) async fn shut(&mut self) {
        match &mut self.rx {
            Some(rx) => {
                if rx.wait_for(|stalled| *stalled).await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending::<()>().await,
        }
    }
}
