"""``python -m skirr``: see :mod:`skirr.cli`."""

from skirr.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
