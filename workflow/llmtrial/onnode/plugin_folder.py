"""On a node: a plugin folder's state, and its removal. Reads {"dir", "mark", "remove"} on stdin;
prints the folder's absolute path, whether it exists, whether it is an llmtrial plugin folder
(``mark`` inside it, the folder not a link) and, with ``remove``, whether it was removed (only a
plugin folder is). The standard library only."""

from __future__ import annotations

import json
import os
import shutil
import sys


def inspect(directory: str, mark: str, remove: bool) -> dict:
    path = os.path.abspath(os.path.expanduser(directory))
    out = {"path": path, "exists": os.path.lexists(path),
           "plugin": not os.path.islink(path) and os.path.isfile(os.path.join(path, mark)), "removed": False}
    if remove and out["plugin"]:
        shutil.rmtree(path)
        out["removed"] = True
    return out


def main() -> None:
    given = json.load(sys.stdin)
    print(json.dumps(inspect(given["dir"], given["mark"], given["remove"])))


if __name__ == "__main__":
    main()
