"""The hosts a trial spans: each a :class:`Node`, reached on this host or over ssh.

Every command is an argv list. On a local node it runs as given; on an ssh node it becomes
``ssh <fixed options> user@address -- <the argv quoted with shlex>``: ssh hands the remote
side one string, which its login shell splits back into exactly the argv given, because
each argument is quoted. Nothing from the trial file passes through a shell on this host:
options that make ssh run a local command (ProxyCommand and the like) are rejected, and
ssh never prompts (BatchMode), so a node that cannot be reached fails in seconds, naming
itself.

A trial without ``nodes`` runs on one local node (:func:`local_node`);
:func:`trial_nodes` and :func:`configuration_nodes` give the nodes a trial and one of its
configurations use, :func:`spanned_nodes` what the trial-wide stages (preflight, staging)
need of the nodes any configuration spans. The trial file's checks of its nodes are its model's
(:mod:`llmtrial.core.trial_checks`).
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from llmtrial.core.configuration_spec import ConfigurationSpec
from llmtrial.core.fileio import sha256_file
from llmtrial.core.record_base import error_lines
from llmtrial.core.trial_checks import option_key
from llmtrial.core.trial_config import NodeBlock, SshBlock, TrialConfig
from llmtrial.host.slurm_hosts import JOB_ENV, allocation_hosts, node_state, own_job_env, srun_argv
from llmtrial.onnode import file_hashes, node_probe

__all__ = [
    "LOCAL_NAME", "NodeError", "Node", "unavailable", "NodeDefaults", "NodeReach", "local_node", "this_node_name", "trial_nodes", "all_nodes", "configuration_nodes", "spec_nodes",
    "spanned_nodes", "number_slurm_nodes", "program_argv", "last_json_object",
]

#: Name of the one node of a trial that lists none.
LOCAL_NAME = "local"

#: ssh options (lower case, as ssh compares them) that are refused in the trial file: the
#: first four run a command through a shell on this host, BatchMode=no could make ssh prompt.

#: ssh's own exit status for its failures (connection, authentication, host key).
SSH_FAILED = 255

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

class NodeError(RuntimeError):
    """A command on a node could not run, timed out, or failed; the message names the node."""


@dataclass(frozen=True)
class NodeDefaults:
    """What a node takes from its trial where its own block says nothing."""

    staging_dir: str = "staging"
    python: str | None = None  # a local node's interpreter (None: this one)
    slurm_host: str | None = None  # the SLURM host a ledger entry recorded for the node
    slurm_trial: bool = False  # a node of the trial is reached through SLURM


class SlurmReach(BaseModel):
    """A ``reach: slurm`` node's host in the allocation, and the allocation."""

    host: str | None = None
    job: str | None = None


class NodeReach(BaseModel):
    """A node as a record or a ledger entry keeps it (:meth:`Node.describe`): how to reach it again, no
    secrets (the identity file's path only). Keys an older entry carried beside these are passed over."""

    model_config = ConfigDict(extra="ignore")

    name: str = ""
    reach: Literal["local", "ssh", "slurm"] = "local"
    address: str | None = None
    python: str | None = None
    staging_dir: str | None = None
    interface: str | None = None
    env_keys: list[str] = []
    ssh: SshBlock | None = None
    slurm: SlurmReach | None = None


@dataclass(frozen=True)
class Node:
    """One host of a trial and how to run argv lists on it.

    ``via`` is not a trial key: an argv prefix for every process this node starts on this
    host (the tests use ``ip netns exec <namespace>`` to act as a second host).
    """

    name: str
    reach: str = "local"
    python: str = sys.executable
    staging_dir: str = "staging"
    address: str = "127.0.0.1"
    interface: str | None = None
    user: str | None = None
    ssh_address: str | None = None
    port: int = 22
    identity_file: str | None = None
    options: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    slurm_host: str | None = None  # reach slurm: the allocation's host (None outside the allocation)
    slurm_job: str | None = None  # reach slurm: the allocation, while this process runs in it
    via: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_config(cls, name: str, block: NodeBlock | Mapping[str, Any],
                    defaults: NodeDefaults = NodeDefaults()) -> Node:
        """The node ``name`` of the trial file's ``nodes`` (``block`` its model, or its mapping, read as the model:
        ValueError naming the node and each problem); ``defaults`` gives the trial's ``staging_dir`` (and
        ``python``, the interpreter of a local node, default this one)."""
        block = node_block(name, block)
        reach, ssh = block.reach, block.ssh
        local_python = defaults.python or sys.executable
        host, job = _slurm_host(name, block, defaults)
        return cls(
            name=name,
            reach=reach,
            python=block.python or (local_python if reach != "ssh" else "python3"),
            staging_dir=str(block.staging_dir or defaults.staging_dir or "staging"),
            address=(block.address or (ssh.address if reach == "ssh" else None) or host
                     or _local_address(block, defaults) or "127.0.0.1"),
            interface=block.interface,
            user=ssh.user,
            ssh_address=ssh.address if reach == "ssh" else None,
            port=ssh.port,
            identity_file=ssh.identity_file,
            options=tuple(ssh.options),
            env=tuple(sorted(block.env.items())),
            slurm_host=host if reach == "slurm" else None,
            slurm_job=job if reach == "slurm" else None,
        )

    @classmethod
    def from_reach(cls, name: str, reach: NodeReach | Mapping[str, Any]) -> Node:
        """The node a record or ledger entry describes (``reach`` as :meth:`describe` gives it):
        what cleanup rebuilds to undo a change on that node from the ledger alone. The same
        checks as the trial file's apply (a refused ssh option raises ValueError)."""
        given = NodeReach.model_validate(reach)
        block = given.model_dump(include={"reach", "python", "staging_dir", "address", "interface", "ssh"},
                                 exclude_none=True)
        return cls.from_config(name, block, NodeDefaults(staging_dir=given.staging_dir or "staging", python=given.python,
                                                         slurm_host=given.slurm.host if given.slurm else None))

    @property
    def is_local(self) -> bool:
        return self.reach == "local"

    def rank_env(self) -> dict[str, str]:
        """The environment of a rank this node runs: the interface for gloo and NCCL, the
        address vLLM announces (VLLM_HOST_IP), then the node's own ``env`` over them."""
        out = {"VLLM_HOST_IP": self.address}
        if self.interface:
            out.update(GLOO_SOCKET_IFNAME=self.interface, NCCL_SOCKET_IFNAME=self.interface)
        return {**out, **dict(self.env)}

    def label(self) -> str:
        """How messages name the node: ``node b (ssh root@10.0.0.2:22)`` or ``node local (this host)``."""
        if self.is_local:
            return f"node {self.name} (this host)"
        if self.reach == "slurm":
            return f"node {self.name} (SLURM host {self.slurm_host or 'unknown outside the allocation'})"
        return f"node {self.name} (ssh {self._target()}:{self.port})"

    def _target(self) -> str:
        return f"{self.user}@{self.ssh_address}" if self.user else str(self.ssh_address)

    def ssh_options(self) -> list[str]:
        """The ``-o`` options, defaults first unless ``options`` names the same key."""
        given = {option_key(o) for o in self.options}
        strict = "yes" if "userknownhostsfile" in given else "accept-new"
        defaults = ["BatchMode=yes", f"StrictHostKeyChecking={strict}", "ConnectTimeout=10"]
        if self.identity_file:
            defaults.append("IdentitiesOnly=yes")
        chosen = [o for o in defaults if option_key(o) not in given] + list(self.options)
        return [arg for option in chosen for arg in ("-o", option)]

    def argv(self, cmd: Sequence[str], wait_s: float | None = None) -> list[str]:
        """The argv that runs ``cmd`` on this node: ``cmd`` itself on a local node, else ssh
        with the command quoted so the remote shell splits it back into exactly ``cmd``; a SLURM
        node reached as a job of its own waits at most ``wait_s`` for its host (srun's ``--immediate``)."""
        cmd = [str(c) for c in cmd]
        if not cmd:
            raise ValueError("empty command")
        if self.is_local:
            return [*self.via, *cmd]
        if self.reach == "slurm":
            if not self.slurm_host:
                raise NodeError(f"{self.label()}: no SLURM allocation names its host here ({JOB_ENV} unset)")
            return [*self.via, *srun_argv(self.slurm_host, cmd, self.slurm_job, wait_s=wait_s)]
        key = ["-i", self.identity_file] if self.identity_file else []
        return [*self.via, "ssh", *key, "-p", str(self.port), *self.ssh_options(), self._target(), "--",
                shlex.join(cmd)]

    def _command(self, cmd: Sequence[str], env: Mapping[str, str] | None,
                 wait_s: float | None = None) -> tuple[list[str], dict[str, str] | None]:
        """(argv to run here, environment for it): a remote ``env`` becomes ``env K=V ...``."""
        for key in env or {}:
            if not _ENV_NAME.match(key):
                raise ValueError(f"{self.label()}: {key!r} is not an environment variable name")
        if self.is_local or self.reach == "slurm":  # srun passes this process's environment on
            return self.argv(cmd, wait_s), self.local_env(env)
        prefix = ["env", *(f"{k}={v}" for k, v in env.items())] if env else []
        return self.argv([*prefix, *cmd]), None


    def local_env(self, env: Mapping[str, str] | None = None) -> dict[str, str] | None:
        """The environment of the process that runs :meth:`argv` here (None: this one's): a SLURM node reached
        as a job of its own gets this process's without the job it may run in (:func:`own_job_env`)."""
        if self.reach == "slurm" and not self.slurm_job:
            return {**own_job_env(), **(env or {})}
        return {**os.environ, **env} if env else None

    def run(self, cmd: Sequence[str], timeout: float, check: bool = False, env: Mapping[str, str] | None = None,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` on the node and wait at most ``timeout`` seconds; output is captured as text.

        A timeout raises :class:`NodeError` (the ssh client is killed; a remote command that
        ignores the hang-up may go on). With ``check``, a non-zero exit raises NodeError naming
        the node, the command and the end of its stderr.
        """
        if (why := unavailable(self)) is not None:
            raise NodeError(why)
        argv, local_env = self._command(cmd, env, wait_s=timeout)
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=local_env,
                                  input=input, stdin=None if input is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired as err:
            raise NodeError(f"{self.label()}: {shlex.join(map(str, cmd))} did not finish within {timeout} s") from err
        except OSError as err:
            raise NodeError(f"{self.label()}: cannot start {argv[0]}: {err}") from err
        if check and proc.returncode != 0:
            raise NodeError(self.failure(cmd, proc.returncode, proc.stderr))
        return proc

    def failure(self, cmd: Sequence[str], returncode: int, stderr: str) -> str:
        """One readable line on a failed command; ssh's own failures say so."""
        tail = " | ".join(line.strip() for line in (stderr or "").strip().splitlines()[-3:]) or "no error output"
        if not self.is_local and returncode == SSH_FAILED:
            return (f"{self.label()}: ssh could not run {shlex.join(map(str, cmd))} (exit {SSH_FAILED}: "
                    f"unreachable, refused, key or host key not accepted): {tail}")
        return f"{self.label()}: {shlex.join(map(str, cmd))} exited {returncode}: {tail}"

    def program(self, module: ModuleType, inputs: Any = None, timeout: float = 60.0) -> dict[str, Any]:
        """Run ``module`` (one of :mod:`llmtrial.onnode`) with the node's own Python, ``inputs``
        as JSON on its stdin, and return the JSON object it prints last. Nothing passes through
        a shell on this host; a failure raises :class:`NodeError` naming the node."""
        stdin = json.dumps(inputs) if inputs is not None else None
        proc = self.run(program_argv(self.python, module), timeout, check=True, input=stdin)
        try:
            return last_json_object(proc.stdout)
        except ValueError as err:
            raise NodeError(f"{self.label()}: {err} from {self.python}") from err

    def sha256(self, paths: Sequence[str], timeout: float = 600.0) -> dict[str, str | None]:
        """The sha256 of each file, computed on the node with its own Python; None for a path
        that is not a readable file there."""
        return self.program(file_hashes, [str(p) for p in paths], timeout)

    def probe(self, timeout: float = 60.0) -> node_probe.NodeProbe:
        """Hostname, interpreter, Python version and machine of the node (for cross-node checks)."""
        return node_probe.NodeProbe(**self.program(node_probe, timeout=timeout))

    def copy_to(self, local_path: str | os.PathLike[str], remote_path: str, timeout: float = 3600.0) -> dict[str, str]:
        """Copy a file or a folder's files from this host to ``remote_path`` on the node and
        verify every sha256 there; returns the manifest (path relative to ``remote_path``, or
        the file's name, -> sha256).

        A folder's files (hidden ones too, symlinks followed) land under ``remote_path``; a file
        becomes ``remote_path``. The bytes travel as a tar stream into ``tar -x`` on the node.
        A file whose hash on the node differs raises :class:`NodeError` listing it.
        """
        src = Path(local_path)
        if src.is_dir():
            dest = remote_path
            members = [(f, f.relative_to(src).as_posix()) for f in _files_under(src)]
        elif src.is_file():
            dest, name = posixpath.split(remote_path.rstrip("/"))
            members = [(src, name)]
        else:
            raise NodeError(f"{self.label()}: nothing to copy at {src}")
        manifest = {rel: sha256_file(f) for f, rel in members}
        self.run(["mkdir", "-p", dest or "."], timeout=60, check=True)
        self._send_tar(members, dest or ".", timeout)
        there = self.sha256([posixpath.join(dest, rel) for rel in manifest], timeout=timeout)
        bad = [f"{rel}: sha256 {there.get(posixpath.join(dest, rel))} on the node, {digest} here"
               for rel, digest in manifest.items() if there.get(posixpath.join(dest, rel)) != digest]
        if bad:
            raise NodeError(f"{self.label()}: copy of {src} to {remote_path} does not verify: " + "; ".join(bad))
        return manifest

    def _send_tar(self, members: list[tuple[Path, str]], dest: str, timeout: float) -> None:
        cmd = ["tar", "-x", "-f", "-", "-C", dest, "--no-same-owner"]
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(self.argv(cmd), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err,
                                    env=self.local_env())
            expired = threading.Event()
            watchdog = threading.Timer(timeout, lambda: (expired.set(), proc.kill()))
            watchdog.start()
            try:
                assert proc.stdin is not None
                with proc.stdin, tarfile.open(fileobj=proc.stdin, mode="w|", dereference=True) as tar:
                    for file, rel in members:
                        tar.add(file, arcname=rel, recursive=False)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the receiver is gone: its status and stderr say why
            finally:
                returncode = proc.wait()
                watchdog.cancel()
            err.seek(0)
            stderr = err.read().decode(errors="replace")
        if expired.is_set():
            raise NodeError(f"{self.label()}: copy into {dest} did not finish within {timeout} s")
        if returncode != 0:
            raise NodeError(self.failure(cmd, returncode, stderr))

    def describe(self) -> dict[str, Any]:
        """What a record says about the node (:class:`NodeReach` as plain data)."""
        parts = {}
        if self.reach == "ssh":
            parts["ssh"] = SshBlock(user=self.user, address=self.ssh_address, port=self.port,
                                    identity_file=self.identity_file, options=list(self.options))
        if self.reach == "slurm":
            parts["slurm"] = SlurmReach(host=self.slurm_host, job=self.slurm_job)
        return NodeReach(name=self.name, reach=self.reach, address=self.address, python=self.python,
                         staging_dir=self.staging_dir, interface=self.interface, env_keys=[k for k, _ in self.env],
                         **parts).model_dump(exclude_unset=True)


def unavailable(node: Node) -> str | None:
    """Why a command cannot reach ``node`` now, without trying: a SLURM host reached as a job of its own
    (outside the allocation: a cleanup) that SLURM has down, drained or not responding, where srun would
    wait in the queue until the host came back. None otherwise."""
    if node.reach != "slurm" or node.slurm_job or not node.slurm_host:
        return None
    state = node_state(node.slurm_host)
    if state is None or state.available:
        return None
    return f"{node.label()}: {state.describe()}: not reached (run the cleanup again once the host is back)"


def node_block(name: str, block: NodeBlock | Mapping[str, Any]) -> NodeBlock:
    """``block`` as the trial file's node model; ValueError naming node ``name`` and each problem."""
    if isinstance(block, NodeBlock):
        return block
    try:
        return NodeBlock.model_validate(dict(block))
    except ValidationError as exc:
        raise ValueError(f"node {name}: " + "; ".join(error_lines(exc))) from None


def _slurm_host(name: str, block: NodeBlock, defaults: NodeDefaults) -> tuple[str | None, str | None]:
    """The allocation's host of a node with ``reach: slurm`` (its ``slurm_index`` in SLURM_JOB_NODELIST)
    and the allocation's id, or what a ledger entry recorded (``defaults.slurm_host``: from outside
    the allocation, which may have ended); (None, None) where neither says."""
    if block.reach != "slurm":
        return None, None
    hosts, job = allocation_hosts(), os.environ.get(JOB_ENV)
    index = block.slurm_index
    if hosts and job and index is not None:
        if index >= len(hosts):
            raise NodeError(f"node {name}: slurm_index {index}, but the allocation has {len(hosts)} host(s) "
                            f"({', '.join(hosts)})")
        return hosts[index], job
    recorded = defaults.slurm_host
    return recorded, (job if recorded in hosts else None)


def _local_address(block: NodeBlock, defaults: NodeDefaults) -> str | None:
    """A local node's address in a trial with slurm nodes: the allocation's first host (where the
    host group runs), so the other hosts reach it; None otherwise."""
    if block.reach != "local" or not defaults.slurm_trial:
        return None
    return next(iter(allocation_hosts()), None)


def number_slurm_nodes(config: dict[str, Any]) -> None:
    """Give each ``reach: slurm`` node without a ``slurm_index`` its position in ``nodes`` (in place)."""
    for i, block in enumerate((config.get("nodes") or {}).values()):
        if block.get("reach") == "slurm" and block.get("slurm_index") is None:
            block["slurm_index"] = i


def _node_defaults(blocks: Mapping[str, NodeBlock], staging_dir: str) -> NodeDefaults:
    return NodeDefaults(staging_dir=staging_dir, slurm_trial=any(b.reach == "slurm" for b in blocks.values()))


def program_argv(python: str, module: ModuleType, *args: str) -> list[str]:
    """``python -c <the source of module> args...``: a self-contained module of this project (one of
    :mod:`llmtrial.onnode`, the probe program, a standalone collective rank) run by an interpreter
    that need not have this project. The program's first line is a comment naming the module: what
    a process list shows of it, and what a stale-process check matches
    (:func:`llmtrial.onnode.node_facts.command_line`), never its docstring's mention of another."""
    source = Path(str(module.__file__)).read_text(encoding="utf-8")
    return [python, "-c", f"# {module.__name__}\n{source}", *args]


def last_json_object(stdout: str) -> dict[str, Any]:
    """The last line of what a program printed that is a JSON object (the answer of each program
    this project runs and reads: lines a library printed before it are passed over); ValueError,
    quoting the end of ``stdout``, where there is none."""
    for line in reversed(stdout.splitlines()):
        if line.lstrip().startswith("{"):
            with contextlib.suppress(ValueError):
                answer = json.loads(line)
                if isinstance(answer, dict):
                    return answer
    raise ValueError(f"no JSON object in what it printed: {stdout[-200:]!r}")


def _files_under(root: Path) -> list[Path]:
    """Regular files under ``root`` (hidden ones too), sorted by relative path."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        found.extend(Path(dirpath) / n for n in sorted(filenames) if (Path(dirpath) / n).is_file())
    return found


def local_node(name: str = LOCAL_NAME, *, staging_dir: str = "staging", python: str | None = None,
               via: Sequence[str] = ()) -> Node:
    """This host as a node (the only node of a trial that lists none)."""
    return Node(name=name, python=python or sys.executable, staging_dir=str(staging_dir), via=tuple(via))


def this_node_name(trial: TrialConfig) -> str:
    """The trial's name for the host the workflow runs on: its first node reached locally, or
    :data:`LOCAL_NAME` when it lists none."""
    return next((name for name, block in trial.nodes.items() if block.reach == "local"), LOCAL_NAME)


def trial_nodes(spanned: Mapping[str, Any]) -> dict[str, Node]:
    """The nodes of ``spanned`` (:func:`spanned_nodes`, a trial-wide stage's params: their blocks and the
    trial's staging_dir) by name, in file order; one local node when it names none."""
    return _nodes({name: node_block(name, block) for name, block in spanned["nodes"].items()}, spanned["staging_dir"])


def _nodes(blocks: Mapping[str, NodeBlock], staging_dir: str) -> dict[str, Node]:
    defaults = _node_defaults(blocks, staging_dir)
    if not blocks:
        return {LOCAL_NAME: local_node(staging_dir=staging_dir)}
    return {name: Node.from_config(name, block, defaults) for name, block in blocks.items()}


def all_nodes(trial: TrialConfig) -> dict[str, Node]:
    """Every node the trial file lists, by name (one local node when it lists none)."""
    return _nodes(trial.nodes, trial.staging_dir)


def configuration_nodes(trial: TrialConfig, name: str) -> list[Node]:
    """The nodes configuration ``name`` spans, the first serving the API (default: the
    trial's first node)."""
    nodes = all_nodes(trial)
    return [nodes[n] for n in trial.configurations[name].nodes or [next(iter(nodes))]]


def spec_nodes(spec: ConfigurationSpec) -> list[Node]:
    """The nodes of a configuration's spec (:func:`llmtrial.config.configuration_spec`), in
    its order; empty for a configuration on this host alone."""
    defaults = _node_defaults(spec.nodes, spec.staging_dir or "staging")
    return [Node.from_config(name, block, defaults) for name, block in spec.nodes.items()]


def spanned_nodes(trial: TrialConfig) -> dict[str, Any]:
    """What a trial-wide stage that runs on every node needs of the trial file, as rule
    params (so editing a node no configuration spans reruns nothing): ``nodes``, the blocks
    of the nodes any configuration spans, in the trial's order ({} when the trial lists
    none: one local node); ``staging_dir``; and ``uses_ray``, whether a configuration
    is launched with Ray or asks for its executor (the Ray versions must then agree)."""
    spanned = {node.name for name in trial.configurations for node in configuration_nodes(trial, name)} \
        if trial.nodes else set()
    entries = [trial.serving, *trial.configurations.values()]
    uses_ray = any(e.args.get("distributed_executor_backend") == "ray" for e in entries) \
        or any(e.launch == "ray" for e in trial.configurations.values())
    return {"nodes": {name: block.model_dump() for name, block in trial.nodes.items() if name in spanned},
            "staging_dir": trial.staging_dir, "uses_ray": uses_ray}
