//! HTTP/3 options: `http3` and `http3_port`; the limits come from the
//! HTTP/2 options of the same meaning (`http2_max_concurrent_streams`,
//! `http2_max_header_list_size`) and the connection timeouts from
//! `keepalive_timeout`.

use pyo3::prelude::*;

use super::count;

/// HTTP/3 (QUIC, RFC 9114) settings. TLS is required: a server with
/// `http3` and no certificate refuses to start (`server::run`).
#[derive(Clone, Debug)]
pub struct Http3 {
    /// The UDP port; `None` (the default, `http3_port = 0`): the port of
    /// each TCP listener.
    pub port: Option<u16>,
    /// Bidirectional (request) streams a client may open at once on one
    /// connection: `http2_max_concurrent_streams`, default 100.
    pub max_concurrent_streams: u32,
    /// SETTINGS_MAX_FIELD_SECTION_SIZE (RFC 9114 §7.2.4.1), bytes:
    /// `http2_max_header_list_size`, default 65536.
    pub max_field_section_size: u64,
    /// Under a Gunicorn master (`http3_steer`, set by `skirr.RustWorker`):
    /// the sockets it bound for packet steering (`proto::h3::steer`).
    pub steer: Option<Steer>,
}

/// The master's UDP sockets for packet steering: a lock file, and per
/// HTTP/3 address the K sockets of its `SO_REUSEPORT` group in bind order
/// (descriptors inherited by fork, owned by the worker's core).
#[derive(Clone, Debug)]
pub struct Steer {
    /// The lock file's descriptor.
    pub lock_fd: i32,
    /// One list of K socket descriptors per address.
    pub groups: Vec<Vec<i32>>,
}

impl Default for Http3 {
    fn default() -> Self {
        Http3 {
            port: None,
            max_concurrent_streams: 100,
            max_field_section_size: 65536,
            steer: None,
        }
    }
}

/// The `http3*` keys as read.
#[derive(Default)]
pub(super) struct Options {
    on: bool,
    port: u16,
    steer: Option<Steer>,
}

impl Options {
    /// Takes `key` if it is an HTTP/3 option (returns whether it was).
    ///
    /// Errors: `TypeError` or `ValueError` naming the key for a value of
    /// the wrong type or out of range.
    pub(super) fn set(&mut self, key: &str, v: &Bound<'_, PyAny>) -> PyResult<bool> {
        match key {
            "http3" => self.on = v.extract()?,
            "http3_port" => self.port = count(v, key)?,
            "http3_steer" => {
                self.steer = v
                    .extract::<Option<(i32, Vec<Vec<i32>>)>>()?
                    .map(|(lock_fd, groups)| Steer { lock_fd, groups })
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The settings when `http3` is on, else `None`; the stream and field
    /// limits are the HTTP/2 options' (`h2`, read whether or not HTTP/2 is
    /// served).
    pub(super) fn finish(self, h2: &super::http2::Http2) -> Option<Http3> {
        self.on.then(|| Http3 {
            port: (self.port != 0).then_some(self.port),
            max_concurrent_streams: h2.max_concurrent_streams,
            max_field_section_size: u64::from(h2.max_header_list_size),
            steer: self.steer,
        })
    }
}
