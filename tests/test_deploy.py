"""deploy/kubernetes/: every manifest validates against the Kubernetes API
schema (kubernetes-validate, strict), the settings agree with each other
(probe paths, ports, drain delay inside graceful_timeout inside the grace
period), every SKIRR_* variable is a Skirr option, and the container's
command as the Deployment writes it (the image's ENTRYPOINT + the
Deployment's args and env) serves under a real Gunicorn master: the health
path answers 200, turns 503 at SIGTERM while ordinary requests still get
200 for the drain delay, and the master exits inside the grace period."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import time

import pytest
from harness import PY, ROOT, _env, listening_socket, request, wait_until

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

KUBE = ROOT / "deploy" / "kubernetes"
K8S_VERSION = "1.33.0"  # oldest Kubernetes release still supported upstream when written


def manifests() -> dict[str, dict]:
    docs = {}
    for path in sorted(KUBE.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs[f"{path.name}:{doc['kind']}"] = doc
    return docs


def deployment() -> dict:
    return next(d for d in manifests().values() if d["kind"] == "Deployment")


def container() -> dict:
    return deployment()["spec"]["template"]["spec"]["containers"][0]


def env() -> dict[str, str]:
    return {e["name"]: e["value"] for e in container().get("env", [])}


def entrypoint() -> list[str]:
    final = (ROOT / "Dockerfile").read_text().split("\nFROM ")[-1]
    line = re.search(r"^ENTRYPOINT\s+(.*)$", final, re.M)
    assert line, "the Dockerfile has no ENTRYPOINT"
    return json.loads(line.group(1))


def graceful_timeout() -> float:
    argv = entrypoint() + container()["args"]
    return float(argv[argv.index("--graceful-timeout") + 1])


@pytest.mark.parametrize("name", sorted(manifests()))
def test_manifest_validates_against_the_kubernetes_schema(name):
    doc = manifests()[name]
    if doc["apiVersion"].startswith("kustomize.config.k8s.io"):
        resources = doc["resources"]
        assert sorted(resources) == sorted(p.name for p in KUBE.glob("*.yaml") if p.name != "kustomization.yaml")
        return
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_every_skirr_variable_is_an_option():
    from skirr.config import OPTIONS

    known = {o.env for o in OPTIONS}
    unknown = sorted(set(env()) - known)
    assert not unknown, f"not Skirr options: {unknown}"


def test_probes_ports_and_timeouts_agree():
    c = container()
    health = env()["SKIRR_HEALTH_PATH"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == health, probe
        assert c[probe]["httpGet"]["port"] == c["ports"][0]["name"], probe
    port = c["ports"][0]["containerPort"]
    assert f"0.0.0.0:{port}" in entrypoint()
    service = next(d for d in manifests().values() if d["kind"] == "Service")
    assert service["spec"]["ports"][0]["targetPort"] == c["ports"][0]["name"]
    drain_delay = float(env()["SKIRR_DRAIN_DELAY"])
    grace = deployment()["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    readiness = c["readinessProbe"]
    # The load balancer must see the pod unready before the drain begins.
    assert readiness["periodSeconds"] * readiness["failureThreshold"] < drain_delay
    assert drain_delay < graceful_timeout() < grace
    metrics_port = int(env()["SKIRR_METRICS_BIND"].rsplit(":", 1)[1])
    assert {"name": "metrics", "containerPort": metrics_port} in c["ports"]
    annotations = deployment()["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(metrics_port)


def _status(port: int, path: str) -> int | None:
    try:
        return request(port, "GET", path).status
    except OSError:
        return None


def test_the_deployments_command_serves_and_drains(tmp_path):
    sock = listening_socket()
    port = sock.getsockname()[1]
    argv = [a.replace("0.0.0.0:8000", f"fd://{sock.fileno()}") for a in entrypoint() + container()["args"]]
    assert argv[0] == "gunicorn"
    argv = [PY, "-m", "gunicorn", *argv[1:]]
    log = tmp_path / "server.log"
    health = env()["SKIRR_HEALTH_PATH"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        metrics_port = s.getsockname()[1]
    variables = {**env(), "SKIRR_METRICS_BIND": f"127.0.0.1:{metrics_port}"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=_env(variables), stdout=out, stderr=subprocess.STDOUT, pass_fds=[sock.fileno()]
        )
    try:
        wait_until(lambda: _status(port, health) == 200, timeout=30, what="the health path")
        body = json.loads(request(port, "GET", health).body)
        assert body["status"] == "ok", body
        assert _status(port, "/items/1") == 200
        scrape = request(metrics_port, "GET", "/metrics").body.decode()
        assert re.search(r'^skirr_requests_total\{[^}]*status="2xx"[^}]*\} [1-9]', scrape, re.M), scrape
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        wait_until(lambda: _status(port, health) == 503, timeout=3, what="the health path saying 503")
        # Inside the drain delay: new connections are still served.
        while time.monotonic() - t0 < float(env()["SKIRR_DRAIN_DELAY"]) - 1.5:
            assert _status(port, "/items/1") == 200
            time.sleep(0.2)
        assert proc.wait(graceful_timeout() + 5) == 0
        assert time.monotonic() - t0 < deployment()["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()
