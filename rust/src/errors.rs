//! Exceptions raised to applications.

use pyo3::create_exception;
use pyo3::exceptions::PyOSError;

create_exception!(
    skirr,
    ClientDisconnected,
    PyOSError,
    "Raised by `send()` when the connection is closed or the response is \
     already complete (ASGI HTTP/WebSocket spec 2.4: an `OSError` subclass)."
);

create_exception!(
    skirr,
    StartupFailed,
    pyo3::exceptions::PyRuntimeError,
    "Raised by `Server.serve()` when lifespan startup fails or times out; \
     the message is the application's."
);
