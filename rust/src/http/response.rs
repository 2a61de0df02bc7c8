//! A response as the app hands it to the Tokio side: the head, the body's
//! shape (whole, a file region, or streamed pieces), and the one
//! plain-text answer the server makes itself.

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

use crate::http::zerocopy::FileSegment;
use crate::wire::response::plain_text_fields;

/// One queued piece of a streamed response body.
pub(crate) enum Out {
    /// Bytes from `http.response.body`.
    Data(Bytes),
    /// A file region from `http.response.zerocopysend`, read by the Tokio
    /// side; its bytes count in `out_bytes` until they are read.
    File(FileSegment),
}

impl Out {
    /// Body bytes this piece carries.
    pub(crate) fn len(&self) -> usize {
        match self {
            Out::Data(b) => b.len(),
            Out::File(f) => f.len(),
        }
    }

    /// Whether it carries no body bytes.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<Bytes> for Out {
    fn from(b: Bytes) -> Self {
        Out::Data(b)
    }
}

/// How the response body travels.
pub(crate) enum BodyOut {
    /// The whole body is known: written with a `Content-Length`.
    Full(Bytes),
    /// Chunks follow through the exchange's queue.
    Stream,
    /// A file's first `len` bytes (`http.response.pathsend`), read by the
    /// Tokio side; written with a `Content-Length`.
    File { file: std::fs::File, len: u64 },
}

/// A response head ready for the wire.
pub(crate) struct ResponseHead {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: BodyOut,
}

impl ResponseHead {
    /// A plain-text response from the server itself, closing the
    /// connection (its request body may be unread).
    pub(crate) fn plain(status: StatusCode, reason: &'static str) -> Self {
        let mut headers = HeaderMap::with_capacity(2);
        plain_text_fields(&mut headers);
        ResponseHead {
            status,
            headers,
            body: BodyOut::Full(Bytes::from_static(reason.as_bytes())),
        }
    }
}

/// A streamed response ended badly: the connection must be closed rather
/// than the response terminated as if complete.
#[derive(Debug)]
pub(crate) struct Aborted;

impl std::fmt::Display for Aborted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the application did not complete the response")
    }
}

impl std::error::Error for Aborted {}
