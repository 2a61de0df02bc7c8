//! HTTP/2 options: Gunicorn's `http_protocols`, `http2_cleartext` and the
//! `http2_*` limits, read into [`Http2`] for the HTTP/2 driver.

use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::{count, secs, str_list};

/// HTTP/2 settings: Gunicorn's `http_protocols`, `http2_cleartext` and
/// `http2_*` limits.
#[derive(Clone, Debug)]
pub struct Http2 {
    /// HTTP/1.1 is served too (`h1` in `http_protocols`).
    pub http1: bool,
    /// ALPN offers `h2` before `http/1.1` (the order of `http_protocols`).
    pub h2_first: bool,
    /// Cleartext connections that open with the HTTP/2 preface are served
    /// HTTP/2 (`http2_cleartext = prior-knowledge`).
    pub prior_knowledge: bool,
    /// SETTINGS_MAX_CONCURRENT_STREAMS. Default 100.
    pub max_concurrent_streams: u32,
    /// SETTINGS_INITIAL_WINDOW_SIZE (per stream). Default 65535.
    pub initial_window_size: u32,
    /// SETTINGS_MAX_FRAME_SIZE. Default 16384.
    pub max_frame_size: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE. Default 65536.
    pub max_header_list_size: u32,
    /// WebSockets over HTTP/2 (RFC 8441): SETTINGS_ENABLE_CONNECT_PROTOCOL
    /// is sent and an extended CONNECT with `:protocol websocket` reaches
    /// the app as a WebSocket. Default off (`http2_websockets`).
    pub websockets: bool,
    /// The server PINGs a connection this often; zero (the default) sends
    /// none (`http2_ping_interval`, seconds).
    pub ping_interval: Duration,
    /// A PING unanswered for this long closes the connection. Default 20 s
    /// (`http2_ping_timeout`).
    pub ping_timeout: Duration,
}

impl Default for Http2 {
    fn default() -> Self {
        Http2 {
            http1: true,
            h2_first: true,
            prior_knowledge: false,
            max_concurrent_streams: 100,
            initial_window_size: 65535,
            max_frame_size: 16384,
            max_header_list_size: 65536,
            websockets: false,
            ping_interval: Duration::ZERO,
            ping_timeout: Duration::from_secs(20),
        }
    }
}

/// `http_protocols`: a comma-separated list of `h1` and `h2`, in order of
/// preference. Returns (h1, h2, h2 before h1).
fn parse_protocols(v: &str) -> PyResult<(bool, bool, bool)> {
    let (mut h1, mut h2, mut h2_first) = (false, false, false);
    for p in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match p.to_ascii_lowercase().as_str() {
            "h1" | "http/1.1" => h1 = true,
            "h2" => {
                h2_first = !h1;
                h2 = true;
            }
            other => {
                return Err(PyValueError::new_err(format!(
                    "option 'http_protocols': {other:?} is not a protocol (h1 or h2)"
                )))
            }
        }
    }
    if !h1 && !h2 {
        return Err(PyValueError::new_err(
            "option 'http_protocols' names no protocol (h1, h2)",
        ));
    }
    Ok((h1, h2, h2_first))
}

/// The `http_protocols` and `http2_*` keys as read.
pub(super) struct Options {
    h2: Http2,
    /// `http_protocols` parsed: (h1, h2, h2 before h1).
    protocols: (bool, bool, bool),
}

impl Default for Options {
    fn default() -> Self {
        Options {
            h2: Http2::default(),
            protocols: (true, false, false),
        }
    }
}

impl Options {
    /// Takes `key` if it is an HTTP/2 option (returns whether it was).
    ///
    /// Errors: `ValueError` for a value out of range (RFC 9113 §6.5.2) or
    /// an unknown protocol or mode, `TypeError` for a value of the wrong
    /// type.
    pub(super) fn set(&mut self, key: &str, v: &Bound<'_, PyAny>) -> PyResult<bool> {
        let h2 = &mut self.h2;
        match key {
            "http_protocols" => self.protocols = parse_protocols(&str_list(v, key)?.join(","))?,
            "http2_cleartext" => {
                let mode: String = v.extract()?;
                h2.prior_knowledge = match mode.as_str() {
                    "off" => false,
                    // Upgrade (RFC 9113 §3.1 deprecates it) is not
                    // served; `both` serves prior knowledge.
                    "prior-knowledge" | "both" => true,
                    other => {
                        return Err(PyValueError::new_err(format!(
                            "option 'http2_cleartext' must be off, prior-knowledge or both \
                             (Upgrade: h2c is not supported), got {other:?}"
                        )))
                    }
                }
            }
            "http2_max_concurrent_streams" => {
                h2.max_concurrent_streams = count::<u32>(v, key)?.max(1)
            }
            "http2_initial_window_size" => {
                h2.initial_window_size = count(v, key)?;
                if h2.initial_window_size > (1 << 31) - 1 {
                    return Err(PyValueError::new_err(
                        "option 'http2_initial_window_size' must be at most 2147483647",
                    ));
                }
            }
            "http2_max_frame_size" => {
                h2.max_frame_size = count(v, key)?;
                if !(16384..=16_777_215).contains(&h2.max_frame_size) {
                    return Err(PyValueError::new_err(
                        "option 'http2_max_frame_size' must be between 16384 and 16777215",
                    ));
                }
            }
            "http2_max_header_list_size" => h2.max_header_list_size = count::<u32>(v, key)?.max(1),
            "http2_websockets" => h2.websockets = v.extract()?,
            "http2_ping_interval" => h2.ping_interval = secs(v, key)?,
            "http2_ping_timeout" => h2.ping_timeout = secs(v, key)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The HTTP/2 limits as read, whether or not HTTP/2 is served (HTTP/3
    /// takes its stream and field limits from them).
    pub(super) fn limits(&self) -> &Http2 {
        &self.h2
    }

    /// The settings when `http_protocols` names `h2`, else `None`.
    pub(super) fn finish(self) -> Option<Http2> {
        let (h1_on, h2_on, h2_first) = self.protocols;
        let mut h2 = self.h2;
        h2_on.then(|| {
            h2.http1 = h1_on;
            h2.h2_first = h2_first;
            h2
        })
    }
}

#[cfg(test)]
mod tests {
    use super::parse_protocols;

    #[test]
    fn protocols_in_order_of_preference() {
        assert_eq!(parse_protocols("h1").ok(), Some((true, false, false)));
        assert_eq!(parse_protocols("h2,h1").ok(), Some((true, true, true)));
        assert_eq!(parse_protocols("h1, h2").ok(), Some((true, true, false)));
        assert_eq!(parse_protocols("h2").ok(), Some((false, true, true)));
    }
}
