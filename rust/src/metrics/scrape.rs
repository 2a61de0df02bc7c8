//! The exposition: every worker accepts scrapes on the listener the master
//! bound, and answers with the whole table.

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::recorder::Recorder;

/// Scrape connections served at once by one worker; more wait in the
/// listener's backlog (Prometheus sends one per scrape interval).
const MAX_SCRAPES: usize = 16;
/// Longest request head the exposition reads.
const MAX_SCRAPE_HEAD: usize = 8192;
/// A scraper must send its request head within this.
const SCRAPE_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Takes a duplicate of the inherited exposition listener `fd` (bound and
/// listening in the master) for this runtime.
///
/// Errors: `dup(2)` failures, or a descriptor that is not a TCP socket.
pub(crate) fn listener(fd: RawFd) -> io::Result<tokio::net::TcpListener> {
    let dup = nix::unistd::dup(
        // SAFETY: `fd` stays open in this process (the master's socket,
        // inherited); we only duplicate it.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
    )?;
    let l = std::net::TcpListener::from(dup);
    l.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(l)
}

/// Accepts scrapes on `listener` until the runtime ends; each connection
/// gets one response (`Connection: close`), rendered from the whole table.
pub(crate) async fn serve(listener: tokio::net::TcpListener, rec: Recorder) {
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_SCRAPES));
    loop {
        let Ok(permit) = std::sync::Arc::clone(&slots).acquire_owned().await else {
            return; // never closed
        };
        match listener.accept().await {
            Ok((sock, _)) => {
                tokio::spawn(async move {
                    answer(sock, rec).await;
                    drop(permit);
                });
            }
            Err(e) => {
                // Out of descriptors (or a transient error): try again
                // shortly rather than spin.
                tracing::debug!("metrics listener: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Reads a request head and answers it: `GET /metrics` (or `HEAD`) gets
/// the exposition, other paths 404, other methods 405.
async fn answer(mut sock: tokio::net::TcpStream, rec: Recorder) {
    let mut buf = Vec::with_capacity(1024);
    let head = tokio::time::timeout(SCRAPE_READ_TIMEOUT, async {
        let mut chunk = [0u8; 1024];
        loop {
            let n = sock.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&chunk[..n]);
            if buf.windows(4).any(|w| w == b"\r\n\r\n") {
                return Some(());
            }
            if buf.len() > MAX_SCRAPE_HEAD {
                return None;
            }
        }
    })
    .await;
    if !matches!(head, Ok(Some(()))) {
        return;
    }
    let line = buf.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let method = parts.next().unwrap_or_default();
    let target = parts.next().unwrap_or_default();
    let path = target.split(|&b| b == b'?').next().unwrap_or_default();
    let (status, ctype, body) = match (method, path) {
        (b"GET" | b"HEAD", b"/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            rec.render().unwrap_or_default(),
        ),
        (b"GET" | b"HEAD", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "metrics are at /metrics\n".to_owned(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "GET /metrics\n".to_owned(),
        ),
    };
    let mut resp = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if method != b"HEAD" {
        resp.extend_from_slice(body.as_bytes());
    }
    let _ = tokio::time::timeout(SCRAPE_READ_TIMEOUT, async {
        if sock.write_all(&resp).await.is_ok() {
            let _ = sock.shutdown().await;
        }
    })
    .await;
}
