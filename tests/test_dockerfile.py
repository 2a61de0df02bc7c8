"""The Dockerfile's steps, performed without a Docker engine (none runs
here): install the wheel into a clean virtualenv with no Rust toolchain on
PATH, run the image's ENTRYPOINT + CMD, pass its HEALTHCHECK, stop on
SIGTERM. hadolint lints the Dockerfile when it is installed (it is in the
test extra)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from harness import ROOT, request, wait_until

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def instruction(name: str, text: str = DOCKERFILE) -> list[str]:
    """Every instruction ``name`` of the final stage, with continuations joined."""
    final = text.split("\nFROM ")[-1]
    joined = re.sub(r"\\\n\s*", " ", final)
    return [m.group(1).strip() for m in re.finditer(rf"^{name}\s+(.*)$", joined, re.M)]


def wheel() -> Path:
    """The wheel built for this interpreter (tests/run.sh builds it once)."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    found = sorted((ROOT / "dist").glob(f"skirr-*-{tag}-*.whl"))
    if not found:
        pytest.skip(f"no {tag} wheel in dist/ (tests/run.sh builds it)")
    return found[-1]


def test_hadolint():
    exe = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(exe).exists():
        pytest.skip("hadolint is not installed")
    r = subprocess.run(
        [exe, "--failure-threshold", "warning", str(ROOT / "Dockerfile")], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_image_steps_serve_the_example_app(tmp_path):
    whl = wheel()
    # A clean environment: no cargo/rustc on PATH, nothing inherited.
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for k in ("PIP_FIND_LINKS", "PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_INDEX_URL"):
        if k in os.environ:
            env[k] = os.environ[k]
    assert shutil.which("cargo", path=env["PATH"]) is None, "cargo must not be reachable"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
    env["PATH"] = f"{venv}/bin:{env['PATH']}"
    pip_line = next(i for i in instruction("RUN") if i.startswith("pip install"))
    pkgs = re.findall(r'"([^"]+)"', pip_line.split("&&")[0])
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", str(whl), *pkgs], check=True, env=env, capture_output=True
    )
    app_dir = tmp_path / "app"
    shutil.copytree(ROOT / "examples", app_dir / "examples")
    for line in instruction("ENV"):  # the image's environment
        env.update(kv.split("=", 1) for kv in line.split())
    entry = json.loads(instruction("ENTRYPOINT")[0])
    cmd = json.loads(instruction("CMD")[0])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [a.replace("0.0.0.0:8000", f"127.0.0.1:{port}") for a in entry + cmd]
    proc = subprocess.Popen(argv, cwd=app_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _up(port), timeout=30, what="the container's server")
        health = instruction("HEALTHCHECK")[0]
        check = json.loads(health[health.index("CMD") + 3 :].strip())
        check = [a.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for a in check]
        assert subprocess.run(check, cwd=app_dir, env=env, timeout=10).returncode == 0
        assert request(port, "GET", "/items/1").status == 200
        proc.send_signal(signal.SIGTERM)  # what `docker stop` sends (STOPSIGNAL)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        out = proc.stdout.read().decode(errors="replace")
    assert "skirr.RustWorker" in out or "Booting worker" in out, out


def _up(port: int) -> bool:
    try:
        return request(port, "GET", "/healthz").status == 200
    except OSError:
        return False


def test_every_path_the_dockerfile_names_exists():
    # Its comments point a reader at files (issue 17: one named a script
    # that never existed).
    named = set(re.findall(r"\b((?:tests|examples|python|rust|deploy)/[\w./-]+\w)", DOCKERFILE))
    assert named, "the Dockerfile names no repository path"
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, missing
