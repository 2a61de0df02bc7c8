//! The ASGI Lifespan protocol (spec 2.0): `lifespan.startup` before the first
//! connection is accepted, `lifespan.shutdown` after the drain.
//!
//! The Tokio side ([`startup`], [`shutdown`]) sends a command through the
//! event queue and waits, bounded by `lifespan_timeout`, for the outcome the
//! app reports through [`LifespanProtocol`] on the asyncio thread.

use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tokio::sync::oneshot;

use crate::asgi::context::AppContext;
use crate::asgi::message::{event, is, message_type};
use crate::bridge::awaitable::ready;
use crate::bridge::context::resolve;
use crate::bridge::names::names;
use crate::bridge::owner::Owner;
use crate::bridge::queue::{Event, Job};
use crate::bridge::start::call_app;
use crate::bridge::waiter::Waiter;
use crate::config::LifespanMode;

/// What the app reported for a lifespan phase.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// `*.complete`.
    Complete,
    /// `*.failed`, with the app's message.
    Failed(String),
    /// The app raised before completing startup: it does not speak
    /// lifespan (the exception's text).
    Unsupported(String),
    /// The app returned without reporting: nothing more to wait for.
    Returned,
}

/// A lifespan command for the asyncio thread.
enum LifespanCommand {
    Startup(oneshot::Sender<Outcome>),
    Shutdown(oneshot::Sender<Outcome>),
}

#[derive(Default)]
struct LsState {
    startup_delivered: bool,
    shutdown_requested: bool,
    shutdown_delivered: bool,
    startup_tx: Option<oneshot::Sender<Outcome>>,
    shutdown_tx: Option<oneshot::Sender<Outcome>>,
    waiter: Option<Py<Waiter>>,
    finished: bool,
}

/// `receive` and `send` for the lifespan scope.
#[pyclass(frozen, module = "skirr._skirr")]
pub(crate) struct LifespanProtocol {
    ctx: Arc<AppContext>,
    st: Mutex<LsState>,
}

impl LifespanProtocol {
    fn report(st: &mut LsState, outcome: Outcome) {
        if let Some(tx) = st.startup_tx.take() {
            let _ = tx.send(outcome);
        } else if let Some(tx) = st.shutdown_tx.take() {
            let _ = tx.send(outcome);
        }
    }

    pub(crate) fn on_return(&self, _py: Python<'_>) {
        let mut st = self.st.lock();
        st.finished = true;
        Self::report(&mut st, Outcome::Returned);
    }

    pub(crate) fn on_error(&self, py: Python<'_>, err: PyErr) {
        let mut st = self.st.lock();
        st.finished = true;
        if st.startup_tx.is_some() {
            if self.ctx.shared.config.lifespan == LifespanMode::On {
                self.ctx
                    .log_error(py, "Exception in 'lifespan' protocol", Some(&err));
            } else {
                self.ctx
                    .log(py, 20, "ASGI 'lifespan' protocol appears unsupported.");
            }
            Self::report(&mut st, Outcome::Unsupported(err.to_string()));
        } else {
            self.ctx
                .log_error(py, "Exception in 'lifespan' protocol", Some(&err));
            Self::report(&mut st, Outcome::Failed(err.to_string()));
        }
    }
}

#[pymethods]
impl LifespanProtocol {
    /// `lifespan.startup`, then (once the server stops) `lifespan.shutdown`.
    fn receive<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let n = names(py);
        let mut st = self.st.lock();
        if !st.startup_delivered {
            st.startup_delivered = true;
            return ready(py, event(py, &n.lifespan_startup)?.into_any());
        }
        if st.shutdown_requested && !st.shutdown_delivered {
            st.shutdown_delivered = true;
            return ready(py, event(py, &n.lifespan_shutdown)?.into_any());
        }
        let fut = self.ctx.waiter(py)?;
        st.waiter = Some(fut.clone().unbind());
        Ok(fut.into_any())
    }

    /// `lifespan.{startup,shutdown}.{complete,failed}`.
    ///
    /// Raises `TypeError` for a malformed message and `RuntimeError` for a
    /// message type that is not a lifespan event.
    fn send<'py>(
        &self,
        py: Python<'py>,
        message: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let n = names(py);
        let (d, t) = message_type(message)?;
        let text = || -> PyResult<String> {
            Ok(match d.get_item(n.message.bind(py))? {
                Some(m) => m.str()?.to_string(),
                None => String::new(),
            })
        };
        let mut st = self.st.lock();
        if is(&t, &n.lifespan_startup_complete) {
            if let Some(tx) = st.startup_tx.take() {
                let _ = tx.send(Outcome::Complete);
            }
        } else if is(&t, &n.lifespan_startup_failed) {
            let msg = text()?;
            if let Some(tx) = st.startup_tx.take() {
                let _ = tx.send(Outcome::Failed(msg));
            }
        } else if is(&t, &n.lifespan_shutdown_complete) {
            if let Some(tx) = st.shutdown_tx.take() {
                let _ = tx.send(Outcome::Complete);
            }
        } else if is(&t, &n.lifespan_shutdown_failed) {
            let msg = text()?;
            if let Some(tx) = st.shutdown_tx.take() {
                let _ = tx.send(Outcome::Failed(msg));
            }
        } else {
            return Err(PyRuntimeError::new_err(format!(
                "unexpected ASGI message type {:?} in the lifespan protocol",
                t.to_string_lossy()
            )));
        }
        self.ctx.done(py)
    }
}

/// A lifespan command on its way to the asyncio thread.
struct LifespanJob {
    ctx: Arc<AppContext>,
    cmd: LifespanCommand,
}

impl Job for LifespanJob {
    fn run(self: Box<Self>, py: Python<'_>) {
        handle(py, &self.ctx, self.cmd);
    }
}

/// Handles a lifespan command on the asyncio thread; the protocol object
/// waits for the shutdown command in `ctx.lifespan`.
fn handle(py: Python<'_>, ctx: &Arc<AppContext>, cmd: LifespanCommand) {
    let slot = &ctx.lifespan;
    match cmd {
        LifespanCommand::Startup(tx) => {
            let proto = LifespanProtocol {
                ctx: Arc::clone(ctx),
                st: Mutex::new(LsState {
                    startup_tx: Some(tx),
                    ..LsState::default()
                }),
            };
            let run = || -> PyResult<Py<LifespanProtocol>> {
                let proto = Py::new(py, proto)?;
                let n = names(py);
                let scope = PyDict::new(py);
                scope.set_item(n.type_.bind(py), n.lifespan.bind(py))?;
                scope.set_item(n.asgi.bind(py), ctx.asgi_lifespan.bind(py))?;
                scope.set_item(n.state.bind(py), ctx.state.bind(py))?;
                let b = proto.bind(py);
                let receive = b.getattr(pyo3::intern!(py, "receive"))?;
                let send = b.getattr(pyo3::intern!(py, "send"))?;
                let started = call_app(py, ctx.app.bind(py), [scope.into_any(), receive, send])
                    .and_then(|coro| {
                        crate::bridge::start::start(
                            py,
                            &ctx.loop_ctx,
                            coro,
                            Owner::new(proto.clone_ref(py)),
                        )
                    });
                if let Err(e) = started {
                    proto.get().on_error(py, e);
                }
                Ok(proto)
            };
            match run() {
                Ok(p) => *slot.lock() = Some(p.into_any()),
                Err(e) => ctx.log_error(py, "could not start the lifespan protocol", Some(&e)),
            }
        }
        LifespanCommand::Shutdown(tx) => {
            let proto = slot.lock().take();
            let Some(proto) =
                proto.and_then(|p| p.into_bound(py).cast_into::<LifespanProtocol>().ok())
            else {
                let _ = tx.send(Outcome::Returned);
                return;
            };
            let p = proto.get();
            let mut st = p.st.lock();
            if st.finished {
                let _ = tx.send(Outcome::Returned);
                return;
            }
            st.shutdown_tx = Some(tx);
            st.shutdown_requested = true;
            if let Some(w) = st.waiter.take() {
                st.shutdown_delivered = true;
                drop(st);
                if let Ok(msg) = event(py, &names(py).lifespan_shutdown) {
                    resolve(w.bind(py), msg.into_any());
                }
            }
        }
    }
}

/// Runs `lifespan.startup`. `Ok(true)` if the app completed it, `Ok(false)`
/// if it does not use lifespan (auto mode), `Err(message)` if startup
/// failed, timed out, or is unsupported in `on` mode.
pub(crate) async fn startup(ctx: &Arc<AppContext>) -> Result<bool, String> {
    let cfg = &ctx.shared.config;
    if cfg.lifespan == LifespanMode::Off {
        return Ok(false);
    }
    let (tx, rx) = oneshot::channel();
    ctx.shared.queue.push(Event::Run(Box::new(LifespanJob {
        ctx: Arc::clone(ctx),
        cmd: LifespanCommand::Startup(tx),
    })));
    match tokio::time::timeout(cfg.lifespan_timeout, rx).await {
        Err(_) => Err(format!(
            "lifespan startup did not complete within {:?}",
            cfg.lifespan_timeout
        )),
        Ok(Err(_)) => Err("the lifespan protocol could not be started".into()),
        Ok(Ok(Outcome::Complete)) => Ok(true),
        Ok(Ok(Outcome::Returned)) => Ok(false),
        Ok(Ok(Outcome::Unsupported(e))) if cfg.lifespan == LifespanMode::On => Err(format!(
            "exception in the lifespan protocol (lifespan=on): {e}"
        )),
        Ok(Ok(Outcome::Unsupported(_))) => Ok(false),
        Ok(Ok(Outcome::Failed(msg))) => Err(if msg.is_empty() {
            "the application reported lifespan.startup.failed".into()
        } else {
            msg
        }),
    }
}

/// Runs `lifespan.shutdown`, bounded by `lifespan_timeout`; logs failures.
pub(crate) async fn shutdown(ctx: &Arc<AppContext>) {
    let shared = &ctx.shared;
    let (tx, rx) = oneshot::channel();
    shared.queue.push(Event::Run(Box::new(LifespanJob {
        ctx: Arc::clone(ctx),
        cmd: LifespanCommand::Shutdown(tx),
    })));
    match tokio::time::timeout(shared.config.lifespan_timeout, rx).await {
        Err(_) => tracing::warn!(
            "lifespan shutdown did not complete within {:?}",
            shared.config.lifespan_timeout
        ),
        Ok(Ok(Outcome::Failed(msg))) => tracing::error!("lifespan shutdown failed: {msg}"),
        _ => {}
    }
}

impl crate::bridge::owner::TaskOwner for LifespanProtocol {
    // A lifespan app cancelled is never an application error.
    const QUIET_CANCEL: bool = true;

    fn on_return(&self, py: Python<'_>) {
        LifespanProtocol::on_return(self, py);
    }

    fn on_error(&self, py: Python<'_>, err: PyErr) {
        LifespanProtocol::on_error(self, py, err);
    }

    fn on_cancel(&self, py: Python<'_>) {
        LifespanProtocol::on_return(self, py);
    }
}
