//! Who hears what an application coroutine does: the protocol object that
//! started it (HTTP, WebSocket or lifespan), known to the bridge only by
//! its hooks ([`TaskOwner`]).
//!
//! [`Task`](crate::bridge::task::Task) and
//! [`AppCall`](crate::bridge::app_call::AppCall) call these hooks after each
//! step; the owner flushes a held response start, checks the response, logs
//! and answers errors. An [`Owner`] is the object plus a `'static` table of
//! plain function pointers: no allocation, one indirect call per hook.

use pyo3::prelude::*;
use pyo3::pyclass::boolean_struct::True;
use pyo3::PyClass;

/// The hooks of a protocol object that owns an application coroutine.
pub(crate) trait TaskOwner: PyClass<Frozen = True> + Sync {
    /// A cancellation is never an application error for this owner, even
    /// when the app cancelled itself (lifespan).
    const QUIET_CANCEL: bool = false;

    /// The coroutine suspended (it awaits something not ready).
    fn on_suspend(&self, _py: Python<'_>) {}

    /// The coroutine returned.
    fn on_return(&self, py: Python<'_>);

    /// The coroutine raised `err`.
    fn on_error(&self, py: Python<'_>, err: PyErr);

    /// The coroutine was cancelled (at shutdown, or by the app itself):
    /// not an application error, so no traceback at ERROR level.
    fn on_cancel(&self, py: Python<'_>);
}

/// A [`TaskOwner`]'s hooks as plain function pointers over the erased
/// object.
struct Hooks {
    on_suspend: fn(Python<'_>, &Py<PyAny>),
    on_return: fn(Python<'_>, &Py<PyAny>),
    on_error: fn(Python<'_>, &Py<PyAny>, PyErr),
    on_cancel: fn(Python<'_>, &Py<PyAny>),
    quiet_cancel: bool,
}

/// The owner `T` of an erased object.
fn owner<'a, 'py, T: TaskOwner>(py: Python<'py>, obj: &'a Py<PyAny>) -> &'a T {
    // SAFETY: `obj` is only ever the object an `Owner` was built from with
    // `Owner::new::<T>` (the field is private and never replaced), so it is
    // an instance of `T`.
    let bound = unsafe { obj.bind(py).cast_unchecked::<T>() };
    // `get` borrows the bound's lifetime; the object lives as long as `obj`.
    let p: *const T = bound.get();
    // SAFETY: `T` is frozen (`get` needs no borrow flag) and `obj` keeps the
    // object alive for `'a`.
    unsafe { &*p }
}

fn on_suspend<T: TaskOwner>(py: Python<'_>, obj: &Py<PyAny>) {
    owner::<T>(py, obj).on_suspend(py);
}

fn on_return<T: TaskOwner>(py: Python<'_>, obj: &Py<PyAny>) {
    owner::<T>(py, obj).on_return(py);
}

fn on_error<T: TaskOwner>(py: Python<'_>, obj: &Py<PyAny>, err: PyErr) {
    owner::<T>(py, obj).on_error(py, err);
}

fn on_cancel<T: TaskOwner>(py: Python<'_>, obj: &Py<PyAny>) {
    owner::<T>(py, obj).on_cancel(py);
}

/// Who gets told about the coroutine's steps.
pub(crate) struct Owner {
    obj: Py<PyAny>,
    hooks: &'static Hooks,
}

impl Owner {
    /// The owner `p`, with `T`'s hooks.
    pub(crate) fn new<T: TaskOwner>(p: Py<T>) -> Self {
        Owner {
            obj: p.into_any(),
            hooks: const {
                &Hooks {
                    on_suspend: on_suspend::<T>,
                    on_return: on_return::<T>,
                    on_error: on_error::<T>,
                    on_cancel: on_cancel::<T>,
                    quiet_cancel: T::QUIET_CANCEL,
                }
            },
        }
    }

    pub(crate) fn on_suspend(&self, py: Python<'_>) {
        (self.hooks.on_suspend)(py, &self.obj);
    }

    pub(crate) fn on_return(&self, py: Python<'_>) {
        (self.hooks.on_return)(py, &self.obj);
    }

    pub(crate) fn on_error(&self, py: Python<'_>, err: PyErr) {
        (self.hooks.on_error)(py, &self.obj, err);
    }

    /// The task was cancelled (at shutdown, or by the app itself): not an
    /// application error, so no traceback at ERROR level.
    pub(crate) fn on_cancel(&self, py: Python<'_>) {
        (self.hooks.on_cancel)(py, &self.obj);
    }

    /// Whether any cancellation is quiet for this owner (see
    /// [`TaskOwner::QUIET_CANCEL`]).
    pub(crate) fn quiet_cancel(&self) -> bool {
        self.hooks.quiet_cancel
    }

    pub(crate) fn as_any(&self) -> &Py<PyAny> {
        &self.obj
    }
}
