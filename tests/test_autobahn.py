"""The Autobahn TestSuite (the standard WebSocket conformance suite) against
a Skirr echo app, with permessage-deflate (sections 12 and 13) on. Every case
must be OK or INFORMATIONAL (no NON-STRICT, FAILED, UNIMPLEMENTED or WRONG
CODE), and every close clean.

CI runs all 517 cases once standalone and sections 1-7, 10, 12.1, 13.1, 13.3
and 13.7 under Gunicorn (the sections whose behaviour could depend on the
worker; sections 9, 12 and 13 are throughput-heavy). SKIRR_AUTOBAHN_FULL=1 runs
the full suite under Gunicorn too (README, "WebSockets", has the figures).

`tests/run.sh` installs Autobahn into a CPython 2.7 virtualenv and sets
SKIRR_WSTEST to its `wstest`; run it that way.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import tempfile
import time

import pytest
from harness import gunicorn, skirr

WSTEST = os.environ.get("SKIRR_WSTEST")
ALL = ["*"]
GUNICORN_SUBSET = ["1.*", "2.*", "3.*", "4.*", "5.*", "6.*", "7.*", "10.*", "12.1.*", "13.1.*", "13.3.*", "13.7.*"]
#: Section 9 sends messages of up to 16 MiB (the default ws_max_message_size).
ARGS = ("--no-access-log", "--log-level", "warning")


def run_wstest(url: str, cases: list[str]) -> dict:
    out = tempfile.mkdtemp(prefix="autobahn-")
    spec = {
        "outdir": out,
        "servers": [{"agent": "skirr", "url": url}],
        "cases": cases,
        "exclude-cases": [],
        "exclude-agent-cases": {},
    }
    spec_path = os.path.join(out, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    t0 = time.monotonic()
    p = subprocess.run(
        [WSTEST, "-m", "fuzzingclient", "-s", spec_path], cwd=out, capture_output=True, text=True, timeout=1500
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    results = json.load(open(os.path.join(out, "index.json")))["skirr"]
    counts = collections.Counter(r["behavior"] for r in results.values())
    per_section = collections.Counter()
    for k, r in results.items():
        per_section[k.split(".")[0]] += r.get("duration", 0) / 1000
    took = ", ".join(f"{k}: {v:.0f}" for k, v in sorted(per_section.items(), key=lambda kv: int(kv[0])))
    print(f"\nAutobahn: {dict(counts)} of {len(results)} cases in {time.monotonic() - t0:.0f} s ({out})")
    print(f"seconds per section: {took}")
    return results


def check(results: dict, expected: int) -> None:
    assert len(results) == expected, len(results)
    bad = {k: r["behavior"] for k, r in results.items() if r["behavior"] not in ("OK", "INFORMATIONAL")}
    assert not bad, bad
    closes = {k: r["behaviorClose"] for k, r in results.items() if r["behaviorClose"] not in ("OK", "INFORMATIONAL")}
    assert not closes, closes


@pytest.mark.timeout(1500)
@pytest.mark.skipif(not WSTEST, reason="SKIRR_WSTEST is not set: run the suite with tests/run.sh")
def test_autobahn_full_suite_standalone():
    with skirr("apps.ws_app:app", *ARGS) as s:
        results = run_wstest(f"ws://127.0.0.1:{s.port}/echo", ALL)
    check(results, 517)


@pytest.mark.timeout(1500)
@pytest.mark.skipif(not WSTEST, reason="SKIRR_WSTEST is not set: run the suite with tests/run.sh")
def test_autobahn_under_gunicorn():
    full = os.environ.get("SKIRR_AUTOBAHN_FULL", "0") != "0"
    with gunicorn("apps.ws_app:app", "-w", "1", "--log-level", "warning") as s:
        results = run_wstest(f"ws://127.0.0.1:{s.port}/echo", ALL if full else GUNICORN_SUBSET)
    check(results, 517 if full else len(results))
    if not full:
        assert any(k.startswith("13.7.") for k in results) and any(k.startswith("1.1.") for k in results)
