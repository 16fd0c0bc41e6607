"""On a node: what preflight compares across nodes (hostname, interpreter, Python version, machine),
printed as one JSON object. Reads nothing. The standard library only."""

from __future__ import annotations

import json
import platform
import socket
import sys
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class NodeProbe:
    """What the node answers."""

    hostname: str
    python: str
    python_version: str
    machine: str


def probe() -> NodeProbe:
    return NodeProbe(hostname=socket.gethostname(), python=sys.executable, python_version=platform.python_version(),
                     machine=platform.machine())


def main() -> None:
    print(json.dumps(asdict(probe())))


if __name__ == "__main__":
    main()
