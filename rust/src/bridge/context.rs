//! What the asyncio thread needs to start and serve applications.
//!
//! Built once on the Python side when the server is created; read only on
//! the asyncio thread (every field is a Python object).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use crate::bridge::waiter::Waiter;
use crate::errors::ClientDisconnected;

/// What the bridge needs of the asyncio side: the loop, the application
/// callable, the task registry and the error logger. Built once when the
/// server is created; read only on the asyncio thread (every field but the
/// flags is a Python object).
pub(crate) struct LoopCtx {
    /// The ASGI 3 application (ASGI 2 apps are wrapped on the Python side).
    pub(crate) app: Py<PyAny>,
    /// The asyncio loop the apps run on.
    pub(crate) event_loop: Py<PyAny>,
    /// An asyncio future that is already done with `None`: what `send()`
    /// returns when it need not wait. Awaiting a done future is all C code
    /// in `_asyncio` (no call into Skirr, no exception raised).
    done: Py<PyAny>,
    /// Tasks that suspended and have not finished, by object address: what
    /// shutdown cancels.
    pub(crate) tasks: Mutex<HashMap<usize, Py<PyAny>>>,
    /// The loop keeps its task factory in `_task_factory` (asyncio's loops;
    /// uvloop has only the method).
    factory_attr: bool,
    /// The loop's instance `__dict__` and the entry that holds its task
    /// factory: `_skirr_task_factory` on Skirr's own loops (uvloop too; see
    /// `serve.py`), or asyncio's `_task_factory` when nothing on the loop's
    /// type shadows it. One dict lookup per request instead of an attribute
    /// lookup or a method call.
    factory_dict: Option<(Py<PyDict>, Py<PyString>)>,
    /// Set once shutdown cancels the tasks left (see
    /// [`cancel_all`](crate::bridge::start::cancel_all)).
    pub(crate) cancelling: AtomicBool,
    /// The error logger (`logging.Logger`).
    pub(crate) error_log: Py<PyAny>,
    /// Keys of the warnings already logged once (app locations: bounded by
    /// the app's code, not by traffic).
    warned: Mutex<HashSet<String>>,
    /// Every application coroutine runs as an asyncio task
    /// (`asyncio_tasks`), not as a Skirr task.
    pub(crate) asyncio_tasks: bool,
}

impl LoopCtx {
    /// Errors: the loop's `create_future` failing.
    pub(crate) fn new(
        py: Python<'_>,
        app: Py<PyAny>,
        event_loop: Py<PyAny>,
        error_log: Py<PyAny>,
        asyncio_tasks: bool,
    ) -> PyResult<Self> {
        let lp = event_loop.bind(py);
        let factory_dict = lp
            .getattr("__dict__")
            .ok()
            .and_then(|d| d.cast_into::<PyDict>().ok())
            .and_then(|d| {
                let own = PyString::intern(py, "_skirr_task_factory");
                let asyncio = PyString::intern(py, "_task_factory");
                let key = if d.contains(&own).unwrap_or(false) {
                    own
                } else if d.contains(&asyncio).unwrap_or(false)
                    && !lp.get_type().hasattr(&asyncio).unwrap_or(true)
                {
                    asyncio
                } else {
                    return None;
                };
                Some((d.unbind(), key.unbind()))
            });
        let create_future = lp.getattr("create_future")?;
        let done = create_future.call0()?;
        done.call_method1("set_result", (py.None(),))?;
        Ok(Self {
            app,
            event_loop: event_loop.clone_ref(py),
            done: done.unbind(),
            tasks: Mutex::new(HashMap::new()),
            cancelling: AtomicBool::new(false),
            factory_attr: lp.hasattr("_task_factory").unwrap_or(false),
            factory_dict,
            error_log,
            warned: Mutex::new(HashSet::new()),
            asyncio_tasks,
        })
    }

    /// The shared completed awaitable (see [`LoopCtx::done`]).
    pub(crate) fn done<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.done.bind(py).clone())
    }

    /// A new [`Waiter`] on the server's loop.
    pub(crate) fn waiter<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, Waiter>> {
        Waiter::new(py, &self.event_loop)
    }

    /// Whether shutdown has cancelled the app's tasks.
    pub(crate) fn cancelling_all(&self) -> bool {
        self.cancelling.load(Ordering::Relaxed)
    }

    /// Whether the loop has a task factory (`loop.get_task_factory()`;
    /// asyncio's own loops keep it in `_task_factory`, read without the
    /// method call on every request).
    pub(crate) fn has_task_factory(&self, py: Python<'_>) -> bool {
        if let Some((d, key)) = &self.factory_dict {
            return d
                .bind(py)
                .get_item(key.bind(py))
                .is_ok_and(|f| f.is_some_and(|f| !f.is_none()));
        }
        let lp = self.event_loop.bind(py);
        let factory = if self.factory_attr {
            lp.getattr(pyo3::intern!(py, "_task_factory"))
        } else {
            lp.call_method0(pyo3::intern!(py, "get_task_factory"))
        };
        factory.is_ok_and(|f| !f.is_none())
    }

    /// Whether a warning with this `key` is new (and now remembered).
    pub(crate) fn warn_once(&self, key: String) -> bool {
        self.warned.lock().insert(key)
    }

    /// Logs `msg` at ERROR, with the traceback of `err` when given.
    pub(crate) fn log_error(&self, py: Python<'_>, msg: &str, err: Option<&PyErr>) {
        let log = self.error_log.bind(py);
        let res = match err {
            Some(e) => {
                // `(type, value, traceback)`: on 3.11 the value alone may
                // not carry its traceback yet.
                let kwargs = PyDict::new(py);
                let info = (e.get_type(py), e.value(py), e.traceback(py));
                let _ = kwargs.set_item("exc_info", info);
                log.call_method("error", (msg,), Some(&kwargs))
            }
            None => log.call_method1("error", (msg,)),
        };
        if let Err(e) = res {
            // The logger itself failed: last resort is stderr.
            e.print(py);
        }
    }

    /// Logs `msg` at the given `logging` level (10 DEBUG … 50 CRITICAL).
    pub(crate) fn log(&self, py: Python<'_>, level: u8, msg: &str) {
        if let Err(e) = self.error_log.bind(py).call_method1("log", (level, msg)) {
            e.print(py);
        }
    }
}

/// Completes a waiter with `value`, unless it was already done (cancelled
/// by the app). Returns whether the value was delivered.
pub(crate) fn resolve(waiter: &Bound<'_, Waiter>, value: Bound<'_, PyAny>) -> bool {
    Waiter::complete(waiter, Ok(value))
}

/// Fails a waiter with `ClientDisconnected(msg)` unless it is done.
pub(crate) fn fail_disconnected(waiter: &Bound<'_, Waiter>, msg: &str) {
    Waiter::complete(waiter, Err(ClientDisconnected::new_err(msg.to_owned())));
}

/// Whether a waiter is done (completed or cancelled).
pub(crate) fn is_done(waiter: &Bound<'_, Waiter>) -> bool {
    !waiter.get().is_pending()
}
