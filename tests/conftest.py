"""Shared fixtures: the repository paths and a free loopback port."""

from __future__ import annotations

import contextlib
import fcntl
import http.server
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from hosts import SSHD, TwoHosts, free_ports, two_hosts
from llmtrial.core.hostlock import LOCK_ENV
from llmtrial.core.records import as_written
from llmtrial.core.resources import CACHE_ENV
from llmtrial.host.process_groups import port_open
from llmtrial.serve.server import ServerProcess
from llmtrial.serve.telemetry import Sampler
from slurm_cluster import SlurmCluster, SlurmUnavailable, leftovers, slurm_cluster

REPO = Path(__file__).resolve().parent.parent
#: The workflow every test runs (``snakemake`` run from the repository finds it there itself).
SNAKEFILE = REPO / "workflow" / "Snakefile"
DATA = Path(__file__).resolve().parent / "data"


#: The marks of tests that run on one pytest-xdist worker, one after another (``make test`` runs two
#: workers): the real-vLLM trials (e2e) and the tests that change or watch what those trials share
#: with everything on this machine (hostwide: the installed vLLM's files, the free disk). The other
#: tests spread over the workers.
SERIAL_MARKS = ("e2e", "hostwide")
#: The mark of real-vLLM modules that need nothing the serial chain holds: their trials patch no installed
#: vLLM file (no patch, or mode plugin), serve on ports of their own and quiet no shared service. They run
#: one after another on the other worker (its first group: pytest-xdist sends the largest group to one
#: worker and the next largest to the other), beside the serial chain, at the others' niceness so the chain
#: keeps its share of the CPU; their vLLM servers hold the stale-sources lock shared, as ``stale_sources`` do.
ASIDE = "aside"

#: The lock between the tests that start what a multi-node trial's stale-process check reports
#: (``stale_sources``: sanity-check ranks, the benchmark client, a planted vLLM; they hold it shared,
#: with their module's fixtures) and the tests that run that check on both hosts and want it to find
#: nothing (:func:`alone_with_the_stale_check`, held exclusively around the run). The two hosts share
#: this machine's processes; the lock keeps the sources off the serial worker without letting the
#: check see them.
STALE_LOCK = Path(tempfile.gettempdir()) / "llmtrial-tests-stale-sources.lock"


@contextlib.contextmanager
def _stale_lock(mode: int) -> Iterator[None]:
    with open(STALE_LOCK, "a") as handle:
        fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def alone_with_the_stale_check() -> contextlib.AbstractContextManager[None]:
    """While no ``stale_sources`` test runs: around a run whose cross-node preflight must find no
    stale process on this machine's two hosts."""
    return _stale_lock(fcntl.LOCK_EX)


@contextlib.contextmanager
def beside_the_chain() -> Iterator[None]:
    """What real vLLM servers running beside the serial chain hold (mark ``aside``): the stale-sources lock,
    shared, and no bytecode written (``PYTHONDONTWRITEBYTECODE``): a file patch of the chain's leaves the
    patched module's cached bytecode stale, and a server of theirs importing it would write a new one into
    the site-packages that a chain's test holds unchanged."""
    with _stale_lock(fcntl.LOCK_SH), pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONDONTWRITEBYTECODE", "1")
        yield


@pytest.fixture(scope="module", autouse=True)
def _stale_sources(request: pytest.FixtureRequest) -> Iterator[None]:
    """A module marked ``stale_sources`` holds the lock shared from its first test to its fixtures'
    end (a module fixture may keep such a process, the benchmark worker, for all its tests); one marked
    ``aside`` is :func:`beside_the_chain` as long."""
    marks = {m.name for m in request.node.iter_markers()}
    context = beside_the_chain() if ASIDE in marks else _stale_lock(fcntl.LOCK_SH) if "stale_sources" in marks else None
    if context is None:
        yield
        return
    with context:
        yield


def is_serial(item: pytest.Item) -> bool:
    return not item.get_closest_marker(ASIDE) and any(item.get_closest_marker(mark) for mark in SERIAL_MARKS)


#: The mark of the serial tests whose runs want no vLLM anywhere on this machine (a multi-node trial's
#: stale-process check on both hosts, :func:`alone_with_the_stale_check`): they wait until no ``aside``
#: module runs, so they run last in the chain, once the other worker's aside modules are done, instead of
#: waiting for one in the middle of the chain.
STALE_CHECK = "stale_check"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker(ASIDE):
            item.add_marker(pytest.mark.xdist_group(ASIDE))
        elif is_serial(item):
            item.add_marker(pytest.mark.xdist_group("serial"))
    # a stable sort: each group keeps its order, the stale checks' modules whole, at the chain's end
    items.sort(key=lambda item: is_serial(item) and item.get_closest_marker(STALE_CHECK) is not None)


#: What the trials the tests run write beside the weights they stage (logs, records, results, a bytecode
#: cache), per trial, beyond the reserve their disk block keeps free; several trials run at once.
TRIALS_WRITE_BYTES = 2 << 30
#: The marks of tests that run a trial through the workflow (its preflight checks the disk's headroom).
TRIAL_MARKS = ("e2e", "workflow")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Stop before the first test when the trials the selected tests run cannot pass the preflight's disk
    check on this machine: one message naming the filesystem and what is short, instead of every trial
    failing on its own (a disk filled by earlier checkouts and their venvs, say)."""
    from llmtrial.core.trial_config import DiskBlock
    from llmtrial.host.disk import headroom_by_filesystem, headroom_message

    if not any(item.get_closest_marker(mark) for item in session.items for mark in TRIAL_MARKS):
        return
    disk = DiskBlock()
    [fs] = headroom_by_filesystem([("tests' trials", Path(tempfile.gettempdir()), TRIALS_WRITE_BYTES, 0)], disk)
    if not fs.ok:
        pytest.exit("the trials these tests run would fail their preflight's disk check (the default disk block, "
                    f"a reserve of {100 * disk.reserve_fraction:g} %): {headroom_message(fs)}; free space there first",
                    returncode=3)


#: How much nicer than the serial tests a pytest-xdist worker runs the others: the serial worker's chain
#: of real-vLLM trials is what ``make test`` waits for, and the other worker, done with its tests long
#: before, takes the CPU where the chain leaves it idle instead of slowing it. A worker that may not
#: lower its niceness again (not root) stays nicer, as both then are: equal shares, as without this.
OTHERS_NICENESS = 10
_NICENESS = os.getpriority(os.PRIO_PROCESS, 0)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if "PYTEST_XDIST_WORKER" not in os.environ:  # one process runs every test at one niceness
        return
    with contextlib.suppress(PermissionError):
        # an aside test's servers run in the CPU time nothing else wants (SCHED_IDLE, inherited by every process
        # its trial starts): at a niceness alone they took a third of the cores from the chain's servers
        policy = os.SCHED_IDLE if item.get_closest_marker(ASIDE) else os.SCHED_OTHER
        if os.sched_getscheduler(0) != policy:
            os.sched_setscheduler(0, policy, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, 0, _NICENESS + (0 if is_serial(item) else OTHERS_NICENESS))


#: The trials the tests run take a host lock of their own (llmtrial.core.hostlock) in place of this
#: host's: each test one in its tmp_path (a test that leaves a residue on purpose keeps its lock, and no
#: other test waits for it), the module and session fixtures one per pytest process, so that the other
#: worker's trials (mark ``aside``: their servers at SCHED_IDLE, in the CPU time the chain leaves) run
#: beside the chain's instead of making the chain wait for each of them (one lock shared by both workers
#: made a chain trial wait for a whole aside trial: 136 s for the plugin trial). Set in every process,
#: not inherited from the controller. The workflow reads it; the library in the test process takes no lock.
_LOCK_DIR = Path(tempfile.mkdtemp(prefix="llmtrial-lock-"))
os.environ[LOCK_ENV] = str(_LOCK_DIR / "host.json")

#: The tiny models the trials generate are kept in a cache of this pytest run's (the controller makes it, its
#: workers and every trial they start inherit it): the first staging of a model generates it, the others copy
#: it (llmtrial.weights.tiny_cache), as an operator's reruns do, and no run reads what an earlier one kept.
_MADE_CACHE = None if CACHE_ENV in os.environ else tempfile.mkdtemp(prefix="llmtrial-cache-")
if _MADE_CACHE is not None:
    os.environ[CACHE_ENV] = _MADE_CACHE


def pytest_unconfigure(config: pytest.Config) -> None:
    """The process that made the run's cache removes it when the run ends (the controller, after its workers);
    each process removes the folder of its own host lock (one a pytest process: 71 were left here in a day)."""
    if _MADE_CACHE is not None:
        shutil.rmtree(_MADE_CACHE, ignore_errors=True)
    shutil.rmtree(_LOCK_DIR, ignore_errors=True)


@pytest.fixture(autouse=True)
def own_host_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    lock = tmp_path / "host-lock.json"
    monkeypatch.setenv(LOCK_ENV, str(lock))
    return lock


def written(record) -> dict:
    """A record (a model or a dict) as ``write_record`` writes it, read back as JSON: a model with the
    fields it was given, by alias."""
    return json.loads(json.dumps(as_written(record), default=str))


#: How far apart the port ranges of two pytest-xdist workers lie: each worker looks for its trials' and servers'
#: ports from ``start + WORKER_PORTS * <worker number>`` up, so that two tests of two workers never settle on
#: one port between their check and their server's bind (a trial's cleanup once found the other worker's vLLM on
#: the port its own configuration would have had, and reported it as a residue).
WORKER_PORTS = 5000


def worker_number() -> int:
    """This pytest-xdist worker's number (gw1: 1); 0 outside pytest-xdist."""
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)


def free_base_port(start: int, count: int) -> int:
    """The first of ``count`` consecutive loopback ports, from ``start`` (in this worker's range: see
    :data:`WORKER_PORTS`) up in steps of ten, none open."""
    port = start + WORKER_PORTS * worker_number()
    while any(port_open("127.0.0.1", port + i) for i in range(count)):
        port += 10
    return port


@pytest.fixture
def free_port() -> int:
    return free_ports(1)[0]


#: A loopback HTTP server whose /health answers 200 after ``delay`` seconds, with one
#: child process in its group (like vLLM's engine core), and that ignores SIGTERM when
#: asked to (to exercise the SIGKILL path).
SERVER_SCRIPT = r"""
import http.server, os, signal, socket, subprocess, sys, tempfile, time, uuid
port, delay, stubborn = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1"
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"child {child.pid}", flush=True)
# an IPC socket where vLLM makes its own (ZMQ ipc://), and a store file where its engine makes one (torch's file
# store, vllm_dist_<hex>), both left there when the group is stopped, as vLLM's are
rpc = os.path.join(os.environ.get("VLLM_RPC_BASE_PATH", tempfile.gettempdir()), str(uuid.uuid4()))
socket.socket(socket.AF_UNIX).bind(rpc)
print(f"rpc {rpc}", flush=True)
with open(os.path.join(tempfile.gettempdir(), f"vllm_dist_{uuid.uuid4().hex}"), "wb") as store:
    print(f"store {store.name}", flush=True)
if stubborn:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(delay)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def fake_server(tmp_path: Path, port: int, delay: float = 0.5, stubborn: bool = False, **kw) -> ServerProcess:
    script = tmp_path / "fake_server.py"
    script.write_text(SERVER_SCRIPT)
    argv = [sys.executable, str(script), str(port), str(delay), "1" if stubborn else "0"]
    return ServerProcess(argv, host="127.0.0.1", port=port, log_path=tmp_path / "server.log", **kw)


def wait_until(predicate: Callable[[], object], what: str, timeout: float = 60.0, poll: float = 0.05) -> object:
    """``predicate()``'s first true value, polled until ``timeout`` seconds pass (a guard against
    hanging, not a speed target: what it waits for normally takes a fraction of that)."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(poll)
    return value


def reported(log: Path, what: str) -> str:
    """The first value the fake server printed as ``<what> <value>``, waited for."""
    def first() -> str | None:
        lines = [line for line in log.read_text().splitlines() if line.startswith(what + " ")]
        return lines[0].split(maxsplit=1)[1] if lines else None

    return wait_until(first, f"the fake server reports its {what}")


def child_pid(log: Path) -> int:
    return int(reported(log, "child"))


class CompletionsDouble(http.server.BaseHTTPRequestHandler):
    """A double of vLLM's OpenAI-compatible /v1/completions with ``stream: true``: one chunk
    per generated token (``max_tokens`` of them, ``delay`` seconds apart), each carrying text,
    then a final chunk without text (the finish reason), with ``stream_options.include_usage``
    a usage chunk (``completion_tokens`` only), and ``data: [DONE]``. Any other path is a 404
    (so vLLM's benchmark finds no /tokenize and skips its prompt alignment)."""

    delay = 0.01

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/completions":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunks = [{"choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]} for i in range(body["max_tokens"])]
        chunks.append({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({"choices": [], "usage": {"completion_tokens": body["max_tokens"]}})
        for chunk in chunks:
            time.sleep(self.delay)
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *a):
        pass


@contextlib.contextmanager
def loopback(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[tuple[str, int]]:
    """(host, port) of a loopback HTTP server of ``handler``, served from a thread until the block ends."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def completions_server():
    """(host, port) of a loopback :class:`CompletionsDouble`."""
    with loopback(CompletionsDouble) as address:
        yield address


class NvmlDoubleBase:
    """The part of a double of nvidia-ml-py's pynvml every NVML test needs: a driver that
    initialises and lists ``count`` GPUs whose handles are their indexes. Tests subclass it
    with the device calls they exercise."""

    count = 2

    def __init__(self):
        self.shut = False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        return i


class NVMLError(Exception):
    pass


class NvmlDouble(NvmlDoubleBase):
    """A double of nvidia-ml-py's pynvml for the GPU inventory (preflight, plans): two H200s of
    141 and 139 GiB at PCI 0000:17:00.0 and 0000:9a:00.0; GPU 1 will not report its PCIe width."""

    NVML_P2P_CAPS_INDEX_READ = 0
    NVML_P2P_STATUS_OK = 0

    def __init__(self, cc=(9, 0)):
        super().__init__()
        self.cc = cc

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H200"

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}"

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=(141 if h == 0 else 139) * 2**30)

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return self.cc

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return 5

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        if h == 1:
            raise NVMLError("Not Supported")
        return 16

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return 16

    def nvmlDeviceGetPciInfo(self, h):
        """pynvml's nvmlPciInfo_t: ``busId`` with NVML's 8-hex-digit domain, upper case."""
        return SimpleNamespace(busId=b"00000000:17:00.0" if h == 0 else "00000000:9A:00.0")

    def nvmlDeviceGetP2PStatus(self, a, b, index):
        return 0

    def nvmlSystemGetDriverVersion(self):
        return "575.51.03"

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return 12090


class NvmlTelemetryDouble(NvmlDoubleBase):
    """A double of nvidia-ml-py's pynvml for sampling: two GPUs; GPU 0 refuses its
    temperature; GPU 1 disappears (every call raises) once ``lose_gpu1`` is set."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
    NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1

    def __init__(self):
        super().__init__()
        self.lose_gpu1 = False
        self.energy = [1_000_000, 2_000_000]

    def _check(self, h):
        if h == 1 and self.lose_gpu1:
            raise NVMLError("GPU is lost")

    def nvmlDeviceGetUtilizationRates(self, h):
        self._check(h)
        return SimpleNamespace(gpu=50 + h, memory=20)

    def nvmlDeviceGetMemoryInfo(self, h):
        self._check(h)
        return SimpleNamespace(used=10 * 2**30, total=80 * 2**30)

    def nvmlDeviceGetPowerUsage(self, h):
        self._check(h)
        return 300_000

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        self._check(h)
        return 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self._check(h)
        self.energy[h] += 300_000  # 300 J per sample
        return self.energy[h]

    def nvmlDeviceGetTemperature(self, h, sensor):
        self._check(h)
        if h == 0:
            raise NVMLError("Not Supported")
        return 60

    def nvmlDeviceGetClockInfo(self, h, clock):
        self._check(h)
        return 1980 if clock == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        self._check(h)
        return 0

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        self._check(h)
        return 1000 + counter

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        self._check(h)
        return [SimpleNamespace(pid=1, usedGpuMemory=8 * 2**30)]


class NvmlPowerDouble(NvmlTelemetryDouble):
    """The telemetry double with an energy counter that runs on the wall clock: each GPU draws 300 W, and its
    counter advances by ``counter_scale`` times the energy that power delivers (1.0: the counter and the
    integral of sampled power agree; 1.3: the counter reads 30 % more, as a board whose counter drifts)."""

    def __init__(self, counter_scale: float = 1.0):
        super().__init__()
        self.counter_scale = counter_scale
        self.t0 = time.time()

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self._check(h)
        watts = self.nvmlDeviceGetPowerUsage(h) / 1000.0
        return int(self.energy[h] + 1000.0 * self.counter_scale * watts * (time.time() - self.t0))


def sampled_at(csv: Path, source, times: list[float]) -> Path:
    """``source`` sampled through a :class:`Sampler` into ``csv`` at exactly ``times`` (Unix seconds, ms
    apart or more): ``time.time`` stands at each in turn while ``sample_now`` takes it (and, one second
    before the first, while the sampler's own first sample is taken), so what a double computes from the
    clock agrees with the times the CSV records whatever the machine's speed."""
    clock = [times[0] - 1.0]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(time, "time", lambda: clock[0])
        with Sampler(csv, [source], interval=3600) as sampler:
            wait_until(lambda: sampler.stats()[source.name]["samples"], "the sampler's first sample")
            for t in times:
                clock[0] = t
                sampler.sample_now(source.name)
    return csv


@pytest.fixture(scope="session")
def hosts() -> Iterator[TwoHosts]:
    """Two hosts on this machine (tests/hosts.py): host A and host B, B with its own sshd;
    skipped only where Debian's sshd is not installed."""
    if not SSHD.is_file():
        pytest.skip(f"{SSHD} is missing: `make test` installs openssh-server (as root)")
    with two_hosts() as made:
        yield made


@pytest.fixture(scope="session")
def hub_plugin_trial(tmp_path_factory):
    """One trial read by the weights and the patch tests (tests/served_trials.py says what it serves)."""
    from served_trials import hub_plugin

    yield from hub_plugin(tmp_path_factory)


@pytest.fixture(scope="session")
def sweep(tmp_path_factory) -> dict:
    """One trial read by the sweep and the workloads tests (tests/served_trials.py says what it serves). Its
    servers run beside the serial chain (mark ``aside``): the trial is :func:`beside_the_chain` itself, a session
    fixture being set up before its first test's module fixtures."""
    from served_trials import sweep_with_workloads

    with beside_the_chain():
        return sweep_with_workloads(tmp_path_factory)


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    """A module's one-node SLURM (tests/slurm_cluster.py, up in about 1.5 s), with its /etc/slurm links;
    skipped (with the reason) where this machine cannot run one. Its tests are hostwide or e2e, so one
    pytest-xdist worker holds it; one module's at a time, so that the two-node cluster of
    tests/workflow/test_slurm_two_nodes.py can link /etc/slurm in its turn. On teardown nothing of it
    may be left (processes, /etc/slurm links, folder)."""
    with contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(slurm_cluster())
        except SlurmUnavailable as exc:
            pytest.skip(str(exc))
        yield cluster
    left = leftovers(cluster.root)
    assert not left, f"the session's SLURM left {left}"
