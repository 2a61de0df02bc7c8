//! What the asyncio thread needs to start and serve applications.
//!
//! Built once on the Python side when the server is created; read only on
//! the asyncio thread (every field is a Python object).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};

use crate::bridge::names::names;
use crate::bridge::waiter::Waiter;
use crate::errors::ClientDisconnected;
use crate::server::Shared;

/// Python-side server context.
pub(crate) struct AppContext {
    pub(crate) shared: Arc<Shared>,
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
    /// A prebuilt HTTP scope with every key present: copying it and
    /// replacing values never resizes the dict.
    pub(crate) http_template: Py<PyDict>,
    /// The same for WebSocket scopes.
    pub(crate) ws_template: Py<PyDict>,
    /// `scope["extensions"]` of HTTP scopes before `tls`: each request
    /// gets a shallow copy (one dict copy costs far less than building the
    /// extensions' dicts anew).
    pub(crate) http_extensions: Py<PyDict>,
    /// `http_extensions` plus early hints, for requests whose client can
    /// receive interim responses (HTTP/1.1, HTTP/2; not HTTP/1.0).
    pub(crate) interim_extensions: Py<PyDict>,
    /// The same for WebSocket scopes.
    pub(crate) ws_extensions: Py<PyDict>,
    /// `scope["asgi"]` for lifespan scopes.
    pub(crate) asgi_lifespan: Py<PyDict>,
    /// The lifespan state namespace; each request gets a shallow copy.
    pub(crate) state: Py<PyDict>,
    /// `root_path`, as `str` and as the prefix of `raw_path`.
    pub(crate) root_path: String,
    /// The error logger (`logging.Logger`).
    pub(crate) error_log: Py<PyAny>,
    /// `access(scope, status, headers, size, seconds)` or `None`.
    pub(crate) access_log: Option<Py<PyAny>>,
    /// Reopens log files (SIGUSR1), or `None`.
    pub(crate) reopen_logs: Option<Py<PyAny>>,
    /// Keys of the warnings already logged once (app locations: bounded by
    /// the app's code, not by traffic).
    warned: Mutex<HashSet<String>>,
}

/// The Python-side arguments of [`AppContext::new`].
pub(crate) struct PyParts {
    pub(crate) app: Py<PyAny>,
    pub(crate) event_loop: Py<PyAny>,
    pub(crate) error_log: Py<PyAny>,
    pub(crate) access_log: Option<Py<PyAny>>,
    pub(crate) reopen_logs: Option<Py<PyAny>>,
}

impl AppContext {
    pub(crate) fn new(py: Python<'_>, shared: Arc<Shared>, p: PyParts) -> PyResult<Self> {
        let n = names(py);
        let lp = p.event_loop.bind(py);
        let asgi_http = PyDict::new(py);
        asgi_http.set_item(n.version.bind(py), "3.0")?;
        asgi_http.set_item(n.spec_version.bind(py), "2.5")?;
        let asgi_lifespan = PyDict::new(py);
        asgi_lifespan.set_item(n.version.bind(py), "3.0")?;
        asgi_lifespan.set_item(n.spec_version.bind(py), "2.0")?;

        let root_path = shared.config.root_path.clone();
        let t = PyDict::new(py);
        let none = py.None();
        t.set_item(n.type_.bind(py), n.http.bind(py))?;
        t.set_item(n.asgi.bind(py), asgi_http)?;
        // The commonest values are in place already: a request that has
        // them skips the store (see `scope::http_scope`).
        t.set_item(n.http_version.bind(py), n.v1_1.bind(py))?;
        t.set_item(n.method.bind(py), n.get.bind(py))?;
        t.set_item(n.scheme.bind(py), n.http.bind(py))?;
        for key in [&n.path, &n.raw_path] {
            t.set_item(key.bind(py), &none)?;
        }
        t.set_item(n.query_string.bind(py), PyBytes::new(py, b""))?;
        t.set_item(n.root_path.bind(py), PyString::new(py, &root_path))?;
        for key in [&n.headers, &n.client, &n.server, &n.state, &n.extensions] {
            t.set_item(key.bind(py), &none)?;
        }
        let ws_template = t.copy()?;
        ws_template.set_item(n.type_.bind(py), n.websocket.bind(py))?;
        ws_template.del_item(n.method.bind(py))?;
        ws_template.set_item(n.subprotocols.bind(py), &none)?;

        // ASGI path send, zero copy send and HTTP trailers extensions;
        // WebSocket denial responses. Their values are empty dicts, shared
        // by every scope.
        let http_extensions = PyDict::new(py);
        http_extensions.set_item("http.response.pathsend", PyDict::new(py))?;
        http_extensions.set_item("http.response.zerocopysend", PyDict::new(py))?;
        http_extensions.set_item("http.response.trailers", PyDict::new(py))?;
        // Early hints (`http.response.early_hint`) reach HTTP/1.1 and
        // HTTP/2 clients, not HTTP/1.0 ones (see `http::interim`).
        let interim_extensions = http_extensions.copy()?;
        interim_extensions.set_item("http.response.early_hint", PyDict::new(py))?;
        let ws_extensions = PyDict::new(py);
        ws_extensions.set_item("websocket.http.response", PyDict::new(py))?;

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
            shared,
            app: p.app,
            event_loop: p.event_loop.clone_ref(py),
            done: done.unbind(),
            tasks: Mutex::new(HashMap::new()),
            cancelling: AtomicBool::new(false),
            factory_attr: lp.hasattr("_task_factory").unwrap_or(false),
            factory_dict,
            http_template: t.unbind(),
            ws_template: ws_template.unbind(),
            http_extensions: http_extensions.unbind(),
            interim_extensions: interim_extensions.unbind(),
            ws_extensions: ws_extensions.unbind(),
            asgi_lifespan: asgi_lifespan.unbind(),
            state: PyDict::new(py).unbind(),
            root_path,
            error_log: p.error_log,
            access_log: p.access_log,
            reopen_logs: p.reopen_logs,
            warned: Mutex::new(HashSet::new()),
        })
    }

    /// The shared completed awaitable (see [`AppContext::done`]).
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
