//! One step of an application coroutine, and what its end means: the part
//! of running an app call that [`Task`](crate::bridge::task::Task) (Skirr's
//! own task) and [`AppCall`](crate::bridge::app_call::AppCall) (the
//! coroutine handed to an `asyncio.Task`) share.
//!
//! A step sends a value into the coroutine with `PyIter_Send` (no
//! `StopIteration` is built when it returns) or throws an exception into it.
//! An exception that ends the coroutine goes to its [`Owner`]: a
//! `CancelledError` the server caused (shutdown, or any end of a lifespan
//! call) is a quiet cancellation; anything else is the application's error.

use std::sync::Arc;

use pyo3::exceptions::{PyStopIteration, PyTypeError};
use pyo3::ffi;
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::PyTraverseError;

use crate::bridge::asyncio::asyncio;
use crate::bridge::context::LoopCtx;
use crate::bridge::owner::Owner;

/// An application coroutine and who hears about it.
pub(crate) struct AppCoro {
    /// What is driven: a coroutine, or an iterator that `PyIter_Send` and
    /// `throw` accept.
    pub(crate) coro: Py<PyAny>,
    pub(crate) owner: Owner,
    pub(crate) ctx: Arc<LoopCtx>,
}

/// What one step of the coroutine produced.
pub(crate) enum Step<'py> {
    Yielded(Bound<'py, PyAny>),
    /// Finished (its return value, `None` for an ASGI app, is dropped).
    Returned,
    Raised(PyErr),
}

impl AppCoro {
    pub(crate) fn new(ctx: &Arc<LoopCtx>, coro: Bound<'_, PyAny>, owner: Owner) -> Self {
        AppCoro {
            coro: coro.unbind(),
            owner,
            ctx: Arc::clone(ctx),
        }
    }

    /// Throws `exc` into the coroutine, or sends it `value` (`None` when
    /// absent).
    pub(crate) fn step<'py>(
        &self,
        py: Python<'py>,
        value: Option<&Bound<'py, PyAny>>,
        exc: Option<Bound<'py, PyAny>>,
    ) -> Step<'py> {
        let coro = self.coro.bind(py);
        if let Some(e) = exc {
            return match coro.call_method1(pyo3::intern!(py, "throw"), (e,)) {
                Ok(v) => Step::Yielded(v),
                Err(e) if e.is_instance_of::<PyStopIteration>(py) => Step::Returned,
                Err(e) => Step::Raised(e),
            };
        }
        let mut result: *mut ffi::PyObject = std::ptr::null_mut();
        // SAFETY: attached; `coro` is a live object and the argument a live
        // object borrowed for the call (`Py_None` is immortal or held by
        // the interpreter); `result` receives a new reference (or NULL with
        // an error set).
        let status = unsafe {
            let arg = value.map_or_else(|| ffi::Py_None(), |v| v.as_ptr());
            ffi::PyIter_Send(coro.as_ptr(), arg, &mut result)
        };
        match status {
            // SAFETY: PYGEN_NEXT gives a new, non-NULL reference.
            ffi::PySendResult::PYGEN_NEXT => {
                Step::Yielded(unsafe { Bound::from_owned_ptr(py, result) })
            }
            ffi::PySendResult::PYGEN_RETURN => {
                if !result.is_null() {
                    // SAFETY: the return value is a new reference.
                    drop(unsafe { Bound::from_owned_ptr(py, result) });
                }
                Step::Returned
            }
            ffi::PySendResult::PYGEN_ERROR => Step::Raised(PyErr::fetch(py)),
        }
    }

    /// The coroutine raised `err`: tells the owner. Returns `err` again when
    /// it is a `CancelledError` (the task running the call ends cancelled),
    /// `None` for any other exception, which stops here.
    ///
    /// A `CancelledError` the server caused (shutdown cancels every task; a
    /// lifespan call is only ever cancelled by the server) is a quiet
    /// cancellation. One the server did not cause (another task cancelled
    /// the handler) is an application error, logged as uvicorn logs it.
    pub(crate) fn raised(&self, py: Python<'_>, err: PyErr) -> Option<PyErr> {
        let cancelled = asyncio(py)
            .map(|a| err.is_instance(py, a.cancelled_error.bind(py)))
            .unwrap_or(false);
        let by_server = self.ctx.cancelling_all();
        if cancelled && (by_server || self.owner.quiet_cancel()) {
            self.owner.on_cancel(py);
            return Some(err);
        }
        let reraise = cancelled.then(|| err.clone_ref(py));
        self.owner.on_error(py, err);
        reraise
    }

    /// The Python objects it holds, for the garbage collector.
    pub(crate) fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.coro)?;
        visit.call(self.owner.as_any())
    }
}

/// An iterator that `PyIter_Send` and `throw` can drive: the coroutine
/// itself, or `obj.__await__()` for another awaitable.
///
/// Errors: `TypeError` if `obj` is neither (the app is not an `async def`).
pub(crate) fn awaitable_iterator(obj: Bound<'_, PyAny>) -> PyResult<Bound<'_, PyAny>> {
    let py = obj.py();
    // SAFETY: type slot lookup on a live object while attached.
    let native = unsafe {
        let tp = ffi::Py_TYPE(obj.as_ptr());
        !(*tp).tp_as_async.is_null() && (*(*tp).tp_as_async).am_send.is_some()
    };
    if native || obj.hasattr(pyo3::intern!(py, "__next__"))? {
        return Ok(obj);
    }
    match obj.getattr_opt(pyo3::intern!(py, "__await__"))? {
        Some(await_) => await_.call0(),
        None => Err(PyTypeError::new_err(format!(
            "the ASGI application returned {} instead of a coroutine: \
             is it an `async def` callable taking (scope, receive, send)?",
            obj.get_type().name()?
        ))),
    }
}
