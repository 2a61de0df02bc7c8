//! Calling the application for a connection scope (asyncio thread): what
//! an HTTP request and a WebSocket handshake share once their scope and
//! protocol object are built.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3::PyClassInitializer;

use crate::asgi::context::AppContext;
use crate::bridge::owner::{Owner, TaskOwner};
use crate::bridge::start::call_app;

/// Calls the app with `scope` and `proto`'s `receive` and `send`, and
/// starts its coroutine, owned by `proto` (`create_failed`: the error log's
/// message if the protocol object cannot be created).
///
/// Never raises: a failure to create the protocol object is logged; one
/// in the call or the start is the protocol's error (answered 500, or the
/// handshake refused).
pub(crate) fn call<T>(
    py: Python<'_>,
    ctx: &Arc<AppContext>,
    scope: Bound<'_, PyDict>,
    proto: T,
    create_failed: &'static str,
) where
    T: TaskOwner + Into<PyClassInitializer<T>>,
{
    let proto = match Py::new(py, proto) {
        Ok(p) => p,
        Err(e) => {
            ctx.log_error(py, create_failed, Some(&e));
            return;
        }
    };
    let run = || -> PyResult<()> {
        let b = proto.bind(py).as_any();
        let receive = b.getattr(pyo3::intern!(py, "receive"))?;
        let send = b.getattr(pyo3::intern!(py, "send"))?;
        let coro = call_app(py, ctx.app.bind(py), [scope.into_any(), receive, send])?;
        crate::bridge::start::start(py, &ctx.loop_ctx, coro, Owner::new(proto.clone_ref(py)))
    };
    if let Err(e) = run() {
        proto.get().on_error(py, e);
    }
}
