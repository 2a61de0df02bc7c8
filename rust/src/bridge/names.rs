//! Interned Python strings used on hot paths: scope keys, message keys and
//! message types. Built once per process on the asyncio thread; dict lookups
//! with interned keys hit CPython's pointer-equality fast path.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyString;

macro_rules! names {
    ($($field:ident = $text:literal,)*) => {
        /// Interned strings, one field per key or constant value.
        pub(crate) struct Names {
            $(pub(crate) $field: Py<PyString>,)*
        }

        impl Names {
            fn new(py: Python<'_>) -> Self {
                Self {
                    $($field: PyString::intern(py, $text).unbind(),)*
                }
            }
        }
    };
}

names! {
    // scope keys
    type_ = "type",
    asgi = "asgi",
    version = "version",
    spec_version = "spec_version",
    http_version = "http_version",
    method = "method",
    scheme = "scheme",
    path = "path",
    raw_path = "raw_path",
    query_string = "query_string",
    root_path = "root_path",
    headers = "headers",
    client = "client",
    server = "server",
    state = "state",
    extensions = "extensions",
    subprotocols = "subprotocols",
    // the `tls` extension's keys
    tls = "tls",
    server_cert = "server_cert",
    client_cert_chain = "client_cert_chain",
    client_cert_name = "client_cert_name",
    client_cert_error = "client_cert_error",
    tls_version = "tls_version",
    cipher_suite = "cipher_suite",
    // scope values
    http = "http",
    https = "https",
    websocket = "websocket",
    ws = "ws",
    wss = "wss",
    lifespan = "lifespan",
    v1_0 = "1.0",
    v1_1 = "1.1",
    v2 = "2",
    v3 = "3",
    // message keys
    status = "status",
    trailers = "trailers",
    body = "body",
    more_body = "more_body",
    message = "message",
    text = "text",
    bytes = "bytes",
    code = "code",
    reason = "reason",
    subprotocol = "subprotocol",
    // message types
    http_request = "http.request",
    websocket_connect = "websocket.connect",
    websocket_receive = "websocket.receive",
    websocket_disconnect = "websocket.disconnect",
    http_disconnect = "http.disconnect",
    lifespan_startup = "lifespan.startup",
    lifespan_shutdown = "lifespan.shutdown",
    lifespan_startup_complete = "lifespan.startup.complete",
    lifespan_startup_failed = "lifespan.startup.failed",
    lifespan_shutdown_complete = "lifespan.shutdown.complete",
    lifespan_shutdown_failed = "lifespan.shutdown.failed",
    // request methods (the common ones are shared, others are built per request)
    get = "GET",
    head = "HEAD",
    post = "POST",
    put = "PUT",
    delete = "DELETE",
    patch = "PATCH",
    options = "OPTIONS",
}

static NAMES: PyOnceLock<Names> = PyOnceLock::new();

/// The process-wide interned strings.
pub(crate) fn names(py: Python<'_>) -> &'static Names {
    NAMES.get_or_init(py, || Names::new(py))
}
