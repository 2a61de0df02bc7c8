//! The bridge between the Tokio runtime (which owns every socket) and the
//! asyncio thread (which runs the application).
//!
//! Data crosses in two directions, and in both directions it is *batched*:
//!
//! * Tokio → Python: [`queue::PyQueue`]. Tokio tasks push [`queue::Event`]s
//!   without touching the GIL; the first push after a drain writes one
//!   eventfd the asyncio loop watches (`loop.add_reader`). One reader callback
//!   then handles every queued event while holding the GIL once.
//! * Python → Tokio: [`wake::Wakeups`]. The asyncio thread never blocks on a
//!   Tokio primitive: it stores results in shared state and hands the waiting
//!   task's `Waker` to a batch that a single dispatcher task drains. While the
//!   reader callback runs, wakes are deferred and flushed once at its end.
//!
//! The per-request shared state lives in `crate::http::exchange`; the
//! awaitables handed to applications live in [`awaitable`], and the wrapper
//! that runs an application coroutine inside an asyncio Task in [`task`].

pub(crate) mod app_call;
pub(crate) mod awaitable;
pub(crate) mod context;
pub(crate) mod names;
pub(crate) mod queue;
pub(crate) mod slots;
pub(crate) mod task;
pub(crate) mod waiter;
pub(crate) mod wake;
