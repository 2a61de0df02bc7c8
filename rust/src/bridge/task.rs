//! Running application coroutines: a task driven from Rust.
//!
//! Each `app(scope, receive, send)` coroutine runs in a [`Task`]: an object
//! with `asyncio.Task`'s behaviour and API (the parts applications and
//! libraries use) whose steps are driven from Rust. It follows CPython's
//! `Task.__step` / `Task.__wakeup` (`Lib/asyncio/tasks.py`) exactly:
//!
//! * each task runs in its own copy of the `contextvars` context;
//! * during a step `asyncio.current_task()` is the task (set with
//!   `asyncio.tasks._enter_task` / `_leave_task`), so anyio, Starlette and
//!   `asyncio.timeout` / `TaskGroup` work;
//! * a yielded asyncio future gets the task's `_wakeup` as done callback; a
//!   bare `yield` reschedules the next step with `call_soon`;
//! * `cancel()`, `cancelling()`, `uncancel()`, `_must_cancel` and
//!   `_fut_waiter` behave as in CPython 3.11+.
//!
//! What it saves, per request: `asyncio.Task.__init__` with its registration
//! in a `WeakSet`, a `call_soon` handle for the first step (the first step
//! runs at once, like Python 3.12's eager tasks), and the teardown of both
//! (measured: about a quarter of the asyncio thread's instructions for a
//! minimal app; see `bench/NOTES.md`). Tasks that suspend are kept in a
//! registry so the server can cancel them at shutdown; `asyncio.all_tasks()`
//! does not list them.
//!
//! The task also observes its coroutine for the server:
//!
//! * when it *suspends*, a held `http.response.start` is flushed, so headers
//!   never wait on an app that sleeps before its first body chunk;
//! * when it *returns*, the owner checks the response was completed;
//! * when it *raises*, the owner logs the traceback and answers 500, or
//!   closes the connection if the response had started. The exception stops
//!   here: no "exception was never retrieved" noise and no dead worker.

use parking_lot::Mutex;
use pyo3::exceptions::PyRuntimeError;
use pyo3::ffi;
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use pyo3::PyTraverseError;

use crate::bridge::asyncio::asyncio;
use crate::bridge::coro::{AppCoro, Step};
use crate::bridge::waiter::{Waiter, IN_STEP};

#[derive(Default)]
struct TaskState {
    done: bool,
    cancelled: bool,
    must_cancel: bool,
    cancel_message: Option<Py<PyAny>>,
    num_cancels_requested: u32,
    fut_waiter: Option<Py<PyAny>>,
    /// `(callback, context)` pairs from `add_done_callback`.
    callbacks: Vec<(Py<PyAny>, Option<Py<PyAny>>)>,
    name: Option<Py<PyAny>>,
    /// In the server's registry of suspended tasks.
    registered: bool,
}

/// An application coroutine driven like an `asyncio.Task`. See the module
/// docs.
#[pyclass(
    frozen,
    weakref,
    freelist = 256,
    module = "skirr._skirr",
    name = "Task"
)]
pub(crate) struct Task {
    /// The coroutine, its owner and the app context.
    app: AppCoro,
    /// The task's `contextvars.Context`.
    context: Py<PyAny>,
    st: Mutex<TaskState>,
}

impl Task {
    /// Creates the task for `app` (its coroutine an iterator `PyIter_Send`
    /// drives, see [`awaitable_iterator`](crate::bridge::coro::awaitable_iterator))
    /// and runs its first step now.
    ///
    /// Errors: the error raised while preparing the first step.
    pub(crate) fn start(py: Python<'_>, app: AppCoro) -> PyResult<()> {
        // SAFETY: attached; returns a new reference or NULL with an error.
        let context = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyContext_CopyCurrent())? };
        let task = Bound::new(
            py,
            Task {
                app,
                context: context.unbind(),
                st: Mutex::new(TaskState::default()),
            },
        )?;
        Task::step(&task, None, true)
    }

    /// One step, as `Task.__step`: throw `exc` (or a pending cancellation)
    /// into the coroutine, or send `None`; then act on what it produced.
    /// `enter_context` is false when the loop already runs this callback in
    /// the task's context (`call_soon`/`add_done_callback` with `context=`).
    fn step(slf: &Bound<'_, Task>, exc: Option<PyErr>, enter_context: bool) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let aio = asyncio(py)?;
        let mut exc = exc;
        {
            let mut st = this.st.lock();
            if st.done {
                return Err(PyErr::from_value(
                    aio.invalid_state
                        .bind(py)
                        .call1(("step(): already done",))?,
                ));
            }
            st.fut_waiter = None;
            if st.must_cancel {
                st.must_cancel = false;
                let already = exc
                    .as_ref()
                    .is_some_and(|e| e.is_instance(py, aio.cancelled_error.bind(py)));
                if !already {
                    let msg = st.cancel_message.as_ref().map(|m| m.clone_ref(py));
                    drop(st);
                    let args = match msg {
                        Some(m) => PyTuple::new(py, [m])?,
                        None => PyTuple::empty(py),
                    };
                    exc = Some(PyErr::from_value(aio.cancelled_error.bind(py).call1(args)?));
                }
            }
        }

        let context = this.context.bind(py);
        if enter_context {
            // SAFETY: attached; `context` is a live Context object.
            if unsafe { ffi::PyContext_Enter(context.as_ptr()) } != 0 {
                return Err(PyErr::fetch(py));
            }
        }
        let loop_ = this.app.ctx.event_loop.bind(py);
        let entered = aio.enter_task.bind(py).call1((loop_, slf));
        let outcome = match entered {
            Ok(_) => {
                let was = IN_STEP.with(|f| f.replace(true));
                let exc = exc.map(|e| e.into_value(py).into_bound(py).into_any());
                let outcome = this.app.step(py, None, exc);
                IN_STEP.with(|f| f.set(was));
                if let Err(e) = aio.leave_task.bind(py).call1((loop_, slf)) {
                    this.app
                        .ctx
                        .log_error(py, "asyncio _leave_task failed", Some(&e));
                }
                outcome
            }
            Err(e) => Step::Raised(e),
        };
        if enter_context {
            // SAFETY: attached; exits the context entered above.
            if unsafe { ffi::PyContext_Exit(context.as_ptr()) } != 0 {
                PyErr::fetch(py).print(py);
            }
        }
        Task::handle(slf, outcome)
    }

    /// Acts on a step's outcome (`Task.__step_run_and_handle_result`).
    fn handle(slf: &Bound<'_, Task>, outcome: Step<'_>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        match outcome {
            Step::Returned => {
                let cancel = {
                    let mut st = this.st.lock();
                    std::mem::take(&mut st.must_cancel)
                };
                if cancel {
                    this.app.owner.on_cancel(py);
                } else {
                    this.app.owner.on_return(py);
                }
                Task::finish(slf, cancel)
            }
            Step::Raised(err) => {
                let cancelled = this.app.raised(py, err).is_some();
                Task::finish(slf, cancelled)
            }
            Step::Yielded(value) => {
                this.app.owner.on_suspend(py);
                Task::suspend(slf, value)
            }
        }
    }

    /// The [`Resume`](crate::bridge::waiter::Resume) hook a task leaves in the [`Waiter`] it waits on:
    /// steps the task `now` (the caller is the loop's reader callback,
    /// outside any task step), or on the next loop iteration.
    fn resume(task: &Bound<'_, PyAny>, now: bool) -> PyResult<()> {
        let task = task.cast::<Task>()?;
        if now {
            Task::step(task, None, true)
        } else {
            Task::schedule(task)
        }
    }

    /// Resumes a task on the next loop iteration, in its context.
    fn schedule(slf: &Bound<'_, Task>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let kwargs = PyDict::new(py);
        kwargs.set_item(pyo3::intern!(py, "context"), this.context.bind(py))?;
        let step = slf.getattr(pyo3::intern!(py, "_step"))?;
        this.app
            .ctx
            .event_loop
            .bind(py)
            .call_method("call_soon", (step,), Some(&kwargs))?;
        Ok(())
    }

    /// The coroutine yielded `value`: wait for it (a future), or step again
    /// on the next loop iteration (a bare `yield`).
    fn suspend(slf: &Bound<'_, Task>, value: Bound<'_, PyAny>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        this.register(slf);
        if let Ok(waiter) = value.cast::<Waiter>() {
            // The shortcut: the waiter steps this task when it completes.
            if waiter.get().is_pending() {
                waiter
                    .get()
                    .attach(slf.clone().into_any().unbind(), Task::resume);
                let must_cancel = {
                    let mut st = this.st.lock();
                    st.fut_waiter = Some(value.clone().unbind());
                    st.must_cancel
                };
                if must_cancel {
                    let msg = this
                        .st
                        .lock()
                        .cancel_message
                        .as_ref()
                        .map(|m| m.clone_ref(py));
                    if Waiter::cancel(waiter, msg) {
                        this.st.lock().must_cancel = false;
                    }
                }
            } else {
                // Completed between the yield and now: step again soon.
                Task::schedule(slf)?;
            }
            return Ok(());
        }
        let context = this.context.bind(py);
        let kwargs = PyDict::new(py);
        kwargs.set_item(pyo3::intern!(py, "context"), context)?;
        if value.is_none() {
            // Bare yield: relinquish control for one loop iteration.
            let step = slf.getattr(pyo3::intern!(py, "_step"))?;
            this.app
                .ctx
                .event_loop
                .bind(py)
                .call_method("call_soon", (step,), Some(&kwargs))?;
            return Ok(());
        }
        let blocking = value.getattr_opt(pyo3::intern!(py, "_asyncio_future_blocking"))?;
        let err = match blocking {
            Some(b) if b.is_truthy()? => {
                if value.is(slf) {
                    PyRuntimeError::new_err("Task cannot await on itself")
                } else {
                    value.setattr(pyo3::intern!(py, "_asyncio_future_blocking"), false)?;
                    let wakeup = slf.getattr(pyo3::intern!(py, "_wakeup"))?;
                    value.call_method(
                        pyo3::intern!(py, "add_done_callback"),
                        (wakeup,),
                        Some(&kwargs),
                    )?;
                    let msg = {
                        let mut st = this.st.lock();
                        st.fut_waiter = Some(value.clone().unbind());
                        st.must_cancel
                            .then(|| st.cancel_message.as_ref().map(|m| m.clone_ref(py)))
                    };
                    if let Some(msg) = msg {
                        // Cancelled during the step: cancel what we wait on.
                        if value
                            .call_method1(pyo3::intern!(py, "cancel"), (msg,))?
                            .is_truthy()?
                        {
                            this.st.lock().must_cancel = false;
                        }
                    }
                    return Ok(());
                }
            }
            Some(_) => PyRuntimeError::new_err(format!(
                "yield was used instead of yield from in task with {}",
                value.repr()?
            )),
            None => PyRuntimeError::new_err(format!("Task got bad yield: {}", value.repr()?)),
        };
        // As CPython: deliver the error into the coroutine on the next step.
        let step = slf.getattr(pyo3::intern!(py, "_step"))?;
        this.app.ctx.event_loop.bind(py).call_method(
            "call_soon",
            (step, err.into_value(py)),
            Some(&kwargs),
        )?;
        Ok(())
    }

    /// Marks the task done and schedules its done callbacks.
    fn finish(slf: &Bound<'_, Task>, cancelled: bool) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let (callbacks, registered) = {
            let mut st = this.st.lock();
            st.done = true;
            st.cancelled = cancelled;
            st.fut_waiter = None;
            (
                std::mem::take(&mut st.callbacks),
                std::mem::take(&mut st.registered),
            )
        };
        if registered {
            this.app.ctx.tasks.lock().remove(&(slf.as_ptr() as usize));
            let _ = asyncio(py)?.unregister_task.bind(py).call1((slf,));
        }
        for (cb, context) in callbacks {
            let kwargs = PyDict::new(py);
            if let Some(c) = context {
                kwargs.set_item(pyo3::intern!(py, "context"), c)?;
            }
            this.app
                .ctx
                .event_loop
                .bind(py)
                .call_method("call_soon", (cb, slf), Some(&kwargs))?;
        }
        Ok(())
    }

    /// Records a task that suspended, so shutdown can cancel it.
    fn register(&self, slf: &Bound<'_, Task>) {
        let mut st = self.st.lock();
        if !st.registered {
            st.registered = true;
            drop(st);
            self.app
                .ctx
                .tasks
                .lock()
                .insert(slf.as_ptr() as usize, slf.clone().into_any().unbind());
            // `asyncio.all_tasks()` lists it (the hook CPython keeps for
            // third-party task types); only tasks that suspend pay for it.
            if let Ok(aio) = asyncio(slf.py()) {
                if let Err(e) = aio.register_task.bind(slf.py()).call1((slf,)) {
                    self.app
                        .ctx
                        .log_error(slf.py(), "asyncio _register_task failed", Some(&e));
                }
            }
        }
    }
}

#[pymethods]
impl Task {
    /// Loop callback: the next step (after a bare `yield`, or to deliver an
    /// error), run by the loop inside the task's context.
    #[pyo3(signature = (exc=None))]
    fn _step(slf: &Bound<'_, Self>, exc: Option<Bound<'_, PyAny>>) -> PyResult<()> {
        Task::step(slf, exc.map(PyErr::from_value), false)
    }

    /// Done callback of the future the task waits on (`Task.__wakeup`).
    fn _wakeup(slf: &Bound<'_, Self>, future: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = slf.py();
        match future.call_method0(pyo3::intern!(py, "result")) {
            Ok(_) => Task::step(slf, None, false),
            Err(e) => Task::step(slf, Some(e), false),
        }
    }

    /// Requests cancellation, as `asyncio.Task.cancel`.
    #[pyo3(signature = (msg=None))]
    fn cancel(&self, py: Python<'_>, msg: Option<Py<PyAny>>) -> PyResult<bool> {
        let waiter = {
            let mut st = self.st.lock();
            if st.done {
                return Ok(false);
            }
            st.num_cancels_requested += 1;
            st.fut_waiter.as_ref().map(|w| w.clone_ref(py))
        };
        if let Some(w) = waiter {
            let m = msg
                .as_ref()
                .map(|m| m.clone_ref(py))
                .unwrap_or_else(|| py.None());
            if w.bind(py)
                .call_method1(pyo3::intern!(py, "cancel"), (m,))?
                .is_truthy()?
            {
                return Ok(true);
            }
        }
        let mut st = self.st.lock();
        st.must_cancel = true;
        st.cancel_message = msg;
        Ok(true)
    }

    /// Pending cancellation requests (`asyncio.Task.cancelling`).
    fn cancelling(&self) -> u32 {
        self.st.lock().num_cancels_requested
    }

    /// Decrements the pending cancellation requests (`Task.uncancel`).
    fn uncancel(&self) -> u32 {
        let mut st = self.st.lock();
        if st.num_cancels_requested > 0 {
            st.num_cancels_requested -= 1;
            if st.num_cancels_requested == 0 {
                st.must_cancel = false;
            }
        }
        st.num_cancels_requested
    }

    fn done(&self) -> bool {
        self.st.lock().done
    }

    fn cancelled(&self) -> bool {
        self.st.lock().cancelled
    }

    /// `None` once done (the server handles the app's errors itself).
    fn result(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let st = self.st.lock();
        if !st.done {
            return Err(PyErr::from_value(
                asyncio(py)?
                    .invalid_state
                    .bind(py)
                    .call1(("Result is not set.",))?,
            ));
        }
        if st.cancelled {
            return Err(PyErr::from_value(
                asyncio(py)?.cancelled_error.bind(py).call0()?,
            ));
        }
        Ok(py.None())
    }

    fn exception(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.result(py)
    }

    #[pyo3(signature = (callback, *, context=None))]
    fn add_done_callback(
        slf: &Bound<'_, Self>,
        callback: Py<PyAny>,
        context: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let this = slf.get();
        let done = this.st.lock().done;
        if done {
            let py = slf.py();
            let kwargs = PyDict::new(py);
            if let Some(c) = context {
                kwargs.set_item("context", c)?;
            }
            this.app.ctx.event_loop.bind(py).call_method(
                "call_soon",
                (callback, slf),
                Some(&kwargs),
            )?;
            return Ok(());
        }
        this.st.lock().callbacks.push((callback, context));
        Ok(())
    }

    fn remove_done_callback(&self, py: Python<'_>, callback: &Bound<'_, PyAny>) -> usize {
        let mut st = self.st.lock();
        let before = st.callbacks.len();
        st.callbacks
            .retain(|(cb, _)| !cb.bind(py).eq(callback).unwrap_or(false));
        before - st.callbacks.len()
    }

    fn get_coro(&self, py: Python<'_>) -> Py<PyAny> {
        self.app.coro.clone_ref(py)
    }

    fn get_context(&self, py: Python<'_>) -> Py<PyAny> {
        self.context.clone_ref(py)
    }

    fn get_loop(&self, py: Python<'_>) -> Py<PyAny> {
        self.app.ctx.event_loop.clone_ref(py)
    }

    fn get_name(&self, py: Python<'_>) -> Py<PyAny> {
        match &self.st.lock().name {
            Some(n) => n.clone_ref(py),
            None => pyo3::intern!(py, "skirr-request")
                .clone()
                .into_any()
                .unbind(),
        }
    }

    fn set_name(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.st.lock().name = Some(value.str()?.into_any().unbind());
        let _ = py;
        Ok(())
    }

    #[pyo3(signature = (*, limit=None))]
    fn get_stack(&self, py: Python<'_>, limit: Option<usize>) -> PyResult<Py<PyAny>> {
        let _ = limit;
        let frame = self
            .app
            .coro
            .bind(py)
            .getattr_opt(pyo3::intern!(py, "cr_frame"))?
            .filter(|f| !f.is_none());
        Ok(match frame {
            Some(f) => pyo3::types::PyList::new(py, [f])?.into_any().unbind(),
            None => pyo3::types::PyList::empty(py).into_any().unbind(),
        })
    }

    /// The future the task waits on (anyio reads it).
    #[getter]
    fn _fut_waiter(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.st.lock().fut_waiter.as_ref().map(|w| w.clone_ref(py))
    }

    /// A cancellation waits for the next step (anyio reads it).
    #[getter]
    fn _must_cancel(&self) -> bool {
        self.st.lock().must_cancel
    }

    #[getter]
    fn _loop(&self, py: Python<'_>) -> Py<PyAny> {
        self.app.ctx.event_loop.clone_ref(py)
    }

    #[getter]
    fn _coro(&self, py: Python<'_>) -> Py<PyAny> {
        self.app.coro.clone_ref(py)
    }

    /// `[(callback, context)]`, as `asyncio.Future._callbacks` (anyio's
    /// `find_root_task` reads it from every task in `all_tasks()`).
    #[getter]
    fn _callbacks(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let st = self.st.lock();
        let items = st
            .callbacks
            .iter()
            .map(|(cb, c)| {
                let c = c.as_ref().map_or_else(|| py.None(), |c| c.clone_ref(py));
                PyTuple::new(py, [cb.clone_ref(py), c])
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok(pyo3::types::PyList::new(py, items)?.into_any().unbind())
    }

    /// `"PENDING"`, `"CANCELLED"` or `"FINISHED"`, as `asyncio.Future._state`.
    #[getter]
    fn _state(&self) -> &'static str {
        let st = self.st.lock();
        match (st.done, st.cancelled) {
            (false, _) => "PENDING",
            (true, true) => "CANCELLED",
            (true, false) => "FINISHED",
        }
    }

    /// Where the task was created (`asyncio` debug mode only; never here).
    #[getter]
    fn _source_traceback(&self, py: Python<'_>) -> Py<PyAny> {
        py.None()
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let coro = self
            .app
            .coro
            .bind(py)
            .repr()
            .map(|r| r.to_string())
            .unwrap_or_else(|_| "<coroutine>".into());
        let state = if self.st.lock().done {
            "finished"
        } else {
            "pending"
        };
        format!("<skirr Task {state} coro={coro}>")
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.app.traverse(&visit)?;
        visit.call(&self.context)?;
        if let Some(st) = self.st.try_lock() {
            visit.call(&st.fut_waiter)?;
            visit.call(&st.cancel_message)?;
            visit.call(&st.name)?;
            for (cb, c) in &st.callbacks {
                visit.call(cb)?;
                visit.call(c)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Some(mut st) = self.st.try_lock() {
            st.fut_waiter = None;
            st.cancel_message = None;
            st.callbacks.clear();
        }
    }
}
