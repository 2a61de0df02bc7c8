//! What `receive()` (and a `send()` that must wait) returns when it cannot
//! complete at once: a [`Waiter`].
//!
//! A `Waiter` is an asyncio-compatible future (`asyncio.isfuture()` is true;
//! it has `_asyncio_future_blocking`, `add_done_callback`, `result`,
//! `cancel`, `get_loop` …), so any task can await it: an `asyncio.Task`
//! started by the app or by anyio gets its done-callbacks through
//! `loop.call_soon`, as with any future. When the awaiting task is a Skirr
//! [`Task`](crate::bridge::task::Task) — the usual case, the request's own
//! task — there is a shortcut: the task registers itself in the waiter with
//! a [`Resume`] hook, and completing the waiter steps the task directly. Inside the loop's reader callback (where Rust hands a
//! batch of messages to the app) that step happens at once: a WebSocket echo
//! goes from socket to app to socket without an asyncio future, a
//! `call_soon` handle or an event-loop iteration per message.

use std::cell::Cell;

use parking_lot::Mutex;
use pyo3::exceptions::{PyStopIteration, PyTypeError};
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use pyo3::PyTraverseError;

use crate::bridge::asyncio::asyncio;
use crate::bridge::awaitable::AwaitStep;

thread_local! {
    /// A Skirr task step is running on this thread (waiters completed now
    /// must not step another task inline: asyncio allows one current task).
    pub(crate) static IN_STEP: Cell<bool> = const { Cell::new(false) };
    /// The loop's reader callback is running: inline steps are allowed.
    pub(crate) static IN_DRAIN: Cell<bool> = const { Cell::new(false) };
}

/// Marks the loop's reader callback for the duration of a batch: waiters
/// completed inside it step their Skirr task at once.
pub(crate) struct DrainGuard(bool);

impl DrainGuard {
    pub(crate) fn enter() -> Self {
        DrainGuard(IN_DRAIN.with(|f| f.replace(true)))
    }
}

impl Drop for DrainGuard {
    fn drop(&mut self) {
        IN_DRAIN.with(|f| f.set(self.0));
    }
}

/// How a waiter resumes the Skirr task suspended on it (the task passes
/// its own function, so the waiter need not know the task's type): `now` is
/// true inside the loop's reader callback when no task step is running (step
/// it at once), false otherwise (step it on the next loop iteration).
/// Errors are printed by the waiter: nobody else could see them.
pub(crate) type Resume = fn(&Bound<'_, PyAny>, bool) -> PyResult<()>;

enum State {
    Pending,
    Done(Py<PyAny>),
    Failed(Py<PyAny>),
    Cancelled(Option<Py<PyAny>>),
}

struct WaiterState {
    state: State,
    /// asyncio's `_asyncio_future_blocking` (set while a task waits on it).
    blocking: bool,
    /// A Skirr task suspended on this waiter, and how to resume it (the
    /// shortcut).
    task: Option<(Py<PyAny>, Resume)>,
    /// `(callback, context)` from `add_done_callback`.
    callbacks: Vec<(Py<PyAny>, Option<Py<PyAny>>)>,
}

/// An awaitable result that Rust completes later; see the module docs.
#[pyclass(frozen, weakref, freelist = 256, module = "skirr._skirr")]
pub(crate) struct Waiter {
    event_loop: Py<PyAny>,
    st: Mutex<WaiterState>,
}

impl Waiter {
    pub(crate) fn new<'py>(
        py: Python<'py>,
        event_loop: &Py<PyAny>,
    ) -> PyResult<Bound<'py, Waiter>> {
        Bound::new(
            py,
            Waiter {
                event_loop: event_loop.clone_ref(py),
                st: Mutex::new(WaiterState {
                    state: State::Pending,
                    blocking: false,
                    task: None,
                    callbacks: Vec::new(),
                }),
            },
        )
    }

    /// Whether nothing completed (or cancelled) it yet.
    pub(crate) fn is_pending(&self) -> bool {
        matches!(self.st.lock().state, State::Pending)
    }

    /// A Skirr task waits on this waiter (it yielded it).
    pub(crate) fn attach(&self, task: Py<PyAny>, resume: Resume) {
        let mut st = self.st.lock();
        st.blocking = false;
        st.task = Some((task, resume));
    }

    /// Completes with a result (`Ok`) or an exception (`Err`); returns
    /// false if it was already done (cancelled by the app).
    pub(crate) fn complete(slf: &Bound<'_, Waiter>, outcome: PyResult<Bound<'_, PyAny>>) -> bool {
        let py = slf.py();
        let (task, callbacks) = {
            let mut st = slf.get().st.lock();
            if !matches!(st.state, State::Pending) {
                return false;
            }
            st.state = match outcome {
                Ok(v) => State::Done(v.unbind()),
                Err(e) => State::Failed(e.into_value(py).into_any()),
            };
            (st.task.take(), std::mem::take(&mut st.callbacks))
        };
        Waiter::wake(slf, task, callbacks);
        true
    }

    /// Resumes whoever waits: the Skirr task directly (inline inside the
    /// reader callback, else on the next loop iteration), callbacks through
    /// `call_soon`.
    fn wake(
        slf: &Bound<'_, Waiter>,
        task: Option<(Py<PyAny>, Resume)>,
        callbacks: Vec<(Py<PyAny>, Option<Py<PyAny>>)>,
    ) {
        let py = slf.py();
        let this = slf.get();
        if let Some((task, resume)) = task {
            let inline = IN_DRAIN.with(Cell::get) && !IN_STEP.with(Cell::get);
            if let Err(e) = resume(task.bind(py), inline) {
                e.print(py);
            }
        }
        for (cb, context) in callbacks {
            let kwargs = PyDict::new(py);
            if let Some(c) = context {
                let _ = kwargs.set_item(pyo3::intern!(py, "context"), c);
            }
            if let Err(e) = this.event_loop.bind(py).call_method(
                pyo3::intern!(py, "call_soon"),
                (cb, slf),
                Some(&kwargs),
            ) {
                e.print(py);
            }
        }
    }

    /// One step of `await waiter` (see `bridge::slots`).
    pub(crate) fn await_step(slf: &Bound<'_, Waiter>) -> AwaitStep {
        let this = slf.get();
        {
            let mut st = this.st.lock();
            if matches!(st.state, State::Pending) {
                st.blocking = true;
                return AwaitStep::Yield(slf.clone().into_any().unbind());
            }
        }
        match this.outcome(slf.py()) {
            Ok(v) => AwaitStep::Return(v),
            Err(e) => AwaitStep::Raise(e),
        }
    }

    /// The value `await` produces, or the exception it raises.
    fn outcome(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let st = self.st.lock();
        match &st.state {
            State::Pending => Ok(None),
            State::Done(v) => Ok(Some(v.clone_ref(py))),
            State::Failed(e) => Err(PyErr::from_value(e.bind(py).clone())),
            State::Cancelled(msg) => {
                let args = match msg {
                    Some(m) => PyTuple::new(py, [m.clone_ref(py)])?,
                    None => PyTuple::empty(py),
                };
                Err(PyErr::from_value(
                    asyncio(py)?.cancelled_error.bind(py).call1(args)?,
                ))
            }
        }
    }
}

#[pymethods]
impl Waiter {
    fn __await__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// Yields itself while pending (asyncio's future protocol), then ends
    /// the `await` with the result or raises the exception.
    fn __next__(slf: &Bound<'_, Self>) -> PyResult<Option<Py<PyAny>>> {
        let py = slf.py();
        let this = slf.get();
        {
            let mut st = this.st.lock();
            if matches!(st.state, State::Pending) {
                st.blocking = true;
                return Ok(Some(slf.clone().into_any().unbind()));
            }
        }
        match this.outcome(py)? {
            Some(v) if !v.is_none(py) => Err(PyStopIteration::new_err((v,))),
            _ => Ok(None),
        }
    }

    fn send(slf: &Bound<'_, Self>, _value: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        match Waiter::__next__(slf)? {
            Some(v) => Ok(v),
            None => Err(PyStopIteration::new_err(())),
        }
    }

    #[getter(_asyncio_future_blocking)]
    fn get_blocking(&self) -> bool {
        self.st.lock().blocking
    }

    #[setter(_asyncio_future_blocking)]
    fn set_blocking(&self, value: bool) {
        self.st.lock().blocking = value;
    }

    fn get_loop(&self, py: Python<'_>) -> Py<PyAny> {
        self.event_loop.clone_ref(py)
    }

    fn done(&self) -> bool {
        !self.is_pending()
    }

    fn cancelled(&self) -> bool {
        matches!(self.st.lock().state, State::Cancelled(_))
    }

    /// The result; raises the exception, `CancelledError`, or
    /// `InvalidStateError` while pending.
    fn result(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match self.outcome(py)? {
            Some(v) => Ok(v),
            None => Err(PyErr::from_value(
                asyncio(py)?
                    .invalid_state
                    .bind(py)
                    .call1(("Result is not ready.",))?,
            )),
        }
    }

    fn exception(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        match self.outcome(py) {
            Ok(Some(_)) => Ok(None),
            Ok(None) => Err(PyErr::from_value(
                asyncio(py)?
                    .invalid_state
                    .bind(py)
                    .call1(("Exception is not set.",))?,
            )),
            Err(e) if e.is_instance(py, asyncio(py)?.cancelled_error.bind(py)) => Err(e),
            Err(e) => Ok(Some(e.into_value(py).into_any())),
        }
    }

    #[pyo3(signature = (callback, *, context=None))]
    fn add_done_callback(
        slf: &Bound<'_, Self>,
        callback: Py<PyAny>,
        context: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let this = slf.get();
        if this.is_pending() {
            this.st.lock().callbacks.push((callback, context));
        } else {
            Waiter::wake(slf, None, vec![(callback, context)]);
        }
        Ok(())
    }

    fn remove_done_callback(&self, py: Python<'_>, callback: &Bound<'_, PyAny>) -> usize {
        let mut st = self.st.lock();
        let before = st.callbacks.len();
        st.callbacks
            .retain(|(cb, _)| !cb.bind(py).eq(callback).unwrap_or(false));
        before - st.callbacks.len()
    }

    /// Cancels the wait: whoever awaits gets `CancelledError`.
    #[pyo3(signature = (msg=None))]
    pub(crate) fn cancel(slf: &Bound<'_, Self>, msg: Option<Py<PyAny>>) -> bool {
        let (task, callbacks) = {
            let mut st = slf.get().st.lock();
            if !matches!(st.state, State::Pending) {
                return false;
            }
            st.state = State::Cancelled(msg);
            (st.task.take(), std::mem::take(&mut st.callbacks))
        };
        // A cancel comes from app code (maybe inside a task step): the
        // waiting Skirr task resumes on the next loop iteration.
        if let Some((t, resume)) = task {
            if let Err(e) = resume(t.bind(slf.py()), false) {
                e.print(slf.py());
            }
        }
        Waiter::wake(slf, None, callbacks);
        true
    }

    fn set_result(&self) -> PyResult<()> {
        Err(PyTypeError::new_err(
            "a skirr Waiter is completed by the server",
        ))
    }

    fn __repr__(&self) -> &'static str {
        match self.st.lock().state {
            State::Pending => "<skirr Waiter pending>",
            State::Cancelled(_) => "<skirr Waiter cancelled>",
            _ => "<skirr Waiter finished>",
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.event_loop)?;
        if let Some(st) = self.st.try_lock() {
            match &st.state {
                State::Done(v) | State::Failed(v) => visit.call(v)?,
                State::Cancelled(m) => visit.call(m)?,
                State::Pending => {}
            }
            if let Some((t, _)) = &st.task {
                visit.call(t)?;
            }
            for (cb, c) in &st.callbacks {
                visit.call(cb)?;
                visit.call(c)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Some(mut st) = self.st.try_lock() {
            st.task = None;
            st.callbacks.clear();
        }
    }
}
