//! The worker's shared state: the floor every connection, protocol and
//! the asyncio side stand on (see [`Worker`]). It holds data and counters,
//! never a protocol: the drivers own their hyper builders, and the TLS
//! acceptor is built by `server::tls` and handed in.

pub(crate) mod clock;
pub(crate) mod concurrency;
pub(crate) mod connections;
pub(crate) mod drain;
pub(crate) mod health;
pub(crate) mod recycle;
pub(crate) mod signals;
pub(crate) mod trim;
pub(crate) mod watchdog;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pyo3::prelude::*;
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use crate::bridge::queue::PyQueue;
use crate::bridge::wake::Wakeups;
use crate::config::Config;
use crate::worker::connections::Connections;

/// Why the server stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Stop accepting, finish in-flight requests (up to the graceful
    /// timeout), run lifespan shutdown.
    Graceful(&'static str),
    /// Close every connection now.
    Quick(&'static str),
}

/// The worker's state, shared by every Tokio task and by the asyncio
/// thread.
pub(crate) struct Worker {
    pub(crate) config: Config,
    pub(crate) queue: Arc<PyQueue>,
    pub(crate) wakeups: Arc<Wakeups>,
    dispatched: AtomicU64,
    stop: watch::Sender<Option<Stop>>,
    /// Every open connection (for drain and abort).
    pub(crate) connections: Connections,
    /// Every connection and WebSocket task, to wait for them at shutdown.
    pub(crate) tracker: TaskTracker,
    /// Memory returned by parked connections, not yet given back to the OS.
    pub(crate) trim: trim::Trim,
    /// TLS termination, when configured.
    pub(crate) tls: Option<tokio_rustls::TlsAcceptor>,
    /// The server certificate as PEM (the `tls` extension's `server_cert`).
    pub(crate) tls_server_cert: Option<String>,
    /// Called with the signal's name on SIGINT, SIGQUIT and SIGABRT, from
    /// the Tokio thread (Gunicorn's `worker_int` and `worker_abort`: the
    /// asyncio loop may be the thing that is stuck).
    pub(crate) signal_hook: std::sync::OnceLock<Py<PyAny>>,
    /// The SIGABRT hook: 0 not run, 1 running, 2 done. In single mode both
    /// Python's handler (on the blocked loop's thread) and Tokio's (on the
    /// stand-in) may get there; Gunicorn's `worker_abort` runs once, and
    /// neither exits while the other runs it.
    abort_hook: std::sync::atomic::AtomicU8,
    /// Called once lifespan startup has succeeded, before the first
    /// accept (the standalone CLI's "listening at" line).
    pub(crate) ready_hook: std::sync::OnceLock<Py<PyAny>>,
    /// Signals forwarded to the app's `loop.add_signal_handler` callbacks.
    pub(crate) signals: signals::Forwarding,
    /// Whether the asyncio loop turns (`loop_stall_timeout`).
    pub(crate) watchdog: watchdog::Watchdog,
    /// The health path's state (`health_path`).
    pub(crate) health: health::Health,
    /// Requests in progress (`limit_concurrency`).
    pub(crate) concurrency: concurrency::Concurrency,
    /// What the connections need to know of a drain (see [`drain`]).
    pub(crate) drain: drain::DrainFacts,
    /// Recycles coordinated with the master's other workers (see
    /// [`recycle`]); `None` standalone or with one worker.
    pub(crate) recycle: Option<recycle::Recycle>,
    /// This worker's slot in the shared metrics table (a no-op when
    /// `metrics_bind` is off).
    pub(crate) metrics: crate::metrics::Recorder,
}

/// The TLS acceptor and the server certificate as PEM, built by
/// `server::tls` from the configuration.
pub(crate) type Tls = (tokio_rustls::TlsAcceptor, String);

impl Worker {
    /// Errors: the metrics table (a one-line `ValueError`), or the eventfd.
    pub(crate) fn new(config: Config, tls: Option<Tls>) -> PyResult<Self> {
        let (tls, tls_server_cert) = match tls {
            Some((a, pem)) => (Some(a), Some(pem)),
            None => (None, None),
        };
        let tracker = TaskTracker::new();
        // One Tokio thread: announce events when it parks (see PyQueue).
        let queue = Arc::new(PyQueue::new(
            config.tokio_threads <= 1,
            config.single_thread,
        )?);
        let watchdog = watchdog::Watchdog::new(config.loop_stall_timeout);
        let health = health::Health::new(config.health_path.clone());
        let concurrency = concurrency::Concurrency::new(config.limit_concurrency);
        let recycle = match config.recycle_lock_fd {
            Some(fd) => Some(recycle::Recycle::new(fd)?),
            None => None,
        };
        let metrics = match config.metrics_table_fd {
            // A ValueError: the worker exits with Gunicorn's boot error.
            Some(fd) => crate::metrics::Recorder::attach(fd).map_err(|e| {
                pyo3::exceptions::PyValueError::new_err(format!(
                    "metrics_bind: cannot use the shared metrics table: {e}"
                ))
            })?,
            None => crate::metrics::Recorder::default(),
        };
        let wakeups = Arc::new(Wakeups::new(config.single_thread));
        Ok(Self {
            config,
            queue,
            wakeups,
            dispatched: AtomicU64::new(0),
            stop: watch::channel(None).0,
            connections: Connections::default(),
            tracker,
            trim: trim::Trim::default(),
            tls,
            tls_server_cert,
            signal_hook: std::sync::OnceLock::new(),
            abort_hook: std::sync::atomic::AtomicU8::new(0),
            ready_hook: std::sync::OnceLock::new(),
            signals: signals::Forwarding::default(),
            watchdog,
            health,
            concurrency,
            drain: drain::DrainFacts::default(),
            recycle,
            metrics,
        })
    }

    /// Counts a request handed to the app; at `max_requests` the worker
    /// stops gracefully so the master re-forks it (once no other worker of
    /// the master drains: see [`recycle`]).
    pub(crate) fn count_request(&self) {
        let n = self.dispatched.fetch_add(1, Ordering::Relaxed) + 1;
        if n == self.config.max_requests {
            recycle::stop_for_max_requests(self, n);
        }
    }

    /// Requests handed to the app so far.
    pub(crate) fn requests_served(&self) -> u64 {
        self.dispatched.load(Ordering::Relaxed)
    }

    /// Asks the server to stop; a quick stop overrides a graceful one.
    pub(crate) fn request_stop(&self, stop: Stop) {
        self.stop.send_modify(|cur| match (*cur, stop) {
            (None, s) | (Some(Stop::Graceful(_)), s @ Stop::Quick(_)) => *cur = Some(s),
            _ => {}
        });
    }

    /// Whether a stop (graceful or quick) has been requested.
    pub(crate) fn stop_requested(&self) -> bool {
        self.stop.borrow().is_some()
    }

    pub(crate) fn stop_rx(&self) -> watch::Receiver<Option<Stop>> {
        self.stop.subscribe()
    }

    /// Runs the ready hook, if any (Tokio thread, once startup has
    /// succeeded); its errors are logged.
    pub(crate) fn ready_hook(&self) {
        if let Some(hook) = self.ready_hook.get() {
            Python::attach(|py| {
                if let Err(e) = hook.call0(py) {
                    tracing::error!("ready hook failed: {e}");
                }
            });
        }
    }

    /// Runs the signal hook, if any; its errors are logged.
    pub(crate) fn signal_hook(&self, name: &str) {
        if let Some(hook) = self.signal_hook.get() {
            Python::attach(|py| {
                if let Err(e) = hook.call1(py, (name,)) {
                    tracing::error!("{name} hook failed: {e}");
                }
            });
        }
    }

    /// Runs the signal hook for SIGABRT unless another thread already does
    /// (see `abort_hook`); `false` then: wait with
    /// [`Worker::wait_abort_hook`], without the GIL, before exiting.
    pub(crate) fn abort_hook_once(&self) -> bool {
        if self
            .abort_hook
            .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return false;
        }
        self.signal_hook("SIGABRT");
        self.abort_hook.store(2, Ordering::SeqCst);
        true
    }

    /// Waits (up to 5 s) for the SIGABRT hook another thread runs.
    pub(crate) fn wait_abort_hook(&self) {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while self.abort_hook.load(Ordering::SeqCst) == 1 && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}
