//! The shared table: a memfd of [`SLOTS`] fixed-size slots of atomic
//! counters, one per worker, and the locks that say which are alive.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::AtomicU64;

use super::labels::{LIMITS, METHODS, PROTOCOLS, STATUSES};

/// Slots in a table: workers that can report at once (Gunicorn's `-w`,
/// plus the replacements that start while the old ones still drain).
pub const SLOTS: usize = 256;
/// Bytes per slot (a [`Slot`] fits; slots never share a lock range).
pub(super) const SLOT_BYTES: usize = 2048;
/// The table's size in bytes.
pub(super) const TABLE_BYTES: usize = SLOTS * SLOT_BYTES;

/// Request duration histogram bounds, in seconds (`le` labels); a last
/// bucket counts everything above (`+Inf`).
pub(super) const BUCKETS_S: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// The same bounds in nanoseconds (compared on the request path).
pub(super) const BUCKETS_NS: [u64; 13] = [
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

pub(super) const REQ_CELLS: usize = METHODS.len() * STATUSES.len() * PROTOCOLS.len();

/// One worker's counters; all-zero bytes are a valid, empty slot.
/// Gauges are `u64`s updated with wrapping adds of ±1 (read as `i64`).
#[repr(C)]
pub(super) struct Slot {
    /// Processes that claimed this slot (`skirr_worker_starts_total`).
    pub(super) starts: AtomicU64,
    /// The current (or last) owner's pid.
    pub(super) pid: AtomicU64,
    pub(super) in_flight: AtomicU64,
    pub(super) conns_open: [AtomicU64; PROTOCOLS.len()],
    pub(super) conns_total: [AtomicU64; PROTOCOLS.len()],
    pub(super) ws_open: AtomicU64,
    pub(super) ws_total: AtomicU64,
    /// WebSocket data messages: received, sent.
    pub(super) ws_messages: [AtomicU64; 2],
    /// HTTP bytes (after TLS) read, written.
    pub(super) bytes: [AtomicU64; 2],
    /// How late the event loop ran its last probe timer (ns).
    pub(super) loop_lag_ns: AtomicU64,
    /// When the next probe is due (CLOCK_MONOTONIC ns; 0: no probe yet).
    pub(super) loop_due_ns: AtomicU64,
    pub(super) refused: [AtomicU64; LIMITS.len()],
    pub(super) duration_sum_ns: AtomicU64,
    /// Per bucket (not cumulative); the last one is `+Inf`.
    pub(super) duration: [AtomicU64; BUCKETS_NS.len() + 1],
    /// [method][status][protocol].
    pub(super) requests: [AtomicU64; REQ_CELLS],
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
    pub(super) base: std::ptr::NonNull<u8>,
    pub(super) fd: RawFd,
    /// This process's slot.
    pub(super) own: usize,
}

// SAFETY: the mapping is shared memory valid for the life of the process
// and accessed only through the atomics of `Slot`, which are Sync.
unsafe impl Send for Table {}
// SAFETY: as above.
unsafe impl Sync for Table {}

impl Table {
    pub(super) fn slot(&self, i: usize) -> &'static Slot {
        // SAFETY: `i < SLOTS`, so the slot lies inside the mapping, which
        // is page-aligned (slots are at multiples of SLOT_BYTES, a multiple
        // of 8) and never unmapped; all-zero bytes are valid atomics, and
        // every process touches the memory only through atomics.
        unsafe { &*(self.base.as_ptr().add(i * SLOT_BYTES) as *const Slot) }
    }

    /// Whether slot `i` has a live owner (a process holding its lock).
    pub(super) fn alive(&self, i: usize) -> bool {
        if i == self.own {
            return true; // our own lock never shows as a conflict
        }
        let mut fl = lock_range(i, libc::F_WRLCK);
        // SAFETY: F_GETLK on our fd with a valid `flock`, which it fills in.
        let rc = unsafe { libc::fcntl(self.fd, libc::F_GETLK, &mut fl) };
        rc == 0 && fl.l_type != libc::F_UNLCK as libc::c_short
    }
}

/// A record lock request (`kind`) on slot `i`'s bytes.
pub(super) fn lock_range(i: usize, kind: libc::c_int) -> libc::flock {
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
pub(super) fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}
