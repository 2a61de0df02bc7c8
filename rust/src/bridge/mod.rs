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
//! Application calls start in [`start`] and run in Skirr's own [`task`]
//! (or, wrapped in an [`app_call`], in an `asyncio.Task`); both drive the
//! coroutine with [`coro`] and report its steps to its [`owner`]. What
//! `receive()`/`send()` return is an [`awaitable`] or a [`waiter`], whose C
//! slots are in [`slots`]. The state a request shares between the two
//! threads belongs to the protocol that queues it, not to the bridge.

pub(crate) mod app_call;
pub(crate) mod asyncio;
pub(crate) mod awaitable;
pub(crate) mod context;
pub(crate) mod coro;
pub(crate) mod names;
pub(crate) mod owner;
pub(crate) mod queue;
pub(crate) mod slots;
pub(crate) mod start;
pub(crate) mod task;
pub(crate) mod waiter;
pub(crate) mod wake;
