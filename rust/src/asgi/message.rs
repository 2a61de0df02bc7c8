//! What every ASGI message shares, whatever the protocol (HTTP, WebSocket,
//! lifespan): a dict with a `type`.

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use crate::bridge::names::names;

/// A new message `{"type": t}`, for the caller to add its other keys.
pub(crate) fn event<'py>(py: Python<'py>, t: &Py<PyString>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item(names(py).type_.bind(py), t.bind(py))?;
    Ok(d)
}

/// The Python type name of `v`, for error messages.
pub(crate) fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// The values of `keys` (interned names) in the message dict `d`, read in
/// one pass over its entries and matched by identity: the string literals
/// of app code are interned as the names are. `None` when some key of `d`
/// is none of `keys` by identity (a key built at run time, an extra key):
/// the caller then looks each key up by equality, as `d[key]` does, so the
/// result is the same either way. A lookup costs ~110 instructions
/// (callgrind, CPython 3.11), the pass ~20 per entry.
pub(crate) fn keys_by_identity<'py, const N: usize>(
    d: &Bound<'py, PyDict>,
    keys: [&Py<PyString>; N],
) -> Option<[Option<Bound<'py, PyAny>>; N]> {
    let mut found = [const { None }; N];
    let mut pos: ffi::Py_ssize_t = 0;
    let mut key = std::ptr::null_mut();
    let mut value = std::ptr::null_mut();
    // SAFETY: attached (`d` is a `Bound`); `d` is a live dict, and
    // `PyDict_Next` lends references valid while it is not changed: nothing
    // in this loop runs Python code.
    while unsafe { ffi::PyDict_Next(d.as_ptr(), &mut pos, &mut key, &mut value) } != 0 {
        let slot = keys.iter().position(|k| k.as_ptr() == key)?;
        // SAFETY: `value` is a live object lent by `PyDict_Next` (above);
        // the `Bound` takes its own reference.
        found[slot] = Some(unsafe { Bound::from_borrowed_ptr(d.py(), value) });
    }
    Some(found)
}

/// Reads `message["type"]`, checking `message` is a dict.
pub(crate) fn message_type<'py>(
    message: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyDict>, Bound<'py, PyString>)> {
    let py = message.py();
    let d = message.cast::<PyDict>().map_err(|_| {
        PyTypeError::new_err(format!(
            "ASGI messages must be dicts, got {}",
            type_name(message)
        ))
    })?;
    let t = d
        .get_item(names(py).type_.bind(py))?
        .ok_or_else(|| PyTypeError::new_err("ASGI message has no 'type' key"))?;
    let t = t.cast_into::<PyString>().map_err(|e| {
        PyTypeError::new_err(format!(
            "ASGI message 'type' must be a str, got {}",
            type_name(&e.into_inner())
        ))
    })?;
    Ok((d.clone(), t))
}

/// Compares an interned name with a message type, pointer first.
pub(crate) fn is(t: &Bound<'_, PyString>, name: &Py<PyString>) -> bool {
    t.as_ptr() == name.as_ptr() || t.to_str().ok() == name.bind(t.py()).to_str().ok()
}
