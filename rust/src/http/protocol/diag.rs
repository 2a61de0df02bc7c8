//! What the log lines about an app's mistakes say: where in the app the
//! call came from, and whether an error only reports the client leaving.

use pyo3::prelude::*;
use pyo3::{ffi, intern};

use crate::errors::ClientDisconnected;

/// `file:line` of the Python frame running now (the caller of `send()`).
pub(super) fn caller_location(py: Python<'_>) -> String {
    // SAFETY: attached; returns a borrowed frame or NULL.
    let frame = unsafe { ffi::PyEval_GetFrame() };
    if frame.is_null() {
        return "an unknown location".into();
    }
    // SAFETY: a non-NULL borrowed frame, alive while this thread runs it.
    let frame = unsafe { Bound::from_borrowed_ptr(py, frame.cast()) };
    let file = frame
        .getattr(intern!(py, "f_code"))
        .and_then(|c| c.getattr(intern!(py, "co_filename")))
        .map(|f| f.to_string())
        .unwrap_or_else(|_| "?".into());
    let line = frame
        .getattr(intern!(py, "f_lineno"))
        .map(|l| l.to_string())
        .unwrap_or_else(|_| "?".into());
    format!("{file}:{line}")
}

/// Whether `err` is `ClientDisconnected` or was raised while handling one
/// (its `__cause__`/`__context__` chain, a few links deep).
pub(super) fn caused_by_disconnect(py: Python<'_>, err: &PyErr) -> bool {
    let mut exc = err.value(py).clone().into_any();
    for _ in 0..8 {
        if exc.is_instance_of::<ClientDisconnected>() {
            return true;
        }
        let next = match exc.getattr(intern!(py, "__cause__")) {
            Ok(c) if !c.is_none() => c,
            _ => match exc.getattr(intern!(py, "__context__")) {
                Ok(c) if !c.is_none() => c,
                _ => return false,
            },
        };
        exc = next;
    }
    false
}
