//! Rust log lines go through Python's `logging`, never raw stderr.
//!
//! A minimal `tracing` subscriber formats each enabled event into a
//! [`LogRecord`] and queues it for the asyncio thread, which hands it to the
//! server's error logger (Gunicorn's under Gunicorn, `skirr.error`
//! standalone), so its handlers, formatters and files apply. The level
//! threshold is read from that logger when the server starts, and disabled
//! levels cost one atomic load.
//!
//! A line an operator needs while the loop is stuck in the app (the loop
//! watchdog's stall warning) is marked `write_now = true` (a field that is
//! not printed) and written at once instead, by [`write_soon`]: a
//! short-lived thread of its own takes the GIL (which a blocked loop
//! thread normally releases, or gives up every few milliseconds) and
//! writes every queued line, never blocking Tokio.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Once};

use parking_lot::RwLock;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};

use pyo3::Python;

use crate::bridge::context::LoopCtx;
use crate::bridge::queue::{LogRecord, PyQueue};

/// Where lines go while a server runs: its queue, and the error logger
/// that [`write_soon`] writes them to.
struct Sink {
    queue: Arc<PyQueue>,
    loop_ctx: Arc<LoopCtx>,
}

static SINK: RwLock<Option<Arc<Sink>>> = RwLock::new(None);
/// Python level threshold; events below it are disabled.
static THRESHOLD: AtomicU8 = AtomicU8::new(30);

fn py_level(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 40,
        Level::WARN => 30,
        Level::INFO => 20,
        Level::DEBUG => 10,
        Level::TRACE => 5,
    }
}

/// The field that asks for [`write_soon`] (see the module docs).
const WRITE_NOW: &str = "write_now";

/// Formats an event's fields; notes [`WRITE_NOW`].
struct Message<'a> {
    text: &'a mut String,
    now: bool,
}

impl Visit for Message<'_> {
    fn record_bool(&mut self, field: &Field, value: bool) {
        if field.name() == WRITE_NOW {
            self.now = value;
        } else {
            let _ = write!(self.text, " {}={value}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.text.push_str(value);
        } else {
            let _ = write!(self.text, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.text, "{value:?}");
        } else {
            let _ = write!(self.text, " {}={value:?}", field.name());
        }
    }
}

struct PyLogSubscriber;

impl Subscriber for PyLogSubscriber {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        // The threshold can change at run time: ask `enabled` every time.
        Interest::sometimes()
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        py_level(metadata.level()) >= THRESHOLD.load(Ordering::Relaxed)
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut message = String::new();
        let mut fields = Message {
            text: &mut message,
            now: false,
        };
        event.record(&mut fields);
        let now = fields.now;
        let record = LogRecord {
            level: py_level(event.metadata().level()),
            message,
        };
        let sink = SINK.read();
        if let Some(s) = sink.as_ref() {
            s.queue.push_log(record);
            if now {
                let s = Arc::clone(s);
                drop(sink);
                write_soon(s);
            }
        } else {
            eprintln!("skirr: {}", record.message);
        }
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// Routes this process's Rust log lines to `queue`, at or above the given
/// `logging` level; `loop_ctx`'s error logger writes them.
pub(crate) fn install(queue: &Arc<PyQueue>, threshold: u8, loop_ctx: &Arc<LoopCtx>) {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let _ = tracing::subscriber::set_global_default(PyLogSubscriber);
    });
    THRESHOLD.store(threshold, Ordering::Relaxed);
    *SINK.write() = Some(Arc::new(Sink {
        queue: Arc::clone(queue),
        loop_ctx: Arc::clone(loop_ctx),
    }));
}

/// Stops routing log lines to the queue (the asyncio loop is stopping).
pub(crate) fn uninstall() {
    *SINK.write() = None;
}

/// Writes the log lines still queued through `loop_ctx`'s error logger,
/// from a thread other than the asyncio one, when the loop will not drain
/// the queue again (the app holds its thread as the worker exits). Other
/// events stay queued.
pub(crate) fn write_queued(py: Python<'_>, queue: &PyQueue, loop_ctx: &LoopCtx) {
    let mut queued = Vec::new();
    queue.take_logs(&mut queued);
    for r in queued {
        loop_ctx.log(py, r.level, &r.message);
    }
}

/// Writes the queued lines now, from a thread of its own that takes the
/// GIL (see the module docs), instead of at the loop's next drain. At most
/// one such thread at a time (a call while one runs does nothing: it
/// takes every line queued when it gets the GIL); never blocks the caller.
/// If the thread cannot be spawned, the lines wait for the loop.
fn write_soon(sink: Arc<Sink>) {
    static RUNNING: AtomicBool = AtomicBool::new(false);
    if RUNNING.swap(true, Ordering::SeqCst) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("skirr-log-writer".into())
        .stack_size(1024 * 1024)
        .spawn(move || {
            Python::attach(|py| write_queued(py, &sink.queue, &sink.loop_ctx));
            RUNNING.store(false, Ordering::SeqCst);
        });
    if spawned.is_err() {
        RUNNING.store(false, Ordering::SeqCst);
    }
}
