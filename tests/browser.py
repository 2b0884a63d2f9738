"""A minimal Chrome DevTools Protocol client for tests: open a page in headless Chromium, collect its console errors
(failed resource loads included), measure its <figure> elements and take a full-page screenshot."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

TIMEOUT_S = 30.0  # for start-up, the page load and each protocol call
WIDTH = 1280  # CSS pixels; the screenshot is taken at device scale 1, so its pixels are CSS pixels

# every <figure> and the <svg> inside it, in page coordinates (scroll offsets added)
MEASURE = """(() => {
  const box = (e) => { if (!e) return null; const r = e.getBoundingClientRect();
    return {x: r.left + window.scrollX, y: r.top + window.scrollY, width: r.width, height: r.height}; };
  return [...document.querySelectorAll('figure')].map(f => ({id: f.id, box: box(f), svg: box(f.querySelector('svg'))}));
})()"""


@dataclass
class Capture:
    errors: list[str]  # console errors, uncaught exceptions, failed loads
    figures: list[dict[str, Any]]  # {"id", "box": {x, y, width, height}, "svg": box or None}
    screenshot: Path  # PNG of the whole page, 1 pixel per CSS pixel
    page_height: int


class Session:
    """One DevTools websocket: numbered calls, with the events that arrive meanwhile kept in order."""

    def __init__(self, ws_url: str) -> None:
        self.ws = connect(ws_url, max_size=None, open_timeout=TIMEOUT_S)
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=TIMEOUT_S))
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, method: str) -> dict[str, Any]:
        """The first event `method` (already received, or the next one to arrive)."""
        deadline = time.monotonic() + TIMEOUT_S
        while not any(e.get("method") == method for e in self.events):
            self.events.append(json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic()))))
        return next(e for e in self.events if e.get("method") == method)

    def close(self) -> None:
        self.ws.close()


def errors(events: list[dict[str, Any]]) -> list[str]:
    """What a page reported as wrong: console.error, uncaught exceptions, error log entries (failed loads)."""
    found = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            found.append("console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"]))
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            found.append("exception: " + details.get("exception", {}).get("description", details.get("text", "")))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            entry = params["entry"]
            found.append(f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}".strip())
    return found


@contextmanager
def chromium(binary: str) -> Iterator[int]:
    """A headless Chromium with remote debugging; yields its DevTools port. Killed on the way out."""
    folder = Path(tempfile.mkdtemp(prefix="rlvr-chromium-"))
    log = (folder / "stderr.log").open("w")  # a file, not a pipe: a pipe nobody drains can block the browser
    process = subprocess.Popen(
        [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--remote-debugging-port=0",
         f"--user-data-dir={folder / 'profile'}", "--no-first-run", "--no-default-browser-check", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=log,
    )
    try:
        yield _devtools_port(process, folder / "stderr.log")
    finally:
        process.kill()
        process.wait(timeout=TIMEOUT_S)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


def _devtools_port(process: subprocess.Popen[bytes], log: Path) -> int:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        match = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", log.read_text(errors="replace"))
        if match:
            return int(match.group(1))
        if process.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError(f"chromium gave no DevTools address (exit code {process.poll()}):\n{log.read_text()[-2000:]}")


def capture(page: Path, screenshot: Path, binary: str) -> Capture:
    """Load `page` (a local HTML file) in headless Chromium; its errors, its figures' boxes, a full-page screenshot."""
    with chromium(binary) as port:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=TIMEOUT_S) as response:
            targets = json.load(response)
        target = next(t for t in targets if t.get("type") == "page")
        session = Session(target["webSocketDebuggerUrl"])
        try:
            for domain in ("Runtime", "Log", "Page"):
                session.call(f"{domain}.enable")
            _viewport(session, 800)
            session.call("Page.navigate", url=page.resolve().as_uri())
            session.wait_for("Page.loadEventFired")
            # the viewport as tall as the page: the screenshot is the whole page, and boxes are measured at that layout
            height = _evaluate(session, "document.documentElement.scrollHeight")
            _viewport(session, height)
            figures = _evaluate(session, MEASURE)
            shot = session.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
            return Capture(errors(session.events), figures, screenshot, height)
        finally:
            session.close()


def _viewport(session: Session, height: int) -> None:
    session.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=height, deviceScaleFactor=1, mobile=False)


def _evaluate(session: Session, expression: str) -> Any:
    result = session.call("Runtime.evaluate", expression=expression, returnByValue=True)
    if "exceptionDetails" in result:
        raise RuntimeError(f"evaluating {expression[:60]!r}: {result['exceptionDetails']}")
    return result["result"]["value"]
