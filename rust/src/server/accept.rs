//! What happens on a TCP connection before HTTP: the PROXY protocol header
//! from a trusted load balancer (bounded by the header read timeout), then
//! the TLS handshake (bounded by `tls_handshake_timeout`, see
//! [`tls::handshake`]), so a silent client cannot hold a slot.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

use crate::asgi::conn::ListenerInfo;
use crate::proto::{serve, Builders};
use crate::server::tls;
use crate::wire::proxy_protocol::{self, Parsed, MAX_HEADER};
use crate::worker::Worker;

/// Reads a PROXY protocol header without reading past it (the bytes after
/// it belong to TLS or HTTP): peek until the header is complete, then
/// consume exactly its length. The client's address, if the header names
/// one.
async fn read_proxy_header(
    tcp: &mut TcpStream,
    versions: proxy_protocol::Versions,
) -> Result<Option<SocketAddr>, &'static str> {
    let mut buf = vec![0u8; MAX_HEADER];
    let mut seen = 0;
    loop {
        let n = tcp.peek(&mut buf).await.map_err(|_| "read error")?;
        if n == 0 {
            return Err("closed before the PROXY protocol header");
        }
        match proxy_protocol::parse(&buf[..n], versions) {
            Parsed::Header { len, source } => {
                tcp.read_exact(&mut buf[..len])
                    .await
                    .map_err(|_| "read error")?;
                return Ok(source);
            }
            Parsed::Invalid(why) => return Err(why),
            Parsed::Incomplete if n == seen => {
                // `peek` does not wait for more than it already returned:
                // the rest of a split header is polled for.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Parsed::Incomplete => seen = n,
        }
    }
}

/// Serves an accepted TCP connection: PROXY header and TLS handshake as
/// configured, then HTTP ([`serve`]).
pub(crate) async fn serve_tcp(
    mut tcp: TcpStream,
    shared: Arc<Worker>,
    listener: Arc<ListenerInfo>,
    builders: Arc<Builders>,
    mut peer: SocketAddr,
    permit: Option<OwnedSemaphorePermit>,
) {
    let limit = shared.config.header_read_timeout;
    if let Some(pp) = &shared.config.proxy_protocol {
        if pp.allows(peer.ip()) {
            match tokio::time::timeout(limit, read_proxy_header(&mut tcp, pp.versions)).await {
                Ok(Ok(Some(source))) => peer = source,
                Ok(Ok(None)) => {}
                Ok(Err(why)) => {
                    tracing::debug!("connection from {peer}: {why}");
                    return;
                }
                Err(_) => {
                    tracing::debug!(
                        "connection from {peer}: no PROXY protocol header in {limit:?}"
                    );
                    return;
                }
            }
        }
    }
    let Some(acceptor) = shared.tls.clone() else {
        serve(tcp, shared, listener, builders, Some(peer), permit, None).await;
        return;
    };
    let Some(stream) = tls::handshake(&acceptor, tcp, &shared, peer).await else {
        return;
    };
    let info = tls::info(stream.get_ref().1);
    serve(
        stream,
        shared,
        listener,
        builders,
        Some(peer),
        permit,
        Some(Box::new(info)),
    )
    .await;
}
