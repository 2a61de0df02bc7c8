"""Skirr: a production ASGI server written in Rust that runs as a Gunicorn worker.

Gunicorn::

    gunicorn -k skirr.RustWorker -w 4 app:app

Standalone (development, containers without Gunicorn)::

    python -m skirr app:app
"""

from skirr._skirr import ClientDisconnected, StartupFailed, __version__

__all__ = ["ClientDisconnected", "RustWorker", "StartupFailed", "__version__"]


def __getattr__(name: str):
    # Gunicorn is optional: import the worker only when it is asked for.
    if name == "RustWorker":
        from skirr.worker import RustWorker

        return RustWorker
    raise AttributeError(f"module 'skirr' has no attribute {name!r}")
