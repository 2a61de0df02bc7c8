//! A worker's life, in order: signals → lifespan startup → accept → stop
//! signal → stop accepting → drain in-flight requests (bounded by the
//! graceful timeout) → lifespan shutdown → return.

use std::future::poll_fn;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{watch, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::asgi::conn::{AltSvc, LocalAddr};
use crate::asgi::context::AppContext;
use crate::asgi::lifespan;
use crate::bridge::queue::Event;
use crate::proto::{self, Builders};
use crate::server::listen::{accept_loop, ConnControl, StdListener};
use crate::worker::connections::Order;
use crate::worker::{signals, Stop, Worker};

/// Why serving ended in error.
#[derive(Debug)]
pub(crate) enum RunError {
    /// Lifespan startup failed: the app's message.
    Startup(String),
    Io(io::Error),
}

impl From<io::Error> for RunError {
    fn from(e: io::Error) -> Self {
        RunError::Io(e)
    }
}

/// How often the parent pid is checked (an orphan exits within a second).
const PARENT_CHECK: Duration = Duration::from_millis(250);
/// After an abort, how long connection tasks get to unwind.
const ABORT_GRACE: Duration = Duration::from_millis(500);
/// After close 1001 went out, how long WebSocket peers get to answer it.
const GOING_AWAY_GRACE: Duration = Duration::from_secs(2);
/// The same on a quick stop (SIGQUIT; SIGINT under Gunicorn).
const QUICK_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// How long a graceful stop drains, then how long WebSockets get for the
/// close handshake after their 1001. Standalone: `graceful_timeout`, then
/// [`GOING_AWAY_GRACE`]. Under Gunicorn (a `parent_pid` to watch) the
/// master kills the worker at `graceful_timeout`, so both fit inside it:
/// the handshake gets up to half of it, at most `GOING_AWAY_GRACE`.
fn drain_deadlines(cfg: &crate::config::Config) -> (Duration, Duration) {
    let total = cfg.graceful_timeout;
    match cfg.parent_pid {
        Some(_) => {
            let grace = GOING_AWAY_GRACE.min(total / 2);
            (total - grace, grace)
        }
        None => (total, GOING_AWAY_GRACE),
    }
}

async fn next_stop(rx: &mut watch::Receiver<Option<Stop>>) -> Stop {
    loop {
        if let Some(s) = *rx.borrow_and_update() {
            return s;
        }
        if rx.changed().await.is_err() {
            return Stop::Quick("stop channel closed");
        }
    }
}

async fn next_quick(rx: &mut watch::Receiver<Option<Stop>>) {
    loop {
        if let Some(Stop::Quick(_)) = *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Registers the worker's signals. SIGTERM: graceful. SIGINT: graceful
/// standalone (a second one is quick), quick under Gunicorn. SIGQUIT:
/// quick. SIGUSR1: reopen log files. SIGABRT (Gunicorn's timeout): the
/// signal hook, then exit 1. INT, QUIT and ABRT run the signal hook first.
/// Signals the app registers later are forwarded to the loop (see
/// [`signals`](crate::worker::signals)).
fn watch_signals(shared: Arc<Worker>) -> io::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut quit = signal(SignalKind::quit())?;
    let mut usr1 = signal(SignalKind::user_defined1())?;
    let mut abrt = signal(SignalKind::from_raw(libc::SIGABRT))?;
    let mut requests = shared.signals.take_receiver();
    let mut forwarded = Vec::new();
    tokio::spawn(async move {
        let mut interrupted = false;
        loop {
            tokio::select! {
                Some(s) = async { requests.as_mut()?.recv().await } => forwarded.push(s),
                n = poll_fn(|cx| signals::poll_forwarded(&mut forwarded, cx)) => {
                    shared.signals.arrived(n, &shared.queue);
                }
                Some(()) = term.recv() => shared.request_stop(Stop::Graceful("SIGTERM")),
                Some(()) = int.recv() => {
                    shared.signal_hook("SIGINT");
                    // After any stop signal, SIGINT forces the stop (as
                    // uvicorn's handler does).
                    if shared.config.sigint_graceful && !interrupted && !shared.stop_requested() {
                        interrupted = true;
                        shared.request_stop(Stop::Graceful("SIGINT"));
                    } else {
                        shared.request_stop(Stop::Quick("SIGINT"));
                    }
                }
                Some(()) = quit.recv() => {
                    shared.signal_hook("SIGQUIT");
                    shared.request_stop(Stop::Quick("SIGQUIT"));
                }
                Some(()) = abrt.recv() => {
                    tracing::error!("SIGABRT (the worker timed out): exiting");
                    if !shared.abort_hook_once() {
                        shared.wait_abort_hook();
                    }
                    std::process::exit(1);
                }
                Some(()) = usr1.recv() => shared.queue.push(Event::ReopenLogs),
                else => break,
            }
        }
    });
    Ok(())
}

fn watch_parent(shared: Arc<Worker>, ppid: u32) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PARENT_CHECK);
        loop {
            tick.tick().await;
            if nix::unistd::getppid().as_raw() as u32 != ppid {
                tracing::warn!("Parent changed, shutting down");
                shared.request_stop(Stop::Quick("parent died"));
                return;
            }
        }
    });
}

/// The worker's listeners: the inherited TCP and Unix ones (with their
/// `Alt-Svc`, if HTTP/3 is on), and the UDP endpoints it bound itself.
struct Bound {
    stream: Vec<(StdListener, Option<Arc<AltSvc>>)>,
    quic: Vec<(quinn::Endpoint, Arc<AltSvc>)>,
}

/// Binds an HTTP/3 endpoint beside each TCP listener when `h3` is set
/// (after fork: each worker its own UDP socket, see `proto::h3`).
///
/// Errors: a UDP socket that cannot be bound (a boot error).
fn bind(
    listeners: Vec<StdListener>,
    h3: Option<&proto::h3::Setup>,
    cfg: &crate::config::Config,
) -> io::Result<Bound> {
    let mut bound = Bound {
        stream: Vec::with_capacity(listeners.len()),
        quic: Vec::new(),
    };
    for l in listeners {
        let alt = match (h3, l.local()?) {
            (Some(setup), LocalAddr::Tcp(addr)) => {
                let endpoint = proto::h3::bind(addr, setup, cfg)?;
                let alt = Arc::new(AltSvc::new(endpoint.local_addr()?.port()));
                bound.quic.push((endpoint, Arc::clone(&alt)));
                Some(alt)
            }
            _ => None,
        };
        bound.stream.push((l, alt));
    }
    Ok(bound)
}

fn spawn_acceptors(
    bound: Option<Bound>,
    shared: &Arc<Worker>,
    control: &ConnControl,
    stop: &CancellationToken,
    h3: Option<&Arc<proto::h3::Setup>>,
) -> Vec<tokio::task::JoinHandle<io::Result<()>>> {
    let Some(bound) = bound else {
        return Vec::new();
    };
    let mut tasks: Vec<_> = bound
        .stream
        .into_iter()
        .map(|(l, alt)| {
            tokio::spawn(accept_loop(
                l,
                Arc::clone(shared),
                control.clone(),
                stop.clone(),
                alt,
            ))
        })
        .collect();
    if let Some(setup) = h3 {
        for (endpoint, alt) in bound.quic {
            let serve = proto::h3::serve(
                (endpoint, alt),
                Arc::clone(shared),
                Arc::clone(&control.app),
                Arc::clone(setup),
                control.tracker.clone(),
                control.limit.clone(),
                stop.clone(),
            );
            tasks.push(tokio::spawn(async move {
                serve.await;
                Ok(())
            }));
        }
    }
    tasks
}

/// `drain_delay` (issue 19): on SIGTERM, the health path already answers
/// 503 and the worker keeps accepting and serving for this long, so a load
/// balancer sees it fail before its connections start closing. A quick
/// stop cuts it short. Returns the time spent.
async fn drain_delay(
    shared: &Worker,
    stop: Stop,
    stop_rx: &mut watch::Receiver<Option<Stop>>,
) -> Duration {
    let delay = shared.config.drain_delay;
    if delay.is_zero() || stop != Stop::Graceful("SIGTERM") {
        return Duration::ZERO;
    }
    tracing::info!("SIGTERM: serving {delay:?} more (drain_delay) before draining");
    let t0 = tokio::time::Instant::now();
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = next_quick(stop_rx) => {}
    }
    t0.elapsed()
}

/// Serves until a stop is requested; see the module docs.
pub(crate) async fn run(
    app: Arc<AppContext>,
    listeners: Vec<StdListener>,
    h3: Option<Arc<proto::h3::Setup>>,
) -> Result<(), RunError> {
    let shared = Arc::clone(&app.shared);
    tokio::spawn(Arc::clone(&shared.wakeups).dispatch());
    watch_signals(Arc::clone(&shared))?;
    if let Some(fd) = shared.config.metrics_fd {
        // Scrapes are answered from the start, during lifespan startup too.
        tokio::spawn(crate::metrics::serve(
            crate::metrics::listener(fd)?,
            shared.metrics,
        ));
    }
    if let Some(ppid) = shared.config.parent_pid {
        watch_parent(Arc::clone(&shared), ppid);
    }
    let mut stop_rx = shared.stop_rx();

    let cfg = &shared.config;
    let control = ConnControl {
        tracker: shared.tracker.clone(),
        limit: (cfg.max_connections > 0).then(|| Arc::new(Semaphore::new(cfg.max_connections))),
        builders: Arc::new(Builders::new(cfg, shared.tracker.clone())),
        app: Arc::clone(&app),
    };
    let stop_accept = CancellationToken::new();
    let mut acceptors = Vec::new();
    let mut listeners = Some(bind(listeners, h3.as_deref(), cfg)?);
    // With a health path, accepting starts before lifespan startup, so the
    // path can say "starting" (other requests wait for startup); not where
    // other workers share the socket (`accept_during_startup`).
    if shared.health.enabled() && cfg.accept_during_startup {
        acceptors = spawn_acceptors(
            listeners.take(),
            &shared,
            &control,
            &stop_accept,
            h3.as_ref(),
        );
    }

    let started = tokio::select! {
        r = lifespan::startup(&app) => r.map_err(RunError::Startup),
        s = next_stop(&mut stop_rx) => {
            tracing::info!("stopped during startup ({s:?})");
            stop_accept.cancel();
            return Ok(());
        }
    };
    let lifespan_running = match started {
        Ok(running) => running,
        Err(e) => {
            stop_accept.cancel();
            return Err(e);
        }
    };
    shared.health.serving();
    shared.ready_hook();
    tokio::spawn(crate::worker::watchdog::Watchdog::run(Arc::clone(&shared)));
    acceptors.extend(spawn_acceptors(
        listeners.take(),
        &shared,
        &control,
        &stop_accept,
        h3.as_ref(),
    ));
    crate::worker::recycle::spawn(&shared);

    let stop = next_stop(&mut stop_rx).await;
    tracing::debug!("stopping: {stop:?}");
    shared.health.draining();
    let delayed = drain_delay(&shared, stop, &mut stop_rx).await;
    if let Some(r) = &shared.recycle {
        r.draining();
    }
    stop_accept.cancel();
    for a in acceptors {
        match a.await {
            Ok(Err(e)) => tracing::error!("listener failed: {e}"),
            Err(e) => tracing::error!("accept task failed: {e}"),
            Ok(Ok(())) => {}
        }
    }
    control.tracker.close();

    let tracker = &shared.tracker;
    let quick = match stop {
        Stop::Quick(_) => true,
        Stop::Graceful(_) => {
            let (drain, close_grace) = drain_deadlines(cfg);
            shared.connections.order_all(Order::Drain);
            tokio::select! {
                _ = tracker.wait() => false,
                _ = tokio::time::sleep(drain.saturating_sub(delayed)) => {
                    tracing::warn!(
                        "graceful timeout ({:?}) reached: closing {} connection(s)",
                        cfg.graceful_timeout,
                        shared.connections.len()
                    );
                    // WebSockets get close 1001 and a moment for the close
                    // handshake; HTTP connections close now.
                    shared.connections.order_all(Order::GoingAway);
                    let _ = tokio::time::timeout(close_grace, tracker.wait()).await;
                    false
                }
                _ = next_quick(&mut stop_rx) => true,
            }
        }
    };
    if quick {
        // WebSockets get close 1001 and a moment for the peer's reply (a
        // socket closed before it is read resets the connection); HTTP
        // connections close now.
        shared.connections.order_all(Order::GoingAway);
        let _ = tokio::time::timeout(QUICK_CLOSE_GRACE, tracker.wait()).await;
    }
    shared.connections.order_all(Order::Abort);
    let _ = tokio::time::timeout(ABORT_GRACE, tracker.wait()).await;

    if let Some(line) = shared.watchdog.summary() {
        tracing::debug!("{line}");
    }
    if lifespan_running && !quick {
        lifespan::shutdown(&app).await;
    }
    Ok(())
}
