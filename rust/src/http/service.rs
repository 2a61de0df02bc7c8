//! The hyper service: one call per request head.
//!
//! It never touches Python. It queues an [`HttpRequest`] for the asyncio
//! thread, then waits for the response head while reading the request body
//! into the exchange as far as the app's buffer allows. Small bodies with a
//! known length are read *before* the app starts, so the common upload
//! completes its first `receive()` without waiting.

use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use bytes::Bytes;
use http::header::EXPECT;
use http::{HeaderValue, Request, Response, StatusCode};

use crate::asgi::http::exchange::{Awaited, BodyOut, Exchange, ResponseHead, TrailersWanted};
use crate::bridge::queue::Event;
use crate::http::body::{ResponseBody, StreamBody};
use crate::http::compress;
use crate::http::ctx::{BusyGuard, ConnCtx};
use crate::http::interim;
use crate::http::pump::{check_deadlines, pump_body, read_small_body, RequestBody};
use crate::wire::handshake;
use crate::wire::request::{check_head, Seen, FIELD_TOO_LARGE};
use crate::worker::Worker;

/// A request on its way to the application.
pub(crate) struct HttpRequest {
    pub(crate) parts: http::request::Parts,
    pub(crate) exch: Arc<Exchange>,
    pub(crate) conn: Arc<ConnCtx>,
    /// When the head was parsed (for the access log's duration); only
    /// read from the clock when access logging is on.
    pub(crate) received: Option<Instant>,
    /// The server answered it before the app saw it: the job is only its
    /// access-log line.
    pub(crate) rejected: Option<Answered>,
}

/// The server's own answer to a request, for its access-log line, which
/// is written later on the asyncio thread.
pub(crate) struct Answered {
    pub(crate) status: u16,
    /// Body bytes sent.
    pub(crate) bytes: u64,
    /// From the head's arrival to the answer (`None` when the arrival was
    /// not timed): fixed when answered, not when logged, which may be
    /// much later (a stalled loop).
    pub(crate) took: Option<std::time::Duration>,
}

impl Answered {
    /// Answered now.
    pub(crate) fn now(status: u16, bytes: u64, received: Option<Instant>) -> Self {
        Self {
            status,
            bytes,
            took: received.map(|r| r.elapsed()),
        }
    }
}

/// Marks the exchange gone if the service future is dropped before the
/// response head was handed to hyper (hyper drops it when the client
/// disconnects mid-request).
struct GoneGuard<'a> {
    exch: &'a Arc<Exchange>,
    shared: &'a Worker,
    armed: bool,
}

impl Drop for GoneGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.exch.mark_gone(self.shared);
        }
    }
}

/// Whether the client waits for a `100 Continue` before its body. On
/// HTTP/2 hyper reads the body without waiting for a `100`, and Skirr's own
/// HTTP/2 interim path carries only what the app sends, so an HTTP/2 body
/// is read as if no `Expect` came: the client sends it after its wait.
/// On HTTP/3 the body's first read, once the app awaits `receive()`, queues
/// the `100` (`proto::h3::body`), as hyper does on HTTP/1.1.
fn continue_wanted(parts: &http::request::Parts) -> bool {
    parts.version != http::Version::HTTP_2 && expects_continue(&parts.headers)
}

/// Whether a request's fields carry `Expect: 100-continue` (RFC 9110
/// §10.1.1; the value is case-insensitive).
pub(crate) fn expects_continue(headers: &http::HeaderMap) -> bool {
    headers
        .get(EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
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
        conn.shared.queue.push(Event::Run(Box::new(HttpRequest {
            parts,
            exch: Arc::new(Exchange::default()),
            conn: Arc::clone(conn),
            received,
            rejected: Some(Answered::now(
                status.as_u16(),
                reason.len() as u64,
                received,
            )),
        })));
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
    use crate::worker::watchdog::{mark_refusal, REASON};
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

/// A request whose head passed every check of [`admit`]; `B`: its body.
pub(crate) struct Admitted<B> {
    parts: http::request::Parts,
    body: B,
    conn: Arc<ConnCtx>,
    busy: BusyGuard,
    received: Option<Instant>,
    seen: Seen,
}

/// What [`admit`] decided.
pub(crate) enum Admission<B> {
    /// The server answered itself (health path, a refused head, a stalled
    /// loop).
    Answered(Response<ResponseBody>),
    /// On to the app: an HTTP request or a WebSocket handshake.
    Admitted(Admitted<B>),
}

impl<B> Admitted<B> {
    /// Whether the request opens a WebSocket (an HTTP/1.1 upgrade or an
    /// RFC 8441 extended CONNECT).
    pub(crate) fn is_websocket(&self) -> bool {
        (self.seen.upgrade && handshake::is_upgrade(&self.parts))
            || handshake::is_extended_connect(&self.parts)
    }

    /// What the WebSocket handshake service takes; an end of stream on the
    /// connection is the client leaving from now on.
    pub(crate) fn into_websocket(self) -> (http::request::Parts, Arc<ConnCtx>, BusyGuard) {
        self.conn.not_plain_http();
        (self.parts, self.conn, self.busy)
    }
}

/// Checks a request head before anything is queued for the app: field
/// counts and sizes (RFC 9110 §5, RFC 9112 §3), a trusted proxy's
/// forwarding fields, a stalled loop. See the module docs. Not `async`: the
/// request's one future stays one state machine.
// One caller: inlined, its large result is built in place (out of line
// it was copied: ~+400 instructions per request, callgrind).
#[inline(always)]
fn admit<B>(req: Request<B>, conn: Arc<ConnCtx>, mut busy: BusyGuard) -> Admission<B> {
    let shared = &*conn.shared;
    let cfg = &conn.shared.config;
    let received = (cfg.access_log || cfg.server_timing).then(Instant::now);
    busy.meter(req.method(), req.version());
    shared.count_request();
    let (mut parts, body) = req.into_parts();
    if matches!(parts.version, http::Version::HTTP_2 | http::Version::HTTP_3) {
        // HTTP/3 fields follow the HTTP/2 rules (RFC 9114 §4.3.1, §4.2.1).
        h2_fields(&mut parts);
        // hyper's HTTP/1.1 parser counts fields; on HTTP/2 and HTTP/3 it
        // is done here.
        let most = shared.config.limit_request_fields;
        if most > 0 && parts.headers.len() > most {
            return Admission::Answered(answer(
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
            tracing::debug!("rejected a request from {:?}: {}", conn.info.peer, r.reason);
            return Admission::Answered(answer(parts, &conn, received, r.status, r.reason, busy));
        }
    };
    if let Some(proxy) = &shared.config.proxy {
        // What a trusted proxy says about the client rides in the request's
        // extensions to the scope builder.
        match proxy.origin(&parts.headers, conn.info.peer.map(|p| p.ip())) {
            Ok(Some(origin)) => {
                parts.extensions.insert(origin);
            }
            Ok(None) => {}
            Err(reason) => {
                return Admission::Answered(answer(
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
        return Admission::Answered(refuse_stalled(parts, &conn, received, busy));
    }
    Admission::Admitted(Admitted {
        parts,
        body,
        conn,
        busy,
        received,
        seen,
    })
}

/// The coding this client accepts, if compression is on, whether the
/// request is `HEAD`, and whether it refuses identity; whether the coding
/// is applied depends on the response (see `compress`).
fn negotiate(
    config: &crate::config::Config,
    parts: &http::request::Parts,
) -> Option<(crate::config::Coding, bool, bool)> {
    config
        .compression
        .as_ref()
        .and_then(|c| compress::negotiate(c, &parts.headers))
        .map(|coding| {
            (
                coding,
                parts.method == http::Method::HEAD,
                compress::identity_refused(&parts.headers),
            )
        })
}

/// Whether the app may be called for a request: the loop must not be
/// stalled (it may have blocked while the body was read), and a slot under
/// `limit_concurrency` must be free (held by `busy` from now). `Err(true)`:
/// stalled; `Err(false)`: at the limit.
fn may_start(shared: &Worker, busy: &mut BusyGuard) -> Result<(), bool> {
    if shared.watchdog.is_stalled() {
        return Err(true);
    }
    busy.hold(shared.concurrency.acquire().map_err(|()| false)?);
    Ok(())
}

/// The `503` of a request over `limit_concurrency`, with `Retry-After`.
fn refuse_concurrency(
    parts: http::request::Parts,
    conn: &Arc<ConnCtx>,
    received: Option<Instant>,
    busy: BusyGuard,
) -> Response<ResponseBody> {
    conn.shared
        .metrics
        .refused(crate::metrics::Limit::Concurrency);
    let mut resp = answer(
        parts,
        conn,
        received,
        StatusCode::SERVICE_UNAVAILABLE,
        crate::worker::concurrency::REASON,
        busy,
    );
    crate::worker::watchdog::retry_after(resp.headers_mut());
    resp
}

/// Compresses the response as negotiated (`coding`: the coding, whether
/// the request is `HEAD`, whether identity is refused): a whole body at
/// once, a streamed or file body through the returned encoder.
fn compress_head(
    config: &crate::config::Config,
    coding: Option<(crate::config::Coding, bool, bool)>,
    head: &mut ResponseHead,
) -> Option<compress::Encoder> {
    let (Some(cfg), Some((coding, head_request, must))) = (&config.compression, coding) else {
        return None;
    };
    let mut coder = None;
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
    coder
}

/// Queues interim responses for the wire, encoded for this request's
/// protocol; returns where they end in the connection's interim bytes.
fn load_interim(conn: &ConnCtx, list: &[(StatusCode, http::HeaderMap)]) -> Option<u64> {
    match conn.h2_stream {
        Some(_) if conn.interim.is_off() => None,
        Some((stream, encode)) => conn.interim.load(encode(stream, list)),
        None => conn.interim.load(interim::encode_h1(list)),
    }
}

/// Ties `exch` to the app's context before its request is queued, with
/// the trailers verdict (`te`: the request has a `TE` field; `No`, the
/// exchange's default, needs no lookup and no lock).
#[inline]
fn attach(exch: &Exchange, conn: &ConnCtx, parts: &http::request::Parts, te: bool) {
    if te {
        let trailers = TrailersWanted::of(parts.version, &parts.headers);
        if trailers != TrailersWanted::No {
            exch.lock().trailers = trailers;
        }
    }
    exch.attach(conn.info.app());
}

/// The WebSocket handshake service, given by the driver (`proto`), so that
/// this protocol-neutral service never names the WebSocket side.
pub(crate) type WsHandshake = fn(
    http::request::Parts,
    Arc<ConnCtx>,
    BusyGuard,
) -> Pin<Box<dyn Future<Output = Response<ResponseBody>> + Send>>;

/// Serves one request: see the module docs. A WebSocket handshake goes to
/// `ws`. `B` is the driver's request body (hyper's `Incoming` on HTTP/1.1
/// and HTTP/2): each driver gets its own copy of this future.
pub(crate) async fn handle<B: RequestBody>(
    req: Request<B>,
    conn: Arc<ConnCtx>,
    ws: WsHandshake,
) -> Result<Response<ResponseBody>, Infallible> {
    let busy = BusyGuard::new(&conn);
    let shared = &*conn.shared;
    if shared.health.enabled() {
        if shared.health.matches(req.method(), req.uri().path()) {
            return Ok(health_response(shared, busy));
        }
        // Accepted during lifespan startup (for the health path): the
        // request waits for startup as it would in the backlog.
        if shared.health.is_starting() {
            shared.health.until_started().await;
        }
    }
    let a = match admit(req, conn, busy) {
        Admission::Answered(resp) => return Ok(resp),
        Admission::Admitted(a) => a,
    };
    if a.is_websocket() {
        let (parts, conn, busy) = a.into_websocket();
        return Ok(ws(parts, conn, busy).await);
    }
    let Admitted {
        parts,
        mut body,
        conn,
        mut busy,
        received,
        seen,
    } = a;
    let shared = &*conn.shared;
    let coding = negotiate(&shared.config, &parts);
    let bodyless = body.is_end_stream();
    // `Expect` only matters for a request with a body.
    let expect_continue = !bodyless && seen.expect && continue_wanted(&parts);

    let max_body = shared.config.max_body_size;
    if max_body > 0 && body.size_hint().lower() > max_body {
        let peer = conn.info.peer;
        tracing::debug!("rejected a request from {peer:?}: body too large");
        return Ok(answer(
            parts,
            &conn,
            received,
            StatusCode::PAYLOAD_TOO_LARGE,
            "request body too large",
            busy,
        ));
    }
    let (exch, mut incoming) = if bodyless {
        (Arc::new(Exchange::bodyless()), None)
    } else {
        match body.size_hint().exact() {
            Some(len) if !expect_continue && len <= shared.config.body_prefetch as u64 => {
                match read_small_body(&mut body, len as usize, &conn).await {
                    Ok(data) => (Arc::new(Exchange::with_complete_body(data, shared)), None),
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

    if let Err(stalled) = may_start(shared, &mut busy) {
        let refuse = if stalled {
            refuse_stalled
        } else {
            refuse_concurrency
        };
        return Ok(refuse(parts, &conn, received, busy));
    }
    let mut guard = GoneGuard {
        exch: &exch,
        shared,
        armed: true,
    };
    attach(&exch, &conn, &parts, seen.te);
    shared.queue.push(Event::Run(Box::new(HttpRequest {
        parts,
        exch: Arc::clone(&exch),
        conn: Arc::clone(&conn),
        received,
        rejected: None,
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
                    // turned them off since, see `proto::h2::io`).
                    if let Some(end) = load_interim(&conn, &list) {
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

    let stream = || StreamBody::new(exch, incoming, Arc::clone(&conn), expect_continue);
    Ok(finish(
        &conn,
        head,
        coding,
        stream,
        busy,
        (app_started, received),
    ))
}

/// The response hyper writes: compressed as negotiated, its body full, a
/// file, or streamed from the exchange (`stream`, called only then);
/// `times`: when the app was called and the head received (Server-Timing).
// One caller: inlined, its large result is built in place (out of line
// it was copied: ~+400 instructions per request, callgrind).
#[inline(always)]
fn finish<B: RequestBody>(
    conn: &ConnCtx,
    mut head: ResponseHead,
    coding: Option<(crate::config::Coding, bool, bool)>,
    stream: impl FnOnce() -> StreamBody<B>,
    mut busy: BusyGuard,
    times: (Option<Instant>, Option<Instant>),
) -> Response<ResponseBody> {
    let coder = compress_head(&conn.shared.config, coding, &mut head);
    busy.responded(head.status);
    let body = match head.body {
        BodyOut::Full(data) => ResponseBody::full(data, busy),
        BodyOut::File { file, len } => ResponseBody::file(file, len, busy),
        BodyOut::Stream => ResponseBody::stream(stream(), busy),
    };
    let body = match coder {
        Some(enc) => body.coded(enc),
        None => body,
    };
    let mut resp = Response::new(body);
    set_status(&mut resp, head.status);
    *resp.headers_mut() = head.headers;
    if let Some(alt) = &conn.info.listener.alt_svc {
        alt.add_to(resp.headers_mut());
    }
    if conn.shared.config.server_timing {
        server_timing(resp.headers_mut(), times.0, times.1);
    }
    resp
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

/// The health path's answer (see [`health`](crate::worker::health)).
fn health_response(shared: &Worker, busy: BusyGuard) -> Response<ResponseBody> {
    let (status, body) = shared.health.answer(shared.watchdog.is_stalled());
    let mut resp = Response::new(ResponseBody::full(Bytes::from_static(body), busy));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    resp
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
