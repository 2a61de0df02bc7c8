"""Instructions per request: the stable regression figure.

    bench/.venv/bin/python bench/instructions.py                 # skirr and the pure-hyper ceiling
    bench/.venv/bin/python bench/instructions.py --servers skirr --workloads raw_get,ws_echo

Wall-clock throughput here varies ±10-15 % between runs; instruction counts
from ``valgrind --tool=callgrind`` over a fixed number of requests repeat to
well under 1 %, whatever else the machine does. Each server runs under
callgrind with instrumentation off; a warm-up runs; instrumentation is
switched on for exactly N requests (or WebSocket messages) sent by
``bench/loadgen`` (HTTP/2 workloads: ``h2load -n N -c16 -m10``, h2c prior
knowledge; HTTP/3 workloads: ``bench/h3load -n N -c16 -m10`` over TLS with the
server's HTTP/3 options from ``bench/quic.py``), then the counts are dumped and
summed per thread.
User-space instructions only (the kernel's share is the same for every
server; see bench/NOTES.md). Writes ``bench/results/instructions-<stamp>.json``.

Only single-process servers can be measured this way (the process that
listens must be the one that serves): ``skirr``, ``skirr-single`` and ``hyper`` here, and
``uvicorn`` or ``hypercorn`` if asked.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import quic  # noqa: E402
from bench.run import (  # noqa: E402
    BENCH,
    H2,
    RESULTS,
    ROOT,
    SERVERS,
    WORKLOADS,
    free_port,
    machine,
    post_body_file,
    wait_ready,
)

LOADGEN = ROOT / "target" / "release" / "loadgen"
SINGLE_PROCESS = {"skirr", "skirr-single", "hyper", "uvicorn", "hypercorn"}


def thread_totals(prefix: str) -> dict[str, int]:
    """Instruction totals of the first dump, per thread file."""
    out = {}
    for f in sorted(glob.glob(prefix + ".1-*")):
        with open(f, errors="replace") as fh:
            for line in fh:
                if line.startswith(("totals:", "summary:")):
                    out[os.path.basename(f)] = int(line.split()[1])
                    break
    return out


def thread_names(pid: int) -> dict[int, str]:
    names = {}
    for t in glob.glob(f"/proc/{pid}/task/*"):
        try:
            names[int(os.path.basename(t))] = Path(t, "comm").read_text().strip()
        except OSError:
            pass
    return names


def measure(server: str, workload: str, count: int, venv: Path, tmp: str) -> dict:
    port = free_port()
    if workload == "ws_echo":
        app = "bench.apps:ws_echo"
    else:
        app = WORKLOADS[workload].app
    if server == "hyper":
        if workload == "ws_echo" or WORKLOADS[workload].hyper_path is None:
            return {"server": server, "workload": workload, "error": "not applicable"}
    proto = "ws" if workload == "ws_echo" else WORKLOADS[workload].proto
    h2, h3 = proto == "h2", proto == "h3"
    if h2 and server not in H2:
        return {"server": server, "workload": workload, "error": "no h2c prior knowledge"}
    if h3 and server not in quic.H3:
        return {"server": server, "workload": workload, "error": "no HTTP/3"}
    tmpl = SERVERS[server] + (H2[server] if h2 else "")
    cmd = tmpl.format(bin=venv / "bin", py=venv / "bin" / "python", app=app, port=port, root=ROOT).split()
    if h3:
        cmd += quic.h3_extra(server, port).split()
    prefix = os.path.join(tmp, f"cg-{server}-{workload}")
    vg = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={prefix}",
        "--dump-instr=no",
        "--separate-threads=yes",
        "--instr-atstart=no",
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(quic.H3_ENV.get(server, {}) if h3 else {}))
    log = open(os.path.join(tmp, f"{server}-{workload}.log"), "wb")
    proc = subprocess.Popen(vg + cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    try:
        if not wait_ready(port, proc, timeout=180):
            return {"server": server, "workload": workload, "error": "did not start under valgrind"}
        if workload == "ws_echo":
            load = [str(LOADGEN), "ws", f"ws://127.0.0.1:{port}/", "16"]
            subprocess.run(load + ["2"], check=True, capture_output=True, timeout=120)
        elif h2:
            w = WORKLOADS[workload]
            path = w.hyper_path if server == "hyper" else w.path
            body = ["-d", str(post_body_file())] if w.method == "POST" else []
            load = ["h2load", "-c16", "-m10", *body, f"http://127.0.0.1:{port}{path}"]
            extra = []
            subprocess.run(load[:1] + ["-n2000"] + load[1:], check=True, capture_output=True, timeout=300)
        elif h3:
            load = quic.h3load_args(port, WORKLOADS[workload], 16, 10)
            subprocess.run(load + ["-n", "2000"], check=True, capture_output=True, timeout=300)
        else:
            w = WORKLOADS[workload]
            path = w.hyper_path if server == "hyper" else w.path
            load = [str(LOADGEN), "http", f"127.0.0.1:{port}", path, "16"]
            extra = [str(w.body_size)] if w.method == "POST" else []
            subprocess.run(load + ["2000", *extra], check=True, capture_output=True, timeout=300)
        subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], capture_output=True, timeout=60)
        if workload == "ws_echo":
            out = subprocess.run(load + ["3"], check=True, capture_output=True, text=True, timeout=300)
            n = json.loads(out.stdout)["messages"]
        elif h2:
            out = subprocess.run(
                load[:1] + [f"-n{count}"] + load[1:], check=True, capture_output=True, text=True, timeout=600
            )
            m = re.search(r"(\d+) succeeded", out.stdout)
            n = int(m.group(1)) if m else 0
        elif h3:
            out = subprocess.run(load + ["-n", str(count)], check=True, capture_output=True, text=True, timeout=600)
            n = json.loads(out.stdout.strip().splitlines()[-1])["requests"]
        else:
            subprocess.run(load + [str(count), *extra], check=True, capture_output=True, timeout=600)
            n = count
        subprocess.run(["callgrind_control", "-d", str(proc.pid)], capture_output=True, timeout=60)
        names = thread_names(proc.pid)
        deadline = time.monotonic() + 30
        totals = {}
        while time.monotonic() < deadline and not totals:
            time.sleep(0.2)
            totals = thread_totals(prefix)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    threads = {}
    for f, total in totals.items():
        m = re.search(r"-(\d+)$", f)
        tid = int(m.group(1)) if m else 0
        threads[f"thread {tid}" + (f" ({names[proc.pid + tid - 1]})" if proc.pid + tid - 1 in names else "")] = (
            total / n
        )
    per = sum(totals.values()) / n if n else 0
    return {
        "server": server,
        "workload": workload,
        "units": n,
        "instructions_per_unit": round(per),
        "per_thread": {k: round(v) for k, v in threads.items() if v >= 1},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", default="skirr,hyper")
    p.add_argument("--workloads", default="raw_get,post_4k,get_64k,fastapi_json,ws_echo")
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--venv", default=str(BENCH / ".venv"))
    p.add_argument(
        "--keep",
        metavar="DIR",
        help="keep callgrind's output files in DIR (for callgrind_annotate) instead of a temporary directory",
    )
    args = p.parse_args(argv)
    venv = Path(args.venv)
    rows = []
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
    with contextlib.nullcontext(args.keep) if args.keep else tempfile.TemporaryDirectory(prefix="skirr-cg-") as tmp:
        for s in args.servers.split(","):
            if s not in SINGLE_PROCESS:
                p.error(f"{s}: only single-process servers can be measured ({', '.join(sorted(SINGLE_PROCESS))})")
            for w in args.workloads.split(","):
                r = measure(s, w, args.requests, venv, tmp)
                rows.append(r)
                if "error" in r:
                    print(f"{s:<8} {w:<13} {r['error']}", flush=True)
                else:
                    unit = "message" if w == "ws_echo" else "request"
                    print(f"{s:<8} {w:<13} {r['instructions_per_unit']:>9,} instructions/{unit}", flush=True)
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "requests": args.requests,
        "rows": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / ("instructions-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S") + ".json")
    out.write_text(json.dumps(report, indent=1))
    print(f"artifact: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
