//! The access log: one call of the access logger per response.

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::asgi::context::AppContext;

/// Calls the access logger: `access(scope, status, headers, size, seconds)`.
pub(crate) fn write_access(
    py: Python<'_>,
    ctx: &AppContext,
    scope: &Py<PyDict>,
    status: u16,
    headers: Py<PyAny>,
    size: u64,
    took: Option<Duration>,
) {
    let Some(access) = &ctx.access_log else {
        return;
    };
    let secs = took.map_or(0.0, |t| t.as_secs_f64());
    if let Err(e) = access
        .bind(py)
        .call1((scope.bind(py), status, headers, size, secs))
    {
        ctx.log_error(py, "access log failed", Some(&e));
    }
}
