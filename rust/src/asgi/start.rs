//! Calling the application for a connection scope (asyncio thread): what
//! an HTTP request and a WebSocket handshake share once their scope and
//! protocol object are built.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;
use pyo3::{ffi, PyClassInitializer, PyTypeInfo};

use crate::asgi::context::AppContext;
use crate::bridge::owner::{Owner, TaskOwner};
use crate::bridge::start::call_app;

/// A protocol type's `receive` and `send` method descriptors, looked up
/// once: binding them per request skips `getattr`'s type lookup (the bound
/// methods the app gets are the same objects `getattr` makes).
pub(crate) struct Methods(PyOnceLock<[Py<PyAny>; 2]>);

impl Methods {
    /// An empty cache, for a `static`.
    pub(crate) const fn new() -> Self {
        Methods(PyOnceLock::new())
    }

    /// `obj.receive` and `obj.send`; `T` is `obj`'s type, the same on
    /// every call with this cache.
    fn bind<'py, T: PyTypeInfo>(
        &self,
        obj: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let py = obj.py();
        let [r, s] = self.0.get_or_try_init(py, || -> PyResult<_> {
            let ty = T::type_object(py);
            Ok([
                ty.getattr(pyo3::intern!(py, "receive"))?.unbind(),
                ty.getattr(pyo3::intern!(py, "send"))?.unbind(),
            ])
        })?;
        Ok((bind_method(r.bind(py), obj)?, bind_method(s.bind(py), obj)?))
    }
}

/// `descr.__get__(obj, type(obj))`: what `getattr` does for a method found
/// on the type of an object without an instance dict.
fn bind_method<'py>(
    descr: &Bound<'py, PyAny>,
    obj: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: attached; `descr` is a live object, so its type is too.
    let get = unsafe { (*ffi::Py_TYPE(descr.as_ptr())).tp_descr_get };
    let Some(get) = get else {
        // Not a descriptor (not reached for a `#[pymethods]` method).
        return Ok(descr.clone());
    };
    // SAFETY: attached; `descr`, `obj` and `obj`'s type are live; the slot
    // returns a new reference or NULL with an error set.
    unsafe {
        let ty = ffi::Py_TYPE(obj.as_ptr()).cast::<ffi::PyObject>();
        Bound::from_owned_ptr_or_err(obj.py(), get(descr.as_ptr(), obj.as_ptr(), ty))
    }
}

/// Calls the app with `scope` and `proto`'s `receive` and `send` (their
/// descriptors cached in `methods`, one cache per protocol type), and
/// starts its coroutine, owned by `proto` (`create_failed`: the error log's
/// message if the protocol object cannot be created).
///
/// Never raises: a failure to create the protocol object is logged; one
/// in the call or the start is the protocol's error (answered 500, or the
/// handshake refused).
pub(crate) fn call<T>(
    py: Python<'_>,
    ctx: &Arc<AppContext>,
    scope: Bound<'_, PyDict>,
    proto: T,
    methods: &'static Methods,
    create_failed: &'static str,
) where
    T: TaskOwner + Into<PyClassInitializer<T>> + PyTypeInfo,
{
    let proto = match Py::new(py, proto) {
        Ok(p) => p,
        Err(e) => {
            ctx.log_error(py, create_failed, Some(&e));
            return;
        }
    };
    let run = || -> PyResult<()> {
        let (receive, send) = methods.bind::<T>(proto.bind(py).as_any())?;
        let coro = call_app(py, ctx.app.bind(py), [scope.into_any(), receive, send])?;
        crate::bridge::start::start(py, &ctx.loop_ctx, coro, Owner::new(proto.clone_ref(py)))
    };
    if let Err(e) = run() {
        proto.get().on_error(py, e);
    }
}
