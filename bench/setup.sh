#!/usr/bin/env bash
# Creates bench/.venv (CPython 3.12: weft-server's wheels need it, so every
# server runs on the same interpreter), installs Skirr (release build) and
# every peer at pinned versions, and builds the Rust helpers (the pure-hyper
# ceiling server and the load clients: HTTP/1.1 and WebSocket, HTTP/3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY_VERSION=${BENCH_PYTHON:-3.12}
py=""
for p in "python$PY_VERSION" "$HOME/.pyenv/versions/$PY_VERSION"*/bin/python; do
    # pyenv shims exist for every version but only run the selected ones.
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import sys' 2>/dev/null; then py=$(command -v "$p"); break; fi
done
[ -n "$py" ] || { echo "bench/setup.sh: CPython $PY_VERSION not found" >&2; exit 1; }
command -v wrk >/dev/null || { echo "bench/setup.sh: wrk not found (apt-get install wrk)" >&2; exit 1; }
command -v h2load >/dev/null || { echo "bench/setup.sh: h2load not found (apt-get install nghttp2-client)" >&2; exit 1; }
curl --version | grep -q HTTP2 || { echo "bench/setup.sh: curl without HTTP/2 (verifies the h2 cells)" >&2; exit 1; }
[ -x bench/.venv/bin/python ] || "$py" -m venv bench/.venv
bench/.venv/bin/pip install -q --upgrade pip
bench/.venv/bin/pip install -q ".[gunicorn,uvloop]" fastapi
bench/.venv/bin/pip install -q -r bench/requirements-peers.txt
cargo build --release -q -p hyper-hello -p loadgen -p h3load
