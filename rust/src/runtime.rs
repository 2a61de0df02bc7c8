//! The per-worker Tokio runtime, built after fork (in `Server.serve`) and
//! never in Gunicorn's master.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::{Builder, Runtime};

use crate::server::listen::StdListener;
use crate::server::run::{self, RunError};
use crate::server::Shared;

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

    fn maybe_trim(&self) {
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

/// A current-thread runtime for one thread (it runs on the caller's thread:
/// no extra thread, no cross-thread task stealing), else a multi-thread one.
///
/// With one thread, events for the asyncio thread are announced when the
/// runtime parks: every request read in one tick travels in one batch.
fn build(shared: &Arc<Shared>) -> io::Result<Runtime> {
    let threads = shared.config.tokio_threads;
    if threads <= 1 {
        let s = Arc::clone(shared);
        Builder::new_current_thread()
            .enable_all()
            .on_thread_park(move || {
                s.queue.flush();
                s.trim.maybe_trim();
            })
            .build()
    } else {
        Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("skirr-tokio")
            .enable_all()
            .build()
    }
}

/// Builds the runtime and serves until the server stops.
pub(crate) fn run(shared: Arc<Shared>, listeners: Vec<StdListener>) -> Result<(), RunError> {
    let rt = build(&shared)?;
    shared.signals.attach(rt.handle().clone());
    let res = rt.block_on(run::run(shared, listeners));
    rt.shutdown_timeout(Duration::from_millis(100));
    res
}
