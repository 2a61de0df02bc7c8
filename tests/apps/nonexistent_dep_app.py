"""An app module that imports a dependency that is not installed (its name
is a prefix of this module's, which once read as "module not found")."""

import nonexistent_dep  # noqa: F401

app = None
