//! `receive` and `send` for one HTTP request (ASGI HTTP spec 2.5).

mod body;
mod diag;
mod receive;

use diag::{caller_location, caused_by_disconnect};
pub(crate) use receive::on_wake;
use receive::{disconnect_message, next_message};

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use parking_lot::Mutex;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::asgi::context::AppContext;
use crate::asgi::http::access::write_access;
use crate::asgi::http::exchange::{BodyOut, Exchange, Out, ResponseHead, TrailersWanted};
use crate::asgi::http::message::{parse_http_send, HttpSend};
use crate::asgi::http::zerocopy;
use crate::bridge::awaitable::ready;
use crate::bridge::context::{is_done, resolve};
use crate::bridge::names::names;
use crate::errors::ClientDisconnected;
use crate::wire::response::{declared_length, status_allows_body};

/// Where the app is in its response.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    /// Nothing sent yet.
    Initial,
    /// `http.response.start` received and held until the first body chunk
    /// (or until the app suspends), so a one-chunk response is written as
    /// one head-plus-body with a `Content-Length`.
    Held,
    /// Head handed to hyper; body chunks are streaming.
    Streaming,
    /// Every byte of the declared `Content-Length` was sent with
    /// `more_body` still true (file responses end with an empty final
    /// chunk): the wire is complete, the app's final message is awaited.
    WireDone,
    /// The final body was sent; the trailer section the start announced
    /// (`trailers: True`) is awaited.
    Trailers,
    /// Final body sent (or a 500 produced).
    Done,
}

struct ProtoState {
    phase: Phase,
    held: Option<(StatusCode, HeaderMap)>,
    status: u16,
    sent: u64,
    /// The `Content-Length` the app declared and is held to (not for HEAD
    /// or bodiless statuses, whose length describes no content here).
    declared: Option<u64>,
    /// The status allows no content (1xx, 204, 304).
    no_body: bool,
    /// For the access log: the response headers as sent.
    response_headers: Option<Py<PyAny>>,
    /// Access logging is on (the scope waits in the exchange).
    logging: bool,
    /// The start said `trailers: True`.
    announced: bool,
    /// ...and they will be written (not HEAD, not a bodiless status).
    trailing: bool,
    /// Trailer fields gathered over `more_trailers` messages.
    trailers: Option<HeaderMap>,
    /// The field names the start's `Trailer` header lists (lowercase):
    /// HTTP/1.1 writes only those (hyper).
    trailer_names: Vec<String>,
}

/// `receive` and `send` callables for one HTTP request.
#[pyclass(frozen, freelist = 256, module = "skirr._skirr")]
pub(crate) struct HttpProtocol {
    exch: Arc<Exchange>,
    /// The request is `HEAD`: whatever body the app sends is not written.
    head: bool,
    /// Interim responses can reach the client (HTTP/1.1, and HTTP/2
    /// streams whose connection has not turned them off; see
    /// `ConnCtx::sends_interim`); elsewhere (HTTP/1.0) they are dropped.
    interim: bool,
    ctx: Arc<AppContext>,
    received: Option<Instant>,
    st: Mutex<ProtoState>,
}

impl HttpProtocol {
    pub(crate) fn new(
        exch: Arc<Exchange>,
        ctx: Arc<AppContext>,
        head: bool,
        interim: bool,
        received: Option<Instant>,
        scope: Option<Py<PyDict>>,
    ) -> Self {
        let logging = scope.is_some();
        if logging {
            let mut ex = exch.lock();
            ex.access_scope = scope;
            ex.received = received;
        }
        Self {
            exch,
            head,
            interim,
            ctx,
            received,
            st: Mutex::new(ProtoState {
                phase: Phase::Initial,
                held: None,
                status: 0,
                sent: 0,
                declared: None,
                no_body: false,
                logging,
                response_headers: None,
                announced: false,
                trailing: false,
                trailers: None,
                trailer_names: Vec::new(),
            }),
        }
    }

    /// The response is complete from the app's side.
    fn finish(&self, py: Python<'_>, st: &mut ProtoState) {
        st.phase = Phase::Done;
        let waiters = {
            let mut ex = self.exch.lock();
            ex.responded = true;
            std::mem::take(&mut ex.recv_waiters)
        };
        for w in waiters {
            if let Ok(msg) = disconnect_message(py) {
                resolve(w.bind(py), msg);
            }
        }
        let (status, sent) = (st.status, st.sent);
        self.log_access(py, st, status, sent);
    }

    /// Writes the response's access-log line, once (later calls do
    /// nothing): `status` and body bytes as they went to the wire.
    fn log_access(&self, py: Python<'_>, st: &ProtoState, status: u16, sent: u64) {
        if !st.logging {
            return;
        }
        let Some(scope) = self.exch.lock().access_scope.take() else {
            return;
        };
        let headers = st
            .response_headers
            .as_ref()
            .filter(|_| status == st.status)
            .map(|h| h.clone_ref(py))
            .unwrap_or_else(|| py.None());
        let took = self.received.map(|r| r.elapsed());
        write_access(py, &self.ctx, &scope, status, headers, sent, took);
    }

    /// The response ended without the app completing it (the client left,
    /// the app failed after the start, the server answered instead): its
    /// line, with what reached the wire. Nothing written, no line.
    fn log_wire(&self, py: Python<'_>, st: &ProtoState) {
        let (status, bytes) = {
            let ex = self.exch.lock();
            (ex.wire_status, ex.wire_bytes)
        };
        if status != 0 {
            self.log_access(py, st, status, bytes);
        }
    }

    /// Answers 500 if nothing reached the wire yet, else closes the
    /// connection.
    fn fail(&self, py: Python<'_>, st: &mut ProtoState) {
        match st.phase {
            Phase::Initial | Phase::Held if self.exch.lock().gone => {
                // Nobody to answer (or the server answered already).
                st.held = None;
                st.phase = Phase::Done;
                self.exch.lock().responded = true;
                self.log_wire(py, st);
            }
            Phase::Initial | Phase::Held => {
                st.held = None;
                st.status = 500;
                st.sent = 21;
                st.response_headers = None;
                self.exch.respond(
                    ResponseHead::plain(StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error"),
                    &self.ctx.shared,
                );
                self.finish(py, st);
            }
            Phase::Streaming | Phase::Trailers => {
                self.exch.abort(&self.ctx.shared);
                st.phase = Phase::Done;
                self.exch.lock().responded = true;
                self.log_wire(py, st);
            }
            // The client has the whole response already.
            Phase::WireDone => self.finish(py, st),
            Phase::Done => {}
        }
    }

    /// `send()` found the client gone: the response ends here (its line
    /// logged with what reached the wire) and the app gets the error.
    fn client_gone(&self, py: Python<'_>, st: &mut ProtoState) -> PyErr {
        st.phase = Phase::Done;
        self.log_wire(py, st);
        ClientDisconnected::new_err("the client disconnected")
    }

    /// `http.response.pathsend` (ASGI path send extension): right after
    /// `http.response.start`, the file at `path` is the whole body. The
    /// file is opened here, so a missing or irregular file is the app's
    /// error (`RuntimeError` naming the path) before anything is written;
    /// its length becomes the `Content-Length` (one the app declared must
    /// match). HEAD and 204/304 send the head only.
    fn path_send<'py>(
        &self,
        py: Python<'py>,
        st: &mut ProtoState,
        path: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        match st.phase {
            Phase::Held => {}
            Phase::Initial => {
                return Err(PyRuntimeError::new_err(
                    "http.response.pathsend sent before http.response.start",
                ))
            }
            Phase::Done if !self.exch.lock().gone => {
                return Err(ClientDisconnected::new_err(
                    "the response is already complete",
                ))
            }
            Phase::Done => return Err(ClientDisconnected::new_err("the client disconnected")),
            Phase::Streaming | Phase::WireDone | Phase::Trailers => {
                return Err(PyRuntimeError::new_err(
                    "http.response.pathsend after http.response.body: the file must be the \
                     whole body",
                ))
            }
        }
        if self.exch.lock().gone {
            return Err(self.client_gone(py, st));
        }
        let fail = |why: String| PyRuntimeError::new_err(format!("http.response.pathsend: {why}"));
        let file =
            std::fs::File::open(path).map_err(|e| fail(format!("cannot open {path:?}: {e}")))?;
        let meta = file
            .metadata()
            .map_err(|e| fail(format!("cannot stat {path:?}: {e}")))?;
        if !meta.is_file() {
            return Err(fail(format!("{path:?} is not a regular file")));
        }
        let len = meta.len();
        let Some((status, mut headers)) = st.held.take() else {
            return Err(fail("no response start held".into()));
        };
        if let Some(declared) = st.declared {
            if declared != len {
                st.held = Some((status, headers));
                return Err(fail(format!(
                    "the Content-Length of {declared} bytes does not match {path:?}, \
                     which has {len}"
                )));
            }
        }
        if !st.no_body && !headers.contains_key(http::header::CONTENT_LENGTH) {
            headers.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(len));
        }
        let body = if self.head || st.no_body {
            BodyOut::Full(Bytes::new())
        } else {
            st.sent = len;
            BodyOut::File { file, len }
        };
        self.respond(status, headers, body);
        self.finish(py, st);
        self.ctx.done(py)
    }

    /// `http.response.early_hint` / `http.response.informational`: queued
    /// for the wire ahead of the head where interim responses can reach the
    /// client (HTTP/1.1, HTTP/2); on HTTP/1.0 it is dropped, as RFC 8297 §2
    /// lets an intermediary do.
    fn interim<'py>(
        &self,
        py: Python<'py>,
        st: &mut ProtoState,
        interim: Option<(StatusCode, HeaderMap)>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if st.phase != Phase::Initial {
            return Err(PyRuntimeError::new_err(
                "an interim (1xx) response after http.response.start: it must come before \
                 the final response (RFC 9110 §15.2)",
            ));
        }
        if self.exch.lock().gone {
            return Err(self.client_gone(py, st));
        }
        let Some((status, headers)) = interim.filter(|_| self.interim) else {
            // HTTP/1.0, or an HTTP/2 connection that turned them off:
            // dropped (RFC 8297 §2 lets an intermediary).
            return self.ctx.done(py);
        };
        if self.exch.push_interim(status, headers, &self.ctx.shared) {
            return self.ctx.done(py);
        }
        // `MAX_QUEUED` wait for the wire: this send() returns once the
        // Tokio side took them.
        let fut = self.ctx.waiter(py)?;
        let mut ex = self.exch.lock();
        if ex.gone || ex.has_room(self.ctx.shared.config.send_buffer) {
            drop(ex);
            return self.ctx.done(py);
        }
        ex.send_waiters.push(fut.clone().unbind());
        Ok(fut.into_any())
    }

    /// `http.response.trailers` (ASGI HTTP trailers extension): gathered
    /// until `more_trailers` is false, then written after the body — a
    /// final HEADERS frame on HTTP/2, the chunked trailer section on
    /// HTTP/1.1 (where hyper writes the fields the response's `Trailer`
    /// header names, and only if the request had `TE: trailers`). Where
    /// the response has no room for them (HEAD, 204/304, a body framed by
    /// `Content-Length`) they are accepted and dropped.
    fn trailers<'py>(
        &self,
        py: Python<'py>,
        st: &mut ProtoState,
        headers: HeaderMap,
        more: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        if !st.announced {
            return Err(PyRuntimeError::new_err(
                "http.response.trailers without 'trailers': True in http.response.start",
            ));
        }
        match st.phase {
            Phase::Initial | Phase::Held | Phase::Streaming => {
                return Err(PyRuntimeError::new_err(
                    "http.response.trailers before the final http.response.body",
                ))
            }
            Phase::Done if self.exch.lock().gone => {
                return Err(ClientDisconnected::new_err("the client disconnected"))
            }
            // Nowhere to write them.
            Phase::Done => return self.ctx.done(py),
            Phase::WireDone => {
                if !more {
                    self.finish(py, st);
                }
                return self.ctx.done(py);
            }
            Phase::Trailers => {}
        }
        if self.exch.lock().gone {
            return Err(self.client_gone(py, st));
        }
        let all = st.trailers.get_or_insert_with(HeaderMap::new);
        for (name, value) in headers {
            if let Some(name) = name {
                all.append(name, value);
            }
        }
        if !more {
            let all = st.trailers.take().unwrap_or_default();
            let wanted = self.exch.lock().trailers;
            match wanted {
                TrailersWanted::No => {
                    // The client did not send `TE: trailers` (ASGI
                    // trailers extension; RFC 9110 §6.5.1): the body ends
                    // without them, on HTTP/2 as on HTTP/1.1.
                    self.exch
                        .push_out(Out::Data(Bytes::new()), true, &self.ctx.shared);
                }
                TrailersWanted::Named => {
                    self.warn_unnamed_trailers(py, st, &all);
                    self.exch.push_trailers(all, &self.ctx.shared);
                }
                TrailersWanted::Yes => self.exch.push_trailers(all, &self.ctx.shared),
            }
            self.finish(py, st);
        }
        self.ctx.done(py)
    }

    /// HTTP/1.1 writes only the trailer fields the response's `Trailer`
    /// header names (RFC 9110 §6.6.2; hyper drops the rest): the others
    /// are warned about once per app location (the frame that called
    /// `send()`).
    fn warn_unnamed_trailers(&self, py: Python<'_>, st: &ProtoState, fields: &HeaderMap) {
        let dropped: Vec<&str> = fields
            .keys()
            .map(|k| k.as_str())
            .filter(|k| !st.trailer_names.iter().any(|n| n == k))
            .collect();
        if dropped.is_empty() {
            return;
        }
        self.warn_at(py, "trailers", |location| {
            format!(
                "trailer fields {} sent at {location} were dropped: on HTTP/1.1 only the \
                 fields the response's Trailer header names are sent (RFC 9110 §6.6.2); \
                 name them in http.response.start, e.g. (b\"trailer\", b\"{}\") (warned once \
                 per location)",
                dropped.join(", "),
                dropped.join(", "),
            )
        });
    }

    /// A body on a 1xx/204/304 response is dropped, as every peer does
    /// (RFC 9110 §15.3.5, §15.4.5): warned once per status and app
    /// location (the frame that called `send()`).
    fn warn_dropped_body(&self, py: Python<'_>, status: u16, len: usize) {
        self.warn_at(py, &status.to_string(), |location| {
            format!(
                "a {status} response cannot have a body: the {len} bytes sent at {location} \
                 were dropped (RFC 9110 §15; warned once per location)"
            )
        });
    }

    /// Hands the response head to the Tokio side.
    fn respond(&self, status: StatusCode, headers: HeaderMap, body: BodyOut) {
        let head = ResponseHead {
            status,
            headers,
            body,
        };
        self.exch.respond(head, &self.ctx.shared);
    }

    /// Logs a warning once per `kind` and app location (the frame that
    /// called `send()`); `message` is given the location.
    fn warn_at(&self, py: Python<'_>, kind: &str, message: impl FnOnce(&str) -> String) {
        let location = caller_location(py);
        if self.ctx.warn_once(format!("{kind} {location}")) {
            self.ctx.log(py, 30, &message(&location));
        }
    }

    /// The app suspended: flush a held start so headers are not delayed by
    /// an app that waits before its first body chunk.
    pub(crate) fn on_suspend(&self, _py: Python<'_>) {
        let mut st = self.st.lock();
        if st.phase == Phase::Held {
            if let Some((status, headers)) = st.held.take() {
                // A HEAD response is complete with its head.
                let (phase, body) = if self.head {
                    (Phase::WireDone, BodyOut::Full(Bytes::new()))
                } else {
                    (Phase::Streaming, BodyOut::Stream)
                };
                st.phase = phase;
                self.respond(status, headers, body);
            }
        }
    }

    /// The app returned.
    pub(crate) fn on_return(&self, py: Python<'_>) {
        let mut st = self.st.lock();
        if st.phase != Phase::Done && self.exch.lock().gone {
            // Nobody is left to answer: not an application error.
            st.phase = Phase::Done;
            self.log_wire(py, &st);
            return;
        }
        if st.phase != Phase::Done {
            let msg = if st.phase == Phase::Initial {
                "ASGI callable returned without starting response"
            } else if st.phase == Phase::WireDone {
                // As uvicorn: the client has it all, the app never said so.
                "ASGI callable returned without completing response \
                 (no final http.response.body with more_body=False)"
            } else {
                "ASGI callable returned without completing response"
            };
            self.ctx.log_error(py, msg, None);
            self.fail(py, &mut st);
        }
    }

    /// The app's task was cancelled.
    pub(crate) fn on_cancel(&self, py: Python<'_>) {
        let mut st = self.st.lock();
        if st.phase != Phase::Done {
            self.ctx.log(
                py,
                10,
                "ASGI request task cancelled before completing its response",
            );
            self.fail(py, &mut st);
        }
    }

    /// The app raised.
    pub(crate) fn on_error(&self, py: Python<'_>, err: PyErr) {
        let mut st = self.st.lock();
        let gone = self.exch.lock().gone;
        if gone && caused_by_disconnect(py, &err) {
            // The app let our own disconnect error escape, maybe wrapped
            // (Starlette raises its `ClientDisconnect` from it): not a bug
            // to log at error level, and any client could fill the log.
            self.ctx
                .log(py, 10, "ASGI callable stopped: client disconnected");
        } else {
            self.ctx
                .log_error(py, "Exception in ASGI application", Some(&err));
        }
        self.fail(py, &mut st);
    }
}

#[pymethods]
impl HttpProtocol {
    /// `await receive()`: the next `http.request` chunk, or
    /// `http.disconnect` once the client is gone or the response was sent.
    ///
    /// Several calls may wait at once (as under uvicorn): each message goes
    /// to the oldest waiter, a disconnect to all of them.
    fn receive<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let mut ex = self.exch.lock();
        if !ex.body_wanted {
            ex.body_wanted = true;
            // Lets the Tokio side start reading (and send `100 Continue`).
            self.exch.resume_body(&mut ex, &self.ctx.shared);
        }
        // Cancelled waiters (Starlette's `is_disconnected()` polls in a
        // cancelled scope) are dropped; live ones keep their turn.
        while ex.recv_waiters.front().is_some_and(|w| is_done(w.bind(py))) {
            ex.recv_waiters.pop_front();
        }
        if ex.recv_waiters.is_empty() {
            if let Some(msg) = next_message(py, &self.exch, &mut ex, &self.ctx.shared)? {
                return ready(py, msg);
            }
        }
        let fut = self.ctx.waiter(py)?;
        ex.recv_waiters.push_back(fut.clone().unbind());
        Ok(fut.into_any())
    }

    /// `await send(message)`: `http.response.start` then
    /// `http.response.body` and `http.response.zerocopysend` chunks (with
    /// `more_body` while streaming), or one `http.response.pathsend`.
    ///
    /// Raises `TypeError`/`RuntimeError` for an invalid message or order,
    /// and `ClientDisconnected` (an `OSError`) once the client is gone or
    /// the response is complete.
    fn send<'py>(
        &self,
        py: Python<'py>,
        message: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let msg = parse_http_send(message)?;
        let mut st = self.st.lock();
        match msg {
            HttpSend::Start {
                status,
                headers,
                trailers,
                has_length,
            } => {
                if self.exch.lock().gone {
                    return Err(self.client_gone(py, &mut st));
                }
                if st.phase != Phase::Initial {
                    if st.phase == Phase::Done && self.exch.lock().gone {
                        return Err(ClientDisconnected::new_err("the client disconnected"));
                    }
                    return Err(PyRuntimeError::new_err(
                        "http.response.start sent twice: the response has already started",
                    ));
                }
                // Read only when the app sent a `Content-Length`.
                let declared = if has_length {
                    declared_length(&headers).map_err(|reason| {
                        PyRuntimeError::new_err(format!("http.response.start has an {reason}"))
                    })?
                } else {
                    None
                };
                st.no_body = !status_allows_body(status);
                let mut headers = headers;
                if st.no_body && status != StatusCode::NOT_MODIFIED {
                    // RFC 9110 §8.6: never on 1xx or 204 (a 304 may carry
                    // the length of the representation it stands for).
                    headers.remove(http::header::CONTENT_LENGTH);
                }
                st.declared = if self.head || st.no_body {
                    None
                } else {
                    declared
                };
                st.status = status.as_u16();
                st.announced = trailers;
                if trailers {
                    st.trailer_names = headers
                        .get_all(http::header::TRAILER)
                        .iter()
                        .filter_map(|v| v.to_str().ok())
                        .flat_map(|v| v.split(','))
                        .map(|n| n.trim().to_ascii_lowercase())
                        .filter(|n| !n.is_empty())
                        .collect();
                }
                st.trailing = trailers && !self.head && !st.no_body;
                if st.logging {
                    let h = message.get_item(names(py).headers.bind(py)).ok();
                    st.response_headers = h.map(Bound::unbind);
                }
                st.held = Some((status, headers));
                st.phase = Phase::Held;
                self.ctx.done(py)
            }
            HttpSend::PathSend { path } => self.path_send(py, &mut st, &path),
            HttpSend::Interim(interim) => self.interim(py, &mut st, interim),
            HttpSend::Trailers {
                headers,
                more_trailers,
            } => self.trailers(py, &mut st, headers, more_trailers),
            HttpSend::Body { body, more_body } => self.body(
                py,
                &mut st,
                Out::Data(body),
                more_body,
                "http.response.body",
            ),
            HttpSend::ZeroCopy(z) => {
                let what = zerocopy::WHAT;
                let sent = self.body(py, &mut st, Out::File(z.segment), z.more_body, what)?;
                drop(st);
                if let Some(advance) = z.advance {
                    advance.run(py)?;
                }
                Ok(sent)
            }
        }
    }
}

impl crate::bridge::owner::TaskOwner for HttpProtocol {
    fn on_suspend(&self, py: Python<'_>) {
        HttpProtocol::on_suspend(self, py);
    }

    fn on_return(&self, py: Python<'_>) {
        HttpProtocol::on_return(self, py);
    }

    fn on_error(&self, py: Python<'_>, err: PyErr) {
        HttpProtocol::on_error(self, py, err);
    }

    fn on_cancel(&self, py: Python<'_>) {
        HttpProtocol::on_cancel(self, py);
    }
}
