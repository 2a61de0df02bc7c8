//! Prometheus metrics for every worker of a Gunicorn master, in shared
//! memory (`metrics_bind`).
//!
//! * The table. The master (or `python -m skirr`) creates it before it
//!   forks ([`create_table`]): a memfd of [`SLOTS`] fixed-size slots of
//!   atomic `u64` counters, mapped `MAP_SHARED` by each worker. A worker
//!   claims the first free slot with an `fcntl` record lock on the slot's
//!   byte range ([`Recorder::attach`]); the kernel drops the lock when the
//!   process dies, however it dies (SIGKILL included), so the worker that
//!   replaces it takes the same slot over.
//! * Counters are cumulative per slot, never reset: a replacement worker
//!   adds to its predecessor's counts, so `skirr_requests_total{worker="0"}`
//!   never decreases across a `max_requests` recycle, as Prometheus expects
//!   of a counter. The `worker` label is the slot's index, not a pid.
//!   Gauges (in flight, open connections) are zeroed when a slot is taken
//!   over, and a dead worker's gauges are not shown.
//! * Writers. Each worker writes its own slot from the Tokio side with
//!   relaxed atomic adds (no lock, no GIL); [`Recorder`] is the handle,
//!   a no-op when metrics are off.
//! * The exposition. The listener is bound by the master and inherited;
//!   every worker accepts on it ([`serve`]) and renders the whole table
//!   (Prometheus text format 0.0.4), so any worker answers for all of them
//!   and a scrape never waits for a busy worker's GIL or event loop.
//!
//! The text is rendered here rather than with the `prometheus` crate: the
//! values live in shared memory as plain atomics, which that crate's
//! registry cannot read without copying every slot into its own metric
//! objects per scrape; the format itself is a few lines of text.

use std::fmt::Write as _;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Slots in a table: workers that can report at once (Gunicorn's `-w`,
/// plus the replacements that start while the old ones still drain).
pub const SLOTS: usize = 256;
/// Bytes per slot (a [`Slot`] fits; slots never share a lock range).
const SLOT_BYTES: usize = 1024;
/// The table's size in bytes.
const TABLE_BYTES: usize = SLOTS * SLOT_BYTES;

/// Request duration histogram bounds, in seconds (`le` labels); a last
/// bucket counts everything above (`+Inf`).
const BUCKETS_S: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// The same bounds in nanoseconds (compared on the request path).
const BUCKETS_NS: [u64; 13] = [
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// `method` label values; anything else is `other`.
const METHODS: [&str; 8] = [
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other",
];
/// `status` label values (the status class).
const STATUSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];
/// `protocol` label values.
const PROTOCOLS: [&str; 2] = ["http1", "http2"];

/// A connection's protocol (`protocol` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Proto {
    /// HTTP/1.0 or HTTP/1.1 (WebSockets start as it).
    Http1 = 0,
    /// HTTP/2.
    Http2 = 1,
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

const LIMITS: [&str; 7] = [
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
    /// calls [`Recorder::refused`] itself).
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

const REQ_CELLS: usize = METHODS.len() * STATUSES.len() * PROTOCOLS.len();

/// One worker's counters; all-zero bytes are a valid, empty slot.
/// Gauges are `u64`s updated with wrapping adds of ±1 (read as `i64`).
#[repr(C)]
struct Slot {
    /// Processes that claimed this slot (`skirr_worker_starts_total`).
    starts: AtomicU64,
    /// The current (or last) owner's pid.
    pid: AtomicU64,
    in_flight: AtomicU64,
    conns_open: [AtomicU64; PROTOCOLS.len()],
    conns_total: [AtomicU64; PROTOCOLS.len()],
    ws_open: AtomicU64,
    ws_total: AtomicU64,
    /// WebSocket data messages: received, sent.
    ws_messages: [AtomicU64; 2],
    /// HTTP bytes (after TLS) read, written.
    bytes: [AtomicU64; 2],
    /// How late the event loop ran its last probe timer (ns).
    loop_lag_ns: AtomicU64,
    /// When the next probe is due (CLOCK_MONOTONIC ns; 0: no probe yet).
    loop_due_ns: AtomicU64,
    refused: [AtomicU64; LIMITS.len()],
    duration_sum_ns: AtomicU64,
    /// Per bucket (not cumulative); the last one is `+Inf`.
    duration: [AtomicU64; BUCKETS_NS.len() + 1],
    /// [method][status][protocol].
    requests: [AtomicU64; REQ_CELLS],
}

const _: () = assert!(std::mem::size_of::<Slot>() <= SLOT_BYTES);
const _: () = assert!(SLOT_BYTES % 8 == 0);

/// Creates an empty table: a memfd of [`SLOTS`] slots (close-on-exec;
/// `fork` keeps it). Returns its descriptor, which the caller keeps open
/// for the life of the process (closing any descriptor of the table drops
/// this process's slot lock).
///
/// Errors: `memfd_create(2)` or `ftruncate(2)` failures.
pub fn create_table() -> io::Result<RawFd> {
    // SAFETY: a valid NUL-terminated name and flags; returns a new fd or -1.
    let fd = unsafe { libc::memfd_create(c"skirr-metrics".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is the memfd just created; ftruncate only sizes it.
    if unsafe { libc::ftruncate(fd, TABLE_BYTES as libc::off_t) } != 0 {
        let e = io::Error::last_os_error();
        // SAFETY: closing the fd we own.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    Ok(fd)
}

/// A mapped table; mapped once per process and never unmapped.
#[derive(Clone, Copy)]
pub(crate) struct Table {
    /// The mapping (TABLE_BYTES long). A raw pointer, not a `&[u8]`:
    /// other processes write it concurrently, through atomics only.
    base: std::ptr::NonNull<u8>,
    fd: RawFd,
    /// This process's slot.
    own: usize,
}

// SAFETY: the mapping is shared memory valid for the life of the process
// and accessed only through the atomics of `Slot`, which are Sync.
unsafe impl Send for Table {}
// SAFETY: as above.
unsafe impl Sync for Table {}

impl Table {
    fn slot(&self, i: usize) -> &'static Slot {
        // SAFETY: `i < SLOTS`, so the slot lies inside the mapping, which
        // is page-aligned (slots are at multiples of SLOT_BYTES, a multiple
        // of 8) and never unmapped; all-zero bytes are valid atomics, and
        // every process touches the memory only through atomics.
        unsafe { &*(self.base.as_ptr().add(i * SLOT_BYTES) as *const Slot) }
    }

    /// Whether slot `i` has a live owner (a process holding its lock).
    fn alive(&self, i: usize) -> bool {
        if i == self.own {
            return true; // our own lock never shows as a conflict
        }
        let mut fl = lock_range(i, libc::F_WRLCK);
        // SAFETY: F_GETLK on our fd with a valid `flock`, which it fills in.
        let rc = unsafe { libc::fcntl(self.fd, libc::F_GETLK, &mut fl) };
        rc == 0 && fl.l_type != libc::F_UNLCK as libc::c_short
    }
}

fn lock_range(i: usize, kind: libc::c_int) -> libc::flock {
    // SAFETY: `flock` is a plain C struct; zero is a valid value for
    // every field, set below.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = (i * SLOT_BYTES) as libc::off_t;
    fl.l_len = SLOT_BYTES as libc::off_t;
    fl
}

/// Nanoseconds on CLOCK_MONOTONIC (the clock of Python's
/// `time.monotonic()`, the same in every process).
fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// A worker's handle on its slot: every method is a few relaxed atomic
/// adds, or nothing when metrics are off (the default).
#[derive(Clone, Copy, Default)]
pub(crate) struct Recorder {
    slot: Option<&'static Slot>,
    table: Option<Table>,
}

impl Recorder {
    /// Maps the table `fd` and claims its first free slot (a write lock
    /// on the slot's bytes, released by the kernel when this process
    /// dies); the slot's gauges are zeroed and its start counted.
    ///
    /// Errors: `mmap(2)` failures, a descriptor that is not a table, or
    /// every slot taken.
    pub(crate) fn attach(fd: RawFd) -> io::Result<Recorder> {
        // SAFETY: `stat` is a plain C struct; all-zero is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat on a caller-provided fd into that buffer.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if st.st_size as usize != TABLE_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the metrics table descriptor is not a Skirr metrics table",
            ));
        }
        // SAFETY: mapping the whole memfd shared and read-write; the result
        // is checked, and the mapping is kept for the life of the process.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                TABLE_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let Some(base) = std::ptr::NonNull::new(p.cast::<u8>()) else {
            return Err(io::Error::other("mmap returned a null mapping"));
        };
        for i in 0..SLOTS {
            let fl = lock_range(i, libc::F_WRLCK);
            // SAFETY: a non-blocking record lock on our fd's byte range.
            if unsafe { libc::fcntl(fd, libc::F_SETLK, &fl) } != 0 {
                continue;
            }
            let table = Table { base, fd, own: i };
            let slot = table.slot(i);
            // A dead predecessor's gauges are stale; its counters stay.
            slot.in_flight.store(0, Relaxed);
            for c in &slot.conns_open {
                c.store(0, Relaxed);
            }
            slot.ws_open.store(0, Relaxed);
            slot.loop_lag_ns.store(0, Relaxed);
            slot.loop_due_ns.store(0, Relaxed);
            slot.pid.store(std::process::id() as u64, Relaxed);
            slot.starts.fetch_add(1, Relaxed);
            return Ok(Recorder {
                slot: Some(slot),
                table: Some(table),
            });
        }
        Err(io::Error::other(format!(
            "all {SLOTS} metrics slots are taken by live workers"
        )))
    }

    /// This worker's slot index (the `worker` label), if metrics are on.
    pub(crate) fn index(&self) -> Option<usize> {
        self.table.map(|t| t.own)
    }

    /// A request head arrived: counts it in flight until the meter drops,
    /// then records it (see [`RequestMeter`]).
    #[inline]
    pub(crate) fn request(
        &self,
        method: &http::Method,
        version: http::Version,
    ) -> Option<RequestMeter> {
        let slot = self.slot?;
        slot.in_flight.fetch_add(1, Relaxed);
        Some(RequestMeter {
            slot,
            started: Instant::now(),
            method: method_class(method),
            proto: if version == http::Version::HTTP_2 {
                Proto::Http2
            } else {
                Proto::Http1
            } as u8,
            status: 0,
        })
    }

    /// An open connection of `proto`, counted until the gauge drops.
    pub(crate) fn connection(&self, proto: Proto) -> OpenGauge {
        OpenGauge::new(self.slot, |s| {
            s.conns_total[proto as usize].fetch_add(1, Relaxed);
            &s.conns_open[proto as usize]
        })
    }

    /// A WebSocket session, counted open until the gauge drops.
    pub(crate) fn websocket(&self) -> OpenGauge {
        OpenGauge::new(self.slot, |s| {
            s.ws_total.fetch_add(1, Relaxed);
            &s.ws_open
        })
    }

    /// A WebSocket data message received (`inbound`) or sent.
    #[inline]
    pub(crate) fn ws_message(&self, inbound: bool) {
        if let Some(s) = self.slot {
            s.ws_messages[usize::from(!inbound)].fetch_add(1, Relaxed);
        }
    }

    /// HTTP bytes read from a client.
    #[inline]
    pub(crate) fn bytes_in(&self, n: usize) {
        if let Some(s) = self.slot {
            s.bytes[0].fetch_add(n as u64, Relaxed);
        }
    }

    /// HTTP bytes written to a client.
    #[inline]
    pub(crate) fn bytes_out(&self, n: usize) {
        if let Some(s) = self.slot {
            s.bytes[1].fetch_add(n as u64, Relaxed);
        }
    }

    /// A request the server answered itself because of `limit`.
    pub(crate) fn refused(&self, limit: Limit) {
        if let Some(s) = self.slot {
            s.refused[limit as usize].fetch_add(1, Relaxed);
        }
    }

    /// The server answered a request itself with `status` and `reason`:
    /// counted as refused if that is a limit's answer ([`Limit::of_answer`]).
    pub(crate) fn refused_answer(&self, status: http::StatusCode, reason: &str) {
        if let Some(limit) = Limit::of_answer(status, reason) {
            self.refused(limit);
        }
    }

    /// The event loop ran its probe timer `lag` late; the next one is due
    /// in `next`. A scrape while the next is overdue reports the overdue
    /// time instead (a blocked loop runs no timer to say so).
    pub(crate) fn loop_lag(&self, lag: Duration, next: Duration) {
        if let Some(s) = self.slot {
            s.loop_lag_ns.store(lag.as_nanos() as u64, Relaxed);
            s.loop_due_ns
                .store(mono_ns() + next.as_nanos() as u64, Relaxed);
        }
    }

    /// The whole table as Prometheus text (format 0.0.4); `None` when
    /// metrics are off.
    pub(crate) fn render(&self) -> Option<String> {
        self.table.map(|t| render(&t))
    }
}

fn method_class(m: &http::Method) -> u8 {
    match *m {
        http::Method::GET => 0,
        http::Method::HEAD => 1,
        http::Method::POST => 2,
        http::Method::PUT => 3,
        http::Method::PATCH => 4,
        http::Method::DELETE => 5,
        http::Method::OPTIONS => 6,
        _ => 7,
    }
}

/// One request, from its head to the end of its response body (when
/// hyper drops the body): in flight meanwhile, then counted in
/// `skirr_requests_total` and the duration histogram. A request whose
/// client left before any response ([`set_status`](Self::set_status)
/// never called) leaves the in-flight gauge and is not counted.
pub(crate) struct RequestMeter {
    slot: &'static Slot,
    started: Instant,
    method: u8,
    proto: u8,
    status: u16,
}

impl RequestMeter {
    /// The response's status (the last one set is counted).
    #[inline]
    pub(crate) fn set_status(&mut self, status: http::StatusCode) {
        self.status = status.as_u16();
    }
}

impl Drop for RequestMeter {
    fn drop(&mut self) {
        let s = self.slot;
        s.in_flight.fetch_sub(1, Relaxed);
        if self.status == 0 {
            return;
        }
        let class = (usize::from(self.status / 100)).clamp(1, 5) - 1;
        let cell = (usize::from(self.method) * STATUSES.len() + class) * PROTOCOLS.len()
            + usize::from(self.proto);
        s.requests[cell].fetch_add(1, Relaxed);
        let ns = self.started.elapsed().as_nanos() as u64;
        let bucket = BUCKETS_NS
            .iter()
            .position(|&b| ns <= b)
            .unwrap_or(BUCKETS_NS.len());
        s.duration[bucket].fetch_add(1, Relaxed);
        s.duration_sum_ns.fetch_add(ns, Relaxed);
    }
}

/// A gauge held at +1 while this lives (an open connection, a WebSocket).
pub(crate) struct OpenGauge(Option<&'static AtomicU64>);

impl OpenGauge {
    fn new(
        slot: Option<&'static Slot>,
        pick: impl FnOnce(&'static Slot) -> &'static AtomicU64,
    ) -> Self {
        OpenGauge(slot.map(|s| {
            let g = pick(s);
            g.fetch_add(1, Relaxed);
            g
        }))
    }
}

impl Drop for OpenGauge {
    fn drop(&mut self) {
        if let Some(g) = self.0 {
            g.fetch_sub(1, Relaxed);
        }
    }
}

fn gauge(v: &AtomicU64) -> i64 {
    v.load(Relaxed) as i64
}

/// Renders every slot that was ever claimed.
fn render(t: &Table) -> String {
    let used: Vec<(usize, &Slot, bool)> = (0..SLOTS)
        .map(|i| (i, t.slot(i)))
        .filter(|(_, s)| s.starts.load(Relaxed) > 0)
        .map(|(i, s)| (i, s, t.alive(i)))
        .collect();
    let mut out = String::with_capacity(4096 + used.len() * 4096);
    let o = &mut out;
    // Writing to a String cannot fail.
    let head = |o: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };

    head(
        o,
        "skirr_requests_total",
        "counter",
        "Requests answered (the response body done), by worker slot, method, status class and protocol.",
    );
    for &(i, s, _) in &used {
        for (m, method) in METHODS.iter().enumerate() {
            for (c, status) in STATUSES.iter().enumerate() {
                for (p, proto) in PROTOCOLS.iter().enumerate() {
                    let n =
                        s.requests[(m * STATUSES.len() + c) * PROTOCOLS.len() + p].load(Relaxed);
                    if n > 0 {
                        let _ = writeln!(
                            o,
                            "skirr_requests_total{{worker=\"{i}\",method=\"{method}\",status=\"{status}\",protocol=\"{proto}\"}} {n}"
                        );
                    }
                }
            }
        }
    }

    head(
        o,
        "skirr_request_duration_seconds",
        "histogram",
        "Time from a request's head to the end of its response body.",
    );
    for &(i, s, _) in &used {
        let mut cum = 0u64;
        for (b, le) in BUCKETS_S.iter().enumerate() {
            cum += s.duration[b].load(Relaxed);
            let _ = writeln!(
                o,
                "skirr_request_duration_seconds_bucket{{worker=\"{i}\",le=\"{le}\"}} {cum}"
            );
        }
        cum += s.duration[BUCKETS_S.len()].load(Relaxed);
        let sum = s.duration_sum_ns.load(Relaxed) as f64 / 1e9;
        let _ = writeln!(
            o,
            "skirr_request_duration_seconds_bucket{{worker=\"{i}\",le=\"+Inf\"}} {cum}\n\
             skirr_request_duration_seconds_sum{{worker=\"{i}\"}} {sum}\n\
             skirr_request_duration_seconds_count{{worker=\"{i}\"}} {cum}"
        );
    }

    let per_slot = |o: &mut String, name: &str, alive_only: bool, value: &dyn Fn(&Slot) -> i64| {
        for &(i, s, alive) in &used {
            if alive || !alive_only {
                let _ = writeln!(o, "{name}{{worker=\"{i}\"}} {}", value(s));
            }
        }
    };
    head(
        o,
        "skirr_requests_in_flight",
        "gauge",
        "Requests between their head and the end of their response.",
    );
    per_slot(o, "skirr_requests_in_flight", true, &|s| {
        gauge(&s.in_flight)
    });

    head(
        o,
        "skirr_connections_open",
        "gauge",
        "Client connections open, by protocol.",
    );
    for &(i, s, _) in used.iter().filter(|u| u.2) {
        for (p, proto) in PROTOCOLS.iter().enumerate() {
            let _ = writeln!(
                o,
                "skirr_connections_open{{worker=\"{i}\",protocol=\"{proto}\"}} {}",
                gauge(&s.conns_open[p])
            );
        }
    }
    head(
        o,
        "skirr_connections_total",
        "counter",
        "Client connections served, by protocol.",
    );
    for &(i, s, _) in &used {
        for (p, proto) in PROTOCOLS.iter().enumerate() {
            let _ = writeln!(
                o,
                "skirr_connections_total{{worker=\"{i}\",protocol=\"{proto}\"}} {}",
                s.conns_total[p].load(Relaxed)
            );
        }
    }

    head(
        o,
        "skirr_websocket_sessions_open",
        "gauge",
        "WebSocket sessions open.",
    );
    per_slot(o, "skirr_websocket_sessions_open", true, &|s| {
        gauge(&s.ws_open)
    });
    head(
        o,
        "skirr_websocket_sessions_total",
        "counter",
        "WebSocket sessions accepted.",
    );
    per_slot(o, "skirr_websocket_sessions_total", false, &|s| {
        s.ws_total.load(Relaxed) as i64
    });
    head(
        o,
        "skirr_websocket_messages_total",
        "counter",
        "WebSocket data messages, by direction (in: from clients).",
    );
    for &(i, s, _) in &used {
        for (d, dir) in ["in", "out"].iter().enumerate() {
            let _ = writeln!(
                o,
                "skirr_websocket_messages_total{{worker=\"{i}\",direction=\"{dir}\"}} {}",
                s.ws_messages[d].load(Relaxed)
            );
        }
    }

    head(
        o,
        "skirr_received_bytes_total",
        "counter",
        "HTTP bytes read from clients (after TLS).",
    );
    per_slot(o, "skirr_received_bytes_total", false, &|s| {
        s.bytes[0].load(Relaxed) as i64
    });
    head(
        o,
        "skirr_sent_bytes_total",
        "counter",
        "HTTP bytes written to clients (before TLS).",
    );
    per_slot(o, "skirr_sent_bytes_total", false, &|s| {
        s.bytes[1].load(Relaxed) as i64
    });

    head(
        o,
        "skirr_refused_total",
        "counter",
        "Requests the server answered itself because of a limit (the option named).",
    );
    for &(i, s, _) in &used {
        for (l, limit) in LIMITS.iter().enumerate() {
            let _ = writeln!(
                o,
                "skirr_refused_total{{worker=\"{i}\",limit=\"{limit}\"}} {}",
                s.refused[l].load(Relaxed)
            );
        }
    }

    let now = mono_ns();
    head(
        o,
        "skirr_event_loop_lag_seconds",
        "gauge",
        "How late the asyncio loop ran its probe timer (or how overdue it is now).",
    );
    for &(i, s, _) in used.iter().filter(|u| u.2) {
        let due = s.loop_due_ns.load(Relaxed);
        let mut lag = s.loop_lag_ns.load(Relaxed);
        if due > 0 && now > due {
            lag = lag.max(now - due);
        }
        let _ = writeln!(
            o,
            "skirr_event_loop_lag_seconds{{worker=\"{i}\"}} {}",
            lag as f64 / 1e9
        );
    }

    head(
        o,
        "skirr_worker_up",
        "gauge",
        "1 while a live worker holds the slot.",
    );
    for &(i, _, alive) in &used {
        let _ = writeln!(o, "skirr_worker_up{{worker=\"{i}\"}} {}", u8::from(alive));
    }
    head(
        o,
        "skirr_worker_starts_total",
        "counter",
        "Worker processes that took this slot.",
    );
    per_slot(o, "skirr_worker_starts_total", false, &|s| {
        s.starts.load(Relaxed) as i64
    });
    let restarts: u64 = used
        .iter()
        .map(|(_, s, _)| s.starts.load(Relaxed).saturating_sub(1))
        .sum();
    head(
        o,
        "skirr_worker_restarts_total",
        "counter",
        "Workers that replaced an earlier one (all slots).",
    );
    let _ = writeln!(o, "skirr_worker_restarts_total {restarts}");
    out
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_survive_a_new_owner_and_render() {
        let fd = create_table().expect("memfd");
        let rec = Recorder::attach(fd).expect("attach");
        assert_eq!(rec.index(), Some(0));
        {
            let mut m = rec
                .request(&http::Method::GET, http::Version::HTTP_11)
                .expect("metrics on");
            m.set_status(http::StatusCode::OK);
        }
        {
            let _gone = rec.request(&http::Method::POST, http::Version::HTTP_2);
        }
        rec.refused_answer(
            http::StatusCode::PAYLOAD_TOO_LARGE,
            "request body too large",
        );
        rec.refused_answer(http::StatusCode::BAD_REQUEST, "invalid request body");
        rec.refused_answer(http::StatusCode::SERVICE_UNAVAILABLE, "some other limit");
        rec.refused_answer(http::StatusCode::SERVICE_UNAVAILABLE, RESPONSE_START_REASON);
        let text = rec.render().expect("rendered");
        assert!(text.contains(
            "skirr_requests_total{worker=\"0\",method=\"GET\",status=\"2xx\",protocol=\"http1\"} 1\n"
        ));
        assert!(
            !text.contains("method=\"POST\""),
            "no response, not counted"
        );
        assert!(text.contains("skirr_requests_in_flight{worker=\"0\"} 0\n"));
        assert!(text.contains("skirr_request_duration_seconds_count{worker=\"0\"} 1\n"));
        assert!(text.contains("skirr_refused_total{worker=\"0\",limit=\"max_body_size\"} 1\n"));
        assert!(
            text.contains("skirr_refused_total{worker=\"0\",limit=\"response_start_timeout\"} 1\n")
        );
        assert!(text.contains("skirr_worker_starts_total{worker=\"0\"} 1\n"));
        assert!(text.contains("skirr_worker_restarts_total 0\n"));
    }
}
