//! The composition root: the Python-facing [`Server`] object, and the
//! orchestration of a worker's life (see [`run`]). It builds the
//! [`Worker`] state (with the TLS acceptor from [`tls`]) and may use every
//! other module; nothing below imports it.

pub(crate) mod accept;
pub(crate) mod admission;
pub(crate) mod cert_name;
pub(crate) mod give_up;
pub(crate) mod listen;
pub(crate) mod run;
pub(crate) mod runtime;
pub(crate) mod single;
pub(crate) mod tls;

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::asgi::context::{AppContext, PyParts};
use crate::bridge::queue::Event;
use crate::config::Config;
use crate::errors::StartupFailed;
use crate::logging;
use crate::worker::{Stop, Worker};

/// A Skirr server for one worker process.
///
/// Python creates it with the app and the asyncio loop, registers
/// [`Server::drain`] as the loop's reader for [`Server::event_fd`], starts
/// the loop in its own thread, then calls [`Server::serve`] on the main
/// thread, which blocks (without the GIL) until the server stops.
/// HTTP/3's TLS: the worker's certificate for QUIC (see `proto::h3`).
///
/// Errors: `ValueError` with one line, as for the TCP listeners' TLS, or
/// when the suites leave QUIC none it can start with.
fn quic_setup(t: &crate::config::TlsSettings) -> PyResult<crate::proto::h3::Setup> {
    let bad = |e: String| pyo3::exceptions::PyValueError::new_err(e);
    let config = tls::quic_config(t).map_err(bad)?;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(config)
        .map_err(|e| bad(format!("http3: the TLS settings do not suit QUIC: {e}")))?;
    Ok(crate::proto::h3::Setup {
        crypto: Arc::new(crypto),
        tls_facts: tls::quic_info,
    })
}

#[pyclass(frozen, module = "skirr._skirr")]
pub struct Server {
    shared: Arc<Worker>,
    ctx: Arc<AppContext>,
    scratch: Mutex<Vec<Event>>,
    log_threshold: u8,
    /// HTTP/3's QUIC TLS configuration, when `http3` is on.
    h3: Option<Arc<crate::proto::h3::Setup>>,
    /// Single-thread mode's runtime, from [`Server::start`] to
    /// [`Server::finish`].
    single: Mutex<Option<Arc<single::Single>>>,
}

impl Server {
    /// How this worker ends if the loop does not stop (`server::give_up`).
    fn exit(&self) -> give_up::Exit {
        give_up::Exit::new(
            Arc::clone(&self.ctx.loop_ctx),
            Arc::clone(&self.shared.queue),
        )
    }
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
        if config.http3.is_some() && config.tls.is_none() {
            // Python refuses this first (`check_tls_files`); a `Server` built
            // by hand gets the same line.
            return Err(pyo3::exceptions::PyValueError::new_err(
                "http3 needs TLS (QUIC is always encrypted): set ssl_certfile and ssl_keyfile",
            ));
        }
        let h3 = match (&config.http3, &config.tls) {
            (Some(_), Some(t)) => Some(Arc::new(quic_setup(t)?)),
            _ => None,
        };
        let tls = match &config.tls {
            Some(t) => Some(tls::acceptor(t).map_err(pyo3::exceptions::PyValueError::new_err)?),
            None => None,
        };
        let shared = Arc::new(Worker::new(config, tls)?);
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
            log_threshold,
            h3,
            single: Mutex::new(None),
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
        self.shared.requests_served()
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
                    Event::Run(job) => job.run(py),
                    Event::Wake(w) => {
                        w.unqueue();
                        w.wake(py);
                    }
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

    /// Writes the Rust log lines still queued through the error logger,
    /// from any thread: for the end of dual mode when the loop's thread is
    /// stuck in the app and will not drain again. Other events stay queued.
    fn write_queued_logs(&self, py: Python<'_>) {
        logging::write_queued(py, &self.shared.queue, &self.ctx.loop_ctx);
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
        if self.shared.config.single_thread {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(
                "loop_mode single: use start(), the loop's selector, then finish()",
            ));
        }
        let listeners = listeners
            .into_iter()
            .map(|(fd, kind)| listen::StdListener::from_fd(fd, &kind))
            .collect::<std::io::Result<Vec<_>>>()?;
        logging::install(&self.shared.queue, self.log_threshold, &self.ctx.loop_ctx);
        let app = Arc::clone(&self.ctx);
        let h3 = self.h3.clone();
        let exit = self.exit();
        let (res, guard) = py.detach(move || {
            let res = runtime::run(app, listeners, h3);
            // Until this thread has the GIL again (see `give_up`).
            (res, give_up::ExitGuard::arm(exit))
        });
        drop(guard);
        logging::uninstall();
        // Make sure the final drain (scheduled by the caller) sees them.
        self.shared.queue.flush();
        run_result(res)
    }

    /// Single-thread mode (`loop_mode` "single", see `server::single`):
    /// builds the runtime and queues the server's main task, which runs
    /// inside [`Server::turn`], called by the loop's selector. `listeners`
    /// as for [`Server::serve`].
    ///
    /// Raises `RuntimeError` in dual mode or when already started,
    /// `OSError` for a bad socket or if the runtime cannot be built.
    fn start(&self, listeners: Vec<(i32, String)>) -> PyResult<()> {
        if !self.shared.config.single_thread {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(
                "start() is for loop_mode single; use serve()",
            ));
        }
        let mut slot = self.single.lock();
        if slot.is_some() {
            return Err(pyo3::exceptions::PyRuntimeError::new_err("already started"));
        }
        let listeners = listeners
            .into_iter()
            .map(|(fd, kind)| listen::StdListener::from_fd(fd, &kind))
            .collect::<std::io::Result<Vec<_>>>()?;
        let rt = runtime::current_thread(&self.shared)?;
        self.shared.signals.attach(rt.handle().clone());
        logging::install(&self.shared.queue, self.log_threshold, &self.ctx.loop_ctx);
        let main = run::run(Arc::clone(&self.ctx), listeners, self.h3.clone());
        let exit = self.exit();
        *slot = Some(Arc::new(single::Single::new(rt, main, exit)));
        Ok(())
    }

    /// Single mode: runs the runtime until a Python fd of the selector's
    /// epoll `epfd` is ready, `timeout` seconds passed (`None`: no bound)
    /// or the server ended; without the GIL. Events for Python are handled
    /// ([`Server::drain`]) as they come, with the GIL; after a drain the
    /// turn goes on (the loop would only call `select()` again) unless the
    /// drain gave the loop work: a ready callback, a new timer, or a stop.
    /// Returns bits: 2 `epfd` readable, 4 the server ended (stop the loop,
    /// then call [`Server::finish`]).
    ///
    /// Raises `RuntimeError` when not started, `OSError` if `epfd` cannot
    /// be registered.
    #[pyo3(signature = (epfd, timeout=None))]
    fn turn(&self, py: Python<'_>, epfd: i32, timeout: Option<f64>) -> PyResult<u8> {
        let Some(single) = self.single.lock().clone() else {
            return Err(pyo3::exceptions::PyRuntimeError::new_err("not started"));
        };
        let timeout = timeout.map(|t| Duration::from_secs_f64(t.clamp(0.0, 1e6)));
        let deadline = timeout.map(|t| Instant::now() + t);
        let shared = &*self.shared;
        let ev_loop = self.ctx.event_loop.bind(py);
        let mut timers = None;
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let flags = py.detach(|| single.turn(shared, epfd, left))?;
            if flags & single::EVENTS == 0 {
                return Ok(flags);
            }
            let before = match timers {
                Some(n) => n,
                None => *timers.insert(pending_timers(ev_loop)),
            };
            // Handled here, with the GIL this thread holds again: the loop
            // need not dispatch the eventfd's reader for it.
            self.drain(py);
            let rest = flags & !single::EVENTS;
            if rest != 0 || left == Some(Duration::ZERO) || !loop_idle(ev_loop, before) {
                return Ok(rest);
            }
        }
    }

    /// Single mode: ends the server (a quick stop if it still runs), shuts
    /// the runtime down; the loop's selector then waits on its own.
    ///
    /// Raises `StartupFailed` if lifespan startup failed, `OSError` for a
    /// socket error, `RuntimeError` when not started or called from a turn.
    fn finish(&self, py: Python<'_>) -> PyResult<()> {
        let Some(single) = self.single.lock().take() else {
            return Err(pyo3::exceptions::PyRuntimeError::new_err("not started"));
        };
        let single = Arc::try_unwrap(single)
            .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("finish() inside a turn"))?;
        let shared = &*self.shared;
        let res = py.detach(|| single.finish(shared));
        logging::uninstall();
        run_result(res)
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

    /// Calls the signal hook (if set) with `name`: single mode's Python-level
    /// SIGABRT handler, which runs while the app blocks the loop (the
    /// stand-in's Tokio handler may run it instead: then this waits for it).
    fn call_signal_hook(&self, py: Python<'_>, name: &str) {
        if name != "SIGABRT" {
            self.shared.signal_hook(name);
        } else if !self.shared.abort_hook_once() {
            // Tokio's handler runs it (single mode's stand-in): it needs
            // the GIL this thread holds.
            py.detach(|| self.shared.wait_abort_hook());
        }
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

fn run_result(res: Result<(), run::RunError>) -> PyResult<()> {
    match res {
        Ok(()) => Ok(()),
        Err(run::RunError::Startup(msg)) => Err(StartupFailed::new_err(msg)),
        Err(run::RunError::Io(e)) => Err(e.into()),
    }
}

/// How many timers the asyncio loop has scheduled (`loop._scheduled`; a
/// loop without it counts as `usize::MAX`, never idle).
fn pending_timers(ev_loop: &Bound<'_, PyAny>) -> usize {
    ev_loop
        .getattr(pyo3::intern!(ev_loop.py(), "_scheduled"))
        .and_then(|s| s.len())
        .unwrap_or(usize::MAX)
}

/// Whether a drain left the asyncio loop nothing to do before its next
/// `select()`: no ready callback, no timer added since (`timers` before
/// the drain), no stop requested. Any doubt (a loop without these
/// attributes) answers no.
fn loop_idle(ev_loop: &Bound<'_, PyAny>, timers: usize) -> bool {
    let py = ev_loop.py();
    let ready = ev_loop
        .getattr(pyo3::intern!(py, "_ready"))
        .and_then(|r| r.len())
        .is_ok_and(|n| n == 0);
    ready
        && timers != usize::MAX
        && pending_timers(ev_loop) == timers
        && ev_loop
            .getattr(pyo3::intern!(py, "_stopping"))
            .and_then(|s| s.is_truthy())
            .is_ok_and(|s| !s)
}
