"""Loading applications and adapting ASGI 2 ones."""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import Any


class AppLoadError(Exception):
    """The application could not be loaded; the message says why, in one line."""


def import_app(spec: str, *, factory: bool = False, app_dir: str | None = ".") -> Any:
    """Imports ``"module:attr"`` (``attr`` may be dotted). With ``factory``,
    calls the attribute with no arguments and returns the result.

    Raises :class:`AppLoadError` for a malformed spec, an import failure,
    a missing attribute, a failing factory, or a result that is not callable.
    """
    if app_dir is not None and app_dir not in sys.path:
        sys.path.insert(0, app_dir)
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AppLoadError(f"APP must be of the form 'module:attribute', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name) or e.name == module_name:
            raise AppLoadError(f"cannot import module {module_name!r}: {e}") from None
        raise AppLoadError(f"importing {module_name!r} failed: {type(e).__name__}: {e}") from None
    except Exception as e:  # noqa: BLE001 - user code may raise anything
        raise AppLoadError(f"importing {module_name!r} failed: {type(e).__name__}: {e}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AppLoadError(f"module {module_name!r} has no attribute {attr!r}") from None
    if factory:
        if not callable(obj):
            raise AppLoadError(f"factory {spec!r} is not callable")
        try:
            obj = obj()
        except Exception as e:  # noqa: BLE001
            raise AppLoadError(f"factory {spec!r} failed: {type(e).__name__}: {e}") from None
    if not callable(obj):
        raise AppLoadError(f"{spec!r} is not callable (got {type(obj).__name__})")
    return obj


def is_asgi3(app: Any) -> bool:
    """Whether ``app`` is an ASGI 3 single callable (rather than an ASGI 2
    double callable ``app(scope)(receive, send)``), decided as uvicorn and
    asgiref do: by whether the callable is a coroutine function."""
    if inspect.isclass(app):
        return hasattr(app, "__await__")
    if inspect.isfunction(app) or inspect.ismethod(app):
        return inspect.iscoroutinefunction(app)
    call = getattr(app, "__call__", None)  # noqa: B004
    return inspect.iscoroutinefunction(call)


class ASGI2Adapter:
    """Runs an ASGI 2 application as ASGI 3."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        instance = self.app(scope)
        await instance(receive, send)


def as_asgi3(app: Any) -> Any:
    """``app`` itself if it is ASGI 3, else an :class:`ASGI2Adapter` around it."""
    return app if is_asgi3(app) else ASGI2Adapter(app)
