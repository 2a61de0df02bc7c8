//! The server: shared state, the Python-facing [`Server`] object, and the
//! orchestration of a worker's life (see [`run`]).

pub(crate) mod admission;
pub(crate) mod cert_name;
pub(crate) mod concurrency;
pub(crate) mod connections;
pub(crate) mod drain;
pub(crate) mod health;
pub(crate) mod listen;
pub(crate) mod recycle;
pub(crate) mod run;
pub(crate) mod signals;
pub(crate) mod tls;
pub(crate) mod watchdog;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use hyper::server::conn::http1;
use hyper_util::rt::TokioTimer;
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use crate::bridge::context::{AppContext, PyParts};
use crate::bridge::queue::{Event, PyQueue};
use crate::bridge::wake::Wakeups;
use crate::config::Config;
use crate::errors::StartupFailed;
use crate::lifespan::{self, LifespanProtocol};
use crate::logging;
use crate::server::connections::Connections;

/// Why the server stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Stop accepting, finish in-flight requests (up to the graceful
    /// timeout), run lifespan shutdown.
    Graceful(&'static str),
    /// Close every connection now.
    Quick(&'static str),
}

/// State shared by every Tokio task of a worker and by the asyncio thread.
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) queue: PyQueue,
    pub(crate) wakeups: Arc<Wakeups>,
    /// hyper's HTTP/1 connection builder, configured once.
    pub(crate) http1: http1::Builder,
    /// hyper's HTTP/2 connection builder, when HTTP/2 is enabled.
    pub(crate) http2: Option<hyper::server::conn::http2::Builder<crate::http::h2conn::StreamExec>>,
    dispatched: AtomicU64,
    stop: watch::Sender<Option<Stop>>,
    /// Every open connection (for drain and abort).
    pub(crate) connections: Connections,
    /// Every connection and WebSocket task, to wait for them at shutdown.
    pub(crate) tracker: TaskTracker,
    /// Memory returned by parked connections, not yet given back to the OS.
    pub(crate) trim: crate::runtime::Trim,
    /// TLS termination, when configured.
    pub(crate) tls: Option<tokio_rustls::TlsAcceptor>,
    /// The server certificate as PEM (the `tls` extension's `server_cert`).
    pub(crate) tls_server_cert: Option<String>,
    /// Called with the signal's name on SIGINT, SIGQUIT and SIGABRT, from
    /// the Tokio thread (Gunicorn's `worker_int` and `worker_abort`: the
    /// asyncio loop may be the thing that is stuck).
    pub(crate) signal_hook: std::sync::OnceLock<Py<PyAny>>,
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

impl Shared {
    /// Errors: the TLS settings or the metrics table (a one-line
    /// `ValueError`), or the eventfd.
    pub(crate) fn new(config: Config) -> PyResult<Self> {
        let (tls, tls_server_cert) = match &config.tls {
            Some(t) => {
                let (a, pem) = tls::acceptor(t).map_err(pyo3::exceptions::PyValueError::new_err)?;
                (Some(a), Some(pem))
            }
            None => (None, None),
        };
        let mut h1 = http1::Builder::new();
        h1.timer(TokioTimer::new())
            // Skirr runs its own idle and head-read timers (see http::conn).
            .header_read_timeout(None)
            // hyper's own `half_close` stops it from noticing a client
            // that leaves mid-request; Skirr keeps hyper's detection and
            // hides only an end of stream after a complete request
            // (`ConnIo::poll_read`), so a half-closed client still gets its
            // response (RFC 9112 §9.6).
            .keep_alive(true);
        if config.max_head_size > 0 {
            // hyper stops buffering an incomplete head at `max_buf_size`
            // (its floor is 8 KiB) and checks a complete one against
            // `max_header_size`: both answer 431.
            h1.max_header_size(config.max_head_size)
                .max_buf_size(config.max_head_size.max(8192));
        }
        if config.limit_request_fields != 100 {
            // 100 is hyper's default, kept on the stack; any other count
            // costs a heap buffer per request.
            let n = match config.limit_request_fields {
                0 => 32768,
                n => n,
            };
            h1.max_headers(n);
        }
        let tracker = TaskTracker::new();
        let h2 = config
            .http2
            .as_ref()
            .map(|h| crate::http::h2conn::builder(h, &config, tracker.clone()));
        // One Tokio thread: announce events when it parks (see PyQueue).
        let queue = PyQueue::new(config.tokio_threads <= 1)?;
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
        Ok(Self {
            config,
            queue,
            wakeups: Arc::new(Wakeups::default()),
            http1: h1,
            http2: h2,
            dispatched: AtomicU64::new(0),
            stop: watch::channel(None).0,
            connections: Connections::default(),
            tracker,
            trim: crate::runtime::Trim::default(),
            tls,
            tls_server_cert,
            signal_hook: std::sync::OnceLock::new(),
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
}

/// A Skirr server for one worker process.
///
/// Python creates it with the app and the asyncio loop, registers
/// [`Server::drain`] as the loop's reader for [`Server::event_fd`], starts
/// the loop in its own thread, then calls [`Server::serve`] on the main
/// thread, which blocks (without the GIL) until the server stops.
#[pyclass(frozen, module = "skirr._skirr")]
pub struct Server {
    shared: Arc<Shared>,
    ctx: Arc<AppContext>,
    scratch: Mutex<Vec<Event>>,
    lifespan: Mutex<Option<Py<LifespanProtocol>>>,
    log_threshold: u8,
}

#[pymethods]
impl Server {
    /// Creates the server.
    ///
    /// * `app`: an ASGI 3 callable.
    /// * `event_loop`: the asyncio loop that will run the app.
    /// * `config`: a dict of options (see `skirr.config`).
    /// * `error_logger`: a `logging.Logger` for errors and Rust's log lines.
    /// * `access_logger`: `access(scope, status, headers, size, seconds)`
    ///   called once per response, or `None`.
    /// * `reopen_logs`: called on SIGUSR1, or `None`.
    ///
    /// Raises `ValueError`/`TypeError` for a bad option, `OSError` if the
    /// eventfd cannot be created.
    #[new]
    #[pyo3(signature = (app, event_loop, config, error_logger, access_logger=None, reopen_logs=None))]
    fn new(
        py: Python<'_>,
        app: Py<PyAny>,
        event_loop: Py<PyAny>,
        config: &Bound<'_, PyDict>,
        error_logger: Py<PyAny>,
        access_logger: Option<Py<PyAny>>,
        reopen_logs: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let config = Config::from_dict(config)?;
        let shared = Arc::new(Shared::new(config)?);
        shared.wakeups.attach_loop(py, event_loop.bind(py))?;
        let log_threshold: u8 = error_logger
            .bind(py)
            .call_method0("getEffectiveLevel")?
            .extract::<i64>()?
            .clamp(0, 255) as u8;
        let ctx = AppContext::new(
            py,
            Arc::clone(&shared),
            PyParts {
                app,
                event_loop,
                error_log: error_logger,
                access_log: access_logger,
                reopen_logs,
            },
        )?;
        Ok(Self {
            shared,
            ctx: Arc::new(ctx),
            scratch: Mutex::new(Vec::with_capacity(256)),
            lifespan: Mutex::new(None),
            log_threshold,
        })
    }

    /// The eventfd the asyncio loop must watch (`loop.add_reader`).
    #[getter]
    fn event_fd(&self) -> i32 {
        self.shared.queue.fd()
    }

    /// This worker's slot in the metrics table (the `worker` label), or
    /// `None` when metrics are off.
    #[getter]
    fn metrics_worker(&self) -> Option<usize> {
        self.shared.metrics.index()
    }

    /// Records the event loop's lateness: its probe timer ran `lag`
    /// seconds late, and the next is due in `next` seconds (see
    /// `skirr.serve`). A no-op when metrics are off.
    fn loop_lag(&self, lag: f64, next: f64) {
        let d = |s: f64| std::time::Duration::from_secs_f64(s.clamp(0.0, 1e6));
        self.shared.metrics.loop_lag(d(lag), d(next));
    }

    /// Requests handed to the application so far.
    #[getter]
    fn requests(&self) -> u64 {
        self.shared.dispatched.load(Ordering::Relaxed)
    }

    /// The lifespan state dict (`scope["state"]` is a copy of it).
    #[getter]
    fn state(&self, py: Python<'_>) -> Py<PyDict> {
        self.ctx.state.clone_ref(py)
    }

    /// Handles every queued event. The loop's reader callback; never raises.
    fn drain(&self, py: Python<'_>) {
        let mut scratch = std::mem::take(&mut *self.scratch.lock());
        self.shared.queue.take_batch(&mut scratch);
        *self.scratch.lock() = scratch;
        {
            let _defer = self.shared.wakeups.defer();
            let _drain = crate::bridge::waiter::DrainGuard::enter();
            while let Some(event) = self.shared.queue.next_taken() {
                match event {
                    Event::Http(req) => crate::http::start(py, &self.ctx, req),
                    Event::Access(req, status, bytes) => {
                        crate::http::log_rejected(py, &self.ctx, &req, status, bytes)
                    }
                    Event::Wake(exch) => {
                        exch.unqueue();
                        crate::http::wake(py, &self.ctx, &exch);
                    }
                    Event::WebSocket(req) => crate::websocket::start(py, &self.ctx, req),
                    Event::WsWake(ws) => {
                        ws.unqueue();
                        crate::websocket::protocol::on_wake(py, &self.ctx, &ws);
                    }
                    Event::Lifespan(cmd) => lifespan::handle(py, &self.ctx, &self.lifespan, cmd),
                    Event::Log(record) => {
                        self.shared.queue.log_taken();
                        self.ctx.log(py, record.level, &record.message);
                    }
                    Event::Signal(signum) => {
                        if let Err(e) = self.shared.signals.deliver(py, signum) {
                            self.ctx
                                .log_error(py, "dispatching a signal failed", Some(&e));
                        }
                    }
                    Event::ReopenLogs => {
                        if let Some(f) = &self.ctx.reopen_logs {
                            if let Err(e) = f.bind(py).call0() {
                                self.ctx
                                    .log_error(py, "reopening log files failed", Some(&e));
                            }
                        }
                    }
                }
            }
        }
        let dropped = self.shared.queue.take_dropped_logs();
        if dropped > 0 {
            self.ctx.log(
                py,
                30,
                &format!("{dropped} log lines were dropped (logging fell behind)"),
            );
        }
    }

    /// The loop watchdog's stamp: the asyncio loop calls it every
    /// [`Server::loop_tick_interval`] seconds (see `server::watchdog`).
    fn loop_turned(&self) {
        self.shared.watchdog.turned();
    }

    /// How often the loop must call [`Server::loop_turned`] (seconds), or
    /// `None` when the watchdog is off (`loop_stall_timeout` 0).
    #[getter]
    fn loop_tick_interval(&self) -> Option<f64> {
        let w = &self.shared.watchdog;
        w.enabled().then(|| w.tick_interval().as_secs_f64())
    }

    /// Serves on the given listening sockets until the server stops.
    ///
    /// `listeners`: `[(fd, kind)]` with `kind` `"tcp"` or `"unix"`; the fds
    /// are duplicated, the caller keeps its own. Blocks without the GIL.
    ///
    /// Raises `StartupFailed` if lifespan startup fails (the worker should
    /// exit with Gunicorn's boot-error code 3), `OSError` for a bad socket.
    fn serve(&self, py: Python<'_>, listeners: Vec<(i32, String)>) -> PyResult<()> {
        let listeners = listeners
            .into_iter()
            .map(|(fd, kind)| listen::StdListener::from_fd(fd, &kind))
            .collect::<std::io::Result<Vec<_>>>()?;
        logging::install(&self.shared, self.log_threshold);
        let shared = Arc::clone(&self.shared);
        let res = py.detach(move || crate::runtime::run(shared, listeners));
        logging::uninstall();
        // Make sure the final drain (scheduled by the caller) sees them.
        self.shared.queue.flush();
        match res {
            Ok(()) => Ok(()),
            Err(run::RunError::Startup(msg)) => Err(StartupFailed::new_err(msg)),
            Err(run::RunError::Io(e)) => Err(e.into()),
        }
    }

    /// Cancels every application task still suspended (at shutdown, on the
    /// asyncio thread); returns how many were cancelled.
    fn cancel_tasks(&self, py: Python<'_>) -> usize {
        crate::bridge::start::cancel_all(py, &self.ctx)
    }

    /// Application tasks suspended and not yet finished.
    #[getter]
    fn pending_tasks(&self) -> usize {
        self.ctx.tasks.lock().len()
    }

    /// Sets `hook()`, called once lifespan startup has succeeded (or was
    /// skipped), before the first connection is accepted; not called when
    /// startup fails. From a Tokio thread, with the GIL.
    fn set_ready_hook(&self, hook: Py<PyAny>) {
        let _ = self.shared.ready_hook.set(hook);
    }

    /// Sets `hook(name)`, called on SIGINT, SIGQUIT and SIGABRT (once).
    fn set_signal_hook(&self, hook: Py<PyAny>) {
        let _ = self.shared.signal_hook.set(hook);
    }

    /// Sets `dispatch(signum)`, called on the loop's thread (from
    /// [`Server::drain`]) when a signal started with
    /// [`Server::forward_signal`] arrives (once).
    fn set_signal_dispatch(&self, dispatch: Py<PyAny>) {
        let _ = self.shared.signals.dispatch.set(dispatch);
    }

    /// Starts catching signal `signum` (an int) for the app, while the
    /// server runs; deliveries reach the dispatcher, several arriving
    /// before it runs count once. The process keeps catching it until it
    /// exits (Tokio never uninstalls a handler).
    ///
    /// Raises `ValueError` for a signal Skirr handles itself (TERM, INT,
    /// QUIT, USR1, ABRT), one out of range or that cannot be caught, and
    /// `RuntimeError` when the server is not running.
    fn forward_signal(&self, signum: i32) -> PyResult<()> {
        self.shared.signals.forward(signum).map_err(|e| {
            if e.contains("not running") {
                pyo3::exceptions::PyRuntimeError::new_err(e)
            } else {
                pyo3::exceptions::PyValueError::new_err(e)
            }
        })
    }

    /// Asks a running server to stop: gracefully, or at once if `quick`.

    #[pyo3(signature = (quick=false))]
    fn stop(&self, quick: bool) {
        self.shared.request_stop(if quick {
            Stop::Quick("requested")
        } else {
            Stop::Graceful("requested")
        });
    }
}
