//! Running an application coroutine inside an asyncio Task.
//!
//! [`AppCall`] wraps the coroutine returned by `app(scope, receive, send)`.
//! It is a coroutine itself (it has `__await__`, `send`, `throw`, `close`,
//! and `__next__`, which the C Task uses for its `send(None)` fast path), so
//! the app still runs in a real `asyncio.Task`: `current_task()`,
//! cancellation and context variables behave as under any server (anyio and
//! Starlette depend on them). The wrapper only observes each step:
//!
//! * the coroutine *suspends*: a held `http.response.start` is flushed, so
//!   headers never wait on an app that sleeps before its first body chunk;
//! * it *returns*: the owner checks the response was completed (else 500);
//! * it *raises*: the owner logs the traceback and answers 500, or closes the
//!   connection if the response had started. The exception stops here, so no
//!   "Task exception was never retrieved" noise and no dead worker.
//!
//! No done-callback is registered: completion is seen inline, at no cost.

use std::ptr;

use pyo3::exceptions::{PyStopIteration, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;

use crate::http::protocol::HttpProtocol;
use crate::lifespan::LifespanProtocol;

/// Who gets told about the coroutine's steps.
pub(crate) enum Owner {
    Http(Py<HttpProtocol>),
    Lifespan(Py<LifespanProtocol>),
}

impl Owner {
    fn on_suspend(&self, py: Python<'_>) {
        if let Owner::Http(p) = self {
            p.get().on_suspend(py);
        }
    }

    fn on_return(&self, py: Python<'_>) {
        match self {
            Owner::Http(p) => p.get().on_return(py),
            Owner::Lifespan(p) => p.get().on_return(py),
        }
    }

    fn on_error(&self, py: Python<'_>, err: PyErr) {
        match self {
            Owner::Http(p) => p.get().on_error(py, err),
            Owner::Lifespan(p) => p.get().on_error(py, err),
        }
    }

    /// The task was cancelled (at shutdown, or by the app itself): not an
    /// application error, so no traceback at ERROR level.
    fn on_cancel(&self, py: Python<'_>) {
        match self {
            Owner::Http(p) => p.get().on_cancel(py),
            Owner::Lifespan(p) => p.get().on_return(py),
        }
    }
}

/// A coroutine wrapper that reports the app's completion to its owner.
#[pyclass(frozen, freelist = 256, module = "skirr._skirr")]
pub(crate) struct AppCall {
    coro: Py<PyAny>,
    owner: Owner,
}

/// What one step of the inner coroutine produced.
enum Step {
    Yielded(Py<PyAny>),
    Returned,
    Raised(PyErr),
}

impl AppCall {
    pub(crate) fn new(coro: Py<PyAny>, owner: Owner) -> Self {
        Self { coro, owner }
    }

    fn send_inner(&self, py: Python<'_>, value: *mut ffi::PyObject) -> Step {
        let mut result: *mut ffi::PyObject = ptr::null_mut();
        // SAFETY: we are attached (we hold `py`); `coro` and `value` are valid
        // strong or borrowed references for the duration of the call, and
        // `result` receives a new reference (or NULL with an error set).
        let status = unsafe { ffi::PyIter_Send(self.coro.as_ptr(), value, &mut result) };
        match status {
            ffi::PySendResult::PYGEN_NEXT => {
                // SAFETY: PYGEN_NEXT returns a new, non-NULL reference.
                Step::Yielded(unsafe { Bound::from_owned_ptr(py, result) }.unbind())
            }
            ffi::PySendResult::PYGEN_RETURN => {
                if !result.is_null() {
                    // SAFETY: the return value is a new reference we discard.
                    drop(unsafe { Bound::from_owned_ptr(py, result) });
                }
                Step::Returned
            }
            ffi::PySendResult::PYGEN_ERROR => Step::Raised(PyErr::fetch(py)),
        }
    }

    /// Reports a step to the owner; returns the value to yield to the Task,
    /// `None` when the coroutine is finished, or the error to propagate.
    fn finish_step(&self, py: Python<'_>, step: Step) -> PyResult<Option<Py<PyAny>>> {
        match step {
            Step::Yielded(v) => {
                self.owner.on_suspend(py);
                Ok(Some(v))
            }
            Step::Returned => {
                self.owner.on_return(py);
                Ok(None)
            }
            Step::Raised(err) => {
                let cancelled = err.is_instance(py, cancelled_error(py)?);
                if cancelled {
                    // Keep asyncio's cancellation semantics for the Task.
                    self.owner.on_cancel(py);
                    Err(err)
                } else {
                    self.owner.on_error(py, err);
                    Ok(None)
                }
            }
        }
    }

    fn as_method_result(r: PyResult<Option<Py<PyAny>>>) -> PyResult<Py<PyAny>> {
        match r? {
            Some(v) => Ok(v),
            None => Err(PyStopIteration::new_err(())),
        }
    }
}

#[pymethods]
impl AppCall {
    fn __await__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// `send(None)`: the C Task's fast path (`tp_iternext`).
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        // SAFETY: Py_None is immortal / always valid while attached.
        let step = self.send_inner(py, unsafe { ffi::Py_None() });
        self.finish_step(py, step)
    }

    fn send(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let step = self.send_inner(py, value.as_ptr());
        Self::as_method_result(self.finish_step(py, step))
    }

    #[pyo3(signature = (typ, val=None, tb=None))]
    fn throw(
        &self,
        py: Python<'_>,
        typ: &Bound<'_, PyAny>,
        val: Option<&Bound<'_, PyAny>>,
        tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let coro = self.coro.bind(py);
        let args = match (val, tb) {
            (None, None) => PyTuple::new(py, [typ])?,
            (Some(v), None) => PyTuple::new(py, [typ, v])?,
            (v, Some(t)) => PyTuple::new(
                py,
                [
                    typ.clone(),
                    v.cloned().unwrap_or_else(|| py.None().into_bound(py)),
                    t.clone(),
                ],
            )?,
        };
        let step = match coro.call_method1(pyo3::intern!(py, "throw"), args) {
            Ok(v) => Step::Yielded(v.unbind()),
            Err(e) if e.is_instance_of::<PyStopIteration>(py) => Step::Returned,
            Err(e) => Step::Raised(e),
        };
        Self::as_method_result(self.finish_step(py, step))
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.coro
            .bind(py)
            .call_method0(pyo3::intern!(py, "close"))?;
        Ok(())
    }

    /// The wrapped coroutine (for debuggers and `Task.get_coro()` users).
    #[getter]
    fn cr_await(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        Ok(self
            .coro
            .bind(py)
            .getattr_opt(pyo3::intern!(py, "cr_await"))?
            .map(Bound::unbind))
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let inner = self
            .coro
            .bind(py)
            .repr()
            .map(|r| r.to_string())
            .unwrap_or_else(|_| "<coroutine>".into());
        format!("<skirr AppCall {inner}>")
    }
}

static CANCELLED: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn cancelled_error(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    CANCELLED
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(py.import("asyncio")?.getattr("CancelledError")?.unbind())
        })
        .map(|c| c.bind(py))
}

/// Calls `app(scope, receive, send)` and checks it returned a coroutine.
///
/// Errors: whatever the call raises, or `TypeError` naming the app when the
/// result is not awaitable (an ASGI app must be an `async` callable).
pub(crate) fn call_app<'py>(
    py: Python<'py>,
    app: &Bound<'py, PyAny>,
    args: [Bound<'py, PyAny>; 3],
) -> PyResult<Bound<'py, PyAny>> {
    let coro = app.call1(PyTuple::new(py, args)?)?;
    // SAFETY: type slot lookup on a valid object while attached.
    let has_send = unsafe {
        let tp = ffi::Py_TYPE(coro.as_ptr());
        !(*tp).tp_as_async.is_null() && (*(*tp).tp_as_async).am_send.is_some()
    };
    if !has_send && !coro.hasattr(pyo3::intern!(py, "__next__"))? {
        return Err(PyTypeError::new_err(format!(
            "the ASGI application returned {} instead of a coroutine: \
             is it an `async def` callable taking (scope, receive, send)?",
            coro.get_type().name()?
        )));
    }
    Ok(coro)
}
