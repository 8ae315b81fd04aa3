"""A real browser for the tests of a web page: Debian's headless Chromium, driven over its DevTools protocol.

The lightest thing that really renders JavaScript: Chromium itself (``apt-get install chromium``,
scripts/bootstrap.sh) started with ``--remote-debugging-port``, and a few DevTools commands sent over
its websocket with the ``websockets`` package: set a cookie, size the window, open a page, wait for
what the page draws, evaluate an expression, take a screenshot. No driver, no Node.
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
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from websockets.sync.client import connect


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class Page:
    """One tab, driven by DevTools commands."""

    def __init__(self, ws_url: str) -> None:
        self._stack = ExitStack()
        # No keepalive pings: the events the page sends between two commands are read only at the next command.
        self._ws = self._stack.enter_context(connect(ws_url, max_size=None, max_queue=None, ping_interval=None,
                                                    open_timeout=30))
        self._ids = itertools.count(1)

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        n = next(self._ids)
        self._ws.send(json.dumps({"id": n, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv(timeout=120))
            if message.get("id") == n:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60, what: str = "") -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(expression)
            except RuntimeError:
                # Evaluated between two documents (a reload under way: no document element yet): not yet.
                if time.monotonic() > deadline:
                    raise
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                text = self.evaluate("document.body ? document.body.innerText.slice(0, 3000) : ''")
                raise AssertionError(f"timed out waiting for {what or expression}; the page shows:\n{text}")
            time.sleep(0.25)

    def size(self, width: int, height: int) -> None:
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def open(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def screenshot(self, path: Path, *, whole: str | None = None) -> None:
        """The page as PNG; ``whole``: a CSS selector of an element whose full height the window is made
        tall enough to show first (a page that scrolls inside a box of its own, as Airflow's UI does)."""
        width = self.evaluate("window.innerWidth")
        height = self.evaluate("window.innerHeight")
        if whole:
            need = self.evaluate(f"Math.ceil(document.querySelector({json.dumps(whole)}).getBoundingClientRect().top"
                                 f" + document.querySelector({json.dumps(whole)}).scrollHeight + 24)")
            self.size(width, max(height, need))
            time.sleep(0.3)
        metrics = self.send("Page.getLayoutMetrics")["cssContentSize"]
        shot = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": metrics["width"], "height": metrics["height"], "scale": 1})
        path.write_bytes(base64.b64decode(shot["data"]))
        if whole:
            self.size(width, height)

    def close(self) -> None:
        self._stack.close()


@contextmanager
def browser(width: int = 1280, height: int = 900) -> Iterator[Page]:
    """A headless Chromium of its own (a private profile), one tab; stopped at the end."""
    binary = chromium()
    if binary is None:
        raise RuntimeError("no chromium: scripts/bootstrap.sh installs Debian's chromium package")
    profile = tempfile.mkdtemp(prefix="rowfilter-chromium-")
    args = [binary, "--headless=new", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
            "--disable-breakpad", "--disable-crash-reporter",
            "--disable-dev-shm-usage", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
            f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"]
    if os.geteuid() == 0:
        args.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    page = None
    try:
        port_file = Path(profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start (exit {process.poll()})")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as answer:
            target = next(t for t in json.load(answer) if t["type"] == "page")
        page = Page(target["webSocketDebuggerUrl"])
        page.send("Page.enable")
        page.send("Network.enable")
        page.size(width, height)
        yield page
    finally:
        if page is not None:
            page.close()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        shutil.rmtree(profile, ignore_errors=True)
