//! The HTTP/3 driver (RFC 9114) on `h3` + `h3-quinn` + `quinn`.
//!
//! Each worker serves a UDP socket beside each TCP listener (same address;
//! the port of the listener or `http3_port`) with `SO_REUSEPORT`, so that
//! Gunicorn's workers share the port as they share the TCP one. Standalone
//! the worker binds it; under a Gunicorn master it is one of the master's,
//! and a BPF program steers each packet to the worker that owns its
//! connection ([`steer`], [`bpf`], [`cid`]). A quinn endpoint on it
//! accepts QUIC connections (TLS 1.3, ALPN `h3`, the worker's certificate);
//! each request stream gets its own [`ConnCtx`] and goes through
//! [`dispatch`](super::dispatch) like an HTTP/2 stream: its receiving half
//! is the request body ([`body::H3Body`]), the response is written on its
//! sending half ([`body::respond`]). The client's unidirectional streams
//! are typed first ([`guard`]): a push stream, and QPACK instructions a
//! server without a dynamic table cannot take, are connection errors; the
//! field sections of request streams are checked on their way to h3 for
//! the malformed ones h3 lets through ([`head`]). The client's streams
//! are read and written through Skirr's own quinn adapters ([`streams`]):
//! `h3-quinn`'s receiving stream cannot be stopped while a read is
//! pending, so only the server's own streams are `h3-quinn`'s.
//!
//! Limits: flow-control windows of [`STREAM_WINDOW`] and
//! [`CONNECTION_WINDOW`], `http2_max_concurrent_streams` bidirectional
//! streams per connection, `http2_max_header_list_size` as SETTINGS_MAX_FIELD_SECTION_SIZE,
//! `max_connections` (one count per worker with TCP; a QUIC connection over
//! it is refused). A connection with
//! no request for `keepalive_timeout` is closed (GOAWAY, then
//! CONNECTION_CLOSE H3_NO_ERROR); the QUIC idle timeout (at least 10 s,
//! with the server's PINGs at a third of it) drops a client that vanished.
//! Drain: GOAWAY, the open streams finish, a final GOAWAY (see [`drive`]),
//! then the connection closes.
//! A request stream whose HEADERS frame does not complete within
//! `header_read_timeout` (`drain_grace` once the connection drains) is
//! reset (H3_REQUEST_REJECTED), that stream only.
//! Per request, as on HTTP/2: `body_read_timeout` (408) and
//! `response_start_timeout` (503) for that stream only ([`deadline`]);
//! `send_timeout`: a response piece QUIC flow control holds back that long
//! resets the stream (H3_REQUEST_CANCELLED) and the app sees the disconnect.
//! Address validation: over [`RETRY_ABOVE`] handshakes in progress, an
//! unvalidated client gets a Retry. A frame h3 would buffer whole over
//! [`frame_limit::limit`] closes the connection ([`frame_limit`]).
//! Interim responses (`103 Early Hints`, `100 Continue`) are HEADERS
//! frames before the final one ([`interim`]). Not yet: WebSockets (RFC
//! 9220).

pub(crate) mod body;
pub(crate) mod bpf;
pub(crate) mod cid;
pub(crate) mod deadline;
pub(crate) mod frame_limit;
pub(crate) mod guard;
pub(crate) mod head;
pub(crate) mod interim;
pub(crate) mod steer;
pub(crate) mod streams;

use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use rustls::pki_types::CertificateDer;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::asgi::conn::{AltSvc, ListenerInfo, LocalAddr, TlsInfo};
use crate::asgi::context::AppContext;
use crate::http::activity::Timeouts;
use crate::http::ctx::{ConnCtx, DRAIN_IDLE};
use crate::worker::clock::clock_ms;
use crate::worker::connections::{Member, Order};
use crate::worker::Worker;

use self::body::{BodyFlags, H3Body, SendHalf};

/// What the composition root (`server`) hands the driver: the QUIC TLS
/// configuration and how to read a connection's TLS facts.
pub(crate) struct Setup {
    /// rustls for QUIC: TLS 1.3, ALPN `h3`.
    pub(crate) crypto: Arc<quinn::crypto::rustls::QuicServerConfig>,
    /// The `tls` extension's facts from the client's certificate chain.
    pub(crate) tls_facts: fn(Option<&[CertificateDer<'static>]>) -> TlsInfo,
}

/// Handshakes in progress in a worker (accepted, not yet established or
/// failed) from which a new connection whose client address is not
/// validated is answered with a Retry (RFC 9000 §8.1.2) instead of being
/// accepted: the Retry is stateless, so a flood of Initials from spoofed
/// addresses holds at most this many handshakes (and `max_connections`
/// slots), and a real client pays one round trip more only under load.
/// The client's next Initial is addressed to the Retry's connection ID,
/// one of ours, so the steering sends it back to this worker, whose key
/// validates the token.
pub(crate) const RETRY_ABOVE: usize = 64;

/// The shortest QUIC idle timeout: a connection whose client vanished is
/// dropped after `max(keepalive_timeout, this)`.
const MIN_QUIC_IDLE: Duration = Duration::from_secs(10);

type H3Conn = ::h3::server::Connection<guard::Guarded, Bytes>;
type Resolver = ::h3::server::RequestResolver<guard::Guarded, Bytes>;

/// Binds the UDP socket for the TCP listener at `tcp` (same address; port
/// `config.http3.port` if set) and starts a quinn endpoint on it. Call
/// inside the worker's runtime.
///
/// Errors: the socket's (`bind` in use without `SO_REUSEPORT` on the other
/// side, permissions) or quinn's configuration, naming the address.
pub(crate) fn bind(
    tcp: SocketAddr,
    setup: &Setup,
    config: &crate::config::Config,
) -> io::Result<quinn::Endpoint> {
    let Some(h3) = &config.http3 else {
        return Err(io::Error::other("HTTP/3 is off"));
    };
    let addr = SocketAddr::new(tcp.ip(), h3.port.unwrap_or(tcp.port()));
    let socket = match steer::socket(addr, config)? {
        Some(s) => s,
        None => udp_socket(addr).map_err(|e| {
            io::Error::new(e.kind(), format!("HTTP/3: cannot bind UDP {addr}: {e}"))
        })?,
    };
    let mut server = quinn::ServerConfig::with_crypto(Arc::clone(&setup.crypto) as _);
    server.transport_config(Arc::new(transport(config, h3)));
    let mut endpoint = quinn::EndpointConfig::default();
    let slot = steer::slot();
    endpoint.cid_generator(move || Box::new(cid::SlotCids::new(slot)));
    quinn::Endpoint::new(
        endpoint,
        Some(server),
        socket,
        Arc::new(quinn::TokioRuntime),
    )
}

/// Bytes a client may send on one stream ahead of what the server has
/// read (QUIC flow control, RFC 9000 §4): about quinn's default (1.25 MB,
/// enough for 10 MB/s per stream at 100 ms round trip).
const STREAM_WINDOW: u32 = 1 << 20;

/// The same for all the streams of a connection together. quinn's default
/// is unbounded, so a client could park a stream window of body on each
/// of `http2_max_concurrent_streams` streams whose app does not read
/// (100 MB per connection); this bounds it, beside what the body pumps
/// read ahead (`body_buffer` per stream).
const CONNECTION_WINDOW: u32 = 4 << 20;

/// QUIC transport limits from the configuration (see the module docs).
fn transport(config: &crate::config::Config, h3: &crate::config::Http3) -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    t.max_concurrent_bidi_streams(quinn::VarInt::from_u32(h3.max_concurrent_streams));
    t.stream_receive_window(quinn::VarInt::from_u32(STREAM_WINDOW));
    t.receive_window(quinn::VarInt::from_u32(CONNECTION_WINDOW));
    let idle = config.keepalive_timeout.max(MIN_QUIC_IDLE);
    t.max_idle_timeout(quinn::IdleTimeout::try_from(idle).ok());
    t.keep_alive_interval(Some(idle / 3));
    t
}

/// A non-blocking UDP socket at `addr` with `SO_REUSEPORT` (and
/// `SO_REUSEADDR`), so that every worker of a Gunicorn master binds its own.
fn udp_socket(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    use nix::sys::socket::{
        self, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn, SockaddrIn6,
    };
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let fd = socket::socket(
        family,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    socket::setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    socket::setsockopt(&fd, sockopt::ReusePort, &true)?;
    match addr {
        SocketAddr::V4(a) => socket::bind(fd.as_raw_fd(), &SockaddrIn::from(a))?,
        SocketAddr::V6(a) => socket::bind(fd.as_raw_fd(), &SockaddrIn6::from(a))?,
    }
    Ok(std::net::UdpSocket::from(fd))
}

/// Accepts QUIC connections on an endpoint until `stop` is cancelled; each
/// is served on a task of `tracker`, holding a slot of `limit` (none free:
/// refused). `alt` (the TCP listener's `Alt-Svc`) is on while this runs.
pub(crate) async fn serve(
    (endpoint, alt): (quinn::Endpoint, Arc<AltSvc>),
    shared: Arc<Worker>,
    app: Arc<AppContext>,
    setup: Arc<Setup>,
    tracker: TaskTracker,
    limit: Option<Arc<Semaphore>>,
    stop: CancellationToken,
) {
    let info = Arc::new(ListenerInfo {
        local: LocalAddr::Tcp(endpoint.local_addr().unwrap_or(([0, 0, 0, 0], 0).into())),
        app,
        py_server: OnceLock::new(),
        alt_svc: None,
    });
    alt.set(true);
    steer::serving(true);
    let handshaking = Arc::new(AtomicUsize::new(0));
    loop {
        let incoming = tokio::select! {
            i = endpoint.accept() => match i {
                Some(i) => i,
                None => break,
            },
            _ = stop.cancelled() => break,
        };
        if !incoming.remote_address_validated()
            && handshaking.load(Ordering::Relaxed) >= RETRY_ABOVE
        {
            // Not validated implies `may_retry`; ignore is the fallback.
            if let Err(e) = incoming.retry() {
                e.into_incoming().ignore();
            }
            continue;
        }
        let permit = match &limit {
            Some(sem) => match Arc::clone(sem).try_acquire_owned() {
                Ok(p) => Some(p),
                Err(_) => {
                    incoming.refuse();
                    continue;
                }
            },
            None => None,
        };
        let (shared, info, setup) = (Arc::clone(&shared), Arc::clone(&info), Arc::clone(&setup));
        tracker.spawn(connection(
            (incoming, Handshaking::new(&handshaking)),
            shared,
            info,
            setup,
            permit,
            tracker.clone(),
        ));
    }
    alt.set(false);
    steer::serving(false);
    // Open connections drain (the server orders them). A new one the
    // kernel still sends to this socket is dropped while a successor may
    // take it (under a master: its client's retransmitted Initial reaches
    // the worker that serves by then, see `steer::hold_new`), else refused
    // at once (CONNECTION_REFUSED), so that its client tries again or falls
    // back to TCP instead of waiting out a handshake timeout; this task
    // ends with the runtime.
    let since = std::time::Instant::now();
    tokio::spawn(async move {
        while let Some(incoming) = endpoint.accept().await {
            if steer::hold_new(since.elapsed()) {
                incoming.ignore();
            } else {
                incoming.refuse();
            }
        }
    });
}

/// Serves one QUIC connection: handshake (bounded by
/// `tls_handshake_timeout`), then request streams until it closes.
async fn connection(
    (incoming, handshaking): (quinn::Incoming, Handshaking),
    shared: Arc<Worker>,
    info: Arc<ListenerInfo>,
    setup: Arc<Setup>,
    permit: Option<OwnedSemaphorePermit>,
    tracker: TaskTracker,
) {
    let member = shared.connections.join();
    let peer = incoming.remote_address();
    let limit = shared.config.tls_handshake_timeout;
    let handshake = async {
        if limit.is_zero() {
            incoming.await.map_err(|e| e.to_string())
        } else {
            match tokio::time::timeout(limit, incoming).await {
                Ok(r) => r.map_err(|e| e.to_string()),
                Err(_) => Err(format!("no handshake within {limit:?}")),
            }
        }
    };
    let done = handshake.await;
    drop(handshaking);
    let qconn = match done {
        Ok(c) => c,
        Err(why) => {
            tracing::debug!("QUIC handshake with {peer}: {why}");
            return;
        }
    };
    let chain = qconn
        .peer_identity()
        .and_then(|id| id.downcast::<Vec<CertificateDer<'static>>>().ok());
    let tls = (setup.tls_facts)(chain.as_deref().map(Vec::as_slice));
    let ctx = Arc::new(ConnCtx::new(
        Arc::clone(&shared),
        info,
        Some(peer),
        permit,
        Some(Box::new(tls)),
    ));
    let field_section = shared
        .config
        .http3
        .as_ref()
        .map_or(65536, |h| h.max_field_section_size);
    let limited = frame_limit::Conn::new(qconn.clone(), frame_limit::limit(field_section));
    let watched = guard::Guarded::new(limited, qconn.clone());
    let built = ::h3::server::builder()
        .max_field_section_size(field_section)
        .build::<_, Bytes>(watched)
        .await;
    let mut h3c: H3Conn = match built {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!("HTTP/3 connection from {peer}: {e}");
            return;
        }
    };
    let _open = shared.metrics.connection(crate::metrics::Proto::Http3);
    let why = drive(&mut h3c, &qconn, &ctx, &member, &tracker).await;
    tracing::debug!("HTTP/3 connection from {peer} done: {why}");
}

/// One handshake in progress, counted in the worker's total until dropped.
struct Handshaking(Arc<AtomicUsize>);

impl Handshaking {
    fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Handshaking(Arc::clone(count))
    }
}

impl Drop for Handshaking {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The request streams open on a connection.
#[derive(Default)]
struct Streams {
    open: AtomicUsize,
    /// When the last one closed ([`clock_ms`]).
    since_ms: AtomicU64,
    /// Woken when one closes.
    closed: Notify,
    /// Cancelled when the connection starts draining: a request head not
    /// complete by then gets `drain_grace`, not `header_read_timeout`.
    draining: CancellationToken,
}

/// One open request stream; closes it on drop.
struct StreamGuard(Arc<Streams>);

impl StreamGuard {
    fn new(streams: &Arc<Streams>) -> Self {
        streams.open.fetch_add(1, Ordering::Relaxed);
        StreamGuard(Arc::clone(streams))
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.since_ms.store(clock_ms(), Ordering::Relaxed);
        self.0.open.fetch_sub(1, Ordering::Relaxed);
        self.0.closed.notify_one();
    }
}

/// Resolves once the server's order for this connection is past `than`.
async fn order_past(member: &Member<'_>, than: Order) -> Order {
    let mut registered = false;
    poll_fn(|cx| {
        if !registered {
            member.register(cx.waker());
            registered = true;
        }
        match member.order() {
            o if o as u8 > than as u8 => Poll::Ready(o),
            _ => Poll::Pending,
        }
    })
    .await
}

/// Closes the connection after its final GOAWAY ([`final_goaway`]): at
/// once when the client has closed it, else after [`DRAIN_IDLE`], so the
/// GOAWAY and the last responses' packets are acknowledged before
/// CONNECTION_CLOSE discards what is unsent.
async fn close_after_goaway(h3c: &mut H3Conn, qconn: &quinn::Connection) {
    let _ = tokio::time::timeout(DRAIN_IDLE, h3c.shutdown(1)).await;
    let _ = tokio::time::timeout(DRAIN_IDLE, qconn.closed()).await;
    qconn.close(quinn::VarInt::from_u32(0x100), b"");
}

/// Sends the GOAWAY that precedes the close (RFC 9114 §5.2, the second
/// of the two HTTP/2 describes in RFC 9113 §6.8): it names the first
/// request stream not accepted, one past `seen` (the last h3 handed
/// over), so the client knows that every request it sent from there on
/// was not processed and may be retried, and that every one below it was
/// answered. h3's `shutdown(n)` names the stream `n` past its last, and
/// sends nothing unless that is below the id already sent (§5.2: it must
/// not grow). Returns the id in force (`sent` or the new one, the lower).
async fn final_goaway(h3c: &mut H3Conn, seen: Option<u64>, sent: Option<u64>) -> u64 {
    let _ = tokio::time::timeout(DRAIN_IDLE, h3c.shutdown(1)).await;
    let next = seen.map_or(0, |s| s + 4);
    sent.map_or(next, |g| g.min(next))
}

/// Accepts request streams until the connection ends; see the module docs
/// for idle and drain. Returns why it ended.
///
/// A drain sends GOAWAY allowing every request the client may have in
/// flight: requests are still accepted for [`DRAIN_IDLE`] (or until none
/// has been open that long), so that they are served rather than lost.
/// Then a final GOAWAY names the first stream not accepted; streams from
/// it on are rejected, and the connection closes once none has been open
/// for [`DRAIN_IDLE`] or when the client closes it: a request the client
/// sent as the connection went idle is rejected (the client may retry
/// it), not lost in the close.
async fn drive(
    h3c: &mut H3Conn,
    qconn: &quinn::Connection,
    ctx: &Arc<ConnCtx>,
    member: &Member<'_>,
    tracker: &TaskTracker,
) -> &'static str {
    let streams = Arc::new(Streams::default());
    streams.since_ms.store(clock_ms(), Ordering::Relaxed);
    let keepalive = ctx.shared.config.keepalive_timeout;
    let mut draining = false;
    let mut accepting = true;
    // The final GOAWAY is out: the connection closes when next idle. It
    // goes out when idle, or at this time after a drain's first GOAWAY.
    let mut closing = false;
    let mut final_at: Option<tokio::time::Instant> = None;
    // The drain's first GOAWAY waits for a first request.
    let mut first_goaway = false;
    // The last request stream accepted, the last h3 handed over (rejected
    // ones too), and the id our GOAWAY named.
    let (mut last, mut seen, mut goaway): (Option<u64>, Option<u64>, Option<u64>) =
        (None, None, None);
    loop {
        let open = streams.open.load(Ordering::Relaxed);
        if (draining || closing) && open == 0 && !accepting {
            close_after_goaway(h3c, qconn).await;
            return "drained";
        }
        let idle_left = (open == 0).then(|| {
            let since = streams.since_ms.load(Ordering::Relaxed);
            let idle = if draining || closing {
                DRAIN_IDLE
            } else {
                keepalive
            };
            let due = since + idle.as_millis() as u64;
            Duration::from_millis(due.saturating_sub(clock_ms()))
        });
        tokio::select! {
            r = h3c.accept(), if accepting => match r {
                Ok(Some(resolver)) => {
                    let id = resolver.frame_stream.id().into_inner();
                    seen = Some(id);
                    if goaway.is_some_and(|g| id >= g) {
                        reject(resolver);
                        continue;
                    }
                    last = Some(id);
                    let guard = StreamGuard::new(&streams);
                    // Boxed: the request future is large (the app call,
                    // body and response states), and spawn moves it twice
                    // (into spawn, then into the task cell); a box is 8 bytes.
                    let fut = Box::pin(request(resolver, Arc::clone(ctx), qconn.clone(), guard));
                    tracker.spawn(fut);
                    if std::mem::take(&mut first_goaway) && !closing {
                        let _ = h3c.shutdown(GOAWAY_ALLOWS_ALL).await;
                    }
                }
                // After our GOAWAY: no more requests; the open ones finish.
                Ok(None) if draining || closing => accepting = false,
                Ok(None) => return "closed by the client",
                Err(e) if e.is_h3_no_error() => return "closed",
                Err(e) => {
                    tracing::debug!("HTTP/3 connection: {e}");
                    return "error";
                }
            },
            o = order_past(member, if draining { Order::Drain } else { Order::Serve }) => {
                if o == Order::Drain {
                    // GOAWAY: requests already sent finish, and those in
                    // flight (see `GOAWAY_ALLOWS_ALL`) until the final one.
                    draining = true;
                    streams.draining.cancel();
                    streams.since_ms.store(clock_ms(), Ordering::Relaxed);
                    final_at = Some(tokio::time::Instant::now() + DRAIN_IDLE);
                    // With no request accepted yet, h3 can only name
                    // stream 0, rejecting the client's first request: the
                    // GOAWAY waits for one (or the final GOAWAY).
                    first_goaway = last.is_none();
                    if !first_goaway {
                        let _ = h3c.shutdown(GOAWAY_ALLOWS_ALL).await;
                    }
                } else {
                    qconn.close(quinn::VarInt::from_u32(0x100), b"server stop");
                    return "server stop";
                }
            }
            _ = streams.closed.notified(), if open > 0 => {}
            // A client still opening streams a second after the GOAWAY.
            _ = sleep_until(final_at), if final_at.is_some() && !closing => {
                goaway = Some(final_goaway(h3c, seen, goaway).await);
                closing = true;
                streams.since_ms.store(clock_ms(), Ordering::Relaxed);
            }
            _ = idle_sleep(idle_left), if idle_left.is_some() => {
                let why = if draining { "drained" } else { "keep-alive idle timeout" };
                if closing {
                    // The final GOAWAY went out a while ago.
                    qconn.close(quinn::VarInt::from_u32(0x100), b"");
                    return why;
                }
                // Every response was sent a while ago; a request still
                // coming is at or past the final GOAWAY: rejected.
                goaway = Some(final_goaway(h3c, seen, goaway).await);
                closing = true;
                streams.since_ms.store(clock_ms(), Ordering::Relaxed);
            }
        }
    }
}

/// Sleeps `d`, or forever if `None`. `select!` makes every branch's
/// future on each turn, enabled or not: this one makes its timer only when
/// polled, so a turn with streams open (no idle deadline) makes none.
async fn idle_sleep(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `at`, or forever if `None`; like [`idle_sleep`], its timer
/// is made only when polled.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// h3 0.0.8's `shutdown(n)` names, in its GOAWAY, the stream `n` past the
/// last one accepted (stream 0 if none was), capped at the largest stream
/// ID (2^62-4). The drain's first GOAWAY asks for the cap: every request
/// the client sent before it read the GOAWAY is served, however many it
/// multiplexes (RFC 9113 §6.8's first step; with the stream after the last
/// one accepted, a client with several requests in flight had all but one
/// rejected). The final GOAWAY ([`final_goaway`]) follows.
const GOAWAY_ALLOWS_ALL: usize = usize::MAX;

/// Refuses a request stream at or above our GOAWAY's id (RFC 9114 §5.2,
/// §4.1.1): H3_REQUEST_REJECTED both ways, the app is not called, and the
/// client may retry the request on another connection.
fn reject(mut resolver: Resolver) {
    use ::h3::quic::{RecvStream as _, SendStream as _};
    let code = ::h3::error::Code::H3_REQUEST_REJECTED.value();
    resolver.frame_stream.stream.stop_sending(code);
    resolver.frame_stream.reset(code);
}

/// Serves one request stream: its head, the shared service, the response.
/// The connection closing drops the service's future: the app is told
/// `http.disconnect`.
async fn request(
    resolver: Resolver,
    conn: Arc<ConnCtx>,
    qconn: quinn::Connection,
    guard: StreamGuard,
) {
    let config = &conn.shared.config;
    let limits = (config.header_read_timeout, config.drain_grace);
    let (req, stream) = match deadline::read_head(resolver, limits, &guard.0.draining).await {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!("HTTP/3 request from {:?} refused: {e}", conn.info.peer);
            return;
        }
    };
    // Malformed (RFC 9114 §4.1.2): a stream error, the app is not called.
    let declared = match crate::http::fields::check_request(req.headers()) {
        Ok(n) => n,
        Err(why) => {
            tracing::debug!("HTTP/3 request from {:?} malformed: {why}", conn.info.peer);
            let mut stream = stream;
            stream.stop_stream(::h3::error::Code::H3_MESSAGE_ERROR);
            stream.stop_sending(::h3::error::Code::H3_MESSAGE_ERROR);
            return;
        }
    };
    let (mut send, recv): (SendHalf, _) = stream.split();
    let ctx = Arc::new(conn.for_request());
    ctx.activity.start_request();
    let flags = Arc::new(BodyFlags::default());
    let expect = crate::http::service::expects_continue(req.headers());
    let continue_to = expect.then(|| Arc::clone(&ctx.interim));
    let mut body = H3Body::new(recv, declared, (Arc::clone(&flags), continue_to));
    body.prime().await;
    let req = req.map(|()| body);
    let t = Timeouts::new(&ctx.shared.config);
    let send_timeout = (t.send > 0).then(|| Duration::from_millis(t.send));
    // Each future is pinned once, here, and passed down by reference: the
    // wrappers below pin what they get, so a future passed by value would
    // take two slots in this task's state (27 KiB before, copied into the
    // task's box on every request).
    // In a block: the app's futures end before the response is written,
    // so their bytes and `respond`'s share one place in the task's state.
    // The service's future (3.2 KB) in a box of its own: with it inline
    // this task's state was 7.3 KB, past jemalloc's 4 KiB fast-path limit
    // (both boxes are now at most 4 KiB: no slow-path malloc or free per
    // request; bench/NOTES.md, entry 91).
    let resp = {
        let mut handle = Box::pin(super::dispatch::handle(req, Arc::clone(&ctx)));
        let handle = handle.as_mut();
        let service = pin!(deadline::watched(handle, &ctx, &t));
        // Interim responses go out while the service runs.
        tokio::select! {
            r = interim::serve(service, &ctx.interim, &mut send, send_timeout) => match r {
                Ok(Ok(r)) => r,
                Ok(Err(never)) => match never {},
                Err(why) => {
                    tracing::debug!("HTTP/3 response to {:?} not completed: {why}", ctx.info.peer);
                    return;
                }
            },
            _ = qconn.closed() => return,
            // The service is dropped: the app sees `http.disconnect`.
            _ = flags.client_reset() => return cancelled(&mut send, &ctx),
        }
    };
    let written = {
        let written = pin!(body::respond(
            &mut send,
            resp,
            send_timeout,
            &flags.malformed
        ));
        tokio::select! {
            r = deadline::watched(written, &ctx, &t) => Some(r),
            // Mid-response, with the body still read: the response goes too.
            _ = flags.client_reset() => None,
        }
    };
    match written {
        Some(Ok(())) => {}
        Some(Err(e)) => {
            tracing::debug!("HTTP/3 response to {:?} not completed: {e}", ctx.info.peer);
        }
        None => cancelled(&mut send, &ctx),
    }
}

/// The client reset its sending half mid-body (RESET_STREAM): as on
/// HTTP/2's RST_STREAM, no answer of the server's own and no access-log
/// line; the stream's sending half is reset (H3_REQUEST_CANCELLED) rather
/// than left for quinn to end with a FIN, which would read as an empty
/// response.
fn cancelled(send: &mut SendHalf, ctx: &ConnCtx) {
    tracing::debug!(
        "HTTP/3 request from {:?}: body reset by the client",
        ctx.info.peer
    );
    send.stop_stream(::h3::error::Code::H3_REQUEST_CANCELLED);
}
