"""A real headless Chromium, driven over the Chrome DevTools Protocol.

No Playwright and no browser download: Debian's ``chromium`` is started with a
fresh profile and ``--remote-debugging-port=0``; the port it picked is read
from ``DevToolsActivePort`` in the profile (polled, like every wait here). One
WebSocket (the ``websockets`` sync client) carries every command; a reader
thread files answers by id and events by session. Every command and every
wait has a timeout. Each test gets fresh pages, each in its own browser
context (no shared cookies or storage); if the test fails, every page is
screenshotted and the PNG paths, page text and console go into the error.
``SKIRR_CHROMIUM`` names another Chromium-like binary.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

CHROMIUM = os.environ.get("SKIRR_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
TIMEOUT = 10.0

FLAGS = [
    "--headless",
    "--no-sandbox",  # root in a container
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--no-proxy-server",
    # No internet here: every host but this one fails at once, not after a DNS timeout.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost",
    # Pages of one test share the browser; none of them is throttled as a background tab.
    "--disable-background-timer-throttling",
    "--disable-renderer-backgrounding",
    "--disable-backgrounding-occluded-windows",
]


class CDPError(Exception):
    """The browser answered a command with an error, or went away."""


class Browser:
    def __init__(self, *flags: str, timeout: float = 20.0, quic: bool = False) -> None:
        """``quic``: keep QUIC on (HTTP/3 tests); every other test turns it off."""
        if not CHROMIUM:
            raise RuntimeError("chromium not found")
        self.dir = Path(tempfile.mkdtemp(prefix="skirr-chromium-"))
        profile = self.dir / "profile"
        self.log_path = self.dir / "chromium.log"
        base = [f for f in FLAGS if not (quic and f == "--disable-quic")]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [CHROMIUM, *base, *flags, f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its helpers share one process group, ended with it
            )
        self._cv = threading.Condition()
        self._ids = itertools.count(1)
        self._answers: dict[int, dict] = {}
        self._events: dict[str | None, list[dict]] = {}
        self._closed = False
        self._stack = ExitStack()
        try:
            port, path = self._devtools_address(profile / "DevToolsActivePort", timeout)
            url = f"ws://127.0.0.1:{port}{path}"
            self.ws = self._stack.enter_context(connect(url, max_size=None, open_timeout=timeout))
        except BaseException:
            self._kill(grace=0)
            raise
        self._reader = threading.Thread(target=self._read, name="cdp-reader", daemon=True)
        self._reader.start()

    def _devtools_address(self, port_file: Path, timeout: float) -> tuple[int, str]:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited ({self.proc.returncode}):\n{self.log()}")
            try:
                lines = port_file.read_text().split()
            except FileNotFoundError:
                lines = []
            if len(lines) >= 2:  # port, then /devtools/browser/<id>
                return int(lines[0]), lines[1]
            if time.monotonic() > deadline:
                raise TimeoutError(f"chromium did not open its DevTools port in {timeout}s:\n{self.log()}")
            time.sleep(0.02)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def _read(self) -> None:
        try:
            for raw in self.ws:
                msg = json.loads(raw)
                with self._cv:
                    if "id" in msg:
                        self._answers[msg["id"]] = msg
                    else:
                        self._events.setdefault(msg.get("sessionId"), []).append(msg)
                    self._cv.notify_all()
        except (ConnectionClosed, OSError):
            pass
        finally:
            with self._cv:
                self._closed = True
                self._cv.notify_all()

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = TIMEOUT):
        with self._cv:
            if self._closed:
                raise CDPError(f"{method}: the browser connection is closed")
            i = next(self._ids)
        msg = {"id": i, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        with self._cv:
            if not self._cv.wait_for(lambda: i in self._answers or self._closed, timeout):
                raise TimeoutError(f"CDP {method}: no answer in {timeout}s")
            if i not in self._answers:
                raise CDPError(f"{method}: the browser connection closed")
            answer = self._answers.pop(i)
        if "error" in answer:
            raise CDPError(f"{method}: {answer['error'].get('message')} {answer['error'].get('data', '')}")
        return answer["result"]

    def events(self, session: str | None) -> list[dict]:
        with self._cv:
            return list(self._events.get(session, ()))

    def wait_event(self, session: str | None, predicate, timeout: float = TIMEOUT, what: str = "event") -> dict:
        def find():
            return next((e for e in self._events.get(session, ()) if predicate(e)), None) or self._closed

        with self._cv:
            found = self._cv.wait_for(find, timeout)
        if not found:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        if found is True:
            raise CDPError(f"the browser connection closed while waiting for {what}")
        return found

    @contextmanager
    def pages(self, n: int):
        """``n`` fresh pages, each in its own browser context; screenshots of
        all of them in the error if the block fails."""
        pages: list[Page] = []
        try:
            pages += [Page(self) for _ in range(n)]
            yield pages
        except Exception as e:
            shots = Path(tempfile.mkdtemp(prefix="skirr-browser-fail-"))
            report = [f"{type(e).__name__}: {e}", f"screenshots in {shots}:"]
            for k, p in enumerate(pages):
                report.append(p.describe(shots / f"page{k}.png"))
            raise AssertionError("\n".join(report)) from e
        finally:
            for p in pages:
                p.close()

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except (CDPError, TimeoutError, OSError, ConnectionClosed):
            pass
        self._stack.close()
        self._kill(grace=10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _kill(self, grace: float) -> None:
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        try:  # whatever is left of the group this browser leads (crashpad, zygotes)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


class Page:
    """One tab: navigate, evaluate JavaScript, type, poll for a condition."""

    def __init__(self, browser: Browser) -> None:
        self.b = browser
        self.context = browser.send("Target.createBrowserContext")["browserContextId"]
        target = browser.send("Target.createTarget", {"url": "about:blank", "browserContextId": self.context})
        self.session = browser.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})[
            "sessionId"
        ]
        for method in ("Page.enable", "Runtime.enable", "Network.enable", "Log.enable"):
            self.send(method)
        self.send("Page.setLifecycleEventsEnabled", {"enabled": True})
        self.send("Emulation.setFocusEmulationEnabled", {"enabled": True})  # every page acts as the focused one
        self.url = "about:blank"

    def send(self, method: str, params: dict | None = None, timeout: float = TIMEOUT):
        return self.b.send(method, params, self.session, timeout)

    def goto(self, url: str, timeout: float = TIMEOUT) -> int:
        """Load ``url`` up to its load event; returns the document's HTTP status."""
        self.url = url
        nav = self.send("Page.navigate", {"url": url}, timeout)
        if nav.get("errorText"):
            raise AssertionError(f"navigating to {url}: {nav['errorText']}")
        loader, frame = nav["loaderId"], nav["frameId"]

        def loaded(e):
            p = e["params"]
            return e["method"] == "Page.lifecycleEvent" and p["name"] == "load" and p["loaderId"] == loader

        self.b.wait_event(self.session, loaded, timeout, f"{url} to load")
        for e in self.b.events(self.session):
            p = e["params"]
            if e["method"] == "Network.responseReceived" and p.get("loaderId") == loader and p.get("frameId") == frame:
                if p["type"] == "Document":
                    return p["response"]["status"]
        raise AssertionError(f"{url}: loaded, but no document response was seen")

    def eval(self, expression: str, timeout: float = TIMEOUT):
        """The value of a JavaScript expression (promises are awaited)."""
        r = self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}, timeout
        )
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            raise AssertionError(f"JavaScript {expression!r} threw: {d.get('exception', {}).get('description', d)}")
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout: float = TIMEOUT, what: str | None = None):
        """Polls until the expression is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.eval(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout}s waiting for {what or expression}")
            time.sleep(0.02)

    def text(self, selector: str = "body") -> str:
        return self.eval(f"document.querySelector({json.dumps(selector)})?.innerText ?? ''")

    def fill(self, selector: str, text: str) -> None:
        """Focus a field, select what is in it and type over it (real input events)."""
        self.eval(f"(e => {{ e.focus(); e.select(); }})(document.querySelector({json.dumps(selector)}))")
        self.send("Input.insertText", {"text": text})

    def press_enter(self) -> None:
        key = {"key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13, "nativeVirtualKeyCode": 13}
        self.send("Input.dispatchKeyEvent", {"type": "keyDown", "text": "\r", **key})
        self.send("Input.dispatchKeyEvent", {"type": "keyUp", **key})

    def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", {"format": "png"})["data"]))
        return path

    def console(self) -> list[str]:
        """Console calls, uncaught exceptions, the browser's own messages (a
        blocked request, say) and failed requests, in order."""
        out = []
        for e in self.b.events(self.session):
            p = e["params"]
            if e["method"] == "Runtime.consoleAPICalled":
                args = " ".join(str(a.get("value", a.get("description"))) for a in p["args"])
                out.append(f"console.{p['type']}: {args}")
            elif e["method"] == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                out.append(f"exception: {d.get('exception', {}).get('description', d.get('text'))}")
            elif e["method"] == "Log.entryAdded":
                entry = p["entry"]
                out.append(f"{entry['source']} {entry['level']}: {entry['text']} {entry.get('url', '')}".rstrip())
            elif e["method"] == "Network.loadingFailed" and not p.get("canceled"):
                out.append(f"request failed: {p.get('errorText')} ({p.get('type')})")
        return out

    def describe(self, shot: Path) -> str:
        lines = [f"-- {self.url}"]
        try:
            lines.append(f"   screenshot: {self.screenshot(shot)}")
            lines.append("   text: " + self.text()[:2000].replace("\n", "\n         "))
        except Exception as e:  # the page may be what broke
            lines.append(f"   (no screenshot/text: {e})")
        lines += [f"   {line}" for line in self.console()[-20:]]
        return "\n".join(lines)

    def close(self) -> None:
        try:
            self.b.send("Target.disposeBrowserContext", {"browserContextId": self.context}, timeout=5)
        except (CDPError, TimeoutError):
            pass
        with self.b._cv:
            self.b._events.pop(self.session, None)
