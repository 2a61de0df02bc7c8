"""Fixtures of the framework compatibility suite: one server per test module
and server kind (see ``servers.py``), and the large files the apps serve."""

from __future__ import annotations

import httpx
import pytest

from .servers import make_data, selected, serve


@pytest.fixture(scope="session")
def data(tmp_path_factory):
    """The large files, by name (``odd.bin``, ``exact.bin``)."""
    return make_data(tmp_path_factory.mktemp("frameworks-data"))


@pytest.fixture(scope="session")
def data_dir(data):
    return next(iter(data.values())).path.parent


@pytest.fixture(scope="module", params=selected())
def server(request, data_dir, tmp_path_factory):
    """The module's ``APP`` served by one server kind, started once per module.
    ``server.kind`` names the kind; ``server.scratch`` is a directory the app
    may write to (``$FRAMEWORKS_SCRATCH``)."""
    scratch = tmp_path_factory.mktemp("frameworks-scratch")
    env = {"FRAMEWORKS_DATA": str(data_dir), "FRAMEWORKS_SCRATCH": str(scratch)}
    with serve(request.param, request.module.APP, env=env) as s:
        s.kind = request.param
        s.scratch = scratch
        yield s


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    server = getattr(item, "funcargs", {}).get("server")
    if report.failed and server is not None and hasattr(server, "logs"):
        report.sections.append((f"{server.kind} server log (tail)", server.logs()[-6000:]))
    return report


@pytest.fixture(scope="module")
def _module_client(server):
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


@pytest.fixture
def client(_module_client):
    """An httpx client for the module's server (one per module: creating one
    costs an SSL context), with no cookies left over from other tests."""
    _module_client.cookies.clear()
    yield _module_client
