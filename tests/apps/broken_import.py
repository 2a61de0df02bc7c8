"""A module whose import fails (for the bad-APP test)."""

import this_module_does_not_exist  # noqa: F401

app = None
