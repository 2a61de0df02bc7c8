//! The hyper service: one call per request head.
//!
//! It never touches Python. It queues an [`HttpRequest`] for the asyncio
//! thread, then waits for the response head while reading the request body
//! into the exchange as far as the app's buffer allows. Small bodies with a
//! known length are read *before* the app starts, so the common upload
//! completes its first `receive()` without waiting.

use std::convert::Infallible;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http::header::EXPECT;
use http::{Request, Response, StatusCode};
use http_body::Body;
use hyper::body::Incoming;

use crate::bridge::queue::Event;
use crate::http::activity::Expired;
use crate::http::body::{ResponseBody, StreamBody};
use crate::http::compress;
use crate::http::conn::{BusyGuard, ConnCtx};
use crate::http::exchange::{Awaited, BodyOut, Exchange};
use crate::http::interim;
use crate::server::Shared;
use crate::wire::request::{check_head, FIELD_TOO_LARGE};

/// A request on its way to the application.
pub(crate) struct HttpRequest {
    pub(crate) parts: http::request::Parts,
    pub(crate) exch: Arc<Exchange>,
    pub(crate) conn: Arc<ConnCtx>,
    /// When the head was parsed (for the access log's duration); only
    /// read from the clock when access logging is on.
    pub(crate) received: Option<Instant>,
}

/// Marks the exchange gone if the service future is dropped before the
/// response head was handed to hyper (hyper drops it when the client
/// disconnects mid-request).
struct GoneGuard<'a> {
    exch: &'a Arc<Exchange>,
    shared: &'a Shared,
    armed: bool,
}

impl Drop for GoneGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.exch.mark_gone(self.shared);
        }
    }
}

fn expects_continue(parts: &http::request::Parts) -> bool {
    parts
        .headers
        .get(EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// Reads a whole body of a known small length, before the app starts.
/// `Err` carries the answer: 400 for a body that fails, 408 when the
/// client stalls past `body_read_timeout`, 503 past
/// `response_start_timeout`.
async fn read_small_body(
    body: &mut Incoming,
    len: usize,
    conn: &ConnCtx,
) -> Result<Bytes, (StatusCode, &'static str)> {
    let mut first: Option<Bytes> = None;
    let mut rest: Option<BytesMut> = None;
    loop {
        let frame = poll_fn(|cx| {
            match conn.activity.take_expired() {
                Some(Expired::Body) => {
                    return Poll::Ready(Err((
                        StatusCode::REQUEST_TIMEOUT,
                        "request body not received in time",
                    )))
                }
                Some(Expired::ResponseStart) => {
                    return Poll::Ready(Err((
                        StatusCode::SERVICE_UNAVAILABLE,
                        crate::metrics::RESPONSE_START_REASON,
                    )))
                }
                None => {}
            }
            match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Pending if conn.activity.peer_eof() => {
                    Poll::Ready(Err((StatusCode::BAD_REQUEST, "request body incomplete")))
                }
                Poll::Pending => {
                    conn.activity.body_wait(true);
                    Poll::Pending
                }
                Poll::Ready(r) => {
                    conn.activity.body_wait(false);
                    Poll::Ready(Ok(r))
                }
            }
        })
        .await?;
        let Some(frame) = frame else { break };
        let frame = frame.map_err(|e| {
            tracing::debug!("request body read failed before dispatch: {e}");
            (StatusCode::BAD_REQUEST, "invalid request body")
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        match (&mut first, &mut rest) {
            (None, _) => first = Some(data),
            (Some(f), None) => {
                let mut buf = BytesMut::with_capacity(len);
                buf.extend_from_slice(f);
                buf.extend_from_slice(&data);
                rest = Some(buf);
            }
            (Some(_), Some(buf)) => buf.extend_from_slice(&data),
        }
    }
    Ok(match rest {
        Some(buf) => buf.freeze(),
        None => first.unwrap_or_default(),
    })
}

/// Reads request body into the exchange while the app has room for it.
///
/// A body that fails to parse (a bad chunk, a length cut short) rejects the
/// request with 400; the client going away does the same, unseen.
pub(crate) fn pump_body(
    cx: &mut Context<'_>,
    exch: &Arc<Exchange>,
    incoming: &mut Option<Incoming>,
    conn: &ConnCtx,
    expect_continue: bool,
) {
    let shared = &*conn.shared;
    while let Some(body) = incoming.as_mut() {
        if !exch.wants_body(shared, expect_continue) {
            conn.activity.body_wait(false);
            return;
        }
        match Pin::new(body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    if !data.is_empty() {
                        conn.activity.body_wait(false);
                        exch.push_body(data, shared);
                    }
                }
            }
            Poll::Ready(Some(Err(e))) => {
                tracing::debug!("request body read failed: {e}");
                *incoming = None;
                conn.activity.body_wait(false);
                exch.reject(StatusCode::BAD_REQUEST, "invalid request body", shared);
            }
            Poll::Ready(None) => {
                *incoming = None;
                conn.activity.body_wait(false);
                exch.end_body(shared);
            }
            Poll::Pending if conn.activity.peer_eof() => {
                // The client ended its side before the body's end.
                *incoming = None;
                conn.activity.body_wait(false);
                exch.reject(StatusCode::BAD_REQUEST, "request body incomplete", shared);
            }
            Poll::Pending => {
                conn.activity.body_wait(true);
                return;
            }
        }
    }
}

/// Answers a passed request deadline (see [`Activity`](crate::http::activity::Activity)).
pub(crate) fn check_deadlines(conn: &ConnCtx, exch: &Arc<Exchange>) {
    let Some(e) = conn.activity.take_expired() else {
        return;
    };
    let shared = &*conn.shared;
    match e {
        Expired::Body => {
            tracing::debug!("request body from {:?} not received in time", conn.peer);
            exch.reject(
                StatusCode::REQUEST_TIMEOUT,
                "request body not received in time",
                shared,
            );
        }
        Expired::ResponseStart => {
            tracing::warn!(
                "the application did not start a response within {:?}: answered 503",
                shared.config.response_start_timeout
            );
            exch.reject(
                StatusCode::SERVICE_UNAVAILABLE,
                crate::metrics::RESPONSE_START_REASON,
                shared,
            );
        }
    }
}

/// An HTTP/2 request's fields as an HTTP/1.1 app expects them: `:authority`
/// becomes the `host` field, first (replacing a `host` the client also
/// sent); several `cookie` fields are joined with "; " (RFC 9113 §8.2.3),
/// as frameworks read only the first. Pseudo-headers never reach the
/// header map (hyper keeps them in the URI).
fn h2_fields(parts: &mut http::request::Parts) {
    let authority = parts
        .uri
        .authority()
        .and_then(|a| http::HeaderValue::from_str(a.as_str()).ok());
    let cookies = parts.headers.get_all(http::header::COOKIE).iter().count();
    if authority.is_none() && cookies < 2 {
        return;
    }
    let old = std::mem::take(&mut parts.headers);
    let mut map = http::HeaderMap::with_capacity(old.len() + 1);
    let has_authority = authority.is_some();
    if let Some(a) = authority {
        map.insert(http::header::HOST, a);
    }
    let mut cookie_done = cookies < 2;
    for (name, value) in &old {
        if name == http::header::HOST && has_authority {
            continue;
        }
        if name == http::header::COOKIE && !cookie_done {
            cookie_done = true;
            let mut joined = Vec::new();
            for v in old.get_all(http::header::COOKIE) {
                if !joined.is_empty() {
                    joined.extend_from_slice(b"; ");
                }
                joined.extend_from_slice(v.as_bytes());
            }
            if let Ok(v) = http::HeaderValue::from_bytes(&joined) {
                map.append(http::header::COOKIE, v);
            }
            continue;
        }
        if name == http::header::COOKIE && cookies >= 2 {
            continue;
        }
        map.append(name.clone(), value.clone());
    }
    parts.headers = map;
}

/// The server's own answer to a request the app never sees, with its
/// access-log line when the access log is on.
fn answer(
    parts: http::request::Parts,
    conn: &Arc<ConnCtx>,
    received: Option<Instant>,
    status: StatusCode,
    reason: &'static str,
    busy: BusyGuard,
) -> Response<ResponseBody> {
    conn.shared.metrics.refused_answer(status, reason);
    if conn.shared.config.access_log {
        conn.shared.queue.push(Event::Access(
            Box::new(HttpRequest {
                parts,
                exch: Arc::new(Exchange::default()),
                conn: Arc::clone(conn),
                received,
            }),
            status.as_u16(),
            reason.len() as u64,
        ));
    }
    let mut resp = ResponseBody::plain(status, reason, busy);
    if conn.shared.config.server_timing {
        server_timing(resp.headers_mut(), None, received);
    }
    resp
}

/// The loop watchdog's answer (see `server::watchdog`): `503`,
/// `Retry-After`, `Connection: close`; the app never sees the request.
fn refuse_stalled(
    parts: http::request::Parts,
    conn: &Arc<ConnCtx>,
    received: Option<Instant>,
    busy: BusyGuard,
) -> Response<ResponseBody> {
    use crate::server::watchdog::{mark_refusal, REASON};
    conn.shared
        .metrics
        .refused(crate::metrics::Limit::LoopStall);
    let status = StatusCode::SERVICE_UNAVAILABLE;
    let mut resp = if !conn.shared.config.access_log || conn.shared.watchdog.may_log_refusal() {
        answer(parts, conn, received, status, REASON, busy)
    } else {
        // Past the stall's access-log budget (counted, reported later).
        ResponseBody::plain(status, REASON, busy)
    };
    mark_refusal(REASON, resp.headers_mut());
    resp
}

/// Serves one request: see the module docs.
pub(crate) async fn handle(
    req: Request<Incoming>,
    conn: Arc<ConnCtx>,
) -> Result<Response<ResponseBody>, Infallible> {
    let busy = BusyGuard::new(&conn);
    let shared = &*conn.shared;
    if shared.health.enabled() {
        if shared.health.matches(req.method(), req.uri().path()) {
            return Ok(crate::server::health::Health::respond(shared, busy));
        }
        // Accepted during lifespan startup (for the health path): the
        // request waits for startup as it would in the backlog.
        if shared.health.is_starting() {
            shared.health.until_started().await;
        }
    }
    let cfg = &conn.shared.config;
    let received = (cfg.access_log || cfg.server_timing).then(Instant::now);
    let mut busy = busy;
    busy.meter(req.method(), req.version());
    shared.count_request();
    let (mut parts, mut body) = req.into_parts();
    if parts.version == http::Version::HTTP_2 {
        h2_fields(&mut parts);
        // hyper's HTTP/1.1 parser counts fields; on HTTP/2 it is done here.
        let most = shared.config.limit_request_fields;
        if most > 0 && parts.headers.len() > most {
            return Ok(answer(
                parts,
                &conn,
                received,
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "too many header fields",
                busy,
            ));
        }
    }
    // A field line over the limit as received (its whitespace counted):
    // after the request line's own limit, before the other checks.
    let raw_too_long = conn.activity.take_field_too_long();
    let seen = match check_head(&parts, &shared.config.limits) {
        Err(r) if r.status == StatusCode::URI_TOO_LONG => Err(r),
        _ if raw_too_long => Err(FIELD_TOO_LARGE),
        other => other,
    };
    let seen = match seen {
        Ok(seen) => seen,
        Err(r) => {
            tracing::debug!("rejected a request from {:?}: {}", conn.peer, r.reason);
            return Ok(answer(parts, &conn, received, r.status, r.reason, busy));
        }
    };
    if let Some(proxy) = &shared.config.proxy {
        // What a trusted proxy says about the client rides in the request's
        // extensions to the scope builder.
        match proxy.origin(&parts.headers, conn.peer.map(|p| p.ip())) {
            Ok(Some(origin)) => {
                parts.extensions.insert(origin);
            }
            Ok(None) => {}
            Err(reason) => {
                return Ok(answer(
                    parts,
                    &conn,
                    received,
                    StatusCode::BAD_REQUEST,
                    reason,
                    busy,
                ))
            }
        }
    }
    if shared.watchdog.is_stalled() {
        return Ok(refuse_stalled(parts, &conn, received, busy));
    }
    if (seen.upgrade && crate::websocket::handshake::is_upgrade(&parts))
        || crate::websocket::handshake::is_extended_connect(&parts)
    {
        conn.not_plain_http();
        // Boxed: inline, the handshake's state (1.4 KiB) made every HTTP
        // request's future 2.3 KiB to allocate and copy (bench/NOTES.md,
        // entry 44).
        return Ok(Box::pin(crate::websocket::service::handle(parts, conn, busy)).await);
    }
    // The coding this client accepts, if compression is on; whether it is
    // applied depends on the response (see `compress`).
    let coding = shared
        .config
        .compression
        .as_ref()
        .and_then(|c| compress::negotiate(c, &parts.headers))
        .map(|coding| {
            (
                coding,
                parts.method == http::Method::HEAD,
                compress::identity_refused(&parts.headers),
            )
        });
    let bodyless = body.is_end_stream();
    // `Expect` only matters for a request with a body. hyper's HTTP/2
    // server cannot send a 100 (no interim responses), so an HTTP/2 body is
    // read as if no `Expect` came: the client sends it after its wait.
    let expect_continue = !bodyless
        && seen.expect
        && parts.version != http::Version::HTTP_2
        && expects_continue(&parts);

    let max_body = shared.config.max_body_size;
    if max_body > 0 && body.size_hint().lower() > max_body {
        tracing::debug!("rejected a request from {:?}: body too large", conn.peer);
        return Ok(answer(
            parts,
            &conn,
            received,
            StatusCode::PAYLOAD_TOO_LARGE,
            "request body too large",
            busy,
        ));
    }
    let prefetch = shared.config.body_prefetch as u64;
    let (exch, mut incoming) = if bodyless {
        (Arc::new(Exchange::with_complete_body(Bytes::new())), None)
    } else {
        match body.size_hint().exact() {
            Some(len) if !expect_continue && len <= prefetch => {
                match read_small_body(&mut body, len as usize, &conn).await {
                    Ok(data) => (Arc::new(Exchange::with_complete_body(data)), None),
                    // The app never sees this request; hyper closes the
                    // connection after the answer (its body is unread).
                    Err((status, reason)) => {
                        return Ok(answer(parts, &conn, received, status, reason, busy))
                    }
                }
            }
            _ => (Arc::new(Exchange::default()), Some(body)),
        }
    };

    if shared.watchdog.is_stalled() {
        // The loop blocked while the body was read.
        return Ok(refuse_stalled(parts, &conn, received, busy));
    }
    match shared.concurrency.acquire() {
        Ok(slot) => busy.hold(slot),
        Err(()) => {
            shared.metrics.refused(crate::metrics::Limit::Concurrency);
            let mut resp = answer(
                parts,
                &conn,
                received,
                StatusCode::SERVICE_UNAVAILABLE,
                crate::server::concurrency::REASON,
                busy,
            );
            crate::server::watchdog::retry_after(resp.headers_mut());
            return Ok(resp);
        }
    }
    let mut guard = GoneGuard {
        exch: &exch,
        shared,
        armed: true,
    };
    shared.queue.push(Event::Http(Box::new(HttpRequest {
        parts,
        exch: Arc::clone(&exch),
        conn: Arc::clone(&conn),
        received,
    })));
    // Where this request's interim responses end in the connection's
    // interim bytes (0: none queued).
    let mut interim_upto = 0u64;
    let head = poll_fn(|cx| {
        check_deadlines(&conn, &exch);
        if conn.activity.peer_eof() {
            exch.client_eof(shared, conn.eof_probe.lock().as_ref().map(Arc::downgrade));
        }
        pump_body(cx, &exch, &mut incoming, &conn, expect_continue);
        loop {
            // This request's interim responses reach the wire first.
            std::task::ready!(conn.interim.poll_written(interim_upto, cx));
            match exch.poll_head(cx, &conn.shared) {
                Poll::Ready(Awaited::Head(head)) => return Poll::Ready(head),
                Poll::Ready(Awaited::Interim(list)) => {
                    // Queued only where they can be sent (`HttpProtocol`
                    // drops them elsewhere; an HTTP/2 connection may have
                    // turned them off since, see `h2io`).
                    let loaded = match conn.h2_stream {
                        Some(_) if conn.interim.is_off() => None,
                        Some(stream) => conn.interim.load(interim::encode_h2(stream, &list)),
                        None => conn.interim.load(interim::encode_h1(&list)),
                    };
                    if let Some(end) = loaded {
                        interim_upto = end;
                    }
                }
                Poll::Pending if conn.activity.peer_eof() && exch.is_gone() => {
                    // Told of the end of stream, the app gave up without an
                    // answer (Quart's disconnect listener cancels the
                    // handler): nothing will be written; the driver closes
                    // the connection.
                    conn.activity.abandon();
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    })
    .await;
    let app_started = exch.lock().app_started;
    conn.activity.responded();
    guard.armed = false;
    drop(guard);

    let mut head = head;
    let mut coder = None;
    if let (Some(cfg), Some((coding, head_request, must))) =
        (&conn.shared.config.compression, coding)
    {
        let len = match &head.body {
            BodyOut::Full(d) => Some(d.len() as u64),
            BodyOut::File { len, .. } => Some(*len),
            BodyOut::Stream => None,
        };
        if compress::applies(cfg, head_request, head.status, &head.headers, len, must) {
            if let BodyOut::Full(d) = &head.body {
                match compress::whole(coding, d) {
                    // Encoding that does not shrink the body (random or
                    // compressed bytes) is not applied: it costs the
                    // client the decoding for nothing.
                    Ok(z) if z.len() >= d.len() && !must => {}
                    Ok(z) => {
                        head.body = BodyOut::Full(z);
                        compress::mark_headers(&mut head.headers, coding);
                    }
                    Err(e) => tracing::error!("response compression failed: {e}"),
                }
            } else {
                match compress::Encoder::new(coding) {
                    Ok(enc) => {
                        coder = Some(enc);
                        compress::mark_headers(&mut head.headers, coding);
                    }
                    Err(e) => tracing::error!("response compression failed: {e}"),
                }
            }
        }
    }
    busy.responded(head.status);
    let body = match head.body {
        BodyOut::Full(data) => ResponseBody::full(data, busy),
        BodyOut::File { file, len } => ResponseBody::file(file, len, busy),
        BodyOut::Stream => ResponseBody::stream(
            StreamBody::new(exch, incoming, Arc::clone(&conn), expect_continue),
            busy,
        ),
    };
    let body = match coder {
        Some(enc) => body.coded(enc),
        None => body,
    };
    let mut resp = Response::new(body);
    set_status(&mut resp, head.status);
    *resp.headers_mut() = head.headers;
    if conn.shared.config.server_timing {
        server_timing(resp.headers_mut(), app_started, received);
    }
    Ok(resp)
}

/// Sets `resp`'s status. hyper writes the literal reason phrase `<none>`
/// for a status it has none for (`499`, `299`, `520`…); the phrase may be
/// empty (RFC 9112 §4), as uvicorn (h11, httptools) sends it: the status
/// line is then `HTTP/1.1 499 ` (HTTP/2 has no reason phrase).
pub(crate) fn set_status<B>(resp: &mut Response<B>, status: http::StatusCode) {
    if status.canonical_reason().is_none() {
        resp.extensions_mut()
            .insert(hyper::ext::ReasonPhrase::from_static(b""));
    }
    *resp.status_mut() = status;
}

/// Appends `Server-Timing: app;dur=…, total;dur=…` (W3C Server Timing;
/// milliseconds with microsecond precision): from the app's call and from
/// the request head to now, when the head goes to hyper.
fn server_timing(headers: &mut http::HeaderMap, app: Option<Instant>, received: Option<Instant>) {
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1000.0;
    let value = match (app, received) {
        (Some(a), Some(r)) => format!("app;dur={:.3}, total;dur={:.3}", ms(a), ms(r)),
        (None, Some(r)) => format!("total;dur={:.3}", ms(r)),
        _ => return,
    };
    if let Ok(v) = http::HeaderValue::from_str(&value) {
        headers.append(http::header::HeaderName::from_static("server-timing"), v);
    }
}

#[cfg(test)]
mod tests {
    use super::h2_fields;

    fn parts(uri: &str, fields: &[(&str, &str)]) -> http::request::Parts {
        let mut b = http::Request::builder()
            .uri(uri)
            .version(http::Version::HTTP_2);
        for (k, v) in fields {
            b = b.header(*k, *v);
        }
        b.body(())
            .map(|r| r.into_parts().0)
            .expect("valid test request")
    }

    fn pairs(p: &http::request::Parts) -> Vec<(String, String)> {
        p.headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn authority_becomes_the_first_host_field() {
        let mut p = parts(
            "http://example.test/x",
            &[("accept", "*/*"), ("host", "other.test")],
        );
        h2_fields(&mut p);
        assert_eq!(
            pairs(&p),
            [("host", "example.test"), ("accept", "*/*")].map(|(a, b)| (a.into(), b.into()))
        );
    }

    #[test]
    fn a_host_without_authority_is_kept() {
        let mut p = parts("/x", &[("host", "only.test")]);
        h2_fields(&mut p);
        assert_eq!(pairs(&p), [("host".into(), "only.test".into())]);
    }

    #[test]
    fn cookie_fields_are_joined_in_order() {
        let mut p = parts(
            "http://a.test/",
            &[("cookie", "a=1"), ("x", "y"), ("cookie", "b=2")],
        );
        h2_fields(&mut p);
        let got = pairs(&p);
        assert_eq!(got[0], ("host".into(), "a.test".into()));
        assert!(got.contains(&("cookie".into(), "a=1; b=2".into())));
        assert_eq!(got.iter().filter(|(k, _)| k == "cookie").count(), 1);
        assert!(got.contains(&("x".into(), "y".into())));
    }
}
