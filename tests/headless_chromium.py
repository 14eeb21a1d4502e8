"""Headless Chromium driven over the Chrome DevTools Protocol, for browser tests.

``HeadlessChromium`` starts Debian's ``chromium`` with ``--remote-debugging-port=0`` (it
writes the port it picked to ``DevToolsActivePort`` in its profile folder) and connects a
websocket (websocket-client) to its first page. ``Page`` sends protocol commands one at a
time and keeps the events that arrive meanwhile: the console errors and uncaught
exceptions a test asserts empty.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import websocket

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
START_TIMEOUT_S = 20.0


def find_chromium() -> str | None:
    """``OCTAVO_CHROMIUM`` if set, else the first of ``CHROMIUM_NAMES`` on PATH."""
    explicit = os.environ.get("OCTAVO_CHROMIUM")
    if explicit:
        return explicit
    return next(filter(None, map(shutil.which, CHROMIUM_NAMES)), None)


class PageError(AssertionError):
    """A protocol command failed, or a wait ran out."""


class Page:
    """One page target: ``call`` a protocol method, ``evaluate`` JavaScript, ``wait_for``."""

    def __init__(self, socket: websocket.WebSocket) -> None:
        self.socket = socket
        self.ids = itertools.count(1)
        self.problems: list[str] = []  # console errors, exceptions, failed loads

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        request_id = next(self.ids)
        self.socket.send(json.dumps({"id": request_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == request_id:
                if "error" in message:
                    raise PageError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._note(message)

    def _note(self, event: dict[str, Any]) -> None:
        """Keep what a page with no bugs never produces."""
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            self.problems.append(f"exception: {text}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            texts = [str(arg.get("value", arg.get("description"))) for arg in params["args"]]
            self.problems.append(f"console.{params['type']}: {' '.join(texts)}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.problems.append(f"log: {params['entry']['text']}")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (promises awaited)."""
        result = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise PageError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float, what: str) -> Any:
        """Poll EXPRESSION until it is truthy; its value, or PageError naming WHAT."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        raise PageError(f"{what} within {timeout:.0f} s (problems: {self.problems})")

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'", 10, "the page did not load")

    def type_into(self, selector: str, text: str) -> None:
        """Focus the element and type TEXT as keyboard input would."""
        self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        self.call("Input.insertText", text=text)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path


@contextmanager
def headless_chromium(binary: str, profile: Path, size: tuple[int, int]) -> Iterator[Page]:
    """A headless Chromium (its profile in PROFILE) with one blank page of SIZE, events on."""
    command = [
        binary,
        "--headless=new",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        f"--window-size={size[0]},{size[1]}",
        "--no-sandbox",  # test containers run as root, where the sandbox refuses to start
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        "--hide-scrollbars",
        "about:blank",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        socket = websocket.create_connection(_page_socket_url(process, profile), timeout=30)
        try:
            page = Page(socket)
            for domain in ("Page", "Runtime", "Log"):
                page.call(f"{domain}.enable")
            yield page
        finally:
            socket.close()
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _page_socket_url(process: subprocess.Popen, profile: Path) -> str:
    """The DevTools websocket URL of the browser's first page, once it listens."""
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise PageError(f"chromium exited with {process.returncode} during startup")
        if port_file.exists() and port_file.read_text().strip():
            port = port_file.read_text().split()[0]
            targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
            pages = [target for target in targets if target["type"] == "page"]
            if pages:
                return pages[0]["webSocketDebuggerUrl"]
        time.sleep(0.1)
    raise PageError(f"chromium did not open its DevTools port within {START_TIMEOUT_S:.0f} s")
