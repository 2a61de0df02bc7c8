"""Framework compatibility suite: a small realistic app per framework
(``apps/``) and tests of what a user of that framework expects, each run
against ``python -m skirr`` and ``gunicorn -k skirr.RustWorker -w 1`` (one
server per module and kind). ``SKIRR_FRAMEWORKS_SERVER=uvicorn`` runs the
same tests against uvicorn, the reference (see ``servers.py``)."""
