"""The README documents what users can set, with the true defaults."""

from __future__ import annotations

import json

from harness import ROOT
from skirr import config


def fmt(default) -> str:
    if isinstance(default, float):
        return f"`{default:g}`"
    if default == "":
        return '`""`'
    if isinstance(default, dict):
        return f"`{json.dumps(default)}`"  # as the option takes it
    return f"`{default}`"


def test_every_option_is_in_the_readme_table_with_its_default():
    readme = (ROOT / "README.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in readme.splitlines() if line.startswith("| `--")}
    for o in config.OPTIONS:
        row = rows.get(f"`{o.flag}`")
        assert row, f"README is missing the row for {o.name}"
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert cells[1] == f"`{o.env}`", o.name
        assert cells[3] == fmt(o.default), (o.name, cells[3], fmt(o.default))
        if o.gunicorn:
            assert o.gunicorn in cells[2], o.name
