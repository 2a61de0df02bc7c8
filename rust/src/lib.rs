//! Skirr: an ASGI 3.0 server written in Rust, run as a Gunicorn worker or
//! standalone (`python -m skirr`).
//!
//! Each worker process builds, after fork, one Tokio runtime that owns every
//! socket (HTTP/1.1 by hyper) and one asyncio thread that runs the app; the
//! [`bridge`] moves work between them in batches. Modules follow the data:
//! [`server`] (accept, drain, signals) → [`http`] (parse, scope, send) →
//! [`lifespan`], with [`config`], [`runtime`] and [`logging`] beside them.
//! [`wire`] holds the checks Skirr adds to hyper's parser; it is the only
//! module built without the `python` feature (for the fuzz targets).

#[cfg(feature = "python")]
mod bridge;
#[cfg(feature = "python")]
pub mod config;
#[cfg(feature = "python")]
mod errors;
#[cfg(feature = "python")]
mod http;
#[cfg(feature = "python")]
mod lifespan;
#[cfg(feature = "python")]
mod logging;
#[cfg(feature = "python")]
mod runtime;
#[cfg(feature = "python")]
mod server;
#[cfg(feature = "python")]
mod websocket;
pub mod wire;

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
    Ok(())
}
