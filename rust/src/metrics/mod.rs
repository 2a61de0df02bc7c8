//! Prometheus metrics for every worker of a Gunicorn master, in shared
//! memory (`metrics_bind`).
//!
//! * The table. The master (or `python -m skirr`) creates it before it
//!   forks ([`create_table`]): a memfd of [`SLOTS`](table::SLOTS)
//!   fixed-size slots of atomic `u64` counters, mapped `MAP_SHARED` by each
//!   worker ([`table`]). A worker
//!   claims the first free slot with an `fcntl` record lock on the slot's
//!   byte range ([`Recorder::attach`]); the kernel drops the lock when the
//!   process dies, however it dies (SIGKILL included), so the worker that
//!   replaces it takes the same slot over.
//! * Counters are cumulative per slot, never reset: a replacement worker
//!   adds to its predecessor's counts, so `skirr_requests_total{worker="0"}`
//!   never decreases across a `max_requests` recycle, as Prometheus expects
//!   of a counter. The `worker` label is the slot's index, not a pid.
//!   Gauges (in flight, open connections) are zeroed when a slot is taken
//!   over, and a dead worker's gauges are not shown.
//! * Writers. Each worker writes its own slot from the Tokio side with
//!   relaxed atomic adds (no lock, no GIL); [`Recorder`] is the handle,
//!   a no-op when metrics are off.
//! * The exposition. The listener is bound by the master and inherited;
//!   every worker accepts on it ([`serve`]) and renders the whole table
//!   (Prometheus text format 0.0.4), so any worker answers for all of them
//!   and a scrape never waits for a busy worker's GIL or event loop.
//!
//! The label values are in [`labels`], the writers in [`recorder`], the text
//! in [`render`], the listener in [`scrape`].
//!
//! The text is rendered here rather than with the `prometheus` crate: the
//! values live in shared memory as plain atomics, which that crate's
//! registry cannot read without copying every slot into its own metric
//! objects per scrape; the format itself is a few lines of text.

mod labels;
mod recorder;
mod render;
mod scrape;
mod table;

pub(crate) use labels::{Limit, Proto, RESPONSE_START_REASON};
pub(crate) use recorder::{OpenGauge, Recorder, RequestMeter};
pub(crate) use scrape::{listener, serve};
pub use table::create_table;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_survive_a_new_owner_and_render() {
        let fd = create_table().expect("memfd");
        let rec = Recorder::attach(fd).expect("attach");
        assert_eq!(rec.index(), Some(0));
        {
            let mut m = rec
                .request(&http::Method::GET, http::Version::HTTP_11)
                .expect("metrics on");
            m.set_status(http::StatusCode::OK);
        }
        {
            let mut m = rec
                .request(&http::Method::GET, http::Version::HTTP_3)
                .expect("metrics on");
            m.set_status(http::StatusCode::NOT_FOUND);
        }
        {
            let _gone = rec.request(&http::Method::POST, http::Version::HTTP_2);
        }
        rec.refused_answer(
            http::StatusCode::PAYLOAD_TOO_LARGE,
            "request body too large",
        );
        rec.refused_answer(http::StatusCode::BAD_REQUEST, "invalid request body");
        rec.refused_answer(http::StatusCode::SERVICE_UNAVAILABLE, "some other limit");
        rec.refused_answer(http::StatusCode::SERVICE_UNAVAILABLE, RESPONSE_START_REASON);
        let text = rec.render().expect("rendered");
        assert!(text.contains(
            "skirr_requests_total{worker=\"0\",method=\"GET\",status=\"2xx\",protocol=\"http1\"} 1\n"
        ));
        assert!(
            !text.contains("method=\"POST\""),
            "no response, not counted"
        );
        assert!(text.contains(
            "skirr_requests_total{worker=\"0\",method=\"GET\",status=\"4xx\",protocol=\"http3\"} 1\n"
        ));
        assert!(text.contains("skirr_requests_in_flight{worker=\"0\"} 0\n"));
        assert!(text.contains("skirr_request_duration_seconds_count{worker=\"0\"} 2\n"));
        assert!(text.contains("skirr_refused_total{worker=\"0\",limit=\"max_body_size\"} 1\n"));
        assert!(
            text.contains("skirr_refused_total{worker=\"0\",limit=\"response_start_timeout\"} 1\n")
        );
        assert!(text.contains("skirr_worker_starts_total{worker=\"0\"} 1\n"));
        assert!(text.contains("skirr_worker_restarts_total 0\n"));
    }
}
