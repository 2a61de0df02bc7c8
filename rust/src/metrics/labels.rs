//! The label values of Skirr's metrics, and the two kinds a caller names
//! ([`Proto`], [`Limit`]); a slot's counters are indexed in their order.

/// `method` label values; anything else is `other`.
pub(super) const METHODS: [&str; 8] = [
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other",
];
/// `status` label values (the status class).
pub(super) const STATUSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];
/// `protocol` label values.
pub(super) const PROTOCOLS: [&str; 3] = ["http1", "http2", "http3"];

/// A connection's protocol (`protocol` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Proto {
    /// HTTP/1.0 or HTTP/1.1 (WebSockets start as it).
    Http1 = 0,
    /// HTTP/2.
    Http2 = 1,
    /// HTTP/3 (a QUIC connection).
    Http3 = 2,
}

/// Why the server answered a request itself (`limit` label of
/// `skirr_refused_total`); the option each one is named after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Limit {
    /// 413: `max_body_size`.
    MaxBodySize = 0,
    /// 414: `limit_request_line`.
    RequestLine = 1,
    /// 431: `limit_request_fields`, `limit_request_field_size` or
    /// `max_head_size` (hyper does not say which).
    RequestHead = 2,
    /// 408: `body_read_timeout`.
    BodyReadTimeout = 3,
    /// 503: `response_start_timeout`.
    ResponseStartTimeout = 4,
    /// 503: `limit_concurrency`.
    Concurrency = 5,
    /// 503: `loop_stall_timeout` (the loop watchdog).
    LoopStall = 6,
}

/// `limit` label values, in the order of [`Limit`].
pub(super) const LIMITS: [&str; 7] = [
    "max_body_size",
    "limit_request_line",
    "request_head",
    "body_read_timeout",
    "response_start_timeout",
    "limit_concurrency",
    "loop_stall_timeout",
];

/// The reason (the body) of the server's 503 for `response_start_timeout`.
pub(crate) const RESPONSE_START_REASON: &str = "the application did not respond in time";

impl Limit {
    /// The limit behind an answer the server gives itself (408, 413, 414,
    /// 431, and the 503 with [`RESPONSE_START_REASON`]); `None` for other
    /// answers (a 400 is no limit; another 503 is some other limit's, which
    /// calls [`Recorder::refused`](super::Recorder::refused) itself).
    pub(crate) fn of_answer(status: http::StatusCode, reason: &str) -> Option<Limit> {
        Some(match status.as_u16() {
            408 => Limit::BodyReadTimeout,
            413 => Limit::MaxBodySize,
            414 => Limit::RequestLine,
            431 => Limit::RequestHead,
            503 if reason == RESPONSE_START_REASON => Limit::ResponseStartTimeout,
            _ => return None,
        })
    }
}
