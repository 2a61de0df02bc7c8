#!/usr/bin/env bash
# One command: set up bench/.venv and run the benchmark matrix.
# Extra arguments go to bench/run.py (e.g. --servers skirr,granian --runs 5).
set -euo pipefail
cd "$(dirname "$0")/.."
bench/setup.sh
exec bench/.venv/bin/python bench/run.py "$@"
