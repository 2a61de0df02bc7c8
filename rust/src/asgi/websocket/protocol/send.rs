//! The `send()` messages of a WebSocket, one method each (ASGI WebSocket
//! spec 2.5); the checks of each keep the order the spec's errors need.

use http::HeaderMap;
use parking_lot::MutexGuard;
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::protocol::CloseFrame;
use tungstenite::Message;

use super::{sendable_code, Outgoing, Phase, ProtoState, WebSocketProtocol};
use crate::asgi::http::exchange::{BodyOut, ResponseHead};
use crate::asgi::http::message::{body_bytes, parse_headers, parse_status};
use crate::asgi::websocket::shared::{Decision, ABNORMAL};
use crate::bridge::names::names;
use crate::errors::ClientDisconnected;

/// `message[k]`, `None` counting as absent.
pub(super) fn get<'py>(
    d: &Bound<'py, PyDict>,
    k: &Py<PyString>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    Ok(d.get_item(k.bind(d.py()))?.filter(|v| !v.is_none()))
}

/// `message[k]` as a `str` (`None` counting as absent); `TypeError(error)`
/// for another type.
fn get_str(
    d: &Bound<'_, PyDict>,
    k: &Py<PyString>,
    error: &'static str,
) -> PyResult<Option<String>> {
    let Some(v) = get(d, k)? else {
        return Ok(None);
    };
    let s = v
        .cast::<PyString>()
        .map_err(|_| PyTypeError::new_err(error))?;
    Ok(Some(s.to_str()?.to_owned()))
}

/// `message["headers"]` (`what`: the message, for errors), empty when
/// absent.
fn get_headers(d: &Bound<'_, PyDict>, what: &str) -> PyResult<HeaderMap> {
    match get(d, &names(d.py()).headers)? {
        Some(h) => parse_headers(&h, what),
        None => Ok(HeaderMap::new()),
    }
}

impl WebSocketProtocol {
    /// `websocket.send`: one message, behind the ones still waiting;
    /// `bytes` and `text` as [`get`] reads them.
    pub(super) fn send_message<'py>(
        &self,
        py: Python<'py>,
        bytes: Option<Bound<'py, PyAny>>,
        text: Option<Bound<'py, PyAny>>,
        st: MutexGuard<'_, ProtoState>,
    ) -> PyResult<Bound<'py, PyAny>> {
        match st.phase {
            Phase::Accepted => {}
            Phase::Closed if self.client_left() => {
                return Err(ClientDisconnected::new_err("the WebSocket is closed"))
            }
            Phase::Closed => {
                return Err(PyRuntimeError::new_err(
                    "websocket.send after websocket.close",
                ))
            }
            _ => {
                return Err(PyRuntimeError::new_err(
                    "websocket.send before websocket.accept",
                ))
            }
        }
        let msg = match (bytes, text) {
            (Some(b), None) => {
                Outgoing::Ready(Message::Binary(body_bytes(&b, "websocket.send 'bytes'")?))
            }
            (None, Some(t)) => {
                let s = t.cast::<PyString>().map_err(|_| {
                    PyTypeError::new_err(format!(
                        "websocket.send 'text' must be a str, got {}",
                        t.get_type()
                            .name()
                            .map(|n| n.to_string())
                            .unwrap_or_default()
                    ))
                })?;
                // Validated now (lone surrogates raise here); copied
                // once it is queued.
                s.to_str()?;
                Outgoing::Text(s.clone().unbind())
            }
            _ => {
                return Err(PyRuntimeError::new_err(
                    "websocket.send needs exactly one of 'bytes' or 'text'",
                ))
            }
        };
        drop(st);
        self.queue_or_wait(py, msg)
    }

    /// `websocket.accept`: the handshake's 101 (or 200 on HTTP/2).
    pub(super) fn accept<'py>(
        &self,
        py: Python<'py>,
        d: &Bound<'py, PyDict>,
        mut st: MutexGuard<'_, ProtoState>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let n = names(py);
        let shared = &self.ctx.shared;
        if !matches!(st.phase, Phase::Connecting | Phase::Handshake) {
            return Err(PyRuntimeError::new_err(
                "websocket.accept sent after the handshake was answered",
            ));
        }
        if self.client_left() {
            st.phase = Phase::Closed;
            return Err(ClientDisconnected::new_err(
                "the client left before the WebSocket was accepted",
            ));
        }
        let subprotocol = get_str(
            d,
            &n.subprotocol,
            "websocket.accept 'subprotocol' must be a str or None",
        )?;
        let headers = get_headers(d, "websocket.accept")?;
        st.phase = Phase::Accepted;
        self.ws.decide(
            Decision::Accept {
                subprotocol,
                headers,
            },
            shared,
        );
        self.ctx.done(py)
    }

    /// `websocket.close`: a denial before the handshake is answered, a close frame after.
    pub(super) fn close<'py>(
        &self,
        py: Python<'py>,
        d: &Bound<'py, PyDict>,
        mut st: MutexGuard<'_, ProtoState>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let n = names(py);
        let shared = &self.ctx.shared;
        let code: u16 = match get(d, &n.code)? {
            Some(c) => {
                let c: i64 = c
                    .extract()
                    .map_err(|_| PyTypeError::new_err("websocket.close 'code' must be an int"))?;
                u16::try_from(c)
                    .ok()
                    .filter(|c| sendable_code(*c))
                    .ok_or_else(|| {
                        PyRuntimeError::new_err(format!(
                            "websocket.close 'code' {c} may not be sent \
                         (1000-1003, 1007-1014 or 3000-4999)"
                        ))
                    })?
            }
            None => 1000,
        };
        let reason =
            get_str(d, &n.reason, "websocket.close 'reason' must be a str")?.unwrap_or_default();
        if reason.len() > 123 {
            return Err(PyRuntimeError::new_err(
                "websocket.close 'reason' is longer than 123 bytes (RFC 6455 §5.5)",
            ));
        }
        match st.phase {
            Phase::Connecting | Phase::Handshake => {
                st.phase = Phase::Closed;
                if !self.client_left() {
                    self.ws.decide(Decision::Deny, shared);
                }
                self.ws.lock().closed.get_or_insert((code, reason));
            }
            Phase::Accepted => {
                st.phase = Phase::Closed;
                drop(st);
                // Behind the messages of send() calls still waiting.
                return self.queue_or_wait(
                    py,
                    Outgoing::Ready(Message::Close(Some(CloseFrame {
                        code: CloseCode::from(code),
                        reason: reason.into(),
                    }))),
                );
            }
            Phase::Responding => {
                return Err(PyRuntimeError::new_err(
                    "websocket.close during websocket.http.response",
                ))
            }
            Phase::Closed => {
                if self.client_left() {
                    return Err(ClientDisconnected::new_err("the WebSocket is closed"));
                }
                return Err(PyRuntimeError::new_err("websocket.close sent twice"));
            }
        }
        self.ctx.done(py)
    }

    /// `websocket.http.response.start`: the head of a denial response.
    pub(super) fn response_start<'py>(
        &self,
        py: Python<'py>,
        d: &Bound<'py, PyDict>,
        mut st: MutexGuard<'_, ProtoState>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let n = names(py);
        if !matches!(st.phase, Phase::Connecting | Phase::Handshake) {
            return Err(PyRuntimeError::new_err(
                "websocket.http.response.start after the handshake was answered",
            ));
        }
        const WHAT: &str = "websocket.http.response.start";
        let status = parse_status(get(d, &n.status)?, WHAT)?;
        let headers = get_headers(d, WHAT)?;
        st.http_head = Some((status, headers));
        st.phase = Phase::Responding;
        self.ctx.done(py)
    }

    /// `websocket.http.response.body`: the denial response's body.
    pub(super) fn response_body<'py>(
        &self,
        py: Python<'py>,
        d: &Bound<'py, PyDict>,
        mut st: MutexGuard<'_, ProtoState>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let n = names(py);
        let shared = &self.ctx.shared;
        if st.phase != Phase::Responding {
            return Err(PyRuntimeError::new_err(
                "websocket.http.response.body before websocket.http.response.start",
            ));
        }
        if let Some(b) = get(d, &n.body)? {
            let b = body_bytes(&b, "websocket.http.response.body 'body'")?;
            st.http_body.extend_from_slice(&b);
        }
        let more = match get(d, &n.more_body)? {
            Some(m) => m.is_truthy()?,
            None => false,
        };
        if !more {
            let (status, headers) = st.http_head.take().unwrap_or_default();
            let body = std::mem::take(&mut st.http_body).freeze();
            st.phase = Phase::Closed;
            if !self.client_left() {
                self.ws.decide(
                    Decision::Respond(ResponseHead {
                        status,
                        headers,
                        body: BodyOut::Full(body),
                    }),
                    shared,
                );
            }
            self.ws
                .lock()
                .closed
                .get_or_insert((ABNORMAL, String::new()));
        }
        self.ctx.done(py)
    }
}
