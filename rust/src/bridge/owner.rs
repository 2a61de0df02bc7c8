//! Who hears what an application coroutine does: the protocol object that
//! started it (HTTP, WebSocket or lifespan).
//!
//! [`Task`](crate::bridge::task::Task) and
//! [`AppCall`](crate::bridge::app_call::AppCall) call these hooks after each
//! step; the owner flushes a held response start, checks the response, logs
//! and answers errors.

use pyo3::prelude::*;

use crate::http::protocol::HttpProtocol;
use crate::lifespan::LifespanProtocol;
use crate::websocket::protocol::WebSocketProtocol;

/// Who gets told about the coroutine's steps.
pub(crate) enum Owner {
    Http(Py<HttpProtocol>),
    WebSocket(Py<WebSocketProtocol>),
    Lifespan(Py<LifespanProtocol>),
}

impl Owner {
    pub(crate) fn on_suspend(&self, py: Python<'_>) {
        if let Owner::Http(p) = self {
            p.get().on_suspend(py);
        }
    }

    pub(crate) fn on_return(&self, py: Python<'_>) {
        match self {
            Owner::Http(p) => p.get().on_return(py),
            Owner::WebSocket(p) => p.get().on_return(py),
            Owner::Lifespan(p) => p.get().on_return(py),
        }
    }

    pub(crate) fn on_error(&self, py: Python<'_>, err: PyErr) {
        match self {
            Owner::Http(p) => p.get().on_error(py, err),
            Owner::WebSocket(p) => p.get().on_error(py, err),
            Owner::Lifespan(p) => p.get().on_error(py, err),
        }
    }

    /// The task was cancelled (at shutdown, or by the app itself): not an
    /// application error, so no traceback at ERROR level.
    pub(crate) fn on_cancel(&self, py: Python<'_>) {
        match self {
            Owner::Http(p) => p.get().on_cancel(py),
            Owner::WebSocket(p) => p.get().on_cancel(py),
            Owner::Lifespan(p) => p.get().on_return(py),
        }
    }

    pub(crate) fn as_any(&self) -> &Py<PyAny> {
        match self {
            Owner::Http(p) => p.as_any(),
            Owner::WebSocket(p) => p.as_any(),
            Owner::Lifespan(p) => p.as_any(),
        }
    }
}
