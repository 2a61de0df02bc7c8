//! Fair admission when every connection slot is held (`max_connections`,
//! Gunicorn's `worker_connections`).
//!
//! With every slot taken, newcomers wait in the kernel's backlog; busy
//! keep-alive clients would keep their slots for as long as they like, so
//! a newcomer could wait forever. While the accept loop waits for a slot,
//! every [`TICK`] it looks whether a connection is waiting in the backlog;
//! if so, the HTTP connections that have held a slot for [`HOLD`] or more
//! are retired, oldest first: each finishes its current response, which
//! says `Connection: close` (a drain order for that connection alone, see
//! `proto::h1`), and frees its slot. WebSockets are never retired.
//!
//! The bound: slots turn over at least every `HOLD` + `TICK` plus one
//! response, so a newcomer behind `q` waiting connections is accepted
//! within about `(q / slots + 1) × (HOLD + TICK)` plus a response time.

use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use crate::worker::Worker;

/// How often a full worker looks at its backlog.
pub(crate) const TICK: Duration = Duration::from_millis(100);
/// How long a connection holds a slot before it can be retired for a
/// newcomer.
pub(crate) const HOLD: Duration = Duration::from_millis(250);

/// Whether a connection waits in `fd`'s accept queue (a listening socket
/// is readable then).
fn has_waiting(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `p` is one valid `pollfd` for the call's duration; a zero
    // timeout never blocks; `fd` is the caller's open listening socket.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & libc::POLLIN != 0
}

/// Runs while the accept loop waits for a free slot (never returns; the
/// loop drops it when a slot frees): see the module docs.
pub(crate) async fn while_full(shared: &Worker, listener: &impl AsRawFd) {
    let fd = listener.as_raw_fd();
    loop {
        tokio::time::sleep(TICK).await;
        if has_waiting(fd) {
            let n = shared.connections.retire_oldest(HOLD);
            if n > 0 {
                tracing::debug!("every connection slot held, newcomers waiting: retiring {n}");
            }
        }
    }
}
