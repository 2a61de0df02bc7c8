"""The Rust crate's floors (issue 18): which top-level module may use which.

A static check of rust/src, no server: every `use crate::…`, `crate::…` and
`super::…` path is an edge from the file that names it to the file it names.
Each top-level module (a folder, or a file at the crate root) sits on a floor
(`FLOORS`, the map in lib.rs's crate docs); a module may use modules on lower
floors only. That rules out a folder cycle and any circle of files that
crosses a folder, which are checked too for a readable failure. The bridge may
use configuration, errors and wire-level helpers only, and the wire-protocol
drivers under `proto/` never use each other.

`KNOWN_UPWARD` lists the upward edges that remain; the test also fails when one
of them is gone, so the list only shrinks.
"""

import re
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "rust" / "src"

# Floor of each top-level module: a module may use modules on lower floors.
FLOORS = {
    "wire": 0,
    "errors": 0,
    "metrics": 0,
    "config": 1,
    "bridge": 2,
    "logging": 3,
    "worker": 3,
    "asgi": 4,
    "http": 5,
    "proto": 7,
    "server": 8,
}

# The bridge's allowed imports (besides itself).
BRIDGE_MAY_USE = {"config", "errors", "wire"}

# Upward edges allowed for now, "from -> to" (none: keep it that way).
KNOWN_UPWARD = set()

# Sub-folders of proto/ that must not import one another.
DRIVERS = ("h1", "h2", "h3", "ws")


def mod_path(rel):
    parts = list(rel.with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return parts


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def expand(tree):
    """'a::{b, c::{d, e}}' -> ['a::b', 'a::c::d', 'a::c::e']."""
    tree = tree.strip()
    i = tree.find("{")
    if i < 0:
        return [tree.split(" as ")[0].strip()]
    head, body = tree[:i], tree[i + 1 : tree.rfind("}")]
    items, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    items.append(cur)
    out = []
    for it in items:
        if it.strip():
            out += [head + x if x != "self" else head.rstrip(":") for x in expand(it)]
    return out


def file_graph():
    files = {p.relative_to(SRC): p.read_text(encoding="utf-8") for p in SRC.rglob("*.rs")}
    by_mod = {tuple(mod_path(r)): r for r in files}

    def resolve(parts):
        for n in range(len(parts), 0, -1):
            r = by_mod.get(tuple(parts[:n]))
            if r is not None:
                return r
        return None

    edges = defaultdict(set)
    for rel, text in files.items():
        t = strip_comments(text)
        me = mod_path(rel)
        is_mod = rel.name in ("mod.rs", "lib.rs")
        paths = []
        for m in re.finditer(r"\buse\s+((?:crate|super|self)::[^;]*);", t, flags=re.S):
            paths += expand(re.sub(r"\s+", " ", m.group(1)))
        paths += re.findall(r"(?<![:\w])((?:crate|super)(?:::\w+)+)", t)
        for p in paths:
            parts = [x for x in p.replace(" ", "").split("::") if x]
            if not parts:
                continue
            if parts[0] == "crate":
                parts = parts[1:]
            elif parts[0] in ("super", "self"):
                base = list(me) if is_mod else list(me[:-1])
                if parts[0] == "self":
                    base = list(me)
                    parts = parts[1:]
                else:
                    parts = parts[1:]
                    while parts and parts[0] == "super":
                        parts = parts[1:]
                        base = base[:-1]
                parts = base + parts
            target = resolve(parts)
            if target is not None and target != rel:
                edges[rel].add(target)
    return files, edges


def top(rel):
    parts = mod_path(rel)
    return parts[0] if parts else "lib"


def folder_edges(edges):
    out = defaultdict(set)
    for a, bs in edges.items():
        for b in bs:
            fa, fb = top(a), top(b)
            if fa != fb and "lib" not in (fa, fb):
                out[fa].add(fb)
    return out


def sccs(nodes, edges):
    """Tarjan's strongly connected components (iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    out.append(comp)
    return out


def test_every_top_level_module_has_a_floor():
    files, _ = file_graph()
    mods = {top(r) for r in files} - {"lib"}
    assert mods <= set(FLOORS), f"modules without a floor in FLOORS: {sorted(mods - set(FLOORS))}"


def test_modules_use_only_lower_floors():
    _, edges = file_graph()
    fe = folder_edges(edges)
    upward = {f"{a} -> {b}" for a, bs in fe.items() for b in bs if FLOORS[b] >= FLOORS[a]}
    new = upward - KNOWN_UPWARD
    paid = KNOWN_UPWARD - upward
    assert not new, f"modules that use a module on their own or a higher floor: {sorted(new)}"
    assert not paid, f"gone from the tree, remove from KNOWN_UPWARD: {sorted(paid)}"


def test_no_folder_cycle_beyond_the_known_debts():
    _, edges = file_graph()
    fe = folder_edges(edges)
    known = defaultdict(set)
    for e in KNOWN_UPWARD:
        a, b = e.split(" -> ")
        known[a].add(b)
    pruned = {a: {b for b in bs if b not in known[a]} for a, bs in fe.items()}
    cycles = [c for c in sccs(sorted(pruned), pruned) if len(c) > 1]
    assert not cycles, f"folder cycles: {cycles}"
    if not KNOWN_UPWARD:
        circles = [sorted(map(str, c)) for c in sccs(sorted(edges), edges) if len({top(f) for f in c}) > 1]
        assert not circles, f"circles of files across folders: {circles}"


def test_bridge_uses_no_protocol_server_or_asgi_module():
    _, edges = file_graph()
    used = {top(b) for a, bs in edges.items() if top(a) == "bridge" for b in bs} - {"bridge"}
    extra = used - BRIDGE_MAY_USE
    known = {e.split(" -> ")[1] for e in KNOWN_UPWARD if e.startswith("bridge -> ")}
    assert not (extra - known), f"the bridge uses {sorted(extra - known)}"


def test_wire_protocol_drivers_do_not_use_each_other():
    _, edges = file_graph()
    bad = []
    for a, bs in edges.items():
        pa = mod_path(a)
        for b in bs:
            pb = mod_path(b)
            if (
                len(pa) > 1
                and len(pb) > 1
                and pa[0] == pb[0] == "proto"
                and pa[1] in DRIVERS
                and pb[1] in DRIVERS
                and pa[1] != pb[1]
            ):
                bad.append(f"{a} -> {b}")
    assert not bad, f"drivers that use another driver: {bad}"


def test_every_driver_folder_is_checked():
    """A new folder under proto/ is a driver: it must be in DRIVERS."""
    folders = {p.name for p in (SRC / "proto").iterdir() if p.is_dir()}
    assert folders == set(DRIVERS), f"proto/ folders {sorted(folders)} vs DRIVERS {sorted(DRIVERS)}"


def test_http3_driver_stands_on_quinn_alone():
    """proto/h3 uses neither another driver (above) nor hyper, the HTTP/1.1
    and HTTP/2 drivers' machinery."""
    files = sorted((SRC / "proto" / "h3").rglob("*.rs"))
    assert files, "proto/h3 is missing"
    hyper = [str(f.relative_to(SRC)) for f in files if re.search(r"\bhyper(_util)?::", strip_comments(f.read_text()))]
    assert not hyper, f"proto/h3 files that use hyper: {hyper}"
