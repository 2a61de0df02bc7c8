"""`metrics_bind` (issue 19): one Prometheus endpoint for every worker of a
Gunicorn master, over real sockets with a real master; the scrapes are
parsed with prometheus_client's parser, and a real Prometheus server (the
Debian package) scrapes and is queried when its binary is installed."""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from harness import PY, TIMEOUT, RawConn, free_port, gunicorn, request, skirr, start, wait_until, worker_pids
from prometheus_client.parser import text_string_to_metric_families

APP = "apps.metrics_app:app"
DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "skirr-dashboard.json"


def dashboard_exprs() -> list[str]:
    """The PromQL of every panel of deploy/grafana/skirr-dashboard.json, with
    Grafana's variables replaced as Grafana would."""
    d = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in d["panels"] for t in p["targets"]]
    return [e.replace("$__rate_interval", "1m").replace("$__range", "5m").replace("$job", ".*") for e in exprs]



def scrape_text(port: int) -> str:
    with RawConn(port) as c:
        c.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        r = c.read_response()
    assert r.status == 200, r
    assert r.header("content-type").startswith("text/plain; version=0.0.4")
    return r.body.decode()


def scrape(port: int) -> dict[str, list]:
    """Family name → samples, through prometheus_client's parser."""
    return {f.name: (f.type, f.samples) for f in text_string_to_metric_families(scrape_text(port))}


def total(fams, family: str, sample: str | None = None, **labels) -> float:
    _, samples = fams[family]
    return sum(
        s.value
        for s in samples
        if (sample is None or s.name == sample) and all(s.labels.get(k) == v for k, v in labels.items())
    )


def settled(port: int) -> float:
    """``skirr_requests`` once no request is in flight and no connection
    open: every request made so far counted (a request is counted when
    hyper drops its body, before its connection ends)."""

    def quiet():
        fams = scrape(port)
        idle = total(fams, "skirr_requests_in_flight") == 0 and total(fams, "skirr_connections_open") == 0
        return idle and (total(fams, "skirr_requests"),)

    return wait_until(quiet, what="no request in flight, no connection open")[0]


def posts(port: int, n: int, threads: int = 4) -> None:
    """`n` POSTs, each on its own connection, from `threads` clients."""
    errors = []

    def run(k: int) -> None:
        for _ in range(k):
            try:
                r = request(port, "POST", "/", body=b"x" * 100)
                assert r.status == 200
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

    ts = [threading.Thread(target=run, args=(n // threads + (i < n % threads),)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(TIMEOUT * 3)
    assert not errors, errors[:3]


def test_two_workers_one_endpoint_counts_sum():
    mport = free_port()
    with gunicorn(APP, "-w", "2", env={"SKIRR_METRICS_BIND": f"127.0.0.1:{mport}"}) as g:
        wait_until(lambda: len(worker_pids(g.proc.pid)) == 2, what="2 workers")
        wait_until(lambda: total(scrape(mport), "skirr_worker_up") == 2, what="both workers in the table")
        posts(g.port, 200)
        # Counted when hyper has written the body: possibly just after the
        # client read it.
        wait_until(lambda: total(scrape(mport), "skirr_requests", method="POST") == 200, what="200 POSTs counted")
        fams = scrape(mport)
        assert fams["skirr_requests"][0] == "counter"
        assert {s.labels["worker"] for s in fams["skirr_worker_up"][1]} == {"0", "1"}
        assert total(fams, "skirr_requests", method="POST", status="2xx", protocol="http1") == 200
        assert fams["skirr_request_duration_seconds"][0] == "histogram"
        count = total(fams, "skirr_request_duration_seconds", "skirr_request_duration_seconds_count")
        assert count == total(fams, "skirr_requests")
        assert total(fams, "skirr_requests_in_flight") == 0
        assert total(fams, "skirr_received_bytes") > 200 * 100
        assert total(fams, "skirr_connections", "skirr_connections_total", protocol="http1") >= 200
        assert total(fams, "skirr_worker_restarts") == 0
        # Every series the Grafana dashboard reads is in the scrape.
        names = {s.name for _, samples in fams.values() for s in samples}
        wanted = {m for e in dashboard_exprs() for m in re.findall(r"skirr_[a-z_]+", e)}
        assert wanted and wanted <= names, wanted - names
        print("scrape with -w 2:\n" + scrape_text(mport)[:1500])


def test_counters_survive_max_requests_recycling():
    mport = free_port()
    with gunicorn(APP, "-w", "1", "--max-requests", "40", env={"SKIRR_METRICS_BIND": f"127.0.0.1:{mport}"}) as g:
        first = worker_pids(g.proc.pid)
        seen = []
        for _ in range(6):
            posts(g.port, 25, threads=1)
            seen.append(total(scrape(mport), "skirr_requests", method="POST"))
        assert seen == sorted(seen), f"a counter went down: {seen}"
        wait_until(lambda: total(scrape(mport), "skirr_requests", method="POST") == 150, what="150 POSTs counted")
        fams = scrape(mport)
        # One slot, taken over by each replacement (the kernel dropped the
        # dead worker's lock): the same series, never reset.
        assert {s.labels["worker"] for s in fams["skirr_worker_starts"][1]} == {"0"}
        assert total(fams, "skirr_worker_starts") >= 4
        assert total(fams, "skirr_worker_restarts") == total(fams, "skirr_worker_starts") - 1
        assert set(first).isdisjoint(worker_pids(g.proc.pid))
        assert "Autorestarting worker" in g.logs()


def test_a_killed_worker_keeps_its_counts_and_its_slot_is_taken_over():
    mport = free_port()
    with gunicorn(APP, "-w", "1", env={"SKIRR_METRICS_BIND": f"127.0.0.1:{mport}"}) as g:
        posts(g.port, 30, threads=1)
        wait_until(lambda: total(scrape(mport), "skirr_requests", method="POST") == 30, what="30 counted")
        (pid,) = worker_pids(g.proc.pid)
        subprocess.run(["kill", "-KILL", str(pid)], check=True)
        wait_until(lambda: worker_pids(g.proc.pid) not in ([], [pid]), what="a new worker")
        wait_until(lambda: total(scrape(mport), "skirr_worker_starts") == 2, what="the slot taken over")
        posts(g.port, 10, threads=1)
        wait_until(lambda: total(scrape(mport), "skirr_requests", method="POST") == 40, what="40 counted")
        assert {s.labels["worker"] for s in scrape(mport)["skirr_worker_up"][1]} == {"0"}


def test_a_hup_keeps_the_endpoint_and_the_totals():
    mport = free_port()
    with gunicorn(APP, "-w", "2", env={"SKIRR_METRICS_BIND": f"127.0.0.1:{mport}"}) as g:
        old = set(wait_until(lambda: len(worker_pids(g.proc.pid)) == 2 and worker_pids(g.proc.pid), what="workers"))
        posts(g.port, 50)
        wait_until(lambda: total(scrape(mport), "skirr_requests", method="POST") == 50, what="50 counted")
        g.send_signal(signal.SIGHUP)
        wait_until(
            lambda: len(worker_pids(g.proc.pid)) == 2 and not old & set(worker_pids(g.proc.pid)), what="new workers"
        )
        wait_until(lambda: total(scrape(mport), "skirr_worker_up") == 2, what="2 live slots")
        posts(g.port, 50)
        wait_until(lambda: total(scrape(mport), "skirr_requests", method="POST") == 100, what="100 counted")
        fams = scrape(mport)
        # A new worker takes a free slot: a new one while the old workers
        # drain, or an old one's once it has exited (its counts stay).
        assert total(fams, "skirr_worker_starts") == 4
        assert 2 <= len(fams["skirr_worker_up"][1]) <= 4
        assert len(fams["skirr_requests_in_flight"][1]) == 2, "gauges of live workers only"


def boot_error(env: dict, *args: str) -> str:
    with gunicorn(APP, *args, env=env, ready=False) as g:
        assert g.wait(30) == 3, g.logs()
        return g.logs()


def test_port_in_use_is_a_boot_error_naming_the_setting(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        logs = boot_error({"SKIRR_METRICS_BIND": f"127.0.0.1:{port}"})
        assert f"metrics_bind 127.0.0.1:{port}: cannot bind: address already in use" in logs
        conf = tmp_path / "conf.py"
        conf.write_text(f"skirr_metrics_bind = '127.0.0.1:{port}'\n")
        logs = boot_error({}, "-c", str(conf))
        assert f"metrics_bind 127.0.0.1:{port}: cannot bind" in logs


@pytest.mark.parametrize("value", ["nonsense", "127.0.0.1:99999", "::1:9100", "192.0.2.1:9100"])
def test_a_bad_metrics_bind_is_a_boot_error_naming_the_setting(value):
    logs = boot_error({"SKIRR_METRICS_BIND": value})
    assert "metrics_bind" in logs.lower(), logs


def test_standalone_bad_metrics_bind_names_the_flag():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        p = subprocess.run(
            [PY, "-m", "skirr", APP, "--port", "0", "--metrics-bind", f"127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=str(Path(__file__).parent),
        )
    assert p.returncode == 1
    assert f"--metrics-bind 127.0.0.1:{port}: cannot bind: address already in use" in p.stderr


def test_standalone_gauges_loop_lag_limits_and_websockets():
    from websockets.sync.client import connect

    mport = free_port()
    with skirr(APP, "--metrics-bind", f"127.0.0.1:{mport}", "--max-body-size", "10") as s:
        fams = scrape(mport)
        assert {x.labels["worker"] for x in fams["skirr_worker_up"][1]} == {"0"}
        assert request(s.port, "POST", "/", body=b"y" * 50).status == 413
        assert request(s.port, "GET", "/status/404").status == 404
        # Each answer is counted when hyper has written (dropped) its body,
        # possibly after the client read it: wait for each count, whose
        # overshoot would show as a timeout (counters only grow).
        wait_until(lambda: total(scrape(mport), "skirr_refused", limit="max_body_size") == 1, what="413 counted")
        wait_until(lambda: total(scrape(mport), "skirr_requests", status="4xx") == 2, what="413 and 404 counted")
        assert request(s.port, "GET", "/" + "a" * 5000).status == 414
        # hyper answers too many fields itself (no request reaches Skirr's service).
        assert request(s.port, "GET", "/", headers=[(f"x-f{i}", "v") for i in range(150)]).status == 431
        wait_until(lambda: total(scrape(mport), "skirr_refused", limit="request_head") == 1, what="431 counted")
        wait_until(lambda: total(scrape(mport), "skirr_refused", limit="limit_request_line") == 1, what="414 counted")
        with connect(f"ws://127.0.0.1:{s.port}/ws", open_timeout=TIMEOUT) as ws:
            ws.send("hi")
            assert ws.recv(timeout=TIMEOUT) == "hi"
            # The echo may reach the client before the server counts it sent.
            wait_until(
                lambda: total(scrape(mport), "skirr_websocket_messages", direction="out") == 1, what="echo counted"
            )
            fams = scrape(mport)
            assert total(fams, "skirr_websocket_sessions_open") == 1
            assert total(fams, "skirr_websocket_messages", direction="in") == 1
            assert total(fams, "skirr_websocket_messages", direction="out") == 1
        wait_until(lambda: total(scrape(mport), "skirr_websocket_sessions_open") == 0, what="session closed")
        # A request in the app: in flight. One that holds the event loop:
        # the scrape (served by Tokio, no GIL needed) shows the lag.
        slow = threading.Thread(target=request, args=(s.port, "GET", "/slow"))
        slow.start()
        wait_until(lambda: total(scrape(mport), "skirr_requests_in_flight") == 1, what="one in flight")
        slow.join(TIMEOUT)
        busy = threading.Thread(target=request, args=(s.port, "GET", "/busy"))
        busy.start()
        lag = wait_until(
            lambda: total(scrape(mport), "skirr_event_loop_lag_seconds") >= 0.3, what="loop lag seen while blocked"
        )
        assert lag
        busy.join(TIMEOUT)
        wait_until(lambda: total(scrape(mport), "skirr_event_loop_lag_seconds") < 0.3, what="lag back down")
        with RawConn(mport) as c:
            c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert c.read_response().status == 404


def test_timeouts_are_counted_by_limit():
    mport = free_port()
    args = ("--metrics-bind", f"127.0.0.1:{mport}", "--response-start-timeout", "0.3", "--body-read-timeout", "0.3")
    with skirr(APP, *args) as s:
        assert request(s.port, "GET", "/slow").status == 503
        with RawConn(s.port) as c:
            c.send(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab")
            assert c.read_response().status == 408
        wait_until(lambda: total(scrape(mport), "skirr_refused", limit="body_read_timeout") == 1, what="408 counted")
        # The 503's request is counted when its body was written: possibly
        # after the client read it (and after the 408's count).
        wait_until(lambda: total(scrape(mport), "skirr_requests", status="5xx") == 1, what="503 counted")
        fams = scrape(mport)
        assert total(fams, "skirr_refused", limit="response_start_timeout") == 1
        assert total(fams, "skirr_refused") == 2
        assert total(fams, "skirr_requests", status="5xx") == 1


def test_http2_requests_and_connections_are_labelled_http2():
    import httpx

    mport = free_port()
    with skirr(APP, "--metrics-bind", f"127.0.0.1:{mport}", "--http2") as s:
        with httpx.Client(base_url=s.url, http1=False, http2=True, timeout=TIMEOUT) as c:
            for _ in range(5):
                assert c.get("/").http_version == "HTTP/2"
            fams = scrape(mport)
            assert total(fams, "skirr_connections_open", protocol="http2") == 1
        wait_until(lambda: total(scrape(mport), "skirr_requests", protocol="http2") == 5, what="5 h2 requests")
        fams = scrape(mport)
        assert total(fams, "skirr_connections", "skirr_connections_total", protocol="http2") == 1
        wait_until(lambda: total(scrape(mport), "skirr_connections_open", protocol="http2") == 0, what="h2 closed")


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=TIMEOUT) as r:
        return json.loads(r.read())


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="no prometheus binary (apt-get install prometheus)")
def test_a_real_prometheus_scrapes_and_sums():
    mport, pport = free_port(), free_port()
    with gunicorn(APP, "-w", "2", env={"SKIRR_METRICS_BIND": f"127.0.0.1:{mport}"}) as g:
        posts(g.port, 120)
        wait_until(lambda: total(scrape(mport), "skirr_requests", method="POST") == 120, what="120 counted")
        with tempfile.TemporaryDirectory(prefix="skirr-prom-") as d:
            cfg = Path(d) / "prometheus.yml"
            cfg.write_text(
                "global:\n  scrape_interval: 1s\n"
                "scrape_configs:\n  - job_name: skirr\n"
                f"    static_configs:\n      - targets: ['127.0.0.1:{mport}']\n"
            )
            prom = start(
                [
                    "prometheus",
                    f"--config.file={cfg}",
                    f"--storage.tsdb.path={d}/data",
                    f"--web.listen-address=127.0.0.1:{pport}",
                ],
                sock=None,
                port=None,
                uds=None,
                ready=False,
            )
            try:
                base = f"http://127.0.0.1:{pport}"
                query = base + "/api/v1/query?query=sum(skirr_requests_total%7Bmethod%3D%22POST%22%7D)"

                def summed():
                    if prom.proc.poll() is not None:
                        raise RuntimeError(prom.logs())
                    try:
                        res = _get_json(query)["data"]["result"]
                    except OSError:
                        return None
                    return res and float(res[0]["value"][1])

                assert wait_until(summed, timeout=60, interval=0.5, what="Prometheus's sum") == 120
                targets = _get_json(base + "/api/v1/targets")["data"]["activeTargets"]
                assert [t["health"] for t in targets] == ["up"]
                workers = _get_json(base + "/api/v1/query?query=skirr_worker_up")["data"]["result"]
                print("Prometheus: sum(skirr_requests_total{method=POST}) = 120; skirr_worker_up:", workers)
                assert sorted(w["metric"]["worker"] for w in workers) == ["0", "1"]
                # The Grafana dashboard's queries parse and evaluate.
                for e in dashboard_exprs():
                    q = base + "/api/v1/query?" + urllib.parse.urlencode({"query": e})
                    assert _get_json(q)["status"] == "success", e
            finally:
                prom.stop()


def test_limit_concurrency_refusals_are_counted_and_the_health_path_is_not():
    mport = free_port()
    args = ("--metrics-bind", f"127.0.0.1:{mport}", "--limit-concurrency", "1", "--health-path", "/_health")
    with skirr(APP, *args) as s:
        # The harness's readiness probe: counted when its body was written,
        # possibly after the client read it; for good once no connection is
        # open.
        before = settled(mport)
        slow = threading.Thread(target=request, args=(s.port, "GET", "/slow"))
        slow.start()
        wait_until(lambda: total(scrape(mport), "skirr_requests_in_flight") == 1, what="the slow request in the app")
        assert request(s.port, "GET", "/").status == 503
        for _ in range(3):
            assert request(s.port, "GET", "/_health").status == 200
        slow.join(TIMEOUT)
        after = settled(mport)
        fams = scrape(mport)
        assert total(fams, "skirr_refused", limit="limit_concurrency") == 1
        # The slow request and the refused one; the probes are not requests.
        assert after - before == 2
