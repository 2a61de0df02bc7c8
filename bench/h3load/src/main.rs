//! Skirr's HTTP/3 benchmark load client (h2load here has no HTTP/3).
//!
//! ```text
//! h3load HOST:PORT PATH [-c CONNECTIONS] [-m STREAMS] [-d SECONDS | -n REQUESTS]
//!        [--rate REQ_PER_S] [--post BYTES] [--ca FILE] [--server-name NAME] [--hold SECONDS]
//! ```
//!
//! Opens `CONNECTIONS` QUIC connections (default 1), each from its own UDP
//! socket (so that a server's SO_REUSEPORT group spreads them as it does
//! TCP connections), and keeps `STREAMS` requests outstanding on each
//! (default 1): GET, or POST with a body of `BYTES` bytes of `x`. It runs
//! for `SECONDS` (default 5), or until `REQUESTS` requests in total were
//! sent. `--rate`: a fixed offered load of that many requests per second in
//! total (a request waits for its slot, then for a free stream); 0, the
//! default, is a closed loop. Certificates: verified against the CA
//! certificates of `--ca` only (webpki takes no self-signed CA:TRUE
//! certificate as a server's own), else not at all (bench servers use
//! throwaway self-signed ones); the TLS server name defaults to `localhost`.
//!
//! Prints one JSON line, as `loadgen` does: requests (2xx responses),
//! non2xx, errors (failed streams and connection attempts), seconds, rps,
//! p50_ms/p99_ms (send of the request head to the end of the response
//! body), connections (handshakes completed), bytes (response body bytes)
//! and first_error. `--hold`: after the load, keeps the connections open
//! (PING every second) for that long, then prints a second line
//! `{"held": N}` — N connections the server had not closed — for
//! idle-connection memory figures.

mod tls;

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};

type SendRequest = h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Who may send the next request, and when.
struct Plan {
    start: Instant,
    deadline: Option<Instant>,
    /// Requests left to send (`u64::MAX` in a timed run).
    todo: AtomicU64,
    /// Requests per second in total; 0 = closed loop.
    rate: f64,
    /// Slots handed out so far (fixed rate only).
    slots: AtomicU64,
}

impl Plan {
    fn over(&self) -> bool {
        self.todo.load(Ordering::Relaxed) == 0 || self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// Waits for the next request's turn; false when the run is over.
    async fn ticket(&self) -> bool {
        let take = |n: u64| n.checked_sub(1);
        if self.over()
            || self
                .todo
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, take)
                .is_err()
        {
            return false;
        }
        if self.rate > 0.0 {
            let k = self.slots.fetch_add(1, Ordering::Relaxed);
            let at = self.start + Duration::from_secs_f64(k as f64 / self.rate);
            if self.deadline.is_some_and(|d| at >= d) {
                return false;
            }
            tokio::time::sleep_until(at.into()).await;
        }
        true
    }
}

struct Shared {
    addr: SocketAddr,
    server_name: String,
    uri: http::Uri,
    body: Option<Bytes>,
    streams: usize,
    config: quinn::ClientConfig,
    plan: Plan,
    ok: AtomicU64,
    non2xx: AtomicU64,
    errors: AtomicU64,
    handshakes: AtomicU64,
    /// Response body bytes received.
    bytes: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl Shared {
    fn error(&self, e: impl std::fmt::Display) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut first) = self.first_error.lock() {
            first.get_or_insert_with(|| e.to_string());
        }
    }
}

/// A connection kept open after the load (`--hold`): dropping the last
/// `SendRequest` or the endpoint would close it.
type Held = (quinn::Endpoint, quinn::Connection, SendRequest);

async fn connect(s: &Shared) -> Result<Held, BoxError> {
    let local: SocketAddr = if s.addr.is_ipv6() {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    }
    .parse()?;
    let mut endpoint = quinn::Endpoint::client(local)?;
    endpoint.set_default_client_config(s.config.clone());
    let conn = endpoint.connect(s.addr, &s.server_name)?.await?;
    let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn.clone())).await?;
    // The connection's control streams and its closing.
    tokio::spawn(async move { std::future::poll_fn(|cx| driver.poll_close(cx)).await });
    Ok((endpoint, conn, send))
}

/// One request and its whole response; returns the status.
async fn request(s: &Shared, send: &mut SendRequest) -> Result<u16, BoxError> {
    let mut head = http::Request::builder().uri(s.uri.clone());
    if let Some(body) = &s.body {
        head = head.method("POST").header("content-length", body.len());
    }
    let mut stream = send.send_request(head.body(())?).await?;
    if let Some(body) = &s.body {
        stream.send_data(body.clone()).await?;
    }
    stream.finish().await?;
    let status = stream.recv_response().await?.status().as_u16();
    while let Some(mut chunk) = stream.recv_data().await? {
        s.bytes
            .fetch_add(chunk.remaining() as u64, Ordering::Relaxed);
        chunk.advance(chunk.remaining());
    }
    Ok(status)
}

/// Sends requests one after the other on one stream slot of a connection;
/// returns their latencies (µs) and whether the connection broke.
async fn stream_slot(
    s: Arc<Shared>,
    mut send: SendRequest,
    conn: quinn::Connection,
) -> (Vec<u32>, bool) {
    let mut latencies = Vec::new();
    while s.plan.ticket().await {
        let t0 = Instant::now();
        match request(&s, &mut send).await {
            Ok(status) => {
                let counter = if (200..300).contains(&status) {
                    &s.ok
                } else {
                    &s.non2xx
                };
                counter.fetch_add(1, Ordering::Relaxed);
                latencies.push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
            }
            Err(e) => {
                s.error(e);
                if conn.close_reason().is_some() {
                    return (latencies, true);
                }
            }
        }
    }
    (latencies, false)
}

/// How long a QUIC + HTTP/3 handshake may take (quinn's own limit is the
/// 30 s idle timeout).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// One client connection: connects (again after a failure, up to three
/// attempts in a row) and runs its stream slots until the run is over.
async fn connection(s: Arc<Shared>) -> (Vec<u32>, Option<Held>) {
    let mut latencies = Vec::new();
    let mut failures = 0;
    while !s.plan.over() && failures < 3 {
        let attempt = tokio::time::timeout(CONNECT_TIMEOUT, connect(&s)).await;
        let (endpoint, conn, send) =
            match attempt.unwrap_or_else(|_| Err("handshake timed out".into())) {
                Ok(held) => held,
                Err(e) => {
                    s.error(format!("connect: {e}"));
                    failures += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
        failures = 0;
        s.handshakes.fetch_add(1, Ordering::Relaxed);
        let slots: Vec<_> = (0..s.streams)
            .map(|_| tokio::spawn(stream_slot(Arc::clone(&s), send.clone(), conn.clone())))
            .collect();
        let mut broken = false;
        for slot in slots {
            if let Ok((l, b)) = slot.await {
                latencies.extend(l);
                broken |= b;
            }
        }
        if !broken {
            return (latencies, Some((endpoint, conn, send)));
        }
    }
    (latencies, None)
}

struct Args {
    target: String,
    path: String,
    connections: usize,
    streams: usize,
    seconds: f64,
    total: Option<u64>,
    rate: f64,
    post: Option<usize>,
    ca: Option<String>,
    server_name: String,
    hold: f64,
}

const USAGE: &str = "usage: h3load HOST:PORT PATH [-c CONNECTIONS] [-m STREAMS] [-d SECONDS | -n REQUESTS] \
                     [--rate REQ_PER_S] [--post BYTES] [--ca FILE] [--server-name NAME] [--hold SECONDS]";

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let (Some(target), Some(path)) = (it.next(), it.next()) else {
        return Err(USAGE.into());
    };
    let mut a = Args {
        target,
        path,
        connections: 1,
        streams: 1,
        seconds: 5.0,
        total: None,
        rate: 0.0,
        post: None,
        ca: None,
        server_name: "localhost".into(),
        hold: 0.0,
    };
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "-c" => a.connections = value.parse().map_err(|e| bad(&e))?,
            "-m" => a.streams = value.parse().map_err(|e| bad(&e))?,
            "-d" => a.seconds = value.parse().map_err(|e| bad(&e))?,
            "-n" => a.total = Some(value.parse().map_err(|e| bad(&e))?),
            "--rate" => a.rate = value.parse().map_err(|e| bad(&e))?,
            "--post" => a.post = Some(value.parse().map_err(|e| bad(&e))?),
            "--ca" => a.ca = Some(value),
            "--server-name" => a.server_name = value,
            "--hold" => a.hold = value.parse().map_err(|e| bad(&e))?,
            _ => return Err(format!("unknown option {flag}\n{USAGE}")),
        }
    }
    if a.connections == 0 || a.streams == 0 {
        return Err("-c and -m must be at least 1".into());
    }
    Ok(a)
}

fn shared(a: &Args) -> Result<Shared, BoxError> {
    let addr = a
        .target
        .to_socket_addrs()?
        .next()
        .ok_or("HOST:PORT resolves to nothing")?;
    let keep_alive = (a.hold > 0.0).then_some(Duration::from_secs(1));
    let start = Instant::now();
    Ok(Shared {
        addr,
        uri: format!("https://{}:{}{}", a.server_name, addr.port(), a.path).parse()?,
        server_name: a.server_name.clone(),
        body: a.post.map(|n| Bytes::from(vec![b'x'; n])),
        streams: a.streams,
        config: tls::client_config(a.ca.as_deref(), keep_alive)?,
        plan: Plan {
            start,
            deadline: a
                .total
                .is_none()
                .then(|| start + Duration::from_secs_f64(a.seconds)),
            todo: AtomicU64::new(a.total.unwrap_or(u64::MAX)),
            rate: a.rate,
            slots: AtomicU64::new(0),
        },
        ok: AtomicU64::new(0),
        non2xx: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        handshakes: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        first_error: Mutex::new(None),
    })
}

/// `s` as a JSON string literal.
fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' | '\\' => out.extend(['\\', c]),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out + "\""
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = parse_args().unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2);
    });
    let s = Arc::new(shared(&args).unwrap_or_else(|e| {
        eprintln!("h3load: {e}");
        std::process::exit(2);
    }));
    let tasks: Vec<_> = (0..args.connections)
        .map(|_| tokio::spawn(connection(Arc::clone(&s))))
        .collect();
    let (mut latencies, mut held) = (Vec::new(), Vec::new());
    for t in tasks {
        if let Ok((l, h)) = t.await {
            latencies.extend(l);
            held.extend(h);
        }
    }
    let secs = s.plan.start.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let pct = |p: f64| -> f64 {
        let i = ((latencies.len() as f64 - 1.0) * p).round() as usize;
        latencies.get(i).map_or(0.0, |&us| us as f64 / 1000.0)
    };
    let ok = s.ok.load(Ordering::Relaxed);
    let first_error = s.first_error.lock().ok().and_then(|e| e.clone());
    println!(
        "{{\"requests\": {ok}, \"non2xx\": {}, \"errors\": {}, \"seconds\": {secs:.3}, \"rps\": {:.1}, \
         \"p50_ms\": {:.3}, \"p99_ms\": {:.3}, \"connections\": {}, \"bytes\": {}, \"first_error\": {}}}",
        s.non2xx.load(Ordering::Relaxed),
        s.errors.load(Ordering::Relaxed),
        ok as f64 / secs,
        pct(0.5),
        pct(0.99),
        s.handshakes.load(Ordering::Relaxed),
        s.bytes.load(Ordering::Relaxed),
        first_error.as_deref().map_or("null".into(), json_str),
    );
    if args.hold > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(args.hold)).await;
        let open = held
            .iter()
            .filter(|(_, c, _)| c.close_reason().is_none())
            .count();
        println!("{{\"held\": {open}}}");
    }
    for (_, conn, _) in &held {
        conn.close(0u32.into(), b"done");
    }
    for (endpoint, _, _) in &held {
        endpoint.wait_idle().await;
    }
}
