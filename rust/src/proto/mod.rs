//! The wire-protocol drivers, one folder each: [`h1`] (HTTP/1.1 on hyper),
//! [`h2`] (HTTP/2 on hyper, with Skirr's own frame scanner), [`h3`]
//! (HTTP/3 on quinn, its own UDP accept loop), [`ws`] (the
//! WebSocket driver, over an HTTP/1.1 upgrade or an RFC 8441 stream). None
//! imports another: this module picks the protocol of a new connection
//! and hands a WebSocket the app accepted to [`ws`]. Each driver builds
//! the [`ConnCtx`] its requests carry and calls the protocol-neutral
//! service (`http::service`), which queues them for the ASGI side.
//!
//! HTTP/3 (`h3/`) sits beside them with its own accept loop on a UDP socket
//! (started by `server::run`), a `ConnCtx` per request stream, the same
//! `dispatch::handle` over a request body that implements
//! `http_body::Body` (any `http::pump::RequestBody`: it gets its own
//! monomorphised copy of the service).

pub(crate) mod dispatch;
pub(crate) mod h1;
pub(crate) mod h2;
pub(crate) mod h3;
pub(crate) mod ws;

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::task::TaskTracker;

use crate::asgi::conn::{ListenerInfo, TlsInfo};
use crate::asgi::websocket::shared::WsShared;
use crate::http::ctx::ConnCtx;
use crate::http::io::{ConnIo, Readiness};
use crate::worker::Worker;

/// hyper's connection builders, configured once per worker from the
/// configuration: the drivers' own, not the worker state's.
pub(crate) struct Builders {
    /// hyper's HTTP/1 connection builder.
    pub(crate) http1: hyper::server::conn::http1::Builder,
    /// hyper's HTTP/2 connection builder, when HTTP/2 is enabled.
    pub(crate) http2: Option<hyper::server::conn::http2::Builder<crate::proto::h2::StreamExec>>,
}

impl Builders {
    /// Builds both from `config`; HTTP/2 streams are tracked by `tracker`.
    pub(crate) fn new(config: &crate::config::Config, tracker: TaskTracker) -> Self {
        let mut h1 = hyper::server::conn::http1::Builder::new();
        h1.timer(hyper_util::rt::TokioTimer::new())
            // Skirr runs its own idle and head-read timers (see proto::h1).
            .header_read_timeout(None)
            // hyper's own `half_close` stops it from noticing a client
            // that leaves mid-request; Skirr keeps hyper's detection and
            // hides only an end of stream after a complete request
            // (`ConnIo::poll_read`), so a half-closed client still gets its
            // response (RFC 9112 §9.6).
            .keep_alive(true);
        if config.max_head_size > 0 {
            // hyper stops buffering an incomplete head at `max_buf_size`
            // (its floor is 8 KiB) and checks a complete one against
            // `max_header_size`: both answer 431.
            h1.max_header_size(config.max_head_size)
                .max_buf_size(config.max_head_size.max(8192));
        }
        if config.limit_request_fields != 100 {
            // 100 is hyper's default, kept on the stack; any other count
            // costs a heap buffer per request.
            let n = match config.limit_request_fields {
                0 => 32768,
                n => n,
            };
            h1.max_headers(n);
        }
        let h2 = config
            .http2
            .as_ref()
            .map(|h| crate::proto::h2::builder(h, config, tracker));
        Builders {
            http1: h1,
            http2: h2,
        }
    }
}

/// Whether a new connection speaks HTTP/2: ALPN chose `h2` on TLS; on
/// cleartext, with prior knowledge enabled, it opens with the preface.
/// With HTTP/1.1 disabled every connection is HTTP/2.
async fn wants_h2<I: AsyncRead + Unpin>(io: &mut ConnIo<I>, ctx: &ConnCtx) -> bool {
    let Some(h2) = &ctx.shared.config.http2 else {
        return false;
    };
    if !h2.http1 {
        return true;
    }
    if let Some(tls) = &ctx.info.tls {
        return tls.h2;
    }
    h2.prior_knowledge && h2::sniff_preface(io, ctx.shared.config.header_read_timeout).await
}

/// Serves one connection until it closes, times out, or the server orders
/// it to stop (see [`Connections::order_all`](crate::worker::connections::Connections::order_all)).
pub(crate) async fn serve<I>(
    io: I,
    shared: Arc<Worker>,
    listener: Arc<ListenerInfo>,
    builders: Arc<Builders>,
    peer: Option<SocketAddr>,
    permit: Option<OwnedSemaphorePermit>,
    tls: Option<Box<TlsInfo>>,
) where
    I: AsyncRead + AsyncWrite + Readiness + Unpin + Send + 'static,
{
    let member = shared.connections.join();
    let ctx = Arc::new(ConnCtx::new(
        Arc::clone(&shared),
        listener,
        peer,
        permit,
        tls,
    ));
    let mut io = ConnIo {
        inner: io,
        prefix: Bytes::new(),
        conn: Arc::clone(&ctx),
        scan: crate::http::headscan::HeadScan::new(shared.config.limits.field_size),
        line: Default::default(),
    };
    // A new connection starts parked: no hyper state at all.
    let why = match h1::wait_readable(&mut io, &ctx, &member).await {
        Err(reason) => reason,
        Ok(()) => match &builders.http2 {
            // The HTTP/2 sniff and serve futures are boxed: inline, they made
            // every connection's task 2.7 KiB where a parked HTTP/1.1 one
            // needs 0.8 (bench/NOTES.md, entry 43).
            Some(h2) if Box::pin(wants_h2(&mut io, &ctx)).await => {
                io.scan = None;
                let _open = shared.metrics.connection(crate::metrics::Proto::Http2);
                io.stop_line_scan();
                Box::pin(h2::serve(io, &ctx, &member, h2, ws_over_h2)).await
            }
            _ => match h1::serve(io, &ctx, &member, &builders.http1).await {
                h1::End::Closed(reason) => reason,
                h1::End::Upgraded(mut io, ws, _open) => {
                    io.scan = None;
                    io.stop_line_scan();
                    // Boxed: a parked connection's task then holds only a
                    // pointer where an active one holds the driver's state.
                    Box::pin(ws::driver::run(io, ws, &ctx, &member)).await;
                    return;
                }
            },
        },
    };
    tracing::debug!("connection from {:?} done: {why}", peer);
}

/// Runs the WebSocket driver on an RFC 8441 stream the app accepted (the
/// HTTP/2 driver's hook, so that it does not name the WebSocket driver).
fn ws_over_h2(io: h2::Upgraded, ws: Arc<WsShared>, stream: Arc<ConnCtx>) -> h2::WsRun {
    Box::pin(async move {
        let shared = Arc::clone(&stream.shared);
        let member = shared.connections.join();
        ws::driver::run(io, ws, &stream, &member).await;
    })
}
