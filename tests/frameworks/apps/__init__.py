"""One small, realistic application per framework, served by the tests in
``tests/frameworks``. Large files come from ``$FRAMEWORKS_DATA`` (a temporary
directory the tests fill)."""
