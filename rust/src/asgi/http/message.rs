//! Validating what an application passes to `send()` on an HTTP connection
//! (ASGI HTTP spec 2.5, "Response Start" and "Response Body").
//!
//! Errors name the message type and field: `TypeError` when a value has the
//! wrong type, `RuntimeError` when it has a forbidden value.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, StatusCode};
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PyMemoryView, PyString, PyTuple};

use crate::asgi::http::zerocopy::{self, ZeroCopySend};
use crate::bridge::names::names;

/// Bodies at least this large are handed to hyper without a copy.
const ZERO_COPY_MIN: usize = 4096;

/// A parsed `send()` message for an HTTP connection.
pub(crate) enum HttpSend {
    Start {
        status: StatusCode,
        headers: HeaderMap,
        /// `trailers`: `http.response.trailers` messages follow the body.
        trailers: bool,
        /// `headers` has a `Content-Length` field (only then is it read).
        has_length: bool,
    },
    Body {
        body: Bytes,
        more_body: bool,
    },
    /// `http.response.pathsend` (ASGI path send extension): the server
    /// sends the file at `path` as the whole body.
    PathSend {
        path: String,
    },
    /// An interim (1xx) response before the final one:
    /// `http.response.early_hint` (ASGI early hints extension, a `103` with
    /// one `Link` field per entry of `links`) or Gunicorn's
    /// `http.response.informational` (`status` 102..=199 but 101, `headers`).
    /// `None`: nothing to send (no links; a `100`, which Skirr sends itself
    /// when the app first calls `receive()`).
    Interim(Option<(StatusCode, HeaderMap)>),
    /// `http.response.zerocopysend` (ASGI zero copy send extension): a
    /// region of the app's file as the next body chunk.
    ZeroCopy(ZeroCopySend),
    /// `http.response.trailers` (ASGI HTTP trailers extension).
    Trailers {
        headers: HeaderMap,
        more_trailers: bool,
    },
}

/// Fields a trailer section must not carry (RFC 9110 §6.5.1: framing,
/// routing, authentication, response control, content metadata).
const NOT_TRAILERS: [HeaderName; 12] = [
    http::header::AUTHORIZATION,
    http::header::CACHE_CONTROL,
    http::header::CONTENT_ENCODING,
    http::header::CONTENT_LENGTH,
    http::header::CONTENT_RANGE,
    http::header::CONTENT_TYPE,
    http::header::HOST,
    http::header::MAX_FORWARDS,
    http::header::SET_COOKIE,
    http::header::TRAILER,
    http::header::TRANSFER_ENCODING,
    http::header::TE,
];

/// Holds a `bytes` object so hyper can write its buffer without a copy.
struct PyBytesOwner {
    _obj: Py<PyBytes>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: a `bytes` object is immutable and its buffer lives as long as the
// object, which `_obj` keeps alive; the buffer is only ever read. Dropping
// `Py<PyBytes>` off the asyncio thread defers the decref to PyO3's pool.
unsafe impl Send for PyBytesOwner {}
// SAFETY: see above; shared access is read-only.
unsafe impl Sync for PyBytesOwner {}

impl AsRef<[u8]> for PyBytesOwner {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr`/`len` describe the buffer of the live, immutable
        // bytes object held by `_obj`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Converts a `bytes`-like `body` into [`Bytes`], without copying large
/// `bytes` objects.
pub(crate) fn body_bytes(v: &Bound<'_, PyAny>, what: &str) -> PyResult<Bytes> {
    if let Ok(b) = v.cast::<PyBytes>() {
        let s = b.as_bytes();
        if s.len() < ZERO_COPY_MIN {
            return Ok(Bytes::copy_from_slice(s));
        }
        return Ok(Bytes::from_owner(PyBytesOwner {
            ptr: s.as_ptr(),
            len: s.len(),
            _obj: b.clone().unbind(),
        }));
    }
    if let Ok(b) = v.cast::<PyByteArray>() {
        return Ok(Bytes::from(b.to_vec()));
    }
    if v.is_instance_of::<PyMemoryView>() {
        let b: Vec<u8> = v.call_method0("tobytes")?.extract()?;
        return Ok(Bytes::from(b));
    }
    Err(PyTypeError::new_err(format!(
        "{what} must be bytes, got {}",
        v.get_type().name()?
    )))
}

use crate::asgi::message::{keys_by_identity, message_type, type_name};

/// One `(name, value)` header pair into `map`.
///
/// `Transfer-Encoding` is dropped: the server owns message framing (it picks
/// `Content-Length`, chunked, or close-delimited per RFC 9112 §6), and
/// `Connection` is kept only as `close` (RFC 9110 §7.6.1). Returns whether
/// the field is `Content-Length`.
fn add_header(
    map: &mut HeaderMap,
    name: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
    what: &str,
) -> PyResult<bool> {
    let name = name.cast::<PyBytes>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{what} header names must be bytes, got {}",
            type_name(name)
        ))
    })?;
    let value = value.cast::<PyBytes>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{what} header values must be bytes, got {} for header {:?}",
            type_name(value),
            String::from_utf8_lossy(name.as_bytes())
        ))
    })?;
    let hn = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
        PyRuntimeError::new_err(format!(
            "{what} has an invalid header name {:?}",
            String::from_utf8_lossy(name.as_bytes())
        ))
    })?;
    let hv = HeaderValue::from_bytes(value.as_bytes()).map_err(|_| {
        PyRuntimeError::new_err(format!(
            "{what} header {:?} has an invalid value (control characters such as CR, LF \
             or NUL are not allowed)",
            hn.as_str()
        ))
    })?;
    if hn == CONNECTION {
        // The connection is the server's to manage: an app's `close` is
        // honoured, anything else (SSE libraries send `keep-alive`) would
        // contradict the server's own framing, and is dropped (as
        // uvicorn does).
        if hv
            .as_bytes()
            .split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
        {
            map.insert(CONNECTION, HeaderValue::from_static("close"));
        }
        return Ok(false);
    }
    if hn == TRANSFER_ENCODING {
        return Ok(false);
    }
    let length = hn == CONTENT_LENGTH;
    map.append(hn, hv);
    Ok(length)
}

fn not_a_pair(what: &str) -> PyErr {
    PyTypeError::new_err(format!(
        "{what} 'headers' items must be [name, value] pairs of exactly two byte strings"
    ))
}

/// One header item: a 2-tuple (fast path) or any 2-item iterable; whether
/// it is `Content-Length`.
fn add_item(map: &mut HeaderMap, item: &Bound<'_, PyAny>, what: &str) -> PyResult<bool> {
    if let Ok(t) = item.cast::<PyTuple>() {
        if t.len() != 2 {
            return Err(not_a_pair(what));
        }
        let (name, value) = (t.get_borrowed_item(0)?, t.get_borrowed_item(1)?);
        return add_header(map, &name, &value, what);
    }
    let mut pair = item.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "{what} 'headers' items must be [name, value] pairs, got {}",
            type_name(item)
        ))
    })?;
    let (Some(name), Some(value), None) = (pair.next(), pair.next(), pair.next()) else {
        return Err(not_a_pair(what));
    };
    add_header(map, &name?, &value?, what)
}

/// Parses the `headers` of a start message into a `HeaderMap`: a list
/// (fast path) or any iterable of `[name, value]` byte-string pairs.
pub(crate) fn parse_headers(v: &Bound<'_, PyAny>, what: &str) -> PyResult<HeaderMap> {
    fields(v, what).map(|(map, _)| map)
}

/// [`parse_headers`], and whether a `Content-Length` field came.
fn fields(v: &Bound<'_, PyAny>, what: &str) -> PyResult<(HeaderMap, bool)> {
    let mut length = false;
    if let Ok(list) = v.cast::<PyList>() {
        // One slot more for the `date` field HTTP/2 and HTTP/3 insert
        // (hyper's HTTP/1.1 writes it without the map): no regrowth.
        let mut map = HeaderMap::with_capacity(list.len() + 1);
        for item in list.iter() {
            length |= add_item(&mut map, &item, what)?;
        }
        return Ok((map, length));
    }
    let mut map = HeaderMap::new();
    for item in v.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "{what} 'headers' must be an iterable of [name, value] pairs, got {}",
            type_name(v)
        ))
    })? {
        length |= add_item(&mut map, &item?, what)?;
    }
    Ok((map, length))
}

/// Reads a response status: an `int` in 200..=599.
///
/// Errors: `TypeError` if missing or not an int, `RuntimeError` if out of
/// range; both name `what`.
pub(crate) fn parse_status(status: Option<Bound<'_, PyAny>>, what: &str) -> PyResult<StatusCode> {
    let status = status.ok_or_else(|| PyTypeError::new_err(format!("{what} requires 'status'")))?;
    if status.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "{what} 'status' must be an int, got bool"
        )));
    }
    if !status.is_instance_of::<pyo3::types::PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "{what} 'status' must be an int, got {}",
            type_name(&status)
        )));
    }
    // An int too large for i64 is out of range like any other.
    let code: i64 = status.extract().unwrap_or(i64::MAX);
    u16::try_from(code)
        .ok()
        .filter(|c| (200..=599).contains(c))
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or_else(|| {
            PyRuntimeError::new_err(format!(
                "{what} 'status' must be a final status code in 200..=599, got {code}"
            ))
        })
}

/// `http.response.early_hint`: `links`, an iterable of `Link` field values
/// as bytes (RFC 8288), becomes a `103 Early Hints` (RFC 8297).
fn early_hint(d: &Bound<'_, PyDict>) -> PyResult<Option<(StatusCode, HeaderMap)>> {
    const WHAT: &str = "http.response.early_hint";
    let links = d
        .get_item("links")?
        .ok_or_else(|| PyTypeError::new_err(format!("{WHAT} requires 'links'")))?;
    if links.is_instance_of::<PyBytes>() || links.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(format!(
            "{WHAT} 'links' must be an iterable of bytes, got {}",
            type_name(&links)
        )));
    }
    let mut headers = HeaderMap::new();
    let iter = links.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "{WHAT} 'links' must be an iterable of bytes, got {}",
            type_name(&links)
        ))
    })?;
    for link in iter {
        let link = link?;
        let Ok(raw) = link.cast::<PyBytes>() else {
            return Err(PyTypeError::new_err(format!(
                "{WHAT} 'links' entries must be bytes, got {}",
                type_name(&link)
            )));
        };
        let value = HeaderValue::from_bytes(raw.as_bytes()).map_err(|_| {
            PyRuntimeError::new_err(format!(
                "{WHAT} has an invalid link {:?}: a field value cannot hold CR, LF or NUL",
                String::from_utf8_lossy(raw.as_bytes())
            ))
        })?;
        if value.is_empty() {
            return Err(PyRuntimeError::new_err(format!("{WHAT} has an empty link")));
        }
        headers.append(http::header::LINK, value);
    }
    interim_size(&headers, WHAT)?;
    Ok((!headers.is_empty()).then_some((StatusCode::EARLY_HINTS, headers)))
}

/// Gunicorn's `http.response.informational`: `status` (100..=199, not 101)
/// and `headers`, sent as they are.
fn informational(d: &Bound<'_, PyDict>) -> PyResult<Option<(StatusCode, HeaderMap)>> {
    const WHAT: &str = "http.response.informational";
    let py = d.py();
    let n = names(py);
    let status = d
        .get_item(n.status.bind(py))?
        .ok_or_else(|| PyTypeError::new_err(format!("{WHAT} requires 'status'")))?;
    if status.is_instance_of::<pyo3::types::PyBool>()
        || !status.is_instance_of::<pyo3::types::PyInt>()
    {
        return Err(PyTypeError::new_err(format!(
            "{WHAT} 'status' must be an int, got {}",
            type_name(&status)
        )));
    }
    let code: i64 = status.extract().unwrap_or(i64::MAX);
    let status = u16::try_from(code)
        .ok()
        .filter(|c| (100..=199).contains(c) && *c != 101)
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or_else(|| {
            PyRuntimeError::new_err(format!(
                "{WHAT} 'status' must be an informational status in 100..=199 other than \
                 101 (RFC 9110 §15.2), got {code}"
            ))
        })?;
    let mut headers = match d.get_item(n.headers.bind(py))? {
        Some(h) => parse_headers(&h, WHAT)?,
        None => HeaderMap::new(),
    };
    // A 1xx has no content and frames nothing (RFC 9110 §8.6, RFC 9112 §6.1).
    headers.remove(http::header::CONTENT_LENGTH);
    headers.remove(TRANSFER_ENCODING);
    interim_size(&headers, WHAT)?;
    Ok((status != StatusCode::CONTINUE).then_some((status, headers)))
}

/// The most field bytes one interim response may carry: a hint is a few
/// links, and clients refuse heads far smaller than a final response may
/// grow to (curl: 100 KiB for all of them together).
const MAX_INTERIM_BYTES: usize = 16 * 1024;

fn interim_size(headers: &HeaderMap, what: &str) -> PyResult<()> {
    let size: usize = headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    if size > MAX_INTERIM_BYTES {
        return Err(PyRuntimeError::new_err(format!(
            "{what} carries {size} bytes of fields, more than {MAX_INTERIM_BYTES}"
        )));
    }
    Ok(())
}

/// `http.response.body` from its `body` and `more_body` values.
fn response_body(
    body: Option<Bound<'_, PyAny>>,
    more_body: Option<Bound<'_, PyAny>>,
) -> PyResult<HttpSend> {
    let body = match body {
        Some(b) => body_bytes(&b, "http.response.body 'body'")?,
        None => Bytes::new(),
    };
    let more_body = match more_body {
        Some(m) if m.is(&*pyo3::types::PyBool::new(m.py(), false)) => false,
        Some(m) => m.is_truthy()?,
        None => false,
    };
    Ok(HttpSend::Body { body, more_body })
}

/// `http.response.start` from its `status`, `headers` and `trailers`
/// values.
fn response_start(
    status: Option<Bound<'_, PyAny>>,
    headers: Option<Bound<'_, PyAny>>,
    trailers: Option<Bound<'_, PyAny>>,
) -> PyResult<HttpSend> {
    const WHAT: &str = "http.response.start";
    let status = parse_status(status, WHAT)?;
    let (headers, has_length) = match headers {
        Some(h) => fields(&h, WHAT)?,
        None => (HeaderMap::new(), false),
    };
    let trailers = match trailers {
        Some(tr) => tr.is_truthy()?,
        None => false,
    };
    Ok(HttpSend::Start {
        status,
        headers,
        trailers,
        has_length,
    })
}

/// Parses an HTTP `send()` message.
///
/// Errors: `TypeError`/`RuntimeError` naming the offending field, or
/// `RuntimeError` for a message type that has no meaning on HTTP.
pub(crate) fn parse_http_send(message: &Bound<'_, PyAny>) -> PyResult<HttpSend> {
    let py = message.py();
    let n = names(py);
    // The two messages of every response, their keys read in one pass.
    if let Some([Some(t), body, more_body, status, headers, trailers]) =
        message.cast::<PyDict>().ok().and_then(|d| {
            keys_by_identity(
                d,
                [
                    &n.type_,
                    &n.body,
                    &n.more_body,
                    &n.status,
                    &n.headers,
                    &n.trailers,
                ],
            )
        })
    {
        // A type holding a dot is not interned: compared by content.
        match t.cast::<PyString>().ok().and_then(|t| t.to_str().ok()) {
            Some("http.response.body") => return response_body(body, more_body),
            Some("http.response.start") => return response_start(status, headers, trailers),
            _ => {}
        }
    }
    let (d, t) = message_type(message)?;
    let kind = t.to_str().unwrap_or("");
    if kind == "http.response.body" {
        return response_body(
            d.get_item(n.body.bind(py))?,
            d.get_item(n.more_body.bind(py))?,
        );
    }
    if kind == "http.response.pathsend" {
        let path = d
            .get_item("path")?
            .ok_or_else(|| PyTypeError::new_err("http.response.pathsend has no 'path'"))?;
        let path: String = path.extract().map_err(|_| {
            PyTypeError::new_err(format!(
                "http.response.pathsend 'path' must be a str, got {}",
                type_name(&path)
            ))
        })?;
        return Ok(HttpSend::PathSend { path });
    }
    if kind == zerocopy::WHAT {
        return zerocopy::parse(&d).map(HttpSend::ZeroCopy);
    }
    if kind == "http.response.start" {
        return response_start(
            d.get_item(n.status.bind(py))?,
            d.get_item(n.headers.bind(py))?,
            d.get_item(n.trailers.bind(py))?,
        );
    }
    if kind == "http.response.early_hint" {
        return early_hint(&d).map(HttpSend::Interim);
    }
    if kind == "http.response.informational" {
        return informational(&d).map(HttpSend::Interim);
    }
    if kind == "http.response.trailers" {
        const WHAT: &str = "http.response.trailers";
        let headers = match d.get_item(n.headers.bind(py))? {
            Some(h) => parse_headers(&h, WHAT)?,
            None => HeaderMap::new(),
        };
        if let Some(bad) = headers.keys().find(|k| NOT_TRAILERS.contains(k)) {
            return Err(PyRuntimeError::new_err(format!(
                "http.response.trailers cannot carry {:?} (RFC 9110 §6.5.1)",
                bad.as_str()
            )));
        }
        let more_trailers = match d.get_item(intern!(py, "more_trailers"))? {
            Some(m) => m.is_truthy()?,
            None => false,
        };
        return Ok(HttpSend::Trailers {
            headers,
            more_trailers,
        });
    }
    Err(PyRuntimeError::new_err(format!(
        "unexpected ASGI message type {:?} on an HTTP connection \
         (expected 'http.response.start', 'http.response.body', \
         'http.response.pathsend', 'http.response.zerocopysend', \
         'http.response.trailers', 'http.response.early_hint' or \
         'http.response.informational')",
        t.to_string_lossy()
    )))
}
