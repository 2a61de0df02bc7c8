//! The per-worker Tokio runtime, built after fork (in `Server.serve`) and
//! never in Gunicorn's master.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::{Builder, Runtime};

use crate::asgi::context::AppContext;
use crate::server::listen::StdListener;
use crate::server::run::{self, RunError};
use crate::worker::Worker;

/// A current-thread runtime for one thread (it runs on the caller's thread:
/// no extra thread, no cross-thread task stealing), else a multi-thread one.
///
/// With one thread, events for the asyncio thread are announced when the
/// runtime parks: every request read in one tick travels in one batch.
fn build(shared: &Arc<Worker>) -> io::Result<Runtime> {
    let threads = shared.config.tokio_threads;
    if threads <= 1 {
        current_thread(shared)
    } else {
        Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("skirr-tokio")
            .enable_all()
            .build()
    }
}

/// The current-thread runtime: on its own thread (dual mode) or driven by
/// the asyncio loop's selector (single mode, `server::single`). Either way
/// events for Python are announced when it is about to park.
pub(crate) fn current_thread(shared: &Arc<Worker>) -> io::Result<Runtime> {
    let s = Arc::clone(shared);
    Builder::new_current_thread()
        .enable_all()
        .on_thread_park(move || {
            s.queue.flush();
            s.trim.maybe_trim();
        })
        .build()
}

/// Builds the runtime and serves until the server stops.
pub(crate) fn run(
    app: Arc<AppContext>,
    listeners: Vec<StdListener>,
    h3: Option<Arc<crate::proto::h3::Setup>>,
) -> Result<(), RunError> {
    let shared = &app.shared;
    let rt = build(shared)?;
    shared.signals.attach(rt.handle().clone());
    let res = rt.block_on(run::run(Arc::clone(&app), listeners, h3));
    rt.shutdown_timeout(Duration::from_millis(100));
    res
}
