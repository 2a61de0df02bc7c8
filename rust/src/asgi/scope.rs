//! Building the HTTP and WebSocket connection scopes (ASGI HTTP and
//! WebSocket specs 2.5, "Connection Scope") from a parsed request head and
//! its connection's [`ConnInfo`], whatever the wire protocol.

use std::borrow::Cow;
use std::net::SocketAddr;

use http::{Method, Version};
use percent_encoding::percent_decode_str;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString};

use crate::asgi::conn::{ConnInfo, LocalAddr, TlsInfo};
use crate::asgi::context::AppContext;
use crate::bridge::names::{names, Names};
use crate::wire::proxy::Origin;

fn method<'py>(py: Python<'py>, n: &Names, m: &Method) -> Bound<'py, PyString> {
    let interned = match *m {
        Method::GET => &n.get,
        Method::POST => &n.post,
        Method::HEAD => &n.head,
        Method::PUT => &n.put,
        Method::DELETE => &n.delete,
        Method::PATCH => &n.patch,
        Method::OPTIONS => &n.options,
        _ => return PyString::new(py, m.as_str()),
    };
    interned.bind(py).clone()
}

/// `path`: the request target's path, percent-decoded, then UTF-8 decoded
/// (invalid sequences become U+FFFD, as `urllib.parse.unquote` does).
/// A path without `%` is its own decoding (`raw` is UTF-8 already): the
/// common case skips the decoder.
pub(crate) fn decode_path(raw: &str) -> Cow<'_, str> {
    if !raw.as_bytes().contains(&b'%') {
        return Cow::Borrowed(raw);
    }
    percent_decode_str(raw).decode_utf8_lossy()
}

/// `(host, port)` for a TCP address; IPv4-mapped IPv6 shown as IPv4.
pub(crate) fn addr_tuple<'py>(py: Python<'py>, addr: &SocketAddr) -> PyResult<Bound<'py, PyAny>> {
    let ip = addr.ip().to_canonical();
    Ok((ip.to_string(), addr.port()).into_pyobject(py)?.into_any())
}

/// `scope["server"]`: `(host, port)`, or `(path, None)` for a Unix socket.
pub(crate) fn server_tuple<'py>(py: Python<'py>, local: &LocalAddr) -> PyResult<Bound<'py, PyAny>> {
    match local {
        LocalAddr::Tcp(a) => addr_tuple(py, a),
        LocalAddr::Unix(path) => Ok((path.as_str(), py.None()).into_pyobject(py)?.into_any()),
    }
}

/// `headers`: `[(name, value), ...]` as bytes; names are lower-case (hyper
/// normalises them). Repeated fields are kept, each name's values in order.
pub(crate) fn headers<'py>(py: Python<'py>, map: &http::HeaderMap) -> PyResult<Bound<'py, PyList>> {
    let len = map.len();
    let Ok(size) = ffi::Py_ssize_t::try_from(len) else {
        return Err(pyo3::exceptions::PyOverflowError::new_err(
            "too many headers",
        ));
    };
    // Sized once and filled in place (no appends, no resizes).
    // SAFETY: attached; returns a new reference or NULL with an error set.
    let list = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyList_New(size))? };
    let mut filled = 0;
    for (name, value) in map.iter().take(len) {
        // SAFETY: attached; a new reference or NULL with an error set.
        let pair = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyTuple_New(2))? };
        let name = PyBytes::new(py, name.as_str().as_bytes());
        let value = PyBytes::new(py, value.as_bytes());
        // SAFETY: `pair` is a new 2-tuple and `list` a new list of `len`
        // slots, both unshared; SET_ITEM steals the references given, and
        // `filled < len` (the iterator is capped at `len`).
        unsafe {
            ffi::PyTuple_SET_ITEM(pair.as_ptr(), 0, name.into_ptr());
            ffi::PyTuple_SET_ITEM(pair.as_ptr(), 1, value.into_ptr());
            ffi::PyList_SET_ITEM(list.as_ptr(), filled as ffi::Py_ssize_t, pair.into_ptr());
        }
        filled += 1;
    }
    if filled != len {
        // Not reachable (`len` counts every value the iterator yields); a
        // list with empty slots must never reach Python.
        let list = PyList::empty(py);
        for (name, value) in map {
            list.append((
                PyBytes::new(py, name.as_str().as_bytes()),
                PyBytes::new(py, value.as_bytes()),
            ))?;
        }
        return Ok(list);
    }
    Ok(list.cast_into::<PyList>()?)
}

/// `d[key] = value` with an interned key, straight to `PyDict_SetItem`.
#[inline]
fn put<T>(d: &Bound<'_, PyDict>, key: &Py<PyString>, value: &Bound<'_, T>) -> PyResult<()> {
    // SAFETY: attached; the dict, key and value are live objects and
    // `PyDict_SetItem` takes its own references.
    if unsafe { ffi::PyDict_SetItem(d.as_ptr(), key.as_ptr(), value.as_ptr()) } != 0 {
        return Err(PyErr::fetch(d.py()));
    }
    Ok(())
}

/// Sets the keys HTTP and WebSocket scopes share: `http_version`, `path`,
/// `raw_path`, `query_string`, `headers`, `client`, `server`, `state`.
fn fill_common(
    py: Python<'_>,
    scope: &Bound<'_, PyDict>,
    ctx: &AppContext,
    p: &http::request::Parts,
    conn: &ConnInfo,
) -> PyResult<()> {
    let n = names(py);
    // The template holds "1.1", `b""` as the query, and (HTTP) "GET" and
    // "http": only other values are stored.
    let version = match p.version {
        Version::HTTP_10 => Some(&n.v1_0),
        Version::HTTP_2 => Some(&n.v2),
        Version::HTTP_3 => Some(&n.v3),
        _ => None,
    };
    if let Some(v) = version {
        put(scope, &n.http_version, v.bind(py))?;
    }

    let raw = p.uri.path();
    let decoded = decode_path(raw);
    let origin = p.extensions.get::<Origin>();
    let proxy_root = origin.and_then(|o| o.root_path.as_deref());
    if let Some(r) = proxy_root {
        put(scope, &n.root_path, &PyString::new(py, r))?;
    }
    let root_path = proxy_root.unwrap_or(&ctx.root_path);
    if root_path.is_empty() {
        put(scope, &n.path, &PyString::new(py, &decoded))?;
        put(scope, &n.raw_path, &PyBytes::new(py, raw.as_bytes()))?;
    } else {
        let root = root_path;
        put(
            scope,
            &n.path,
            &PyString::new(py, &format!("{root}{decoded}")),
        )?;
        let mut raw_path = Vec::with_capacity(root.len() + raw.len());
        raw_path.extend_from_slice(root.as_bytes());
        raw_path.extend_from_slice(raw.as_bytes());
        put(scope, &n.raw_path, &PyBytes::new(py, &raw_path))?;
    }
    if let Some(query) = p.uri.query().filter(|q| !q.is_empty()) {
        put(scope, &n.query_string, &PyBytes::new(py, query.as_bytes()))?;
    }
    put(scope, &n.headers, &headers(py, &p.headers)?)?;

    let client = match (origin.and_then(|o| o.client.as_ref()), conn.peer) {
        (Some((host, port)), _) => (host.as_str(), *port).into_pyobject(py)?.into_any(),
        (None, Some(peer)) => match conn.py_client.get() {
            Some(c) => c.bind(py).clone(),
            None => {
                let c = addr_tuple(py, &peer)?;
                let _ = conn.py_client.set(c.clone().unbind());
                c
            }
        },
        (None, None) => py.None().into_bound(py),
    };
    put(scope, &n.client, &client)?;
    let server = match conn.listener.py_server.get() {
        Some(s) => s.bind(py).clone(),
        None => {
            let s = server_tuple(py, &conn.listener.local)?;
            let _ = conn.listener.py_server.set(s.clone().unbind());
            s
        }
    };
    put(scope, &n.server, &server)?;
    put(scope, &n.state, &ctx.state.bind(py).copy()?)?;
    Ok(())
}

/// The `tls` extension dict of connections without a client certificate
/// at `version` and `suite`: built once per pair, shared by them.
fn shared_tls_template<'py>(
    py: Python<'py>,
    ctx: &AppContext,
    version: u16,
    suite: Option<u16>,
) -> PyResult<Bound<'py, PyDict>> {
    let found = ctx
        .tls_templates
        .lock()
        .iter()
        .find(|(v, s, _)| *v == version && *s == suite)
        .map(|(_, _, d)| d.bind(py).clone());
    if let Some(d) = found {
        return Ok(d);
    }
    let n = names(py);
    let d = PyDict::new(py);
    d.set_item(&n.server_cert, ctx.shared.tls_server_cert.as_deref())?;
    d.set_item(&n.client_cert_chain, PyList::empty(py))?;
    d.set_item(&n.client_cert_name, py.None())?;
    d.set_item(&n.client_cert_error, py.None())?;
    d.set_item(&n.tls_version, version)?;
    d.set_item(&n.cipher_suite, suite)?;
    ctx.tls_templates
        .lock()
        .push((version, suite, d.clone().unbind()));
    Ok(d)
}

/// The connection's `tls` extension dict: the shared one, or (with a
/// client certificate) the connection's own, built at its first request.
/// Every value in it is immutable but `client_cert_chain`, which each
/// request gets its own copy of (see [`tls_dict`]).
fn tls_template<'py>(
    py: Python<'py>,
    ctx: &AppContext,
    conn: &ConnInfo,
    t: &TlsInfo,
) -> PyResult<Bound<'py, PyDict>> {
    if let Some(d) = conn.py_tls.get() {
        return Ok(d.bind(py).clone());
    }
    let shared = shared_tls_template(py, ctx, t.version, t.cipher_suite)?;
    if t.client_cert_chain.is_empty() && t.client_cert_name.is_none() {
        return Ok(shared);
    }
    let n = names(py);
    let d = shared.copy()?;
    d.set_item(&n.client_cert_chain, PyList::new(py, &t.client_cert_chain)?)?;
    d.set_item(&n.client_cert_name, t.client_cert_name.as_deref())?;
    let _ = conn.py_tls.set(d.clone().unbind());
    Ok(d)
}

/// A request's own `tls` dict: a copy of the connection's, with a new
/// `client_cert_chain` list (an app that changes either changes only its
/// own request's).
fn tls_dict<'py>(
    py: Python<'py>,
    ctx: &AppContext,
    conn: &ConnInfo,
    t: &TlsInfo,
) -> PyResult<Bound<'py, PyDict>> {
    let n = names(py);
    let template = tls_template(py, ctx, conn, t)?;
    let d = template.copy()?;
    let own = if t.client_cert_chain.is_empty() {
        PyList::empty(py)
    } else {
        match template.get_item(&n.client_cert_chain)? {
            Some(chain) => {
                let chain = chain.cast_into::<PyList>()?;
                chain.get_slice(0, chain.len())
            }
            None => PyList::new(py, &t.client_cert_chain)?,
        }
    };
    put(&d, &n.client_cert_chain, &own)?;
    Ok(d)
}

/// `scope["extensions"]`: `tls` (ASGI TLS extension 0.2) on TLS
/// connections: `client_cert_name` is the client certificate's subject
/// (RFC 4514), `client_cert_error` is always `None` (rustls refuses a
/// certificate that fails verification during the handshake).
fn extensions<'py>(
    py: Python<'py>,
    ctx: &AppContext,
    conn: &ConnInfo,
    template: &Py<PyDict>,
) -> PyResult<Bound<'py, PyDict>> {
    let ext = template.bind(py).copy()?;
    if let Some(t) = &conn.tls {
        put(&ext, &names(py).tls, &tls_dict(py, ctx, conn, t)?)?;
    }
    Ok(ext)
}

/// The scope of an HTTP request (ASGI HTTP spec 2.5); `interim`: whether
/// interim responses can reach its client (the driver knows), which
/// advertises `http.response.early_hint`.
pub(crate) fn http_scope<'py>(
    py: Python<'py>,
    ctx: &AppContext,
    parts: &http::request::Parts,
    conn: &ConnInfo,
    interim: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let n = names(py);
    let scope = ctx.http_template.bind(py).copy()?;
    fill_common(py, &scope, ctx, parts, conn)?;
    if parts.method != Method::GET {
        put(&scope, &n.method, &method(py, n, &parts.method))?;
    }
    let https = parts.extensions.get::<Origin>().and_then(|o| o.https);
    if https.unwrap_or(conn.tls.is_some()) {
        put(&scope, &n.scheme, n.https.bind(py))?;
    }
    let template = if interim {
        &ctx.interim_extensions
    } else {
        &ctx.http_extensions
    };
    let ext = extensions(py, ctx, conn, template)?;
    put(&scope, &n.extensions, &ext)?;
    Ok(scope)
}

/// The scope of a WebSocket handshake (ASGI WebSocket spec 2.5), with the
/// `websocket.http.response` extension advertised.
pub(crate) fn websocket_scope<'py>(
    py: Python<'py>,
    ctx: &AppContext,
    parts: &http::request::Parts,
    conn: &ConnInfo,
    subprotocols: &[String],
) -> PyResult<Bound<'py, PyDict>> {
    let n = names(py);
    let scope = ctx.ws_template.bind(py).copy()?;
    fill_common(py, &scope, ctx, parts, conn)?;
    let https = parts.extensions.get::<Origin>().and_then(|o| o.https);
    let scheme = if https.unwrap_or(conn.tls.is_some()) {
        &n.wss
    } else {
        &n.ws
    };
    put(&scope, &n.scheme, scheme.bind(py))?;
    put(&scope, &n.subprotocols, &PyList::new(py, subprotocols)?)?;
    let ext = extensions(py, ctx, conn, &ctx.ws_extensions)?;
    put(&scope, &n.extensions, &ext)?;
    Ok(scope)
}

#[cfg(test)]
mod tests {
    use super::decode_path;

    #[test]
    fn decodes_percent_sequences_as_utf8() {
        assert_eq!(decode_path("/a%20b"), "/a b");
        assert_eq!(decode_path("/caf%C3%A9"), "/café");
        assert_eq!(decode_path("/plain"), "/plain");
        assert_eq!(decode_path("/caf\u{e9}"), "/caf\u{e9}");
    }

    #[test]
    fn invalid_utf8_becomes_replacement_character() {
        assert_eq!(decode_path("/%FF%FE"), "/\u{FFFD}\u{FFFD}");
    }

    #[test]
    fn encoded_slash_is_decoded_in_path_only() {
        assert_eq!(decode_path("/a%2Fb"), "/a/b");
    }
}
