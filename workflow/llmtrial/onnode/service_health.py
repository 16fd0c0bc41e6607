"""On a service's node (on this host when the service has none): one health check, ``http``, ``tcp``
or ``completion``. Reads {"health": {...}, "timeout": s} on stdin and prints {"ok": bool, "seen":
text}. The standard library only."""

from __future__ import annotations

import json
import socket
import sys
import urllib.error
import urllib.request


def http(health: dict, timeout: float) -> dict:
    try:
        with urllib.request.urlopen(health["url"], timeout=timeout) as resp:
            status = resp.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    want = int(health.get("expect_status", 200))
    return {"ok": status == want, "seen": f"HTTP {status} from {health['url']} (want {want})"}


def tcp(health: dict, timeout: float) -> dict:
    host = health.get("host", "127.0.0.1")
    with socket.create_connection((host, int(health["port"])), timeout=timeout):
        return {"ok": True, "seen": f"{host}:{health['port']} accepts connections"}


def completion(health: dict, timeout: float) -> dict:
    body = json.dumps({"model": health["model"], "prompt": health.get("prompt", "Hello"),
                       "max_tokens": int(health.get("max_tokens", 4))}).encode()
    req = urllib.request.Request(health["url"].rstrip("/") + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=float(health.get("timeout_s", timeout))) as resp:
        text = json.loads(resp.read())["choices"][0].get("text", "")
    return {"ok": True, "seen": f"completion answered ({len(text)} characters)"}


CHECKS = {"http": http, "tcp": tcp, "completion": completion}


def check(health: dict, timeout: float) -> dict:
    kind = health.get("kind")
    if kind not in CHECKS:
        return {"ok": False, "seen": f"unknown health check kind {kind!r}"}
    try:
        return CHECKS[kind](health, timeout)
    except (OSError, KeyError, ValueError) as exc:
        return {"ok": False, "seen": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    given = json.load(sys.stdin)
    print(json.dumps(check(given["health"], given["timeout"])))


if __name__ == "__main__":
    main()
