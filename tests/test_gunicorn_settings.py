"""Gunicorn's settings, hooks and logging with ``-k skirr.RustWorker``,
each against a live master."""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from harness import PY, ROOT, RawConn, free_port, gunicorn, listening_socket, request, start, wait_until, worker_pids

APP = "apps.probe:app"



def answers(port: int, host: str = "127.0.0.1", family=socket.AF_INET) -> bool:
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect((host, port))
            s.sendall(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def run_gunicorn(*args: str, env: dict | None = None):
    """A Gunicorn master binding its own addresses (no inherited socket)."""
    cmd = [PY, "-m", "gunicorn", "-k", "skirr.RustWorker", "--graceful-timeout", "5", *args]
    return start(cmd, sock=None, port=None, uds=None, env=env, ready=False)


# ----------------------------------------------------------------- binding


def test_several_binds_ipv4_ipv6_and_unix(tmp_path):
    p4, p6 = free_port(), free_port()
    uds = str(tmp_path / "s.sock")
    g = run_gunicorn("-b", f"127.0.0.1:{p4}", "-b", f"[::1]:{p6}", "-b", f"unix:{uds}", APP)
    try:
        wait_until(lambda: answers(p4), what="IPv4 bind")
        assert answers(p6, "::1", socket.AF_INET6)
        with RawConn(path=uds) as c:
            c.send(b"GET /scope HTTP/1.1\r\nHost: a\r\n\r\n")
            scope = json.loads(c.read_response().body)
            assert scope["server"][0] == uds and scope["client"] is None
    finally:
        g.stop()


def test_backlog_and_reuse_port():
    port = free_port()
    g = run_gunicorn("-b", f"127.0.0.1:{port}", "--backlog", "37", "--reuse-port", APP)
    try:
        wait_until(lambda: answers(port), what="server")
        out = subprocess.run(["ss", "-ltn", f"sport = :{port}"], capture_output=True, text=True).stdout
        assert re.search(r"LISTEN\s+\d+\s+37\s", out), out
        # SO_REUSEPORT: another socket may bind the same port.
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("127.0.0.1", port))
        s.close()
    finally:
        g.stop()


def test_worker_connections_limits_concurrent_connections():
    with gunicorn(APP, "--worker-connections", "2") as g:
        a, b = RawConn(g.port), RawConn(g.port)
        for c in (a, b):
            c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            c.read_response()
        third = RawConn(g.port)
        third.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        third.sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            third.sock.recv(1)
        third.sock.settimeout(10)
        a.close()
        assert third.read_response().status == 200
        b.close()
        third.close()


# ----------------------------------------------------------------- lifecycle settings


def test_graceful_timeout_bounds_the_drain():
    with gunicorn(APP, "--graceful-timeout", "1") as g:
        with RawConn(g.port) as c:
            c.send(b"GET /sleep?secs=30&tag=drain HTTP/1.1\r\nHost: a\r\n\r\n")
            wait_until(  # the request is in the app
                lambda: {"sleeping": "drain"} in json.loads(request(g.port, "GET", "/events").body), what="in the app"
            )
            t0 = time.monotonic()
            g.send_signal(signal.SIGTERM)
            assert c.is_closed(timeout=10)
            assert time.monotonic() - t0 < 5
        assert g.wait(10) == 0


def test_max_requests_jitter():
    with gunicorn(APP, "--max-requests", "10", "--max-requests-jitter", "5") as g:
        # The worker restarts after 10 + randint(0, 5) requests; the
        # harness's readiness check was the first of them.
        first = int(request(g.port, "GET", "/pid").body)
        n = 1
        while int(request(g.port, "GET", "/pid").body) == first:
            n += 1
            assert n <= 14
        assert 9 <= n <= 14, n


def test_preload_app_imports_in_the_master_and_serves_after_fork():
    with gunicorn(APP, "--preload", "-w", "2") as g:
        imported = int(request(g.port, "GET", "/import-pid").body)
        assert imported == g.proc.pid, "imported once, in the master"
        assert int(request(g.port, "GET", "/pid").body) in worker_pids(g.proc.pid)


def test_reload_on_code_change_and_extra_files(tmp_path):
    app = tmp_path / "reloadme.py"
    extra = tmp_path / "extra.txt"
    extra.write_text("1")
    app.write_text(
        "async def app(scope, receive, send):\n"
        "    if scope['type'] != 'http': return\n"
        "    await send({'type': 'http.response.start', 'status': 200, 'headers': []})\n"
        "    await send({'type': 'http.response.body', 'body': b'v1'})\n"
    )
    with gunicorn(
        "reloadme:app",
        "--reload",
        "--reload-extra-file",
        str(extra),
        "--chdir",
        str(tmp_path),
        env={"PYTHONPATH": str(tmp_path)},
    ) as g:
        assert request(g.port).body == b"v1"
        first = worker_pids(g.proc.pid)
        time.sleep(1.1)  # mtime granularity of the reloader's poll
        app.write_text(app.read_text().replace("b'v1'", "b'v2'"))
        wait_until(lambda: _body(g.port) == b"v2", timeout=20, what="reloaded code")
        second = wait_until(lambda: worker_pids(g.proc.pid), what="worker")
        assert second != first
        extra.write_text("2")
        wait_until(lambda: worker_pids(g.proc.pid) not in ([], second), timeout=20, what="reload on extra file")


def _body(port: int) -> bytes | None:
    try:
        return request(port).body
    except OSError:
        return None


def test_umask_applies_to_the_unix_socket(tmp_path):
    uds = str(tmp_path / "u.sock")
    with gunicorn(APP, "--umask", "0o077", uds=uds):
        assert os.stat(uds).st_mode & 0o777 == 0o700


def test_worker_tmp_dir_chdir_raw_env(tmp_path):
    tmpdir = tmp_path / "hb"
    tmpdir.mkdir()
    with gunicorn(
        APP,
        "--worker-tmp-dir",
        str(tmpdir),
        "--chdir",
        str(ROOT / "tests"),
        "-e",
        "SKIRR_TEST_VALUE=from-raw-env",
    ) as g:
        pid = worker_pids(g.proc.pid)[0]
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        assert any(str(tmpdir) in link for link in links), links
        assert os.readlink(f"/proc/{pid}/cwd") == str(ROOT / "tests")
        assert request(g.port, "GET", "/env?name=SKIRR_TEST_VALUE").body == b"from-raw-env"


@pytest.mark.skipif(os.geteuid() != 0, reason="switching user needs root")
def test_user_and_group(tmp_path):
    nobody = pwd.getpwnam("nobody")
    # The interpreters on these machines live under /root (mode 0700), so
    # nothing can be imported once the worker runs as nobody; CPython 3.13's
    # random.seed() imports _sha2 lazily. Importing hashlib in the master (as a
    # config file does) makes it inherited, as a deployed interpreter in
    # /usr would make it readable.
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text("import hashlib  # noqa: F401\n")
    conf.chmod(0o644)
    with gunicorn(APP, "-c", str(conf), "--user", "nobody", "--group", str(nobody.pw_gid)) as g:
        pid = worker_pids(g.proc.pid)[0]
        status = Path(f"/proc/{pid}/status").read_text()
        assert re.search(rf"Uid:\s+{nobody.pw_uid}\s", status)
        assert re.search(rf"Gid:\s+{nobody.pw_gid}\s", status)
        assert request(g.port).status == 200


def test_proc_name():
    pytest.importorskip("setproctitle")
    with gunicorn(APP, "-n", "skirr-test-app") as g:
        pid = worker_pids(g.proc.pid)[0]
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        assert b"skirr-test-app" in title


# ----------------------------------------------------------------- Skirr options from Gunicorn


def test_skirr_options_from_the_config_file_and_environment(tmp_path):
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text("skirr_max_body_size = 10\n")
    with gunicorn(APP, "-c", str(conf)) as g:
        assert request(g.port, "POST", "/echo", body=b"x" * 11).status == 413
        assert request(g.port, "POST", "/echo", body=b"x" * 10).status == 200
    with gunicorn(APP, env={"SKIRR_MAX_BODY_SIZE": "5"}) as g:
        assert request(g.port, "POST", "/echo", body=b"x" * 6).status == 413


def test_a_misspelled_skirr_setting_is_named_in_a_warning(tmp_path):
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text("skirr_max_bdy_size = 5\n")
    with gunicorn(APP, "-c", str(conf)) as g:
        want = "setting skirr_max_bdy_size does not apply: not a Skirr option (did you mean skirr_max_body_size?)"
        wait_until(lambda: want in g.logs(), what="warning")
        assert request(g.port, "POST", "/echo", body=b"x" * 6).status == 200


def test_uvloop_asked_for_but_missing_stops_the_boot(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['uvloop'] = None\n")
    path = os.pathsep.join([str(tmp_path), str(ROOT), str(ROOT / "tests")])
    with gunicorn(APP, env={"SKIRR_LOOP": "uvloop", "PYTHONPATH": path}, ready=False) as g:
        assert g.wait(20) != 0, "the master halts when a worker cannot boot"
        assert "'uvloop' is not installed" in g.logs()
        assert "exited with code 3" in g.logs()
        assert "Traceback" not in g.logs()


def test_inapplicable_settings_warn_once_and_unhonourable_ones_stop_the_boot():
    with gunicorn(APP, "--threads", "4") as g:
        wait_until(lambda: "setting threads does not apply" in g.logs(), what="warning")
        assert g.logs().count("setting threads does not apply") == 1
        assert request(g.port).status == 200
    with gunicorn(APP, "--protocol", "uwsgi", ready=False) as g:
        assert g.wait(20) != 0
        assert "protocol 'uwsgi' is not supported" in g.logs()


# ----------------------------------------------------------------- hooks


HOOKS = """
import os
LOG = os.environ["HOOK_LOG"]
def _w(*parts):
    with open(LOG, "a") as f:
        f.write(" ".join(str(p) for p in parts) + "\\n")
def on_starting(server): _w("on_starting")
def when_ready(server): _w("when_ready")
def post_fork(server, worker): _w("post_fork", worker.pid)
def post_worker_init(worker): _w("post_worker_init", worker.pid)
def worker_int(worker): _w("worker_int", worker.pid)
def worker_abort(worker): _w("worker_abort", worker.pid)
def worker_exit(server, worker): _w("worker_exit", worker.pid)
def child_exit(server, worker): _w("child_exit", worker.pid)
def pre_request(worker, req): _w("pre_request", req.method, req.path, dict(req.headers).get("X-HOOK"))
def post_request(worker, req, environ, resp):
    _w("post_request", req.method, req.path, resp.status_code, resp.status, environ["REMOTE_ADDR"], resp.sent)
"""


def test_server_hooks(tmp_path):
    conf = tmp_path / "hooks.py"
    conf.write_text(HOOKS)
    log = tmp_path / "hooks.log"
    env = {"HOOK_LOG": str(log)}

    def lines():
        return log.read_text().splitlines() if log.exists() else []

    with gunicorn(APP, "-c", str(conf), "--timeout", "2", env=env) as g:
        r = request(g.port, "GET", "/healthz", headers=[("X-Hook", "yes")])
        assert r.status == 200
        wait_until(lambda: any(ln.startswith("post_request") for ln in lines()), what="post_request")
        text = "\n".join(lines())
        for name in ("on_starting", "when_ready", "post_fork", "post_worker_init"):
            assert name in text, (name, text)
        assert "pre_request GET /healthz yes" in text
        assert re.search(r"post_request GET /healthz 200 200 OK 127\.0\.0\.1 2", text), text
        # An app that raises before responding: the hook sees what the client got.
        crash = request(g.port, "GET", "/crash")
        assert crash.status == 500
        want = f"post_request GET /crash 500 500 Internal Server Error 127.0.0.1 {len(crash.body)}"
        wait_until(lambda: want in "\n".join(lines()), what="post_request after a crash")

        # worker_int: SIGINT to a worker.
        w = worker_pids(g.proc.pid)[0]
        os.kill(w, signal.SIGINT)
        wait_until(lambda: f"worker_int {w}" in "\n".join(lines()), what="worker_int")
        wait_until(lambda: f"child_exit {w}" in "\n".join(lines()), what="child_exit")
        assert f"worker_exit {w}" in "\n".join(lines())

        # worker_abort: a blocked loop past --timeout gets SIGABRT.
        w2 = wait_until(lambda: [p for p in worker_pids(g.proc.pid) if p != w], what="replacement worker")[0]
        wait_until(lambda: request(g.port).status == 200, what="replacement serving")
        try:
            request(g.port, "GET", "/block?secs=20")
        except Exception:  # noqa: BLE001 - the worker is killed under the request
            pass
        wait_until(lambda: f"worker_abort {w2}" in "\n".join(lines()), timeout=30, what="worker_abort")


# ----------------------------------------------------------------- logging


ALL_ATOMS = (
    "h=%(h)s l=%(l)s u=%(u)s t=%(t)s r=%(r)s s=%(s)s m=%(m)s U=%(U)s q=%(q)s H=%(H)s b=%(b)s B=%(B)s "
    "f=%(f)s a=%(a)s T=%(T)s D=%(D)s M=%(M)s L=%(L)s p=%(p)s i=%({x-in}i)s o=%({x-out}o)s e=%({SERVER_NAME}e)s"
)


def test_access_log_format_with_every_atom(tmp_path):
    access = tmp_path / "access.log"
    with gunicorn(APP, "--access-logfile", str(access), "--access-logformat", ALL_ATOMS) as g:
        r = request(
            g.port,
            "GET",
            "/head?x=1",
            headers=[
                ("Referer", "http://ref/"),
                ("User-Agent", "probe/1"),
                ("X-In", "inval"),
                ("Authorization", "Basic dXNlcjpwdw=="),
            ],
        )
        assert r.status == 200
        line = wait_until(
            lambda: [ln for ln in access.read_text().splitlines() if "U=/head" in ln], what="access line"
        )[0]
    fields = dict(kv.split("=", 1) for kv in re.findall(r"\b\w=\S+", line))
    assert fields["h"] == "127.0.0.1"
    assert fields["u"] == "user"
    assert fields["s"] == "200" and fields["m"] == "GET" and fields["q"] == "x=1" and fields["H"] == "HTTP/1.1"
    assert fields["b"] == "10" and fields["B"] == "10"
    assert fields["f"] == "http://ref/" and fields["a"] == "probe/1"
    assert fields["i"] == "inval" and fields["e"] == "127.0.0.1"
    assert fields["p"] == f"<{worker_pid_from(line)}>" or fields["p"].startswith("<")
    assert "r=GET" in line and "/head?x=1" in line


def worker_pid_from(line: str) -> str:
    m = re.search(r"p=<(\d+)>", line)
    return m.group(1) if m else ""


def test_error_log_receives_rust_and_app_lines_in_gunicorns_format(tmp_path):
    err = tmp_path / "error.log"
    with gunicorn(APP, "--error-logfile", str(err), "--capture-output", "--log-level", "info") as g:
        assert request(g.port, "GET", "/crash").status == 500
        assert request(g.port, "GET", "/print").body == b"printed"
        text = wait_until(
            lambda: (t := err.read_text()) and "Exception in ASGI application" in t and "printed by the app" in t and t,
            what="error log lines",
        )
    line = next(ln for ln in text.splitlines() if "Exception in ASGI application" in ln)
    assert re.match(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4}\] \[\d+\] \[ERROR\] ", line), line


def test_logconfig_dict(tmp_path):
    out = tmp_path / "custom.log"
    conf = tmp_path / "logconf.py"
    conf.write_text(
        "logconfig_dict = {'version': 1, 'disable_existing_loggers': False,"
        " 'formatters': {'f': {'format': 'CUSTOM %(levelname)s %(message)s'}},"
        f" 'handlers': {{'h': {{'class': 'logging.FileHandler', 'filename': {str(out)!r}, 'formatter': 'f'}}}},"
        " 'root': {'level': 'INFO', 'handlers': ['h']},"
        " 'loggers': {'gunicorn.error': {'handlers': ['h'], 'level': 'INFO', 'propagate': False}}}\n"
    )
    with gunicorn(APP, "-c", str(conf)) as g:
        assert request(g.port, "GET", "/crash").status == 500
        wait_until(
            lambda: out.exists() and "CUSTOM ERROR Exception in ASGI application" in out.read_text(), what="custom log"
        )


def _udp_listener():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.settimeout(10)
    return s


def test_statsd_request_metrics():
    udp = _udp_listener()
    port = udp.getsockname()[1]
    with gunicorn(APP, "--statsd-host", f"127.0.0.1:{port}", "--statsd-prefix", "skirrtest") as g:
        for _ in range(3):
            request(g.port)
        got = b""
        deadline = time.monotonic() + 10
        while b"skirrtest.gunicorn.request.status.200" not in got and time.monotonic() < deadline:
            got += udp.recv(4096) + b"\n"
    udp.close()
    assert b"skirrtest.gunicorn.requests:1|c" in got
    assert b"skirrtest.gunicorn.request.duration:" in got
    assert b"skirrtest.gunicorn.request.status.200:1|c" in got


def test_syslog():
    udp = _udp_listener()
    port = udp.getsockname()[1]
    with gunicorn(
        APP, "--log-syslog", "--log-syslog-to", f"udp://127.0.0.1:{port}", "--log-syslog-prefix", "skirrsys"
    ) as g:
        request(g.port, "GET", "/crash")
        got = b""
        deadline = time.monotonic() + 10
        while b"Exception in ASGI application" not in got and time.monotonic() < deadline:
            got += udp.recv(65536)
    udp.close()
    assert b"skirrsys" in got


def test_usr1_reopens_log_files_after_rotation(tmp_path):
    access = tmp_path / "access.log"
    with gunicorn(APP, "--access-logfile", str(access)) as g:
        request(g.port, "GET", "/before-rotation")
        wait_until(lambda: "/before-rotation" in access.read_text(), what="first line")
        access.rename(tmp_path / "access.log.1")
        g.send_signal(signal.SIGUSR1)
        wait_until(lambda: access.exists(), what="reopened file")
        # The worker reopens too (the master forwards USR1, so the master's
        # new file can exist a moment before the worker writes to it):
        # probe until a line reaches the new file.
        probes = iter(range(1_000_000))

        def probe_lands_in_new_file() -> bool:
            n = next(probes)
            request(g.port, "GET", f"/after-rotation-{n}")
            return f"/after-rotation-{n} " in access.read_text()

        wait_until(probe_lands_in_new_file, what="a new line in the new file")
        # From then on nothing goes to the old file.
        request(g.port, "GET", "/after-reopen")
        wait_until(lambda: "/after-reopen" in access.read_text(), what="the next line in the new file")
        assert "/after-reopen" not in (tmp_path / "access.log.1").read_text()


# ----------------------------------------------------------------- signals under load


class Load:
    """Keeps requests flowing on fresh connections; counts failures."""

    def __init__(self, port: int, threads: int = 4) -> None:
        self.port, self.ok, self.failed, self.errors = port, 0, 0, []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run) for _ in range(threads)]

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                ok = request(self.port, "GET", "/").status == 200
            except Exception as e:  # noqa: BLE001
                ok = False
                with self.lock:
                    self.errors.append(repr(e))
            with self.lock:
                if ok:
                    self.ok += 1
                else:
                    self.failed += 1

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)


def test_hup_under_load_has_zero_failed_requests():
    with gunicorn(APP, "-w", "2") as g:
        before = set(wait_until(lambda: len(worker_pids(g.proc.pid)) == 2 and worker_pids(g.proc.pid), what="workers"))
        with Load(g.port) as load:
            time.sleep(0.5)
            g.send_signal(signal.SIGHUP)
            wait_until(
                lambda: (w := set(worker_pids(g.proc.pid))) and len(w) == 2 and not (w & before),
                timeout=30,
                what="new workers replacing the old",
            )
            time.sleep(0.5)
        assert load.failed == 0, load.errors[:5]
        assert load.ok > 50


def test_ttin_ttou_add_and_remove_workers():
    with gunicorn(APP, "-w", "1") as g:
        wait_until(lambda: len(worker_pids(g.proc.pid)) == 1, what="1 worker")
        g.send_signal(signal.SIGTTIN)
        wait_until(lambda: len(worker_pids(g.proc.pid)) == 2, what="2 workers")
        g.send_signal(signal.SIGTTOU)
        wait_until(lambda: len(worker_pids(g.proc.pid)) == 1, what="back to 1")
        assert request(g.port).status == 200


def test_killed_worker_is_replaced_and_others_keep_serving():
    with gunicorn(APP, "-w", "2") as g:
        workers = wait_until(lambda: len(worker_pids(g.proc.pid)) == 2 and worker_pids(g.proc.pid), what="workers")
        with Load(g.port, threads=2) as load:
            os.kill(workers[0], signal.SIGKILL)
            wait_until(
                lambda: len(w := worker_pids(g.proc.pid)) == 2 and workers[0] not in w, what="replacement worker"
            )
        assert load.ok > 0
        assert request(g.port).status == 200


def test_max_requests_under_load_has_zero_failed_requests():
    with gunicorn(APP, "-w", "2", "--max-requests", "40") as g:
        first = set(wait_until(lambda: len(worker_pids(g.proc.pid)) == 2 and worker_pids(g.proc.pid), what="workers"))
        with Load(g.port) as load:
            wait_until(lambda: not (set(worker_pids(g.proc.pid)) & first), timeout=60, what="both workers recycled")
        assert load.failed == 0, load.errors[:5]


# ----------------------------------------------------------------- systemd


def test_systemd_socket_activation_and_notify(tmp_path):
    """Starts the unit's ExecStart the way systemd does: the socket on fd 3,
    LISTEN_FDS/LISTEN_PID set, and a NOTIFY_SOCKET to report readiness."""
    unit = (ROOT / "deploy" / "skirr.service").read_text()
    exec_start = re.search(r"^ExecStart=(.+)$", unit, re.M).group(1)
    assert "-k skirr.RustWorker" in exec_start
    notify_path = str(tmp_path / "notify")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(notify_path)
    notify.settimeout(30)
    listener = listening_socket()
    port = listener.getsockname()[1]
    argv = exec_start.split()
    # The unit runs a venv's gunicorn and the app from its working directory.
    argv[0] = str(Path(sys.executable).with_name("gunicorn"))
    argv[-1] = APP
    launcher = (
        "import os, sys;"
        f"os.dup2({listener.fileno()}, 3);"
        "os.environ['LISTEN_FDS'] = '1';"
        "os.environ['LISTEN_PID'] = str(os.getpid());"
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    env = {"NOTIFY_SOCKET": notify_path, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}
    server = start([PY, "-c", launcher, *argv], sock=listener, port=port, uds=None, env=env, ready=False)
    try:
        msg = notify.recv(4096)
        assert b"READY=1" in msg
        assert answers(port)
        assert request(port, "GET", "/pid").status == 200
    finally:
        server.stop()
        notify.close()
