//! Listening sockets and the accept loop.
//!
//! Sockets are created by Gunicorn's master (or by `python -m skirr`) and
//! inherited; Skirr duplicates their descriptors and accepts on them.

use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::asgi::conn::{AltSvc, ListenerInfo, LocalAddr};
use crate::asgi::context::AppContext;
use crate::proto::{self, Builders};
use crate::server::accept;
use crate::server::admission;
use crate::worker::watchdog::Gate;
use crate::worker::Worker;

/// A listening socket before the runtime exists.
pub(crate) enum StdListener {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
}

impl StdListener {
    /// Wraps a duplicate of `fd`. `kind` is `"tcp"` or `"unix"`.
    ///
    /// Errors: `dup(2)` failures, an unknown `kind`, or a socket that is
    /// not listening.
    pub(crate) fn from_fd(fd: RawFd, kind: &str) -> io::Result<Self> {
        let dup = nix::unistd::dup(
            // SAFETY: `fd` is a descriptor the caller keeps open for the
            // duration of this call; we only duplicate it.
            unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
        )?;
        let owned: OwnedFd = dup;
        let l = match kind {
            "tcp" => StdListener::Tcp(std::net::TcpListener::from(owned)),
            "unix" => StdListener::Unix(std::os::unix::net::UnixListener::from(owned)),
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("unknown listener kind {other:?} (expected 'tcp' or 'unix')"),
                ))
            }
        };
        match &l {
            StdListener::Tcp(t) => t.set_nonblocking(true)?,
            StdListener::Unix(u) => u.set_nonblocking(true)?,
        }
        Ok(l)
    }

    /// Where it is bound.
    pub(crate) fn local(&self) -> io::Result<LocalAddr> {
        Ok(match self {
            StdListener::Tcp(t) => LocalAddr::Tcp(t.local_addr()?),
            StdListener::Unix(u) => LocalAddr::Unix(
                u.local_addr()?
                    .as_pathname()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
            ),
        })
    }
}

/// Where connection tasks are tracked (to wait for them at shutdown) and
/// the connection limit.
#[derive(Clone)]
pub(crate) struct ConnControl {
    pub(crate) tracker: TaskTracker,
    pub(crate) limit: Option<Arc<Semaphore>>,
    /// The drivers' hyper builders.
    pub(crate) builders: Arc<Builders>,
    /// The application context the connections' requests run in.
    pub(crate) app: Arc<AppContext>,
}

fn is_fd_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOBUFS) | Some(libc::ENOMEM)
    )
}

/// A free slot of the connection limit, taken as a connection is
/// accepted (before the acceptor waits for the next one).
fn try_slot(limit: &Option<Arc<Semaphore>>) -> Option<OwnedSemaphorePermit> {
    Arc::clone(limit.as_ref()?).try_acquire_owned().ok()
}

/// The slot of an accepted connection: `early` ([`try_slot`]), else, when
/// a QUIC connection took the last free one since the acceptor saw it
/// free, the next one to free up. `None` without a limit.
async fn slot(
    early: Option<OwnedSemaphorePermit>,
    limit: Option<Arc<Semaphore>>,
) -> Option<OwnedSemaphorePermit> {
    match early {
        Some(p) => Some(p),
        None => limit?.acquire_owned().await.ok(),
    }
}

/// Accepts connections until `stop` is cancelled; `alt_svc`: the
/// listener's HTTP/3 twin, announced in its responses.
///
/// With a connection limit, accepting waits for a free slot, so excess
/// clients wait in the kernel backlog. When descriptors run out, accepting
/// pauses (logged once per episode); existing connections are unaffected.
pub(crate) async fn accept_loop(
    listener: StdListener,
    shared: Arc<Worker>,
    control: ConnControl,
    stop: CancellationToken,
    alt_svc: Option<Arc<AltSvc>>,
) -> io::Result<()> {
    let info = Arc::new(ListenerInfo {
        local: listener.local()?,
        app: Arc::clone(&control.app),
        py_server: OnceLock::new(),
        alt_svc,
    });
    enum L {
        Tcp(TcpListener),
        Unix(UnixListener),
    }
    // Paused while the asyncio loop is stalled (see `watchdog`).
    let mut gate = {
        use std::os::fd::AsFd;
        match &listener {
            StdListener::Tcp(t) => Gate::new(&shared, t.as_fd()),
            StdListener::Unix(u) => Gate::new(&shared, u.as_fd()),
        }
    };
    impl std::os::fd::AsRawFd for L {
        fn as_raw_fd(&self) -> RawFd {
            match self {
                L::Tcp(t) => t.as_raw_fd(),
                L::Unix(u) => u.as_raw_fd(),
            }
        }
    }
    let l = match listener {
        StdListener::Tcp(t) => L::Tcp(TcpListener::from_std(t)?),
        StdListener::Unix(u) => L::Unix(UnixListener::from_std(u)?),
    };
    let mut exhausted = false;
    loop {
        let permit = match &control.limit {
            Some(sem) => tokio::select! {
                p = Arc::clone(sem).acquire_owned() => match p {
                    Ok(p) => Some(p),
                    Err(_) => break,
                },
                // Every slot held: newcomers waiting get slots in turn.
                _ = admission::while_full(&shared, &l) => break,
                _ = stop.cancelled() => break,
            },
            None => None,
        };
        // The slot is free now; it is taken once a connection is accepted,
        // so that an idle acceptor holds none (a QUIC connection may use it).
        drop(permit);
        tokio::select! {
            _ = gate.open() => {}
            _ = stop.cancelled() => break,
        }
        let res = match &l {
            L::Tcp(t) => tokio::select! {
                r = t.accept() => r.map(|(s, peer)| spawn_tcp(s, peer, &shared, &info, &control)),
                _ = stop.cancelled() => break,
                _ = gate.shut() => continue,
            },
            L::Unix(u) => tokio::select! {
                r = u.accept() => r.map(|(s, _)| {
                    let (shared, info) = (Arc::clone(&shared), Arc::clone(&info));
                    let (builders, limit) = (Arc::clone(&control.builders), control.limit.clone());
                    let early = try_slot(&limit);
                    control.tracker.spawn(async move {
                        let permit = slot(early, limit).await;
                        proto::serve(s, shared, info, builders, None, permit, None).await
                    });
                }),
                _ = stop.cancelled() => break,
                _ = gate.shut() => continue,
            },
        };
        match res {
            Ok(()) => exhausted = false,
            Err(e) if is_fd_exhaustion(&e) => {
                if !exhausted {
                    tracing::error!(
                        "accept failed: {e}; pausing accepts until descriptors free up \
                         (existing connections keep being served)"
                    );
                    exhausted = true;
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    _ = stop.cancelled() => break,
                }
            }
            // ECONNABORTED and friends concern one client only.
            Err(e) => tracing::debug!("accept failed: {e}"),
        }
    }
    if let (L::Tcp(t), true) = (&l, shared.config.own_listeners) {
        hand_over(t, &shared, &info, &control);
    }
    Ok(())
}

/// Serves an accepted TCP connection (TLS and the PROXY protocol first,
/// where configured) as a tracked task, in a connection slot.
fn spawn_tcp(
    s: TcpStream,
    peer: SocketAddr,
    shared: &Arc<Worker>,
    info: &Arc<ListenerInfo>,
    control: &ConnControl,
) {
    let _ = s.set_nodelay(true);
    let (shared, info) = (Arc::clone(shared), Arc::clone(info));
    let (builders, limit) = (Arc::clone(&control.builders), control.limit.clone());
    let early = try_slot(&limit);
    if shared.tls.is_some() || shared.config.proxy_protocol.is_some() {
        control.tracker.spawn(async move {
            let permit = slot(early, limit).await;
            accept::serve_tcp(s, shared, info, builders, peer, permit).await
        });
    } else {
        control.tracker.spawn(async move {
            let permit = slot(early, limit).await;
            proto::serve(s, shared, info, builders, Some(peer), permit, None).await
        });
    }
}

/// Stops a listener of this worker's own (`own_listeners`, Gunicorn's
/// `reuse_port`) taking connections: takes those the kernel has queued on
/// it, then shuts it down, which takes it out of its `SO_REUSEPORT` group,
/// so new connections go to the other workers' sockets. Left open until the
/// process exits (Python holds it too), it was still handed its share of
/// new connections, which waited unanswered and were reset at the exit.
/// Those that complete their handshake between the last accept and the
/// shutdown are still reset, unless `net.ipv4.tcp_migrate_req` is 1 (the
/// kernel then moves them to another socket of the group).
fn hand_over(
    t: &TcpListener,
    shared: &Arc<Worker>,
    info: &Arc<ListenerInfo>,
    control: &ConnControl,
) {
    use nix::sys::socket::{accept4, shutdown, Shutdown, SockFlag};
    use std::os::fd::{AsRawFd, FromRawFd};
    let mut taken = 0;
    loop {
        // The socket itself, not tokio's readiness: connections queued
        // since the reactor last looked count too.
        let fd = match accept4(
            t.as_raw_fd(),
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        ) {
            Ok(fd) => fd,
            Err(nix::errno::Errno::EINTR | nix::errno::Errno::ECONNABORTED) => continue,
            Err(_) => break,
        };
        // SAFETY: `accept4` returned a new descriptor that nothing else owns.
        let std = unsafe { std::net::TcpStream::from_raw_fd(fd) };
        let (Ok(peer), Ok(s)) = (std.peer_addr(), TcpStream::from_std(std)) else {
            continue;
        };
        spawn_tcp(s, peer, shared, info, control);
        taken += 1;
    }
    if let Err(e) = shutdown(t.as_raw_fd(), Shutdown::Both) {
        tracing::debug!("shutting the listener down failed: {e}");
    }
    tracing::debug!("listener handed over ({taken} queued connection(s) taken)");
}
