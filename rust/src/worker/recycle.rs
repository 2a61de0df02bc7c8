//! `max_requests` recycles that never overlap, under a Gunicorn master with
//! two or more workers.
//!
//! Gunicorn starts a worker's replacement only once the old one has
//! exited, so two workers draining at once (each reached its limit) leave
//! no worker accepting: new connections wait in the backlog until a
//! replacement boots. The workers of one master share a file (created by
//! `skirr.RustWorker` in the master, before the fork; its descriptor is
//! `recycle_lock_fd`) and take POSIX record locks on it, which the kernel
//! drops when a process exits, however it exits:
//!
//! * byte 0: held by a worker while it drains, until it exits;
//! * bytes 1..=[`SLOTS`]: each worker that accepts holds one.
//!
//! A worker that reaches `max_requests` recycles only when no other worker
//! drains and another accepts (its replacement has booted); until then it
//! keeps serving, checking every [`RETRY`], for at most [`max_defer`].
//! Drains ordered by a signal (SIGTERM, HUP) never wait.

use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::fcntl::{fcntl, FcntlArg};
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::worker::{Stop, Worker};

/// Lock slots for accepting workers (more workers than this share none:
/// they count as not accepting, and defer to the bound).
pub(crate) const SLOTS: i64 = 256;
/// How often a deferred recycle looks again.
const RETRY: Duration = Duration::from_millis(100);

/// The longest a recycle is deferred: the other worker's drain is bounded
/// by `graceful_timeout`, its replacement's boot is not; twice the
/// timeout, at least 10 s.
pub(crate) fn max_defer(cfg: &crate::config::Config) -> Duration {
    (cfg.graceful_timeout * 2).max(Duration::from_secs(10))
}

/// This worker's part in the shared lock file.
pub(crate) struct Recycle {
    fd: OwnedFd,
    /// The accepting slot this worker holds.
    slot: Mutex<Option<i64>>,
    /// `max_requests` was reached.
    reached: AtomicBool,
    wake: Notify,
}

fn flock(kind: libc::c_int, start: i64) -> libc::flock {
    // SAFETY: `libc::flock` is a plain C struct of integers, for which all
    // zeroes is a valid value (the fields that matter are set below).
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = kind as libc::c_short;
    l.l_whence = libc::SEEK_SET as libc::c_short;
    l.l_start = start;
    l.l_len = 1;
    l
}

impl Recycle {
    /// Takes part through `fd` (the master's file; duplicated, the caller
    /// keeps its own). Errors: `dup(2)`.
    pub(crate) fn new(fd: RawFd) -> std::io::Result<Self> {
        // SAFETY: `fd` is a descriptor the worker keeps open for its life
        // (`skirr.RustWorker`); it is only duplicated here.
        let fd = nix::unistd::dup(unsafe { BorrowedFd::borrow_raw(fd) })?;
        Ok(Recycle {
            fd,
            slot: Mutex::new(None),
            reached: AtomicBool::new(false),
            wake: Notify::new(),
        })
    }

    fn set(&self, kind: libc::c_int, start: i64) -> bool {
        fcntl(&self.fd, FcntlArg::F_SETLK(&flock(kind, start))).is_ok()
    }

    /// Whether another process holds a lock on byte `start` (a process's
    /// own locks never conflict with it, so they do not show).
    fn held_by_other(&self, start: i64) -> bool {
        let mut l = flock(libc::F_WRLCK, start);
        match fcntl(&self.fd, FcntlArg::F_GETLK(&mut l)) {
            Ok(_) => l.l_type != libc::F_UNLCK as libc::c_short,
            Err(_) => false,
        }
    }

    /// This worker accepts: it takes a free slot.
    pub(crate) fn accepting(&self) {
        let mut slot = self.slot.lock();
        if slot.is_none() {
            *slot = (1..=SLOTS).find(|&s| self.set(libc::F_WRLCK, s));
        }
    }

    /// This worker drains: it gives its slot up and marks the drain (held
    /// until the process exits). Another drain (HUP) may hold the mark:
    /// this one goes on regardless.
    pub(crate) fn draining(&self) {
        if let Some(s) = self.slot.lock().take() {
            self.set(libc::F_UNLCK, s);
        }
        self.set(libc::F_WRLCK, 0);
    }

    /// Whether a recycle now leaves a worker accepting: no other worker
    /// drains, and another accepts.
    pub(crate) fn clear(&self) -> bool {
        !self.held_by_other(0) && (1..=SLOTS).any(|s| self.held_by_other(s))
    }

    /// `max_requests` was reached (once; the deferring task stops the
    /// server when [`Recycle::clear`]).
    pub(crate) fn reached(&self) {
        if !self.reached.swap(true, Ordering::Relaxed) {
            self.wake.notify_one();
        }
    }
}

/// Stops the server for its `max_requests` recycle, at once or, under a
/// [`Recycle`] lock, once it is clear (see the module docs).
pub(crate) fn stop_for_max_requests(shared: &Worker, served: u64) {
    match &shared.recycle {
        Some(r) => r.reached(),
        None => stop_now(shared, served),
    }
}

fn stop_now(shared: &Worker, served: u64) {
    tracing::info!("Autorestarting worker after current request ({served} requests served).");
    shared.drain.set_recycle();
    shared.request_stop(Stop::Graceful("max requests"));
}

/// The task that waits for `max_requests` and a clear moment (started by
/// `run` once the worker accepts).
pub(crate) fn spawn(shared: &Arc<Worker>) {
    let Some(r) = &shared.recycle else { return };
    r.accepting();
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        let Some(r) = &shared.recycle else { return };
        r.wake.notified().await;
        let bound = max_defer(&shared.config);
        let start = tokio::time::Instant::now();
        let mut told = false;
        while !r.clear() && start.elapsed() < bound {
            if !told {
                tracing::info!(
                    "max requests reached while another worker drains or boots: \
                     serving on until it accepts (at most {bound:?})"
                );
                told = true;
            }
            tokio::time::sleep(RETRY).await;
        }
        stop_now(&shared, shared.requests_served());
    });
}
