//! Body chunks for `send()`: `http.response.body` and
//! `http.response.zerocopysend` (whose file regions travel the same queue,
//! in order, under the same `Content-Length` and backpressure rules).

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::HeaderValue;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use super::{HttpProtocol, Phase, ProtoState};
use crate::asgi::http::exchange::{BodyOut, Out};
use crate::errors::ClientDisconnected;

impl HttpProtocol {
    /// One body chunk (`what` names the message in errors): held to the
    /// declared `Content-Length` (too long is refused before anything is
    /// queued), written with the head when it is the whole body, else
    /// queued; `send()` then waits while the queue is over `send_buffer`.
    pub(super) fn body<'py>(
        &self,
        py: Python<'py>,
        st: &mut ProtoState,
        body: Out,
        more_body: bool,
        what: &'static str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let shared = &self.ctx.shared;
        match st.phase {
            Phase::Initial => {
                return Err(PyRuntimeError::new_err(format!(
                    "{what} sent before http.response.start"
                )))
            }
            Phase::Done => {
                let gone = self.exch.lock().gone;
                return Err(ClientDisconnected::new_err(if gone {
                    "the client disconnected"
                } else {
                    "the response is already complete"
                }));
            }
            Phase::Trailers => {
                return Err(PyRuntimeError::new_err(format!(
                    "{what} after the final body: http.response.trailers is expected"
                )))
            }
            Phase::Held | Phase::Streaming | Phase::WireDone => {}
        }
        if self.exch.gone_now(shared) {
            return Err(self.client_gone(py, st));
        }
        let mut body = body;
        if self.head {
            if let (Out::File(f), Some((_, headers)), false) = (&body, st.held.as_mut(), more_body)
            {
                // The length a GET would be framed by (as for pathsend).
                if !headers.contains_key(CONTENT_LENGTH) {
                    headers.insert(CONTENT_LENGTH, HeaderValue::from(f.len()));
                }
            }
            // HEAD: the head is the whole answer (RFC 9110 §9.3.2).
            body = Out::Data(Bytes::new());
        } else if st.no_body && !body.is_empty() {
            self.warn_dropped_body(py, st.status, body.len());
            body = Out::Data(Bytes::new());
        }
        let total = st.sent + body.len() as u64;
        if let Some(declared) = st.declared {
            if total > declared {
                // Refused before anything is queued: the wire never
                // carries more than the head announced.
                return Err(PyRuntimeError::new_err(format!(
                    "response body is longer than its Content-Length of {declared} \
                     bytes ({total} bytes sent)"
                )));
            }
            if !more_body && total < declared {
                return self.end_short(py, st, body, total, declared);
            }
        }
        st.sent = total;
        if st.phase == Phase::WireDone {
            if !more_body {
                self.finish(py, st);
            }
            return self.ctx.done(py);
        }
        // The chunk that reaches the declared length ends the wire
        // message even while `more_body` is true: hyper stops
        // polling the body there.
        let wire_end = !more_body || st.declared == Some(total) || self.head;
        if st.phase == Phase::Held {
            let (status, mut headers) = st.held.take().unwrap_or_default();
            // Trailers need a streamed body (chunked on HTTP/1.1).
            if wire_end && !st.trailing {
                let (body, file) = match body {
                    Out::Data(b) => (BodyOut::Full(b), None),
                    file => {
                        // The whole body is this file region: its length
                        // frames it, as a whole `http.response.body` is.
                        if !headers.contains_key(CONTENT_LENGTH) {
                            headers.insert(CONTENT_LENGTH, HeaderValue::from(total));
                        }
                        (BodyOut::Stream, Some(file))
                    }
                };
                self.respond(status, headers, body);
                if let Some(file) = file {
                    self.exch.push_out(file, true, shared);
                }
                return self.ended(py, st, more_body);
            }
            st.phase = Phase::Streaming;
            self.respond(status, headers, BodyOut::Stream);
        }
        if more_body && wire_end {
            self.exch.push_out(body, true, shared);
            st.phase = Phase::WireDone;
            return self.ctx.done(py);
        }
        if !more_body && st.trailing {
            // The body ends with the trailer section, still to come.
            self.exch.push_out(body, false, shared);
            st.phase = Phase::Trailers;
            return self.ctx.done(py);
        }
        let full = self.exch.push_out(body, !more_body, shared);
        if !more_body {
            self.finish(py, st);
            return self.ctx.done(py);
        }
        if !full {
            return self.ctx.done(py);
        }
        // Over the send buffer: wait until the client drains it.
        let fut = self.ctx.waiter(py)?;
        let mut ex = self.exch.lock();
        if ex.gone || ex.has_room(shared.config.send_buffer) {
            drop(ex);
            return self.ctx.done(py);
        }
        ex.send_waiters.push(fut.clone().unbind());
        Ok(fut.into_any())
    }

    /// The whole wire body was handed over with the head: the response is
    /// complete, or (`more_body`) awaits the app's final message.
    fn ended<'py>(
        &self,
        py: Python<'py>,
        st: &mut ProtoState,
        more_body: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        if more_body {
            st.phase = Phase::WireDone;
        } else {
            self.finish(py, st);
        }
        self.ctx.done(py)
    }

    /// The app ended a response shorter than its `Content-Length`: what it
    /// sent is written, then the connection is closed so the client sees
    /// an incomplete message rather than a wrong one (RFC 9112 §6.3).
    fn end_short<'py>(
        &self,
        py: Python<'py>,
        st: &mut ProtoState,
        body: Out,
        total: u64,
        declared: u64,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.ctx.log_error(
            py,
            &format!(
                "response body is shorter than its Content-Length ({total} of {declared} \
                 bytes): closing the connection"
            ),
            None,
        );
        let shared = &self.ctx.shared;
        st.sent = total;
        if let Some((status, headers)) = st.held.take() {
            self.respond(status, headers, BodyOut::Stream);
        }
        self.exch.push_out(body, false, shared);
        self.exch.abort(shared);
        self.finish(py, st);
        self.ctx.done(py)
    }
}
