//! Skirr: an ASGI 3.0 server written in Rust, run as a Gunicorn worker or
//! standalone (`python -m skirr`).
//!
//! Each worker process builds, after fork, one Tokio runtime that owns every
//! socket (HTTP/1.1 and HTTP/2 by hyper; HTTP/3 by quinn and h3, on a UDP
//! socket of its own; WebSockets on Skirr's own framing with
//! permessage-deflate, `wire::ws_frame`, deflate by flate2) and one
//! asyncio thread that runs the app; the [`bridge`] moves work between them
//! in batches.
//!
//! The modules stand on floors: each uses only the floors below it
//! (`tests/test_layers.py` checks this, and that no circle of files crosses
//! a folder):
//!
//! ```text
//! server/     composition root: Server, run, listen, accept, tls, runtime,
//!             single (loop_mode single)
//! proto/      wire-protocol drivers: h1/, h2/, h3/, ws/ (none uses another;
//!             ws/ also answers the handshake),
//!             mod.rs picks one, dispatch.rs routes a request
//! http/       HTTP semantics shared by every version (Tokio side):
//!             drivers' connection state (ctx.rs), service (generic over
//!             the request body), body, compression, interim responses
//! asgi/       protocol-neutral ASGI: application context, connection
//!             facts (conn.rs), scopes, the app's start, messages,
//!             lifespan; http/: the HTTP exchange, receive/send, access
//!             log; websocket/: a WebSocket's receive/send, shared state
//! worker/     the worker's shared state        logging.rs
//! bridge/     Tokio <-> asyncio: queue of jobs and wakes, task type
//! config/     options          errors.rs, metrics/, wire/ (Python-free)
//! ```
//!
//! The bridge names no protocol: a request reaches the asyncio thread as a
//! [`Job`](bridge::queue::Job) and news for its waiters as a
//! [`Wake`](bridge::queue::Wake); an application coroutine's owner is a
//! [`TaskOwner`](bridge::owner::TaskOwner). A wire protocol is a `proto/`
//! folder (HTTP/3 is `proto/h3`). [`wire`] holds the checks Skirr adds to
//! hyper's parser; it is the only module built without the `python` feature
//! (for the fuzz targets).

// No function over `too-many-lines-threshold` (clippy.toml) lines.
#![warn(clippy::too_many_lines)]

#[cfg(feature = "python")]
mod asgi;
#[cfg(feature = "python")]
mod bridge;
#[cfg(feature = "python")]
pub mod config;
#[cfg(feature = "python")]
mod errors;
#[cfg(feature = "python")]
mod http;
#[cfg(feature = "python")]
mod logging;
#[cfg(feature = "python")]
mod metrics;
#[cfg(feature = "python")]
mod proto;
#[cfg(feature = "python")]
mod server;
pub mod wire;
#[cfg(feature = "python")]
mod worker;

// jemalloc keeps each size class in its own slabs: the few long-lived
// objects of a parked connection do not pin the pages of the 8 KiB hyper
// buffers freed around them (see bench/NOTES.md). Its symbols are prefixed,
// so CPython's own allocations stay with the system allocator.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read once at its first allocation: one arena (a
/// worker has two busy threads; more arenas cost idle memory), freed pages
/// returned to the OS after 1 s instead of 10 s, and the thread caches'
/// garbage collection every 1 MiB allocated instead of every 64 KiB (each
/// request allocates a read buffer of 8 KiB: at 64 KiB the collection ran
/// every eighth request; bench/NOTES.md, entry 28).
#[cfg(feature = "jemalloc")]
#[export_name = "_rjem_malloc_conf"]
pub static JEMALLOC_CONF: JemallocConf = JemallocConf(
    c"narenas:1,dirty_decay_ms:1000,muzzy_decay_ms:0,tcache_gc_incr_bytes:1048576".as_ptr(),
);

/// A C string pointer jemalloc reads as `const char *malloc_conf`.
#[cfg(feature = "jemalloc")]
#[repr(transparent)]
pub struct JemallocConf(*const std::ffi::c_char);

// SAFETY: the pointer is to a 'static, immutable C string literal.
#[cfg(feature = "jemalloc")]
unsafe impl Sync for JemallocConf {}

#[cfg(feature = "python")]
use pyo3::prelude::*;

/// The `skirr._skirr` extension module.
#[cfg(feature = "python")]
#[pymodule]
fn _skirr(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<server::Server>()?;
    bridge::slots::install(py);
    m.add(
        "ClientDisconnected",
        py.get_type::<errors::ClientDisconnected>(),
    )?;
    m.add("StartupFailed", py.get_type::<errors::StartupFailed>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(pyo3::wrap_pyfunction!(metrics_table, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(config::effective_config, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(h3_steer_check, m)?)?;
    Ok(())
}

/// Attaches HTTP/3's packet-steering program (for an empty table) to the
/// `SO_REUSEPORT` group of the bound UDP socket `fd`: the Gunicorn master
/// calls it once, before forking, to learn whether steering works here.
///
/// Raises `OSError` naming the kernel's refusal.
#[cfg(feature = "python")]
#[pyfunction]
fn h3_steer_check(fd: i32) -> PyResult<()> {
    Ok(proto::h3::steer::check(fd)?)
}

/// Creates the shared metrics table (`metrics_bind`) in the process that
/// forks the workers, before it forks; returns its descriptor, to keep
/// open and hand to each worker's server as `metrics_table_fd`.
///
/// Raises `OSError` if the memfd cannot be created.
#[cfg(feature = "python")]
#[pyfunction]
fn metrics_table() -> PyResult<i32> {
    Ok(metrics::create_table()?)
}

#[cfg(all(test, feature = "jemalloc"))]
mod tests {
    /// Reads a jemalloc option of type `T` (its C type's size) by name.
    fn opt<T: Copy + Default>(name: &std::ffi::CStr) -> T {
        let mut value = T::default();
        let mut len = std::mem::size_of::<T>();
        // SAFETY: `value` and `len` describe a writable buffer of exactly
        // the option's size; mallctl fails with EINVAL otherwise.
        let rc = unsafe {
            tikv_jemalloc_sys::mallctl(
                name.as_ptr(),
                (&mut value as *mut T).cast(),
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        assert_eq!(rc, 0, "mallctl {name:?}");
        value
    }

    #[test]
    fn jemalloc_reads_skirrs_options() {
        assert_eq!(opt::<isize>(c"opt.dirty_decay_ms"), 1000);
        assert_eq!(opt::<isize>(c"opt.muzzy_decay_ms"), 0);
        assert_eq!(opt::<u32>(c"opt.narenas"), 1);
        assert_eq!(opt::<usize>(c"opt.tcache_gc_incr_bytes"), 1 << 20);
    }
}
