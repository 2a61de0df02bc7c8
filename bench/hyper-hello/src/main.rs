//! The benchmark ceiling: hyper on a current-thread Tokio runtime, answering
//! every request with the same bodies as the benchmark's ASGI apps, no Python.
//!
//! Usage: `hyper-hello PORT [--h2]`. Routes: `/` 13-byte body, `/64k`
//! 65,536 bytes, any POST reads the body and answers its length.
//!
//! Without `--h2` every connection is HTTP/1.1 (hyper's `http1` builder, the
//! HTTP/1.1 floor). With `--h2` hyper-util's `auto` builder serves each
//! connection as HTTP/2 when it opens with the preface (h2c prior knowledge)
//! and as HTTP/1.1 otherwise, on the same port (the HTTP/2 floor).

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

static BIG: [u8; 65536] = [b'x'; 65536];

async fn handle(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = if req.method() == Method::POST {
        let n = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes().len())
            .unwrap_or(0);
        Bytes::from(n.to_string())
    } else if req.uri().path() == "/64k" {
        Bytes::from_static(&BIG)
    } else {
        Bytes::from_static(b"Hello, world!")
    };
    let mut resp = Response::new(Full::new(body));
    resp.headers_mut()
        .insert("content-type", "text/plain".parse().expect("static header"));
    Ok(resp)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(8000);
    let h2 = std::env::args().skip(2).any(|a| a == "--h2");
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        tokio::spawn(async move {
            let io = TokioIo::new(stream);
            if h2 {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(io, service_fn(handle))
                    .await;
            } else {
                let _ = http1::Builder::new()
                    .serve_connection(io, service_fn(handle))
                    .await;
            }
        });
    }
}
