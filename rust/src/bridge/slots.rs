//! C-level iteration slots for Skirr's awaitables ([`Ready`], [`Waiter`]).
//!
//! Finishing an `await` normally means raising `StopIteration(value)`;
//! through PyO3's generic `__next__` that builds a lazy error, normalizes
//! it, and the interpreter unpacks it again: hundreds of instructions per
//! `receive()`. These slots answer the interpreter directly:
//!
//! * `am_send` (used by `PyIter_Send`: CPython 3.10/3.11's `await`, and
//!   Skirr's task driver) returns the value with `PYGEN_RETURN` and raises
//!   nothing at all;
//! * `tp_iternext` (CPython 3.12+'s `await` on a non-generator) sets
//!   `StopIteration` directly, or returns NULL without an error for `None`.
//!
//! The Python-visible `__next__`/`send` methods stay as they are.

use std::ptr;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyType;

use crate::bridge::awaitable::{AwaitStep, Ready};
use crate::bridge::waiter::Waiter;

/// The `await` step of a Skirr awaitable at `obj`.
///
/// # Safety
/// `obj` is a live instance of `Ready` or `Waiter` and the thread is
/// attached to the interpreter.
unsafe fn step(py: Python<'_>, obj: *mut ffi::PyObject) -> AwaitStep {
    // SAFETY: per the contract, `obj` is a live object; borrowing it does
    // not change its reference count.
    let any = unsafe { Bound::from_borrowed_ptr(py, obj) };
    if let Ok(w) = any.cast::<Waiter>() {
        return Waiter::await_step(w);
    }
    match any.cast::<Ready>() {
        Ok(r) => r.get().await_step(),
        Err(_) => AwaitStep::Raise(pyo3::exceptions::PyTypeError::new_err(
            "not a skirr awaitable",
        )),
    }
}

unsafe extern "C" fn am_send(
    obj: *mut ffi::PyObject,
    _arg: *mut ffi::PyObject,
    result: *mut *mut ffi::PyObject,
) -> ffi::PySendResult {
    // SAFETY: CPython calls slots with the GIL held; `obj` is an instance
    // of a type these slots were installed on; `result` is writable.
    unsafe {
        let py = Python::assume_attached();
        match step(py, obj) {
            AwaitStep::Yield(v) => {
                *result = v.into_ptr();
                ffi::PySendResult::PYGEN_NEXT
            }
            AwaitStep::Return(v) => {
                *result = match v {
                    Some(v) => v.into_ptr(),
                    None => ffi::Py_NewRef(ffi::Py_None()),
                };
                ffi::PySendResult::PYGEN_RETURN
            }
            AwaitStep::Raise(e) => {
                e.restore(py);
                *result = ptr::null_mut();
                ffi::PySendResult::PYGEN_ERROR
            }
        }
    }
}

unsafe extern "C" fn tp_iternext(obj: *mut ffi::PyObject) -> *mut ffi::PyObject {
    // SAFETY: as for `am_send`.
    unsafe {
        let py = Python::assume_attached();
        match step(py, obj) {
            AwaitStep::Yield(v) => v.into_ptr(),
            AwaitStep::Return(None) => ptr::null_mut(),
            AwaitStep::Return(Some(v)) => {
                if v.is_none(py) {
                    return ptr::null_mut();
                }
                // StopIteration(v), built explicitly so a tuple value is
                // not mistaken for constructor arguments.
                let exc = ffi::PyObject_CallOneArg(ffi::PyExc_StopIteration, v.as_ptr());
                if !exc.is_null() {
                    ffi::PyErr_SetObject(ffi::PyExc_StopIteration, exc);
                    ffi::Py_DECREF(exc);
                }
                ptr::null_mut()
            }
            AwaitStep::Raise(e) => {
                e.restore(py);
                ptr::null_mut()
            }
        }
    }
}

fn install_on(ty: &Bound<'_, PyType>) {
    let tp = ty.as_type_ptr();
    // SAFETY: `tp` is a heap type created by PyO3 for one of our classes
    // (it defines `__await__`, so `tp_as_async` points at the type's own
    // async-methods struct). Slots of heap types may be replaced;
    // `PyType_Modified` drops caches that saw the old ones.
    unsafe {
        (*tp).tp_iternext = Some(tp_iternext);
        if !(*tp).tp_as_async.is_null() {
            (*(*tp).tp_as_async).am_send = Some(am_send);
        }
        ffi::PyType_Modified(tp);
    }
}

/// Installs the slots (once, at module initialisation).
pub(crate) fn install(py: Python<'_>) {
    install_on(&py.get_type::<Ready>());
    install_on(&py.get_type::<Waiter>());
}
