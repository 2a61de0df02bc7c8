//! The exposition text (Prometheus text format 0.0.4) of a whole table:
//! each metric's `# HELP`/`# TYPE` head, then one line per slot (and
//! label set).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::labels::{LIMITS, METHODS, PROTOCOLS, STATUSES};
use super::table::{mono_ns, Slot, Table, BUCKETS_S, SLOTS};

/// A slot that was ever claimed: its index, counters, and whether a live
/// worker holds it.
type Used<'a> = [(usize, &'a Slot, bool)];

fn gauge(v: &AtomicU64) -> i64 {
    v.load(Relaxed) as i64
}

/// Renders every slot that was ever claimed.
pub(super) fn render(t: &Table) -> String {
    let used: Vec<(usize, &Slot, bool)> = (0..SLOTS)
        .map(|i| (i, t.slot(i)))
        .filter(|(_, s)| s.starts.load(Relaxed) > 0)
        .map(|(i, s)| (i, s, t.alive(i)))
        .collect();
    let mut out = String::with_capacity(4096 + used.len() * 4096);
    let o = &mut out;
    requests(o, &used);
    connections(o, &used);
    websockets(o, &used);
    bytes_and_refusals(o, &used);
    event_loop_and_workers(o, &used);
    out
}

/// A metric's `# HELP` and `# TYPE` lines. (Writing to a `String` cannot
/// fail, here and below.)
fn head(o: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// One line per slot (only live ones if `alive_only`): `name{worker=…} value`.
fn per_slot(
    o: &mut String,
    used: &Used<'_>,
    name: &str,
    alive_only: bool,
    value: &dyn Fn(&Slot) -> i64,
) {
    for &(i, s, alive) in used {
        if alive || !alive_only {
            let _ = writeln!(o, "{name}{{worker=\"{i}\"}} {}", value(s));
        }
    }
}

/// `skirr_requests_total` and the request duration histogram.
fn requests(o: &mut String, used: &Used<'_>) {
    head(
        o,
        "skirr_requests_total",
        "counter",
        "Requests answered (the response body done), by worker slot, method, status class and protocol.",
    );
    for &(i, s, _) in used {
        for (m, method) in METHODS.iter().enumerate() {
            for (c, status) in STATUSES.iter().enumerate() {
                for (p, proto) in PROTOCOLS.iter().enumerate() {
                    let n =
                        s.requests[(m * STATUSES.len() + c) * PROTOCOLS.len() + p].load(Relaxed);
                    if n > 0 {
                        let _ = writeln!(
                            o,
                            "skirr_requests_total{{worker=\"{i}\",method=\"{method}\",status=\"{status}\",protocol=\"{proto}\"}} {n}"
                        );
                    }
                }
            }
        }
    }

    head(
        o,
        "skirr_request_duration_seconds",
        "histogram",
        "Time from a request's head to the end of its response body.",
    );
    for &(i, s, _) in used {
        let mut cum = 0u64;
        for (b, le) in BUCKETS_S.iter().enumerate() {
            cum += s.duration[b].load(Relaxed);
            let _ = writeln!(
                o,
                "skirr_request_duration_seconds_bucket{{worker=\"{i}\",le=\"{le}\"}} {cum}"
            );
        }
        cum += s.duration[BUCKETS_S.len()].load(Relaxed);
        let sum = s.duration_sum_ns.load(Relaxed) as f64 / 1e9;
        let _ = writeln!(
            o,
            "skirr_request_duration_seconds_bucket{{worker=\"{i}\",le=\"+Inf\"}} {cum}\n\
             skirr_request_duration_seconds_sum{{worker=\"{i}\"}} {sum}\n\
             skirr_request_duration_seconds_count{{worker=\"{i}\"}} {cum}"
        );
    }
}

/// Requests in flight and connections, open and served.
fn connections(o: &mut String, used: &Used<'_>) {
    head(
        o,
        "skirr_requests_in_flight",
        "gauge",
        "Requests between their head and the end of their response.",
    );
    per_slot(o, used, "skirr_requests_in_flight", true, &|s| {
        gauge(&s.in_flight)
    });

    head(
        o,
        "skirr_connections_open",
        "gauge",
        "Client connections open, by protocol.",
    );
    for &(i, s, _) in used.iter().filter(|u| u.2) {
        for (p, proto) in PROTOCOLS.iter().enumerate() {
            let _ = writeln!(
                o,
                "skirr_connections_open{{worker=\"{i}\",protocol=\"{proto}\"}} {}",
                gauge(&s.conns_open[p])
            );
        }
    }
    head(
        o,
        "skirr_connections_total",
        "counter",
        "Client connections served, by protocol.",
    );
    for &(i, s, _) in used {
        for (p, proto) in PROTOCOLS.iter().enumerate() {
            let _ = writeln!(
                o,
                "skirr_connections_total{{worker=\"{i}\",protocol=\"{proto}\"}} {}",
                s.conns_total[p].load(Relaxed)
            );
        }
    }
}

/// WebSocket sessions and messages.
fn websockets(o: &mut String, used: &Used<'_>) {
    head(
        o,
        "skirr_websocket_sessions_open",
        "gauge",
        "WebSocket sessions open.",
    );
    per_slot(o, used, "skirr_websocket_sessions_open", true, &|s| {
        gauge(&s.ws_open)
    });
    head(
        o,
        "skirr_websocket_sessions_total",
        "counter",
        "WebSocket sessions accepted.",
    );
    per_slot(o, used, "skirr_websocket_sessions_total", false, &|s| {
        s.ws_total.load(Relaxed) as i64
    });
    head(
        o,
        "skirr_websocket_messages_total",
        "counter",
        "WebSocket data messages, by direction (in: from clients).",
    );
    for &(i, s, _) in used {
        for (d, dir) in ["in", "out"].iter().enumerate() {
            let _ = writeln!(
                o,
                "skirr_websocket_messages_total{{worker=\"{i}\",direction=\"{dir}\"}} {}",
                s.ws_messages[d].load(Relaxed)
            );
        }
    }
}

/// Bytes read and written, and the server's own answers by limit.
fn bytes_and_refusals(o: &mut String, used: &Used<'_>) {
    head(
        o,
        "skirr_received_bytes_total",
        "counter",
        "HTTP bytes read from clients (after TLS).",
    );
    per_slot(o, used, "skirr_received_bytes_total", false, &|s| {
        s.bytes[0].load(Relaxed) as i64
    });
    head(
        o,
        "skirr_sent_bytes_total",
        "counter",
        "HTTP bytes written to clients (before TLS).",
    );
    per_slot(o, used, "skirr_sent_bytes_total", false, &|s| {
        s.bytes[1].load(Relaxed) as i64
    });

    head(
        o,
        "skirr_refused_total",
        "counter",
        "Requests the server answered itself because of a limit (the option named).",
    );
    for &(i, s, _) in used {
        for (l, limit) in LIMITS.iter().enumerate() {
            let _ = writeln!(
                o,
                "skirr_refused_total{{worker=\"{i}\",limit=\"{limit}\"}} {}",
                s.refused[l].load(Relaxed)
            );
        }
    }
}

/// Event-loop lag and the workers' lives.
fn event_loop_and_workers(o: &mut String, used: &Used<'_>) {
    let now = mono_ns();
    head(
        o,
        "skirr_event_loop_lag_seconds",
        "gauge",
        "How late the asyncio loop ran its probe timer (or how overdue it is now).",
    );
    for &(i, s, _) in used.iter().filter(|u| u.2) {
        let due = s.loop_due_ns.load(Relaxed);
        let mut lag = s.loop_lag_ns.load(Relaxed);
        if due > 0 && now > due {
            lag = lag.max(now - due);
        }
        let _ = writeln!(
            o,
            "skirr_event_loop_lag_seconds{{worker=\"{i}\"}} {}",
            lag as f64 / 1e9
        );
    }

    head(
        o,
        "skirr_worker_up",
        "gauge",
        "1 while a live worker holds the slot.",
    );
    for &(i, _, alive) in used {
        let _ = writeln!(o, "skirr_worker_up{{worker=\"{i}\"}} {}", u8::from(alive));
    }
    head(
        o,
        "skirr_worker_starts_total",
        "counter",
        "Worker processes that took this slot.",
    );
    per_slot(o, used, "skirr_worker_starts_total", false, &|s| {
        s.starts.load(Relaxed) as i64
    });
    let restarts: u64 = used
        .iter()
        .map(|(_, s, _)| s.starts.load(Relaxed).saturating_sub(1))
        .sum();
    head(
        o,
        "skirr_worker_restarts_total",
        "counter",
        "Workers that replaced an earlier one (all slots).",
    );
    let _ = writeln!(o, "skirr_worker_restarts_total {restarts}");
}
