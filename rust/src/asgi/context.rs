//! What the ASGI side needs to build scopes and run applications: the
//! bridge's [`LoopCtx`], the worker's state, prebuilt scope templates and
//! extensions, the lifespan state and the access logger; and the
//! [`WakeSlot`] an HTTP exchange or a WebSocket is woken through.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};

use crate::bridge::context::LoopCtx;
use crate::bridge::names::names;
use crate::bridge::queue::{Event, Wake};
use crate::worker::Worker;

/// A shared `tls` extension dict: (TLS version, cipher suite, the dict).
pub(crate) type TlsTemplate = (u16, Option<u16>, Py<PyDict>);

/// The ASGI side's context: the [`LoopCtx`] (reached through `Deref`), the
/// worker's state, and the prebuilt scope parts.
pub(crate) struct AppContext {
    /// The bridge's part.
    pub(crate) loop_ctx: Arc<LoopCtx>,
    pub(crate) shared: Arc<Worker>,
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
    /// The `tls` extension dict of connections without a client
    /// certificate, one per (TLS version, cipher suite) seen (a few at
    /// most); each request gets a copy (see `scope::tls_dict`).
    pub(crate) tls_templates: Mutex<Vec<TlsTemplate>>,
    /// `root_path`, as `str` and as the prefix of `raw_path`.
    pub(crate) root_path: String,
    /// `access(scope, status, headers, size, seconds)` or `None`.
    pub(crate) access_log: Option<Py<PyAny>>,
    /// Reopens log files (SIGUSR1), or `None`.
    pub(crate) reopen_logs: Option<Py<PyAny>>,
    /// The lifespan protocol object while its app call runs (see
    /// `lifespan::handle`).
    pub(crate) lifespan: Mutex<Option<Py<PyAny>>>,
}

impl std::ops::Deref for AppContext {
    type Target = LoopCtx;

    fn deref(&self) -> &LoopCtx {
        &self.loop_ctx
    }
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
    /// Errors: building the scope templates, or the loop's `create_future`.
    pub(crate) fn new(py: Python<'_>, shared: Arc<Worker>, p: PyParts) -> PyResult<Self> {
        let loop_ctx = Arc::new(LoopCtx::new(
            py,
            p.app,
            p.event_loop,
            p.error_log,
            shared.config.asyncio_tasks,
        )?);
        let n = names(py);
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

        Ok(Self {
            loop_ctx,
            shared,
            http_template: t.unbind(),
            ws_template: ws_template.unbind(),
            http_extensions: http_extensions.unbind(),
            interim_extensions: interim_extensions.unbind(),
            ws_extensions: ws_extensions.unbind(),
            asgi_lifespan: asgi_lifespan.unbind(),
            state: PyDict::new(py).unbind(),
            tls_templates: Mutex::new(Vec::new()),
            root_path,
            access_log: p.access_log,
            reopen_logs: p.reopen_logs,
            lifespan: Mutex::new(None),
        })
    }
}

/// What lets an HTTP exchange or a WebSocket be woken on the asyncio
/// thread: its "queued" mark (it is in the event queue at most once at a
/// time, which keeps the queue bounded) and the application context its
/// wakes run in.
#[derive(Default)]
pub(crate) struct WakeSlot {
    queued: AtomicBool,
    /// Unset for an exchange no app sees (an answer the server made).
    app: OnceLock<Arc<AppContext>>,
}

impl WakeSlot {
    /// Ties the slot to the application context its wakes run in (once,
    /// before its request or handshake is queued).
    pub(crate) fn attach(&self, app: &Arc<AppContext>) {
        let _ = self.app.set(Arc::clone(app));
    }

    /// The application context, once attached.
    pub(crate) fn app(&self) -> Option<&Arc<AppContext>> {
        self.app.get()
    }

    /// Clears the "queued" mark ([`Wake::unqueue`]).
    pub(crate) fn unqueue(&self) {
        self.queued.store(false, Ordering::Release);
    }

    /// Queues `owner` (the object that holds this slot) for the asyncio
    /// thread's attention, unless it is already queued.
    pub(crate) fn queue<W: Wake + 'static>(&self, owner: &Arc<W>, shared: &Worker) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            shared
                .queue
                .push(Event::Wake(Arc::clone(owner) as Arc<dyn Wake>));
        }
    }
}
