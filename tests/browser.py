"""A page opened in headless Chromium with the network off, read over the DevTools protocol.

``visit(page, screenshot)`` launches Debian's ``chromium`` in a session of its own, attaches
to its page, turns the network off (``Network.emulateNetworkConditions`` offline), opens the
page's ``file://`` URI and waits for its load event. It returns every URL the page asked for
(other than itself and ``data:`` URIs), every error it logged (console errors and failed
asserts, uncaught exceptions, browser log entries of level error), its title and DOM, and
writes a PNG of its first screen. Every wait is bounded; the browser's process group is
killed at the end, whatever happened.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

#: Off: everything Chromium fetches on its own (updates, safe browsing, sync, translation,
#: field trials), so that the only network traffic is the page's own.
QUIET_FLAGS = [
    "--no-first-run", "--no-default-browser-check", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--disable-default-apps", "--disable-extensions", "--disable-domain-reliability",
    "--disable-client-side-phishing-detection", "--disable-breakpad", "--disable-quic", "--metrics-recording-only",
    "--disable-field-trial-config", "--no-pings", "--safebrowsing-disable-auto-update",
    "--disable-features=Translate,OptimizationHints,MediaRouter,DialMediaRouteProvider,AutofillServerCommunication,"
    "CertificateTransparencyComponentUpdater,InterestFeedContentSuggestions,NetworkTimeServiceQuerying",
]


def chromium_available() -> bool:
    return Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)


@dataclass
class PageVisit:
    """What one offline visit of a page saw."""

    url: str
    title: str
    #: URLs the page asked for, other than its own and data: URIs (offline, none of them loaded)
    requests: list[str]
    #: console errors and failed asserts, uncaught exceptions, log entries of level error
    errors: list[str]
    #: the PNG of the first screen (the viewport)
    screenshot: Path
    #: ``document.documentElement.outerHTML`` after the load event
    dom: str
    #: elements (outside SVG charts) that reach past the window's right edge: tag and text
    too_wide: list[str]


class DevTools:
    """A DevTools protocol client over one websocket: calls wait for their answer (bounded),
    events arriving meanwhile are kept in ``events``, in order."""

    def __init__(self, ws: ClientConnection):
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self._next = 0

    def _receive(self, deadline: float, what: str) -> dict[str, Any]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"chromium: no {what} in time")
        try:
            message = json.loads(self.ws.recv(timeout=left))
        except TimeoutError:
            raise TimeoutError(f"chromium: no {what} in time") from None
        if "method" in message:
            self.events.append(message)
        return message

    def call(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None,
             timeout: float = 30) -> dict[str, Any]:
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        self.ws.send(json.dumps(message))
        deadline = time.monotonic() + timeout
        while True:
            answer = self._receive(deadline, f"answer to {method}")
            if answer.get("id") == self._next:
                if "error" in answer:
                    raise RuntimeError(f"chromium: {method} failed: {answer['error']}")
                return answer.get("result", {})

    def wait_for(self, method: str, *, session: str | None = None, timeout: float = 30) -> dict[str, Any]:
        """The first event ``method`` (of ``session``), seen already or arriving within ``timeout``."""
        def match(event: dict[str, Any]) -> bool:
            return event.get("method") == method and (session is None or event.get("sessionId") == session)

        seen = next((e for e in self.events if match(e)), None)
        deadline = time.monotonic() + timeout
        while seen is None:
            message = self._receive(deadline, method)
            seen = message if match(message) else None
        return seen["params"]


def devtools_endpoint(profile: Path, proc: subprocess.Popen, timeout: float) -> str:
    """The browser's websocket URL, from ``DevToolsActivePort`` (port, then path) in its profile."""
    active = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = active.read_text().split("\n") if active.is_file() else []
        if len(lines) >= 2 and lines[0].strip().isdigit() and lines[1].startswith("/"):
            return f"ws://127.0.0.1:{lines[0].strip()}{lines[1].strip()}"
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with {proc.returncode} before it listened")
        time.sleep(0.05)
    raise TimeoutError(f"chromium wrote no {active} in {timeout:.0f} s")


def stop_group(proc: subprocess.Popen, grace: float = 5) -> None:
    """SIGTERM to the browser's process group (Chromium then reaps its own children), SIGKILL
    to whatever of the group is left after ``grace`` seconds."""
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@contextmanager
def chromium(width: int, height: int, timeout: float) -> Iterator[DevTools]:
    """Headless Chromium with a fresh profile, its DevTools connection; killed (its whole
    process group) and its profile removed on the way out."""
    profile = Path(tempfile.mkdtemp(prefix="llmtrial-chromium-"))
    argv = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-port=0",
            f"--user-data-dir={profile}", f"--window-size={width},{height}", *QUIET_FLAGS, "about:blank"]
    with (profile.parent / f"{profile.name}.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    try:
        url = devtools_endpoint(profile, proc, timeout)
        with connect(url, proxy=None, max_size=None, open_timeout=timeout, ping_interval=None) as ws:
            yield DevTools(ws)
    finally:
        stop_group(proc)
        shutil.rmtree(profile, ignore_errors=True)
        (profile.parent / f"{profile.name}.log").unlink(missing_ok=True)


def attach_offline(cdp: DevTools, width: int, height: int) -> str:
    """Attach to the browser's page (flat session), with every domain read here enabled,
    the network off and a ``width`` x ``height`` viewport: the session id."""
    pages = [t for t in cdp.call("Target.getTargets")["targetInfos"] if t["type"] == "page"]
    target = pages[0]["targetId"] if pages else cdp.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Network", "Page", "Runtime", "Log"):
        cdp.call(f"{domain}.enable", session=session)
    cdp.call("Network.emulateNetworkConditions",
             {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1}, session=session)
    cdp.call("Emulation.setDeviceMetricsOverride",
             {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=session)
    return session


def describe_error(event: dict[str, Any]) -> str | None:
    """The text of an event that reports an error, or None."""
    method, params = event["method"], event["params"]
    if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
        args = [str(a.get("value", a.get("description", ""))) for a in params.get("args", [])]
        return f"console.{params['type']}: {' '.join(args)}"
    if method == "Runtime.exceptionThrown":
        details = params["exceptionDetails"]
        return f"exception: {details.get('exception', {}).get('description') or details.get('text', '')}"
    if method == "Log.entryAdded" and params["entry"]["level"] == "error":
        entry = params["entry"]
        return f"log ({entry.get('source', '')}): {entry.get('text', '')} {entry.get('url', '')}".rstrip()
    return None


def evaluate(cdp: DevTools, session: str, expression: str) -> Any:
    result = cdp.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=session)
    if "exceptionDetails" in result:
        raise RuntimeError(f"chromium: {expression} raised {result['exceptionDetails']}")
    return result["result"].get("value")


#: The elements whose right edge is past the window's (a page that scrolls sideways), outside SVG.
TOO_WIDE = ("Array.from(document.querySelectorAll('body *'))"
            ".filter(e => !e.closest('svg') && e.getBoundingClientRect().right > document.documentElement.clientWidth + 1)"
            ".slice(0, 10).map(e => e.tagName + ' ' + (e.textContent || '').trim().slice(0, 60))")


def visit(page: Path, screenshot: Path, *, width: int = 1400, height: int = 900, timeout: float = 60) -> PageVisit:
    """Open ``page`` offline in headless Chromium; write its first screen to ``screenshot``."""
    url = Path(page).resolve().as_uri()
    with chromium(width, height, timeout) as cdp:
        session = attach_offline(cdp, width, height)
        navigated = cdp.call("Page.navigate", {"url": url}, session=session, timeout=timeout)
        if navigated.get("errorText"):
            raise RuntimeError(f"chromium could not open {url}: {navigated['errorText']}")
        cdp.wait_for("Page.loadEventFired", session=session, timeout=timeout)
        title = evaluate(cdp, session, "document.title")
        dom = evaluate(cdp, session, "document.documentElement.outerHTML")
        too_wide = evaluate(cdp, session, TOO_WIDE)
        shot = cdp.call("Page.captureScreenshot", {"format": "png"}, session=session, timeout=timeout)
        events = [e for e in cdp.events if e.get("sessionId") == session]
    screenshot = Path(screenshot)
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    screenshot.write_bytes(base64.b64decode(shot["data"]))
    requested = [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"]
    requests = [u for u in dict.fromkeys(requested) if u != url and not u.startswith("data:")]
    errors = [text for text in map(describe_error, events) if text is not None]
    return PageVisit(url=url, title=title, requests=requests, errors=errors, screenshot=screenshot, dom=dom,
                     too_wide=too_wide)
