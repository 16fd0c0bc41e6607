"""On a node: what preflight compares across nodes (hostname, interpreter, Python version, machine),
printed as one JSON object. Reads nothing. The standard library only."""

from __future__ import annotations

import json
import platform
import socket
import sys


def probe() -> dict:
    return {"hostname": socket.gethostname(), "python": sys.executable,
            "python_version": platform.python_version(), "machine": platform.machine()}


def main() -> None:
    print(json.dumps(probe()))


if __name__ == "__main__":
    main()
