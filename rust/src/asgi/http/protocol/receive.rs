//! The messages `receive()` returns on an HTTP connection (ASGI HTTP spec
//! 2.5, "Request" and "Disconnect"), and the wakes that hand them to the
//! waiting `receive()` calls.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict};

use crate::asgi::context::AppContext;
use crate::asgi::http::access::write_access;
use crate::asgi::http::exchange::{ExchState, Exchange};
use crate::bridge::context::{fail_disconnected, is_done, resolve};
use crate::bridge::names::names;
use crate::worker::Worker;

/// `{"type": "http.request", "body": b"", "more_body": False}`, copied
/// for each message: a copy and one or two stores cost less than a new
/// dict's three inserts. Same keys, order and values as built anew.
static REQUEST_TEMPLATE: PyOnceLock<Py<PyDict>> = PyOnceLock::new();

pub(super) fn request_message<'py>(
    py: Python<'py>,
    body: &[u8],
    more: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let n = names(py);
    let template = REQUEST_TEMPLATE.get_or_try_init(py, || -> PyResult<_> {
        let d = PyDict::new(py);
        d.set_item(n.type_.bind(py), n.http_request.bind(py))?;
        d.set_item(n.body.bind(py), PyBytes::new(py, b""))?;
        d.set_item(n.more_body.bind(py), false)?;
        Ok(d.unbind())
    })?;
    let d = template.bind(py).copy()?;
    if !body.is_empty() {
        d.set_item(n.body.bind(py), PyBytes::new(py, body))?;
    }
    if more {
        d.set_item(n.more_body.bind(py), true)?;
    }
    Ok(d.into_any())
}

pub(super) fn disconnect_message(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    let n = names(py);
    let d = PyDict::new(py);
    d.set_item(n.type_.bind(py), n.http_disconnect.bind(py))?;
    Ok(d.into_any())
}

/// The next message `receive()` can deliver right now, if any.
pub(super) fn next_message<'py>(
    py: Python<'py>,
    exch: &Exchange,
    ex: &mut ExchState,
    shared: &Worker,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let cfg = &shared.config;
    if ex.gone {
        // The client left (or the request was rejected mid-body): whatever
        // body is still buffered must not look like a complete request.
        return disconnect_message(py).map(Some);
    }
    if let Some(chunk) = ex.body.pop_front() {
        let was_full = ex.body_bytes >= cfg.body_buffer;
        ex.body_bytes -= chunk.len();
        if was_full && ex.body_bytes < cfg.body_buffer {
            exch.resume_body(ex, shared);
        }
        let more = !(ex.body.is_empty() && ex.body_end);
        ex.request_complete = !more;
        return request_message(py, &chunk, more).map(Some);
    }
    if ex.responded {
        // Once the response was sent, only a disconnect is left to report
        // (ASGI HTTP spec, "Disconnected").
        return disconnect_message(py).map(Some);
    }
    if ex.body_end && !ex.request_complete {
        ex.request_complete = true;
        return request_message(py, b"", false).map(Some);
    }
    if ex.eof && ex.request_complete {
        // The client stopped sending after its request. An app that asks
        // learns it as `http.disconnect` (uvicorn's answer), and from then
        // on the client counts as gone (send() raises); one that does not
        // ask answers a half-closed client normally (RFC 9112 §9.6).
        ex.gone = true;
        exch.resume_body(ex, shared);
        return disconnect_message(py).map(Some);
    }
    Ok(None)
}

/// Handles a `Wake` event: completes the waiters of `exch` that can
/// complete now (on the asyncio thread).
pub(crate) fn on_wake(py: Python<'_>, ctx: &AppContext, exch: &Exchange) {
    let shared = &ctx.shared;
    let mut ex = exch.lock();
    // Oldest waiter first; a disconnect reaches every one of them.
    let mut recv = Vec::new();
    while let Some(w) = ex.recv_waiters.pop_front() {
        if is_done(w.bind(py)) {
            continue;
        }
        match next_message(py, exch, &mut ex, shared) {
            Ok(Some(msg)) => recv.push((w, msg)),
            Ok(None) => {
                ex.recv_waiters.push_front(w);
                break;
            }
            Err(e) => {
                drop(ex);
                ctx.log_error(py, "could not build an http.request message", Some(&e));
                return;
            }
        }
    }
    let rejected = std::mem::take(&mut ex.rejection_unlogged)
        .then(|| {
            ex.access_scope
                .take()
                .map(|s| (s, ex.wire_status, ex.wire_bytes, ex.received))
        })
        .flatten();
    let mut send = Vec::new();
    let gone = ex.gone;
    if gone || ex.has_room(shared.config.send_buffer) {
        send = std::mem::take(&mut ex.send_waiters);
    }
    drop(ex);
    if let Some((scope, status, bytes, received)) = rejected {
        // The server answered while the app was serving (408/413/503):
        // its time is the wait until that answer.
        write_access(
            py,
            ctx,
            &scope,
            status,
            py.None(),
            bytes,
            received.map(|r| r.elapsed()),
        );
    }
    for (w, msg) in recv {
        resolve(w.bind(py), msg);
    }
    for w in send {
        if gone {
            fail_disconnected(w.bind(py), "the client disconnected");
        } else {
            resolve(w.bind(py), py.None().into_bound(py));
        }
    }
}
