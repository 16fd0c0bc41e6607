"""On a service's node (on this host when the service has none): one health check, ``http``, ``tcp``
or ``completion``. Reads {"health": {...}, "timeout": s} on stdin and prints {"ok": bool, "seen":
text}. The standard library only."""

from __future__ import annotations

import json
import socket
import sys
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Health:
    """A service's health check as the trial file's ``services.<name>.health`` gives it."""

    kind: str | None = None
    url: str | None = None
    expect_status: int = 200
    host: str = "127.0.0.1"
    port: int | None = None
    argv: list = field(default_factory=list)
    model: str | None = None
    prompt: str = "Hello"
    max_tokens: int = 4
    timeout_s: float = 60


@dataclass(frozen=True)
class HealthAnswer:
    """What the check saw: whether the service answered as expected, and what it said."""

    ok: bool
    seen: str


def http(health: Health, timeout: float) -> HealthAnswer:
    try:
        with urllib.request.urlopen(health.url, timeout=timeout) as resp:
            status = resp.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    want = int(health.expect_status)
    return HealthAnswer(status == want, f"HTTP {status} from {health.url} (want {want})")


def tcp(health: Health, timeout: float) -> HealthAnswer:
    with socket.create_connection((health.host, int(health.port)), timeout=timeout):
        return HealthAnswer(True, f"{health.host}:{health.port} accepts connections")


def completion(health: Health, timeout: float) -> HealthAnswer:
    body = json.dumps({"model": health.model, "prompt": health.prompt, "max_tokens": int(health.max_tokens)}).encode()
    req = urllib.request.Request(health.url.rstrip("/") + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=float(health.timeout_s)) as resp:
        text = json.loads(resp.read())["choices"][0].get("text", "")
    return HealthAnswer(True, f"completion answered ({len(text)} characters)")


CHECKS = {"http": http, "tcp": tcp, "completion": completion}


def check(health: Health, timeout: float) -> HealthAnswer:
    if health.kind not in CHECKS:
        return HealthAnswer(False, f"unknown health check kind {health.kind!r}")
    try:
        return CHECKS[health.kind](health, timeout)
    except (OSError, KeyError, ValueError, TypeError, AttributeError) as exc:
        return HealthAnswer(False, f"{type(exc).__name__}: {exc}")


def main() -> None:
    given = json.load(sys.stdin)
    print(json.dumps(asdict(check(Health(**given["health"]), given["timeout"]))))


if __name__ == "__main__":
    main()
