//! Listening sockets and the accept loop.
//!
//! Sockets are created by Gunicorn's master (or by `python -m skirr`) and
//! inherited; Skirr duplicates their descriptors and accepts on them.

use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};
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
                    Err(_) => return Ok(()),
                },
                // Every slot held: newcomers waiting get slots in turn.
                _ = admission::while_full(&shared, &l) => return Ok(()),
                _ = stop.cancelled() => return Ok(()),
            },
            None => None,
        };
        // The slot is free now; it is taken once a connection is accepted,
        // so that an idle acceptor holds none (a QUIC connection may use it).
        drop(permit);
        tokio::select! {
            _ = gate.open() => {}
            _ = stop.cancelled() => return Ok(()),
        }
        let res = match &l {
            L::Tcp(t) => tokio::select! {
                r = t.accept() => r.map(|(s, peer)| {
                    let _ = s.set_nodelay(true);
                    let (shared, info) = (Arc::clone(&shared), Arc::clone(&info));
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
                }),
                _ = stop.cancelled() => return Ok(()),
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
                _ = stop.cancelled() => return Ok(()),
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
                    _ = stop.cancelled() => return Ok(()),
                }
            }
            // ECONNABORTED and friends concern one client only.
            Err(e) => tracing::debug!("accept failed: {e}"),
        }
    }
}
