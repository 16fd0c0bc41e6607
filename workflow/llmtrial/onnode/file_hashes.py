"""On a node: the sha256 of files. Reads a JSON list of paths on stdin and prints one JSON object,
path -> hex sha256 (null for a path that is not a readable file). The standard library only."""

from __future__ import annotations

import hashlib
import json
import sys

CHUNK = 1 << 20


def sha256(path: str) -> str | None:
    """The hex sha256 of the file at ``path``, or None where it cannot be read."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(CHUNK), b""):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def main() -> None:
    print(json.dumps({path: sha256(path) for path in json.load(sys.stdin)}))


if __name__ == "__main__":
    main()
