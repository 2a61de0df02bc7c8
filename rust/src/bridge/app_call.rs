//! The faithful task path: the app's coroutine runs in a real
//! `asyncio.Task` made by `loop.create_task()` (so a task factory set with
//! `loop.set_task_factory()` is honoured, `asyncio.current_task()` is an
//! `asyncio.Task`, `asyncio.all_tasks()` lists it), wrapped in an
//! [`AppCall`] that tells the server what the coroutine does.
//!
//! [`AppCall`] is a coroutine (it has `send`, `throw`, `close` and
//! `__await__`, so `asyncio.iscoroutine()` accepts it and a task factory may
//! `await` it). Each step is forwarded to the app's coroutine and observed
//! as [`Task`](crate::bridge::task::Task) observes it: a suspension flushes
//! a held response start, a return lets the owner check the response, an
//! exception is logged and answered by the owner and does not escape (as
//! under uvicorn, whose `run_asgi` catches everything), and a
//! `CancelledError` is re-raised so the task ends cancelled.
//!
//! Selected by `--tasks asyncio`, or for a request that starts while the
//! loop has a task factory (see [`crate::bridge::start::start`]).

use parking_lot::Mutex;
use pyo3::exceptions::PyStopIteration;
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::PyTraverseError;

use crate::bridge::awaitable::AwaitStep;
use crate::bridge::coro::{AppCoro, Step};

/// The app's coroutine as the asyncio task sees it. See the module docs.
#[pyclass(frozen, module = "skirr._skirr", name = "AppCall")]
pub(crate) struct AppCall {
    /// The app's coroutine, its owner and the app context.
    app: AppCoro,
    /// The asyncio task running it (for shutdown's cancellation registry).
    task: Mutex<Option<Py<PyAny>>>,
    finished: Mutex<bool>,
}

impl AppCall {
    /// Creates the task for `app` with `loop.create_task()`.
    ///
    /// Errors: whatever `create_task` (or the app's task factory) raises.
    pub(crate) fn start(py: Python<'_>, app: AppCoro) -> PyResult<()> {
        let call = Bound::new(
            py,
            AppCall {
                app,
                task: Mutex::new(None),
                finished: Mutex::new(false),
            },
        )?;
        let ctx = &call.get().app.ctx;
        let task = ctx
            .event_loop
            .bind(py)
            .call_method1(pyo3::intern!(py, "create_task"), (&call,))?;
        let key = call.as_ptr() as usize;
        if !*call.get().finished.lock() {
            // An eager task factory may have run it to the end already.
            ctx.tasks.lock().insert(key, task.clone().unbind());
            *call.get().task.lock() = Some(task.unbind());
        }
        Ok(())
    }

    /// Forwards one step (`value` sent, or `exc` thrown) to the app's
    /// coroutine and observes the outcome.
    pub(crate) fn drive(
        slf: &Bound<'_, AppCall>,
        value: Option<&Bound<'_, PyAny>>,
        exc: Option<Bound<'_, PyAny>>,
    ) -> AwaitStep {
        let py = slf.py();
        let this = slf.get();
        match this.app.step(py, value, exc) {
            Step::Yielded(yielded) => {
                this.app.owner.on_suspend(py);
                AwaitStep::Yield(yielded.unbind())
            }
            Step::Returned => {
                this.end(slf);
                this.app.owner.on_return(py);
                AwaitStep::Return(None)
            }
            Step::Raised(err) => {
                this.end(slf);
                // A cancellation ends the task cancelled, as asyncio
                // expects; any other exception stops here.
                match this.app.raised(py, err) {
                    Some(e) => AwaitStep::Raise(e),
                    None => AwaitStep::Return(None),
                }
            }
        }
    }

    fn end(&self, slf: &Bound<'_, AppCall>) {
        *self.finished.lock() = true;
        if self.task.lock().take().is_some() {
            self.app.ctx.tasks.lock().remove(&(slf.as_ptr() as usize));
        }
    }
}

fn into_result(py: Python<'_>, step: AwaitStep) -> PyResult<Py<PyAny>> {
    match step {
        AwaitStep::Yield(v) => Ok(v),
        AwaitStep::Return(v) => Err(PyStopIteration::new_err(
            v.unwrap_or_else(|| py.None()).into_any(),
        )),
        AwaitStep::Raise(e) => Err(e),
    }
}

#[pymethods]
impl AppCall {
    /// `coroutine.send(value)`.
    fn send(slf: &Bound<'_, Self>, value: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        into_result(slf.py(), AppCall::drive(slf, Some(value), None))
    }

    /// `coroutine.throw(exc)` (the one-argument form asyncio uses; the
    /// legacy `(type, value, traceback)` form builds the exception).
    #[pyo3(signature = (typ, val=None, _tb=None))]
    fn throw(
        slf: &Bound<'_, Self>,
        typ: Bound<'_, PyAny>,
        val: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let exc = match val {
            Some(v) if !v.is_none() => v,
            _ if typ.is_instance_of::<pyo3::types::PyType>() => typ.call0()?,
            _ => typ,
        };
        into_result(slf.py(), AppCall::drive(slf, None, Some(exc)))
    }

    /// `coroutine.close()`.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.app
            .coro
            .bind(py)
            .call_method0(pyo3::intern!(py, "close"))?;
        Ok(())
    }

    fn __await__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        into_result(slf.py(), AppCall::drive(slf, None, None))
    }

    /// The app coroutine's name, for task reprs and instrumentation.
    #[getter(__name__)]
    fn name(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(self.app.coro.bind(py).getattr("__name__")?.unbind())
    }

    #[getter(__qualname__)]
    fn qualname(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(self.app.coro.bind(py).getattr("__qualname__")?.unbind())
    }

    /// The app's own coroutine frame (`Task.get_stack` and debuggers).
    #[getter]
    fn cr_frame(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.app
            .coro
            .bind(py)
            .getattr("cr_frame")
            .ok()
            .map(Bound::unbind)
    }

    #[getter]
    fn cr_running(&self, py: Python<'_>) -> bool {
        self.app
            .coro
            .bind(py)
            .getattr("cr_running")
            .and_then(|v| v.is_truthy())
            .unwrap_or(false)
    }

    #[getter]
    fn cr_await(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.app
            .coro
            .bind(py)
            .getattr("cr_await")
            .ok()
            .map(Bound::unbind)
    }

    #[getter]
    fn cr_code(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.app
            .coro
            .bind(py)
            .getattr("cr_code")
            .ok()
            .map(Bound::unbind)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "<skirr AppCall {}>",
            self.app
                .coro
                .bind(py)
                .repr()
                .map(|r| r.to_string())
                .unwrap_or_default()
        )
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.app.traverse(&visit)?;
        if let Some(t) = &*self.task.lock() {
            visit.call(t)?;
        }
        Ok(())
    }
}
