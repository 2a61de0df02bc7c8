//! Starting an application call, and cancelling the ones left at shutdown.
//!
//! An app call runs in Skirr's [`Task`] unless `tasks = asyncio` is set or
//! the loop has a task factory (Sentry, OpenTelemetry, aiomonitor set one to
//! see every task): then in an `asyncio.Task` wrapped around an
//! [`AppCall`].

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::bridge::app_call::AppCall;
use crate::bridge::context::LoopCtx;
use crate::bridge::coro::{awaitable_iterator, AppCoro};
use crate::bridge::owner::Owner;
use crate::bridge::task::Task;

/// Calls `app(scope, receive, send)`.
///
/// Errors: whatever the call raises.
pub(crate) fn call_app<'py>(
    py: Python<'py>,
    app: &Bound<'py, PyAny>,
    args: [Bound<'py, PyAny>; 3],
) -> PyResult<Bound<'py, PyAny>> {
    app.call1(PyTuple::new(py, args)?)
}

/// Cancels every suspended task (at shutdown); returns how many. From now
/// on a `CancelledError` ending an app call is the server's doing, not an
/// application error.
pub(crate) fn cancel_all(py: Python<'_>, ctx: &LoopCtx) -> usize {
    ctx.cancelling
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let tasks: Vec<Py<PyAny>> = ctx.tasks.lock().values().map(|t| t.clone_ref(py)).collect();
    let n = tasks.len();
    for t in tasks {
        let _ = t.bind(py).call_method0(pyo3::intern!(py, "cancel"));
    }
    n
}

/// Starts an app call (the coroutine `app(…)` returned): in Skirr's
/// [`Task`], whose first step runs now, or in an `asyncio.Task` (see
/// [`AppCall`]) under `tasks = asyncio` or while the loop has a task
/// factory.
///
/// Errors: `TypeError` if `coro` is not awaitable (Skirr's task), whatever
/// `create_task` or the task factory raises, or the error raised while
/// preparing the first step.
pub(crate) fn start(
    py: Python<'_>,
    ctx: &Arc<LoopCtx>,
    coro: Bound<'_, PyAny>,
    owner: Owner,
) -> PyResult<()> {
    if ctx.asyncio_tasks || ctx.has_task_factory(py) {
        return AppCall::start(py, AppCoro::new(ctx, coro, owner));
    }
    Task::start(py, AppCoro::new(ctx, awaitable_iterator(coro)?, owner))
}
