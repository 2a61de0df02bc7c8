//! Giving memory freed by parked connections back to the OS.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Gives memory freed by parked connections back to the OS.
///
/// A burst of activity leaves hyper's per-connection buffers freed but
/// still mapped (the allocator keeps them); once enough connections have
/// parked, the free pages are returned (jemalloc's `arena.<all>.purge`, or
/// glibc's `malloc_trim` without the `jemalloc` feature). It runs on the
/// Tokio thread just before it idles, so never while requests are waiting.
#[derive(Default)]
pub(crate) struct Trim {
    parked: AtomicUsize,
}

impl Trim {
    /// Parked connections that make a trim worthwhile (each freed ≈ 8 KiB).
    const MIN_PARKED: usize = 128;

    /// A connection parked (its hyper buffers were freed).
    pub(crate) fn parked(&self) {
        self.parked.fetch_add(1, Ordering::Relaxed);
    }

    /// Trims when enough connections parked since the last trim (the
    /// Tokio thread, before it idles).
    pub(crate) fn maybe_trim(&self) {
        if self.parked.load(Ordering::Relaxed) < Self::MIN_PARKED {
            return;
        }
        self.parked.store(0, Ordering::Relaxed);
        #[cfg(feature = "jemalloc")]
        // SAFETY: `arena.<MALLCTL_ARENAS_ALL>.purge` takes no input and no
        // output; it returns every arena's unused dirty pages to the OS.
        unsafe {
            tikv_jemalloc_sys::mallctl(
                c"arena.4096.purge".as_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            );
        }
        #[cfg(all(not(feature = "jemalloc"), target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim only releases free heap pages; it takes the
        // allocator's locks itself and is safe to call from any thread.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}
