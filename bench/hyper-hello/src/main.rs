//! The benchmark ceiling: hyper on a current-thread Tokio runtime, answering
//! every request with the same bodies as the benchmark's ASGI apps, no Python.
//!
//! Usage: `hyper-hello PORT`. Routes: `/` 13-byte body, `/64k` 65,536
//! bytes, any POST reads the body and answers its length.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
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
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        tokio::spawn(async move {
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service_fn(handle))
                .await;
        });
    }
}
