//! Awaitables handed to applications.
//!
//! Many `receive()` calls can complete at once: the data is already here.
//! [`Ready`] is a pre-completed awaitable whose first `__next__` finishes the
//! `await` with the message, with no event-loop round trip. (`send()` uses a
//! shared, already-done asyncio future instead: its result is always `None`.)

use parking_lot::Mutex;
use pyo3::exceptions::PyStopIteration;
use pyo3::prelude::*;

/// What one step of `await obj` produces (for Skirr's awaitables, whose
/// C slots answer the interpreter directly, see `bridge::slots`; and for
/// [`AppCall`](crate::bridge::app_call::AppCall)'s steps).
pub(crate) enum AwaitStep {
    /// Suspend, yielding this object to the task.
    Yield(Py<PyAny>),
    /// Done with this value (`None`: the value `None`).
    Return(Option<Py<PyAny>>),
    Raise(PyErr),
}

/// An awaitable that is already complete.
///
/// `await Ready(v)` evaluates to `v` (or `None`) without suspending.
#[pyclass(frozen, freelist = 256, module = "skirr._skirr")]
pub(crate) struct Ready {
    value: Mutex<Option<Py<PyAny>>>,
}

#[pymethods]
impl Ready {
    fn __await__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// Ends the `await`: `StopIteration(value)`, or a bare stop for `None`.
    fn __next__(&self) -> PyResult<Option<Py<PyAny>>> {
        match self.value.lock().take() {
            Some(value) => Err(PyStopIteration::new_err((value,))),
            None => Ok(None),
        }
    }

    /// Coroutine protocol: what `send(None)` on a started await does.
    fn send(&self, _value: &Bound<'_, PyAny>) -> PyResult<Option<Py<PyAny>>> {
        self.__next__()
    }
}

impl Ready {
    pub(crate) fn await_step(&self) -> AwaitStep {
        AwaitStep::Return(self.value.lock().take())
    }
}

/// An awaitable that completes with `value`.
pub(crate) fn ready<'py>(py: Python<'py>, value: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    Ok(Bound::new(
        py,
        Ready {
            value: Mutex::new(Some(value.unbind())),
        },
    )?
    .into_any())
}
