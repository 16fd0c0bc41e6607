"""Two hosts made on this machine, for the multi-node tests.

Host A and host B are two network namespaces joined by a veth pair (interface ``llmt0`` in
both, addresses the caller picks, no other route), with loopback up in each. Host B runs
Debian's sshd (``/usr/sbin/sshd``, package openssh-server, which ``make test`` installs)
inside its namespace with its own host key, listening on B's address only, and accepting one
ed25519 key generated for the run. Namespaces are named ``llmt-a-<pid>-<n>`` and
``llmt-b-<pid>-<n>`` (``n`` counts the pairs made by this process). Commands "on host A" run under ``ip netns exec <A>``, so
the ssh client in A reaches B over the veth pair and nothing else. B has its own staging
folder.

:func:`two_hosts` removes everything on exit, also when the body raised: sshd and any other
process left in either namespace (by pid), both namespaces (which removes the veth ends), the
temporary folder, and ``/run/sshd`` when it created it. On entry it first removes what a
crashed earlier run left: namespaces and folders named after a process that is gone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from llmtrial.core.ledger import Entry, Ledger
from llmtrial.core.paths import TrialPaths
from llmtrial.host.nodes import Node, NodeDefaults, local_node

SSHD = Path("/usr/sbin/sshd")
#: sshd's compiled-in privilege separation folder; it refuses to start without it.
PRIVSEP_DIR = Path("/run/sshd")
#: Left while a pair made here made PRIVSEP_DIR: the last pair of any test process to go removes
#: both (pairs of several pytest-xdist workers, or several runs, share the folder; a pair that
#: removed it under another's sshd would break that sshd's every connection).
PRIVSEP_MARK = Path(tempfile.gettempdir()) / "llmt-made-run-sshd"
#: The library, for a Python started on host A.
WORKFLOW = Path(__file__).resolve().parent.parent / "workflow"
PREFIX = "llmt-"
INTERFACE = "llmt0"
_STALE_NS = re.compile(rf"^{PREFIX}[ab]-(\d+)-\d+$")
_STALE_TMP = re.compile(rf"^{PREFIX}hosts-(\d+)-")
_RUNS = itertools.count()


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports free at the time of asking."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class HostsUnavailable(RuntimeError):
    """This machine cannot make the two hosts (no sshd)."""


@dataclass
class TwoHosts:
    ns_a: str
    ns_b: str
    addr_a: str
    addr_b: str
    port: int
    tmp: Path
    key: Path
    wrong_key: Path
    known_hosts: Path
    staging_a: Path
    staging_b: Path
    sshd_log: Path
    sshd: subprocess.Popen | None = None
    setup_s: float = 0.0
    teardown_s: float = field(default=0.0)

    def on_a(self, argv: list[str]) -> list[str]:
        """``argv`` run on host A (in its namespace)."""
        return ["ip", "netns", "exec", self.ns_a, *argv]

    def on_b(self, argv: list[str]) -> list[str]:
        """``argv`` run in host B's namespace directly (not through ssh): for checks only."""
        return ["ip", "netns", "exec", self.ns_b, *argv]

    def python_on_a(self, code: str, *args: str, timeout: float = 180) -> dict:
        """Run ``code`` (``sys.argv[1:]`` is ``args``) in a new Python (this one) on host A,
        as a stage of the workflow runs there, and return the JSON object it prints last:
        such a process reaches host B over ssh and knows it only from what it is given."""
        proc = subprocess.run(self.on_a([sys.executable, "-c", code, *args]), capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, "PYTHONPATH": str(WORKFLOW)})
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def node_blocks(self, python_b: str = sys.executable) -> dict:
        """Both hosts as a trial file's ``nodes`` (for a process on host A): ``a`` this host,
        ``b`` over ssh with the interpreter ``python_b`` (default this one, the venv's)."""
        def block(node: Node) -> dict:
            return {k: v for k, v in node.describe().items() if k not in ("name", "env_keys")}
        return {"a": {**block(self.node_a()), "python": sys.executable},
                "b": {**block(self.node_b()), "python": python_b}}

    def node_a(self) -> Node:
        """Host A as the trial's local node."""
        node = local_node("a", staging_dir=str(self.staging_a), via=self.on_a([]))
        return dataclasses.replace(node, address=self.addr_a, interface=INTERFACE)

    def node_b(self, **ssh: object) -> Node:
        """Host B as an ssh node, reached from host A; ``ssh`` overrides keys of its ``ssh`` block."""
        block = {
            "reach": "ssh",
            "python": "python3",
            "staging_dir": str(self.staging_b),
            "interface": INTERFACE,
            "ssh": {"user": "root", "address": self.addr_b, "port": self.port, "identity_file": str(self.key),
                    "options": [f"UserKnownHostsFile={self.known_hosts}"], **ssh},
        }
        node = Node.from_config("b", block, NodeDefaults(staging_dir=str(self.staging_a)))
        return dataclasses.replace(node, via=tuple(self.on_a([])))


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def namespaces() -> list[str]:
    """Names of the network namespaces on this machine."""
    return [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()]


def _kill_namespace_processes(ns: str) -> None:
    """SIGKILL every process inside namespace ``ns`` (all of them started by this module)."""
    for pid in _ip("netns", "pids", ns, check=False).stdout.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def _remove_namespace(ns: str) -> None:
    if ns in namespaces():
        _kill_namespace_processes(ns)
        _ip("netns", "del", ns, check=False)


def clean_stale() -> list[str]:
    """Remove namespaces and temporary folders of earlier runs whose process is gone."""
    removed = []
    for ns in namespaces():
        m = _STALE_NS.match(ns)
        if m and not _alive(int(m.group(1))):
            _remove_namespace(ns)
            removed.append(ns)
    for folder in Path(tempfile.gettempdir()).glob(f"{PREFIX}hosts-*"):
        m = _STALE_TMP.match(folder.name)
        if m and not _alive(int(m.group(1))):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(folder))
    return removed


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "llmtrial-test", "-f", str(path)],
                   check=True, capture_output=True, timeout=30)


def _network(h: TwoHosts) -> None:
    _ip("netns", "add", h.ns_a)
    _ip("netns", "add", h.ns_b)
    _ip("-n", h.ns_a, "link", "add", INTERFACE, "type", "veth", "peer", "name", INTERFACE, "netns", h.ns_b)
    for ns, addr in ((h.ns_a, h.addr_a), (h.ns_b, h.addr_b)):
        _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", INTERFACE)
        _ip("-n", ns, "link", "set", INTERFACE, "up")
        _ip("-n", ns, "link", "set", "lo", "up")


def _sshd_config(h: TwoHosts, host_key: Path, authorized: Path) -> Path:
    config = h.tmp / "sshd_config"
    config.write_text("\n".join([
        f"Port {h.port}", f"ListenAddress {h.addr_b}", f"HostKey {host_key}", f"PidFile {h.tmp / 'sshd.pid'}",
        f"AuthorizedKeysFile {authorized}", "PermitRootLogin prohibit-password", "PubkeyAuthentication yes",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
        "PrintMotd no", "X11Forwarding no", "LogLevel VERBOSE", "",
    ]))
    return config


def _start_sshd(h: TwoHosts, timeout: float = 20.0) -> None:
    host_key = h.tmp / "ssh_host_ed25519_key"
    _keygen(host_key)
    authorized = h.tmp / "authorized_keys"
    authorized.write_text(Path(f"{h.key}.pub").read_text())
    h.known_hosts.write_text(f"[{h.addr_b}]:{h.port} {Path(f'{host_key}.pub').read_text()}")
    config = _sshd_config(h, host_key, authorized)
    test = subprocess.run([str(SSHD), "-t", "-f", str(config)], capture_output=True, text=True, timeout=30)
    if test.returncode != 0:
        raise RuntimeError(f"sshd -t rejects {config}: {test.stderr.strip()}")
    with open(h.sshd_log, "wb") as log:
        h.sshd = subprocess.Popen(h.on_b([str(SSHD), "-D", "-e", "-f", str(config)]), stdin=subprocess.DEVNULL,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    while "Server listening on" not in h.sshd_log.read_text(errors="replace"):
        if h.sshd.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"sshd in {h.ns_b} did not start: {h.sshd_log.read_text(errors='replace')[-500:]}")
        time.sleep(0.05)


def _stop_sshd(h: TwoHosts) -> None:
    if h.sshd is None or h.sshd.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(h.sshd.pid, signal.SIGTERM)
    try:
        h.sshd.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(h.sshd.pid, signal.SIGKILL)
        h.sshd.wait(timeout=5)


def _release_privsep() -> None:
    """Remove PRIVSEP_DIR when a pair made it and no pair is left on this machine."""
    if PRIVSEP_MARK.exists() and not [ns for ns in namespaces() if ns.startswith(PREFIX)]:
        with contextlib.suppress(OSError):
            PRIVSEP_DIR.rmdir()
        PRIVSEP_MARK.unlink(missing_ok=True)


@contextlib.contextmanager
def two_hosts(subnet: str = "10.231.1", port: int = 2222) -> Iterator[TwoHosts]:
    """Make host A (``<subnet>.1``) and host B (``<subnet>.2``, sshd on ``port``); remove
    all of it on exit. Raises :class:`HostsUnavailable` when sshd is not installed."""
    if not SSHD.is_file():
        raise HostsUnavailable(f"{SSHD} is missing: install Debian's openssh-server (make test does, as root)")
    started = time.monotonic()
    clean_stale()
    run = f"{os.getpid()}-{next(_RUNS)}"
    tmp = Path(tempfile.mkdtemp(prefix=f"{PREFIX}hosts-{run}-"))
    h = TwoHosts(ns_a=f"{PREFIX}a-{run}", ns_b=f"{PREFIX}b-{run}", addr_a=f"{subnet}.1", addr_b=f"{subnet}.2",
                 port=port, tmp=tmp, key=tmp / "id_ed25519", wrong_key=tmp / "wrong_ed25519",
                 known_hosts=tmp / "known_hosts", staging_a=tmp / "staging-a", staging_b=tmp / "staging-b",
                 sshd_log=tmp / "sshd.log")
    try:
        h.staging_a.mkdir()
        h.staging_b.mkdir()
        _keygen(h.key)
        _keygen(h.wrong_key)
        _network(h)  # before the folder: a pair going away now sees this one and leaves the folder
        if not PRIVSEP_DIR.exists():
            PRIVSEP_DIR.mkdir(mode=0o755)
            PRIVSEP_MARK.touch()
        _start_sshd(h)
        h.setup_s = time.monotonic() - started
        yield h
    finally:
        stopping = time.monotonic()
        _stop_sshd(h)
        for ns in (h.ns_b, h.ns_a):
            _remove_namespace(ns)
        shutil.rmtree(tmp, ignore_errors=True)
        _release_privsep()
        h.teardown_s = time.monotonic() - stopping


CLEANUP = ("import json, sys; from llmtrial.lifecycle.cleanup import run_cleanup; "
           "print(run_cleanup(sys.argv[1], stop_timeout=5).model_dump_json(exclude_unset=True))")


def cleanup_on_a(hosts: TwoHosts, results: Path) -> dict:
    """``run_cleanup(results)`` in a new Python on host A."""
    return hosts.python_on_a(CLEANUP, str(results))


def kill_planted(pids: list[int]) -> None:
    """Kill processes a test planted (by pid), whatever became of them."""
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()


def entries(results: Path) -> list[Entry]:
    """The trial ledger's entries under ``results``."""
    return Ledger(TrialPaths(results).ledger).entries()
