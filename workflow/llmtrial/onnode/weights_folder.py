"""On a node: a staged weights folder resolved, sized or deleted. Reads {"op": "resolve" | "size" |
"delete", "path", "root"} on stdin and prints one JSON object. A delete removes only what lies inside
the staging root ``root``, without force: what it cannot remove is a residue, with the error seen.
The standard library only."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys

SYMLINK = 0o120000
FILE_TYPE = 0o170000


def seen(error: OSError) -> str:
    return f"{errno.errorcode.get(error.errno or 0, 'error')}: {error.strerror}; not forced"


def residue(what: str, size: int | None, why: str) -> dict:
    return {"kind": "weights", "what": what, "size": size, "tried": "remove without force", "seen": why}


def size_of(path: str) -> int:
    """The bytes of the files under ``path`` (links not followed, nor counted)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            file = os.path.join(folder, name)
            if not os.path.islink(file):
                with contextlib.suppress(OSError):  # gone meanwhile
                    total += os.lstat(file).st_size
    return total


def remove(out: dict, path: str) -> None:
    try:
        st = os.lstat(path)
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as error:
        out["residues"].append(residue(path, st.st_size, seen(error)))
        return
    out["files_removed"] += 1
    out["freed_bytes"] += 0 if (st.st_mode & FILE_TYPE) == SYMLINK else st.st_size


def rmdir(out: dict, path: str) -> None:
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as error:
        if not any(r["what"].startswith(path + os.sep) for r in out["residues"]):
            out["residues"].append(residue(path, None, seen(error)))


def remove_tree(out: dict, target: str) -> None:
    """Remove ``target``'s files and folders bottom up, links as links."""
    for folder, dirs, files in os.walk(target, topdown=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            remove(out, os.path.join(folder, name))
        for name in dirs:
            if not os.path.islink(os.path.join(folder, name)):
                rmdir(out, os.path.join(folder, name))
    rmdir(out, target)


def delete(given: str, root: str) -> dict:
    """Delete ``given`` (a folder, a file or a link) where it lies inside ``root``, never ``root`` itself."""
    root = os.path.realpath(root)
    out = {"path": given, "freed_bytes": 0, "files_removed": 0, "residues": []}
    if not os.path.lexists(given):
        out["action"] = "none (already gone)"
        return out
    target = os.path.join(os.path.realpath(os.path.dirname(given) or "."), os.path.basename(given))
    if os.path.commonpath([target, root]) != root or target == root or root == os.path.sep:
        out["residues"].append({"kind": "weights", "what": target, "size": None, "tried": "delete",
                                "seen": f"refused: not inside the staging root {root}"})
        out["action"] = "refused"
        return out
    if os.path.islink(target) or not os.path.isdir(target):
        remove(out, target)
    else:
        remove_tree(out, target)
    out["action"] = "deleted" if not out["residues"] else "partly deleted"
    return out


def answer(op: str, path: str, root: str | None) -> dict:
    if op == "resolve":
        return {"path": os.path.abspath(os.path.expanduser(path))}
    if op == "size":
        return {"exists": os.path.isdir(path), "bytes": size_of(path)}
    if op != "delete" or not root:
        raise ValueError(f"unknown op {op!r}, or a delete without a staging root")
    return delete(path, root)


def main() -> None:
    given = json.load(sys.stdin)
    print(json.dumps(answer(given["op"], given["path"], given["root"])))


if __name__ == "__main__":
    main()
