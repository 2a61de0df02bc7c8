"""The Autobahn TestSuite (the standard WebSocket conformance suite) against
a Skirr echo app: sections 1-7 and 10. No case may be FAILED or NON-STRICT,
except 6.4.3 and 6.4.4 (see README, "Limitations").

`tests/run.sh` installs Autobahn into a CPython 2.7 virtualenv and sets
SKIRR_WSTEST to its `wstest`; run it that way.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import tempfile

import pytest
from harness import skirr

WSTEST = os.environ.get("SKIRR_WSTEST")
#: Fail-fast on invalid UTF-8 inside a partly received frame: tungstenite
#: validates a frame once it is complete, so these close correctly but late.
KNOWN_NON_STRICT = {"6.4.3", "6.4.4"}


@pytest.mark.skipif(not WSTEST, reason="SKIRR_WSTEST is not set: run the suite with tests/run.sh")
def test_autobahn_fuzzingclient_sections_1_to_7_and_10():
    out = tempfile.mkdtemp(prefix="autobahn-")
    with skirr("apps.ws_app:app", "--no-access-log", "--log-level", "warning") as s:
        spec = {
            "outdir": out,
            "servers": [{"agent": "skirr", "url": f"ws://127.0.0.1:{s.port}/echo"}],
            "cases": ["1.*", "2.*", "3.*", "4.*", "5.*", "6.*", "7.*", "10.*"],
            "exclude-cases": [],
            "exclude-agent-cases": {},
        }
        spec_path = os.path.join(out, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        p = subprocess.run(
            [WSTEST, "-m", "fuzzingclient", "-s", spec_path], cwd=out, capture_output=True, text=True, timeout=600
        )
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    results = json.load(open(os.path.join(out, "index.json")))["skirr"]
    counts = collections.Counter(r["behavior"] for r in results.values())
    print(f"\nAutobahn: {dict(counts)} of {len(results)} cases")
    bad = {k: r["behavior"] for k, r in results.items() if r["behavior"] not in ("OK", "INFORMATIONAL")}
    assert set(bad) <= KNOWN_NON_STRICT, bad
    assert all(v == "NON-STRICT" for v in bad.values()), bad
    assert counts["OK"] >= 242
    closes = {k: r["behaviorClose"] for k, r in results.items() if r["behaviorClose"] not in ("OK", "INFORMATIONAL")}
    assert not closes, closes
