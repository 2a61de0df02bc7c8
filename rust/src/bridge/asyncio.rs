//! The `asyncio` internals the bridge calls, looked up once per process.
//!
//! [`Task`](crate::bridge::task::Task) enters and leaves itself as the
//! current task and (un)registers itself for `asyncio.all_tasks()` through
//! CPython's hooks for third-party tasks; every awaitable raises asyncio's
//! own `CancelledError` and `InvalidStateError`.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// Python objects the bridge needs, looked up once.
pub(crate) struct Asyncio {
    pub(crate) enter_task: Py<PyAny>,
    pub(crate) leave_task: Py<PyAny>,
    pub(crate) register_task: Py<PyAny>,
    pub(crate) unregister_task: Py<PyAny>,
    pub(crate) cancelled_error: Py<PyAny>,
    pub(crate) invalid_state: Py<PyAny>,
}

static ASYNCIO: PyOnceLock<Asyncio> = PyOnceLock::new();

/// The lookups, made on first use.
///
/// Errors: the import or attribute error if this Python's `asyncio` lacks
/// one of them.
pub(crate) fn asyncio(py: Python<'_>) -> PyResult<&'static Asyncio> {
    ASYNCIO.get_or_try_init(py, || {
        let tasks = py.import("asyncio.tasks")?;
        let exc = py.import("asyncio.exceptions")?;
        Ok(Asyncio {
            enter_task: tasks.getattr("_enter_task")?.unbind(),
            leave_task: tasks.getattr("_leave_task")?.unbind(),
            register_task: tasks.getattr("_register_task")?.unbind(),
            unregister_task: tasks.getattr("_unregister_task")?.unbind(),
            cancelled_error: exc.getattr("CancelledError")?.unbind(),
            invalid_state: exc.getattr("InvalidStateError")?.unbind(),
        })
    })
}
