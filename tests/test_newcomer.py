"""What a newcomer meets in the first hour, each with one clear message:
an app module that fails to import."""

from __future__ import annotations

import os
import subprocess

from harness import PY, ROOT, _env


def run_cli(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-m", "skirr", *args], cwd=str(ROOT), env=_env(None), capture_output=True, text=True, timeout=timeout
    )


def one_error_line(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 1, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("skirr: error: "), p.stderr
    return lines[0]


# --- 3. an app module that fails to import (standalone) -----------------------------------


def test_import_error_names_the_file_and_line():
    line = one_error_line(run_cli("tests.apps.keyerror_at_import:app", "--port", "0"))
    assert "KeyError: 'SECRET_KEY'" in line
    assert os.path.join("tests", "apps", "keyerror_at_import.py") + ", line 4" in line, line
    assert "--log-level debug" in line


def test_import_error_traceback_at_debug_starts_at_the_app():
    p = run_cli("tests.apps.keyerror_at_import:app", "--port", "0", "--log-level", "debug")
    assert p.returncode == 1
    assert "Traceback (most recent call last):" in p.stderr
    assert 'keyerror_at_import.py", line 4, in <module>' in p.stderr
    assert "importlib" not in p.stderr and "skirr/asgi.py" not in p.stderr, p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("skirr: error: ")


def test_missing_dependency_is_not_reported_as_a_wrong_app_path():
    line = one_error_line(run_cli("nonexistent_dep_app:app", "--app-dir", "tests/apps", "--port", "0"))
    assert "the app module 'nonexistent_dep_app' imports 'nonexistent_dep', which is not installed" in line, line
    assert "nonexistent_dep_app.py, line 4" in line
    assert "cannot import module" not in line


def test_wrong_app_path_says_where_it_looked():
    line = one_error_line(run_cli("tests.apps.no_such_app:app", "--port", "0"))
    assert "cannot import module 'tests.apps.no_such_app'" in line
    assert str(ROOT) in line and "--app-dir" in line
