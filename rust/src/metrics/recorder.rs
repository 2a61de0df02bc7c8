//! The writers: a worker's [`Recorder`] on its own slot, and the guards
//! that count a request ([`RequestMeter`]) or an open connection
//! ([`OpenGauge`]) while they live.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use super::labels::{Limit, Proto, PROTOCOLS, STATUSES};
use super::table::{lock_range, mono_ns, Slot, Table, BUCKETS_NS, SLOTS, TABLE_BYTES};

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
            proto: match version {
                http::Version::HTTP_2 => Proto::Http2,
                http::Version::HTTP_3 => Proto::Http3,
                _ => Proto::Http1,
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
        self.table.map(|t| super::render::render(&t))
    }
}

/// The `method` label's index in [`METHODS`](super::labels::METHODS).
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
