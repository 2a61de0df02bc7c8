//! The process-wide coarse clock the connection timers, the connection
//! registry and the loop watchdog read.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// `CLOCK_MONOTONIC_COARSE` in milliseconds: read a few times per request,
/// so the cheapest clock will do (its resolution, a few ms, is far below
/// any timeout's).
fn coarse_ms() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC_COARSE)
        .unwrap_or_else(|_| nix::sys::time::TimeSpec::new(0, 0));
    ts.tv_sec() as u64 * 1000 + ts.tv_nsec() as u64 / 1_000_000
}

fn clock_base() -> (Instant, u64) {
    static BASE: OnceLock<(Instant, u64)> = OnceLock::new();
    *BASE.get_or_init(|| (Instant::now(), coarse_ms()))
}

/// Milliseconds on a process-wide monotonic clock, for connection timers.
pub(crate) fn clock_ms() -> u64 {
    coarse_ms().saturating_sub(clock_base().1)
}

/// The Tokio instant of a [`clock_ms`] reading.
pub(crate) fn deadline_at(ms: u64) -> tokio::time::Instant {
    tokio::time::Instant::from_std(clock_base().0 + Duration::from_millis(ms))
}
