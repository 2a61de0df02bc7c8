"""Loading applications: clear errors when that fails, ASGI 2 apps adapted,
WSGI apps refused."""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import sysconfig
import traceback
from typing import Any


class AppLoadError(Exception):
    """The application could not be loaded; the message says why, in one line.

    ``cause`` is the exception raised by the application's code, if any
    (for a traceback at debug level).
    """

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


def _short(path: str) -> str:
    """``path`` relative to the working directory when it lies inside it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


#: Where the standard library and installed packages live: frames there are
#: not "the app's code" when pointing at the line that failed.
_LIBRARY_DIRS = tuple(
    {
        os.path.realpath(p) + os.sep
        for k in ("stdlib", "platstdlib", "purelib", "platlib")
        if (p := sysconfig.get_path(k))
    }
)
_HERE = os.path.dirname(os.path.realpath(__file__)) + os.sep


def _loader_frame(filename: str) -> bool:
    """Skirr's or importlib's frames, above the app's own in a traceback."""
    return (
        filename.startswith("<frozen ")
        or os.path.realpath(filename).startswith(_HERE)
        or filename.endswith(os.path.join("importlib", "__init__.py"))
    )


def where(e: BaseException) -> str:
    """``"path, line N"`` of the line that raised ``e``: for an error
    inside a library the app called, the app's line that called it."""
    if isinstance(e, SyntaxError) and e.filename:
        return f"{_short(e.filename)}, line {e.lineno}"
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not _loader_frame(f.filename)]
    if not frames:
        return ""
    own = [f for f in frames if not os.path.realpath(f.filename).startswith(_LIBRARY_DIRS)]
    f = (own or frames)[-1]
    return f"{_short(f.filename)}, line {f.lineno}"


def app_traceback(e: BaseException, loader_dirs: tuple[str, ...] = ()) -> str:
    """The traceback of ``e`` from the app's first frame on (frames of
    Skirr, importlib and ``loader_dirs`` above it are left out)."""
    tb = e.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not (_loader_frame(name) or os.path.realpath(name).startswith(loader_dirs)):
            break
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb))


def describe(e: BaseException) -> str:
    """``"Type: message (path, line N)"``, on one line (a message of several
    lines, e.g. a validation report, is cut after its first)."""
    msg = e.msg if isinstance(e, SyntaxError) and e.filename else str(e)
    lines = msg.strip().splitlines()
    text = type(e).__name__ + (f": {lines[0]}" if lines else "") + (" …" if len(lines) > 1 else "")
    at = where(e)
    return f"{text} ({at})" if at else text


def _is_prefix(package: str, module: str) -> bool:
    return module == package or module.startswith(package + ".")


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
        missing = e.name or ""
        if missing and _is_prefix(missing, module_name):
            # The APP path itself (or a package on it) does not exist.
            searched = os.path.abspath(app_dir if app_dir is not None else ".")
            raise AppLoadError(
                f"cannot import module {module_name!r}: no module named {missing!r} in {searched} or on sys.path "
                "(run from the directory holding it, or set --app-dir)"
            ) from None
        if not missing:
            raise AppLoadError(f"importing {module_name!r} failed: {describe(e)}", e) from None
        at = where(e)
        at = f" ({at})" if at else ""
        if missing.partition(".")[0] == module_name.partition(".")[0]:
            # A module of the app's own package, not a dependency.
            raise AppLoadError(
                f"the app module {module_name!r} imports {missing!r}, which does not exist{at}", e
            ) from None
        raise AppLoadError(
            f"the app module {module_name!r} imports {missing!r}, which is not installed{at}: "
            f"install it for the Python running Skirr ({sys.executable})",
            e,
        ) from None
    except Exception as e:  # noqa: BLE001 - user code may raise anything
        raise AppLoadError(f"importing {module_name!r} failed: {describe(e)}", e) from None
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
            raise AppLoadError(f"factory {spec!r} failed: {describe(e)}", e) from None
    if not callable(obj):
        raise AppLoadError(f"{spec!r} is not callable (got {type(obj).__name__})")
    return obj


def is_asgi3(app: Any) -> bool:
    """Whether ``app`` is an ASGI 3 single callable (rather than an ASGI 2
    double callable ``app(scope)(receive, send)``), decided as uvicorn and
    asgiref do: by whether the callable is a coroutine function."""
    if inspect.iscoroutinefunction(app):
        return True  # also sees through functools.partial
    if inspect.isclass(app):
        return hasattr(app, "__await__")
    if inspect.isfunction(app) or inspect.ismethod(app) or isinstance(app, functools.partial):
        return False
    call = getattr(app, "__call__", None)  # noqa: B004
    return inspect.iscoroutinefunction(call)


def _binds(app: Any, n: int) -> bool | None:
    """Whether ``app`` accepts ``n`` positional arguments (``None``: no
    signature to tell, e.g. a C callable)."""
    try:
        sig = inspect.signature(app)
    except (TypeError, ValueError):
        return None
    try:
        sig.bind(*range(n))
    except TypeError:
        return False
    return True


def interface(app: Any) -> str:
    """``"asgi3"``, ``"asgi2"`` or ``"wsgi"``.

    Coroutine functions are ASGI 3. Any other callable is ASGI 2
    (``app(scope)``), as uvicorn and asgiref decide, unless its signature
    rules that out: one that takes exactly two positional arguments is a
    WSGI app ``app(environ, start_response)``, and one that takes exactly
    three is an ASGI 3 app returning an awaitable (a plain-``def``
    middleware that returns the wrapped app's coroutine).
    """
    if is_asgi3(app):
        return "asgi3"
    if _binds(app, 1) is False:
        if _binds(app, 2):
            return "wsgi"
        if _binds(app, 3):
            return "asgi3"
    return "asgi2"


class ASGI2Adapter:
    """Runs an ASGI 2 application as ASGI 3."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        instance = self.app(scope)
        await instance(receive, send)


class ReturnedAwaitable:
    """Runs an ASGI 3 callable that is not a coroutine function but returns
    an awaitable."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


def wsgi_message(name: str) -> str:
    return (
        f"{name} is a WSGI application (it is called as app(environ, start_response)), and Skirr serves ASGI: "
        "serve it with a WSGI server (e.g. gunicorn -k gthread), or wrap it: "
        "from asgiref.wsgi import WsgiToAsgi; app = WsgiToAsgi(app)"
    )


def as_asgi3(app: Any, name: str = "the application") -> Any:
    """``app`` as an ASGI 3 callable: itself, or wrapped if it is ASGI 2.

    Raises :class:`AppLoadError` for a WSGI application (``name`` says
    which, e.g. ``"'app:app'"``).
    """
    kind = interface(app)
    if kind == "wsgi":
        raise AppLoadError(wsgi_message(name))
    if kind == "asgi2":
        return ASGI2Adapter(app)
    return app if is_asgi3(app) else ReturnedAwaitable(app)
