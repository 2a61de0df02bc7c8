//! Skirr's benchmark load client.
//!
//! `loadgen http HOST:PORT PATH CONNECTIONS REQUESTS [POST_BYTES]` sends
//! `REQUESTS` requests in total over `CONNECTIONS` keep-alive connections
//! (one outstanding request per connection) and prints one JSON line:
//! requests, errors, non-2xx, seconds, req/s. Used where an exact number of
//! requests matters (instructions-per-request counts under callgrind), where
//! wrk's time-based runs do not fit.
//!
//! `loadgen ws URL CONNECTIONS SECONDS [SIZE]` opens `CONNECTIONS` WebSockets
//! to an echo endpoint; each sends a `SIZE`-byte text message (default 16),
//! waits for its echo, and repeats for `SECONDS`. Prints messages, errors,
//! seconds, msgs/s and p50/p99 round-trip latency. Python clients saturate
//! long before the servers do, hence a compiled client.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Stats {
    ok: AtomicU64,
    non2xx: AtomicU64,
    errors: AtomicU64,
}

/// Reads one response; returns its status.
async fn read_response(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<u16> {
    let mut filled = 0usize;
    loop {
        if filled == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        let n = s.read(&mut buf[filled..]).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        filled += n;
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        let head_len = match resp.parse(&buf[..filled]) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => continue,
            Err(e) => return Err(std::io::Error::other(e)),
        };
        let status = resp.code.unwrap_or(0);
        let len = resp
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("content-length"))
            .and_then(|h| {
                std::str::from_utf8(h.value)
                    .ok()?
                    .trim()
                    .parse::<usize>()
                    .ok()
            })
            .ok_or_else(|| std::io::Error::other("response without content-length"))?;
        let total = head_len + len;
        if buf.len() < total {
            buf.resize(total, 0);
        }
        while filled < total {
            let n = s.read(&mut buf[filled..total]).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            filled += n;
        }
        return Ok(status);
    }
}

async fn worker(addr: String, request: Arc<Vec<u8>>, todo: Arc<AtomicU64>, stats: Arc<Stats>) {
    let mut buf = vec![0u8; 16 * 1024];
    'conn: while todo.load(Ordering::Relaxed) > 0 {
        let mut s = match TcpStream::connect(&addr).await {
            Ok(s) => s,
            Err(_) => {
                stats.errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = s.set_nodelay(true);
        loop {
            if todo
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_err()
            {
                return;
            }
            let res = async {
                s.write_all(&request).await?;
                read_response(&mut s, &mut buf).await
            }
            .await;
            match res {
                Ok(status) if (200..300).contains(&status) => {
                    stats.ok.fetch_add(1, Ordering::Relaxed);
                }
                Ok(_) => {
                    stats.non2xx.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    stats.errors.fetch_add(1, Ordering::Relaxed);
                    continue 'conn;
                }
            }
        }
    }
}

async fn ws_worker(url: String, payload: String, until: Instant, stats: Arc<Stats>) -> Vec<u32> {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let mut rtts = Vec::new();
    let Ok((mut ws, _)) = tokio_tungstenite::connect_async(url.as_str()).await else {
        stats.errors.fetch_add(1, Ordering::Relaxed);
        return rtts;
    };
    while Instant::now() < until {
        let t0 = Instant::now();
        if ws.send(Message::text(payload.clone())).await.is_err() {
            stats.errors.fetch_add(1, Ordering::Relaxed);
            return rtts;
        }
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) if t.len() == payload.len() => break,
                Some(Ok(_)) => continue,
                _ => {
                    stats.errors.fetch_add(1, Ordering::Relaxed);
                    return rtts;
                }
            }
        }
        rtts.push(t0.elapsed().as_micros() as u32);
        stats.ok.fetch_add(1, Ordering::Relaxed);
    }
    let _ = ws.close(None).await;
    rtts
}

async fn ws_main(args: &[String]) {
    let url = args[2].clone();
    let conns: usize = args[3].parse().expect("CONNECTIONS must be an integer");
    let secs: f64 = args[4].parse().expect("SECONDS must be a number");
    let size: usize = args.get(5).map(|s| s.parse().expect("SIZE")).unwrap_or(16);
    let payload = "m".repeat(size);
    let stats = Arc::new(Stats {
        ok: AtomicU64::new(0),
        non2xx: AtomicU64::new(0),
        errors: AtomicU64::new(0),
    });
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(secs);
    let tasks: Vec<_> = (0..conns)
        .map(|_| {
            tokio::spawn(ws_worker(
                url.clone(),
                payload.clone(),
                until,
                Arc::clone(&stats),
            ))
        })
        .collect();
    let mut rtts = Vec::new();
    for t in tasks {
        if let Ok(v) = t.await {
            rtts.extend(v);
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    rtts.sort_unstable();
    let pct = |p: f64| -> f64 {
        if rtts.is_empty() {
            return 0.0;
        }
        let i = ((rtts.len() as f64 - 1.0) * p).round() as usize;
        rtts[i] as f64 / 1000.0
    };
    let ok = stats.ok.load(Ordering::Relaxed);
    println!(
        "{{\"messages\": {}, \"errors\": {}, \"seconds\": {:.3}, \"mps\": {:.1}, \"p50_ms\": {:.3}, \"p99_ms\": {:.3}}}",
        ok,
        stats.errors.load(Ordering::Relaxed),
        elapsed,
        ok as f64 / elapsed,
        pct(0.5),
        pct(0.99)
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() >= 5 && args[1] == "ws" {
        return ws_main(&args).await;
    }
    if args.len() < 6 || args[1] != "http" {
        eprintln!(
            "usage: loadgen http HOST:PORT PATH CONNECTIONS REQUESTS [POST_BYTES]\n       \
             loadgen ws URL CONNECTIONS SECONDS [SIZE]"
        );
        std::process::exit(2);
    }
    let addr = args[2].clone();
    let path = &args[3];
    let conns: usize = args[4].parse().expect("CONNECTIONS must be an integer");
    let total: u64 = args[5].parse().expect("REQUESTS must be an integer");
    let request = match args.get(6).map(|b| b.parse::<usize>().expect("POST_BYTES")) {
        Some(n) => {
            let mut r =
                format!("POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {n}\r\n\r\n")
                    .into_bytes();
            r.extend(std::iter::repeat_n(b'x', n));
            r
        }
        None => format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").into_bytes(),
    };
    let request = Arc::new(request);
    let todo = Arc::new(AtomicU64::new(total));
    let stats = Arc::new(Stats {
        ok: AtomicU64::new(0),
        non2xx: AtomicU64::new(0),
        errors: AtomicU64::new(0),
    });
    let start = Instant::now();
    let tasks: Vec<_> = (0..conns)
        .map(|_| {
            tokio::spawn(worker(
                addr.clone(),
                Arc::clone(&request),
                Arc::clone(&todo),
                Arc::clone(&stats),
            ))
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    let secs = start.elapsed().as_secs_f64();
    let ok = stats.ok.load(Ordering::Relaxed);
    println!(
        "{{\"requests\": {}, \"non2xx\": {}, \"errors\": {}, \"seconds\": {:.3}, \"rps\": {:.1}}}",
        ok,
        stats.non2xx.load(Ordering::Relaxed),
        stats.errors.load(Ordering::Relaxed),
        secs,
        ok as f64 / secs
    );
}
