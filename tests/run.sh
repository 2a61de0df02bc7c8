#!/usr/bin/env bash
# Installs what the tests need and runs every test Skirr has:
#   Rust: cargo fmt --check, clippy -D warnings, unit tests, and each fuzz
#   target for FUZZ_SECONDS (default 20; 0 skips);
#   Python: ruff, then the pytest suite (real servers, real sockets, a real
#   Gunicorn master) on each CPython in SKIRR_TEST_PYTHONS (default 3.11 3.13).
# Each interpreter gets its own virtualenv in .venv-test/<version> and one
# release-built wheel in dist/ (also used by the Dockerfile test), installed
# with its [test] extra.
# SKIRR_TEST_QUICK=1: after the wheels, only ruff and pytest (no Autobahn set-up,
# so its test is skipped; no cargo fmt, clippy, Rust unit tests or fuzzing).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHONS=${SKIRR_TEST_PYTHONS:-"3.11 3.13"}

find_python() {
    local v=$1 p
    for p in "python$v" "$HOME/.pyenv/versions/$v"*/bin/python; do
        if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import sys; sys.exit(0)' 2>/dev/null; then
            command -v "$p"
            return 0
        fi
    done
    return 1
}

first=""
for v in $PYTHONS; do
    py=$(find_python "$v") || { echo "tests/run.sh: CPython $v not found" >&2; exit 1; }
    venv=".venv-test/$v"
    [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    echo "== building and installing skirr[test] for $("$venv/bin/python" -V)"
    tag=$("$venv/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
    rm -f dist/skirr-*-"$tag"-*.whl
    "$venv/bin/python" -m pip wheel -q --no-deps -w dist .
    whl=$(ls dist/skirr-*-"$tag"-*.whl)
    "$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$whl"
    "$venv/bin/python" -m pip install -q "$whl[test]"
    [ -n "$first" ] || first=$venv
done

if [ "${SKIRR_TEST_QUICK:-0}" != 0 ]; then
    echo "== SKIRR_TEST_QUICK: ruff and pytest only"
    "$first/bin/ruff" check python tests examples bench
    for v in $PYTHONS; do
        echo "== pytest on CPython $v"
        ".venv-test/$v/bin/python" -m pytest -q "$@"
    done
    exit 0
fi

echo "== Autobahn TestSuite (CPython 2.7 virtualenv)"
py27=$(find_python 2.7) || { echo "tests/run.sh: CPython 2.7 not found (needed by Autobahn)" >&2; exit 1; }
ab=".venv-test/autobahn"
if [ ! -x "$ab/bin/wstest" ]; then
    "$py27" -m pip install -q "virtualenv==20.15.1"
    "$py27" -m virtualenv -q "$ab"
    "$ab/bin/pip" install -q autobahntestsuite
fi
export SKIRR_WSTEST="$PWD/$ab/bin/wstest"

echo "== Rust: fmt, clippy, unit tests"
export PYO3_PYTHON="$PWD/$first/bin/python"
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test -p skirr

if [ "${FUZZ_SECONDS:-20}" != 0 ]; then
    echo "== fuzzing (rust/fuzz, ${FUZZ_SECONDS:-20}s per target)"
    tests/fuzz.sh
fi

echo "== Python: ruff"
"$first/bin/ruff" check python tests examples bench

for v in $PYTHONS; do
    echo "== pytest on CPython $v"
    # Run from a copy-free layout: tests import the installed skirr, not python/.
    ".venv-test/$v/bin/python" -m pytest -q "$@"
done
