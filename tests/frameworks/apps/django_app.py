"""A Django project in one module: settings configured here, no scaffold.

Async and sync views, a FileResponse of a large file, StreamingHttpResponse
(async and sync iterators), multipart upload, and a counter of
``request_finished`` signals (which Django sends from ``response.close()``
once the response has been sent)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from pathlib import Path

import django
from django.conf import settings

settings.configure(
    DEBUG=False,
    SECRET_KEY="frameworks-suite-not-secret",
    ALLOWED_HOSTS=["*"],
    ROOT_URLCONF=__name__,
    MIDDLEWARE=[],
    INSTALLED_APPS=[],
    DATABASES={},
    USE_TZ=True,
    # Uploads over 256 KiB spill to a temporary file (TemporaryUploadedFile).
    FILE_UPLOAD_MAX_MEMORY_SIZE=256 * 1024,
    LOGGING_CONFIG=None,
)
django.setup(set_prefix=False)

from django.core.asgi import get_asgi_application  # noqa: E402
from django.core.signals import request_finished, request_started  # noqa: E402
from django.http import FileResponse, HttpResponse, JsonResponse, StreamingHttpResponse  # noqa: E402
from django.urls import path  # noqa: E402

DATA = Path(os.environ.get("FRAMEWORKS_DATA", "."))

_lock = threading.Lock()
SIGNALS = {"started": 0, "finished": 0}


def _on_started(sender, **kwargs):
    with _lock:
        SIGNALS["started"] += 1


def _on_finished(sender, **kwargs):
    with _lock:
        SIGNALS["finished"] += 1


request_started.connect(_on_started)
request_finished.connect(_on_finished)

RELEASE: dict[str, asyncio.Event] = {}
STREAMS_CANCELLED: list[str] = []  # streams whose client went away mid-way


def _event(key: str) -> asyncio.Event:
    return RELEASE.setdefault(key, asyncio.Event())


def healthz(request):
    return HttpResponse("ok", content_type="text/plain")


async def async_view(request, rest=""):
    await asyncio.sleep(0.001)
    asyncio.get_running_loop()  # raises outside a loop
    return JsonResponse(
        {
            "view": "async",
            "method": request.method,
            "path": request.path,
            "rest": rest,
            "query": request.GET.dict(),
            "scheme": request.scheme,
            "host": request.get_host(),
            "remote_addr": request.META.get("REMOTE_ADDR"),
            "x_test": request.headers.get("X-Test"),
            "absolute": request.build_absolute_uri("/x?y=1"),
        }
    )


def sync_view(request):
    try:
        asyncio.get_running_loop()
        loop_in_thread = True
    except RuntimeError:
        loop_in_thread = False
    return JsonResponse(
        {
            "view": "sync",
            "main_thread": threading.current_thread() is threading.main_thread(),
            "loop_in_thread": loop_in_thread,
            "cookie": request.COOKIES.get("flavour"),
        }
    )


async def echo_view(request):
    resp = HttpResponse(request.body, content_type=request.content_type or "application/octet-stream")
    resp["X-Body-Length"] = str(len(request.body))
    resp.set_cookie("seen", "yes")
    return resp


def file_view(request, name):
    return FileResponse(open(DATA / name, "rb"), as_attachment=True, filename=name)


async def stream_view(request):
    """Streams "first", waits until /release?key=... (so the client can show
    the first chunk arrived before the view finished), then three more."""
    key = request.GET["key"]
    released = _event(key)

    async def gen():
        try:
            yield b"first\n"
            try:
                await asyncio.wait_for(released.wait(), 5)
            except asyncio.TimeoutError:
                yield b"never released\n"
                return
            for i in range(3):
                await asyncio.sleep(0.001)
                yield f"chunk {i}\n".encode()
        except asyncio.CancelledError:
            STREAMS_CANCELLED.append(key)
            raise

    return StreamingHttpResponse(gen(), content_type="text/plain")


async def release_view(request):
    _event(request.GET["key"]).set()
    return JsonResponse({"released": request.GET["key"]})


def stream_sync_view(request):
    n = int(request.GET.get("n", "5"))
    return StreamingHttpResponse((f"line {i}\n".encode() for i in range(n)), content_type="text/plain")


def upload_view(request):
    if request.method != "POST":
        return HttpResponse(status=405)
    files = {}
    for field, f in request.FILES.items():
        h = hashlib.sha256()
        for chunk in f.chunks():
            h.update(chunk)
        files[field] = {
            "name": f.name,
            "size": f.size,
            "sha256": h.hexdigest(),
            "content_type": f.content_type,
            "on_disk": hasattr(f, "temporary_file_path"),
        }
    return JsonResponse({"fields": request.POST.dict(), "files": files})


def signals_view(request):
    with _lock:
        return JsonResponse({**SIGNALS, "streams_cancelled": STREAMS_CANCELLED})


urlpatterns = [
    path("healthz", healthz),
    path("async", async_view),
    path("async/<path:rest>", async_view),
    path("sync", sync_view),
    path("echo", echo_view),
    path("file/<str:name>", file_view),
    path("stream", stream_view),
    path("release", release_view),
    path("stream-sync", stream_sync_view),
    path("upload", upload_view),
    path("signals", signals_view),
]

application = get_asgi_application()
