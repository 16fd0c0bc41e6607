"""The configuration record's model: what one serving configuration's job measured
(``results/<trial>/configs/<name>/record.json``), its passes, scenarios, server, failure and telemetry."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from llmtrial.core.answers_model import Answers
from llmtrial.core.record_base import Fact, HeldGpu, Maybe, Number, RecordModel, Rows, Verdict
from llmtrial.core.scenario_model import NodeWindow, Scenario, WindowFigures

# --------------------------------------------------------------------------- the server and its failure


class ErrorLine(RecordModel):
    """The log line that explains the failure."""

    line: Any
    source: Any
    pattern: str = Field(description=(
        "The failure's kind (a name of llmtrial.logs.failures.FAILURE_PATTERNS), or unknown when none explains "
        "the log."))
    diagnosis: Any


#: A start-up phase of vLLM, in start-up order, serving last: where a crash happened
#: (:mod:`llmtrial.logs.signature`) and where a knob acts (:mod:`llmtrial.logs.knob_phases`).
Phase = Literal["device_init", "weight_loading", "post_load_processing", "memory_profiling", "kv_allocation",
                "graph_capture_compile", "serving"]


class CrashFrame(RecordModel):
    """A traceback frame in the vLLM package."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: str = Field(description="The file from vllm/ on.")
    function: str = Field(description="The function.")
    line: int = Field(description="The line of the source file.")


class Signature(RecordModel):
    """How the server crashed, read from its log (llmtrial.logs.signature): two failed configurations fail the
    same way when exception, message, frame and phase are equal."""

    model_config = ConfigDict(extra="forbid")

    exception: str | None = Field(description="The exception type as the log prints it; null where it prints none.")
    message: str | None = Field(description="Its message with every number masked (<N>, <HEX>).")
    frame: CrashFrame | None = Field(description="The innermost vLLM frame of its traceback.")
    phase: Phase | None = Field(description=(
        "The start-up phase the log shows it happened in (vLLM's frames, else its own lines before the crash); "
        "null where the log does not show one."))
    out_of_memory: bool = Field(description="A device out-of-memory error, in any wording vLLM or torch uses.")
    source: str = Field(description="The log it was read from (of every rank's: the rank that crashed first).")
    crash_line: int = Field(description="The 1-based line of the crash in that log.")
    phase_line: int | None = Field(None, description="The 1-based line that shows the phase.")

    @property
    def key(self) -> tuple[str | None, str | None, CrashFrame | None, Phase | None]:
        """What two crashes share when they are the same failure (no line of a log)."""
        return self.exception, self.message, self.frame, self.phase


class ConfirmLaunch(RecordModel):
    """One relaunch of a failed configuration for its confirmation."""

    model_config = ConfigDict(extra="forbid")

    knob_set: bool = Field(description="The knob as the configuration has it (true), or as the other configuration has it (false).")
    log: str = Field(description="Its server log, relative to the configuration's folder.")
    started: bool = Field(description="The server answered /health.")
    signature: Signature | None = Field(None, description="Its crash's signature, when it did not start and its log shows one.")


class Confirmation(RecordModel):
    """The relaunches that confirm (or not) the one knob between a failed configuration and another
    (failures.confirm): without it, then with it again."""

    model_config = ConfigDict(extra="forbid")

    knob: str = Field(description="The knob (a vLLM arg or an environment variable).")
    against: str = Field(description="The configuration that differs from this one in that knob alone.")
    value: str | None = Field(description="Its value here (null: not set).")
    instead: str | None = Field(description="Its value in the other configuration, the one the first relaunch takes.")
    launches: list[ConfirmLaunch] = Field(description="The relaunches in order: without the knob, then with it.")
    removing_fixes: bool = Field(description="The relaunch without the knob started.")
    adding_back_breaks: bool | None = Field(description=(
        "The relaunch with the knob put back failed with the crash's signature; null: it was not run (the "
        "relaunch without the knob did not start)."))


class DownState(RecordModel):
    """What a server that exited after it was ready was doing, from the telemetry its job sampled
    (:mod:`llmtrial.serve.idle`): an idle crash (seed 002) when its last /metrics sample showed no request
    running or waiting."""

    model_config = ConfigDict(extra="forbid")

    idle: bool | None = Field(description=(
        "True: the last /metrics sample before the server was found down showed no request running or waiting "
        "and no benchmark pass was sending (an idle crash); false: it showed some, or a pass was in flight (at "
        "concurrency 1 a sample can fall between two requests); null: no /metrics sample was taken after start-up."))
    pass_in_flight: str | None = Field(description=(
        "The benchmark pass whose telemetry window was open at that sample (its file stem), or null."))
    found_down_at: float = Field(description="When the job found the server down (Unix time).")
    last_sample_at: float | None = Field(description="That /metrics sample's time (Unix time), or null.")
    running: float | None = Field(description="vllm:num_requests_running in that sample, or null.")
    waiting: float | None = Field(description="vllm:num_requests_waiting in that sample, or null.")
    kernel_lines: list[str] = Field(description=(
        "The kernel log's NVRM and Xid lines that appeared from that sample to the health check after the failure "
        "(the telemetry's kernel-log source, then the check): the driver's word on the window."))
    kernel_log: str | None = Field(description="Why the kernel log could not be read, or null when it was.")
    window: WindowFigures | None = Field(description=(
        "What telemetry sampled from that sample to the server found down (the GPUs' and the host's figures), or "
        "null without a sample."))


class Failure(RecordModel):
    """Why the configuration failed."""

    phase: Literal["gpu_check", "sanity_check", "startup", "cold_start", "benchmark", "idle"] = Field(description=(
        "Where it failed: gpu_check (a foreign process or a failed GPU: not launched), sanity_check (the "
        "collective across nodes), a serving phase, or idle (the server died while serving.idle_watch_s held it "
        "idle after the passes)."))
    reason: str = Field(description="exited, timeout, port_in_use, request_failed or pass_failed.")
    message: str = Field(description="One sentence.")
    returncode: int | None = Field(None, description="The server's exit code when it exited.")
    error_line: ErrorLine | None = Field(None, description=(
        "The log line that explains the failure, or null when none matched."))
    log_tail: Maybe[list[str]] = Field(None, description="Last lines of the server log.")
    signature: Maybe[Signature] = Field(None, description=(
        "The crash's signature, from every rank's log; absent where no log shows an exception or a traceback "
        "(a timeout, a refused launch)."))
    down: Maybe[DownState] = Field(None, description=(
        "Only for a server that exited after it was ready: what its last /metrics sample showed (idle or not), "
        "the kernel log's lines and the telemetry of the window up to when it was found down."))


class ServerStop(RecordModel):
    """Teardown by process group."""

    signals: Any
    survivors: Any
    port_closed: Any
    stop_seconds: Maybe[float] = Field(None, description="From the first signal to the group's end.")
    nodes: Maybe[dict[str, Any]] = Field(None, description="Across nodes: each other node's group, stopped there, by node.")
    survivors_on_nodes: Maybe[dict[str, Any]] = Field(None, description="Across nodes: what outlived the stop, by node.")
    returncode: Maybe[int | None] = Field(None, description="The server's exit status (negative: the signal that ended it).")


class Server(RecordModel):
    """How the server was started and stopped."""

    argv: list[str] = Field(description="The exact command (no shell).")
    env: dict[str, str] = Field(description="Environment added for the server, secrets redacted.")
    host: str = Field(description="Bind address.")
    port: int = Field(description="Port.")
    log: str = Field(description="Server log, relative to the configuration folder.")
    launched_at: float | None = Field(None, description="Unix time the server was launched.")
    ready_at: float | None = Field(None, description="Unix time it first answered /health 200.")
    stop: Maybe[ServerStop] = Field(None, description="Teardown by process group.")
    pid: Maybe[int] = Field(None, description="The server's pid, the leader of its process group.")
    ranks: Maybe[dict[str, Any]] = Field(None, description="Across nodes: each node's rank or Ray node as launched, by node.")


class PatchSeen(RecordModel):
    """One patch as the server saw it."""

    name: str = Field(description="The patch.")
    mode: Literal["file", "plugin"] = Field(description="How it was applied.")
    flag: str = Field(description="The environment flag that guards its behaviour.")
    flag_on: bool = Field(description='The configuration set the flag to "1".')
    observed: bool = Field(description="A server log line matched the patch's evidence pattern.")
    as_expected: bool = Field(description="Observed exactly when the flag was on.")
    processes: list[str] = Field(description="The vLLM processes that logged the evidence (name pid N).")
    lines: list[Any] = Field(description="The evidence lines, each with its source (server.log:N), process and pid.")
    hooks: list[Any] = Field(description="Mode plugin: the line each process printed when the hook was installed.")


class ServerPatches(RecordModel):
    """The trial's vLLM patches as this configuration's server saw them."""

    reapplied: bool = Field(description="The job applied the patches again first (a rerun after cleanup reverted them).")
    plugin_dir: str | None = Field(description="The plugin folder put first on the server's PYTHONPATH (mode plugin).")
    patches: list[PatchSeen] = Field(description="One entry per patch.")


class GpuProcess(RecordModel):
    """A compute process NVML listed on a selected GPU."""

    gpu: Any
    pid: Any
    user: Any
    command: Any
    name: Maybe[str | None] = Field(None, description="The process name NVML or /proc gives.")
    uuid: Maybe[str | None] = Field(None, description="The GPU's UUID.")
    memory_bytes: Number | None = Field(None, description="GPU memory it holds (null when NVML will not say).")
    allowed_by: str | None = Field(None, description="The hardware.allow_processes entry that allows it, or null.")


class GpuCensus(RecordModel):
    """Every compute process on a selected GPU before launch, and those not allowed."""

    source: str
    gpus: list[int]
    processes: list[GpuProcess]
    foreign: Rows
    held_failed: Maybe[list[HeldGpu]] = None
    reason: str | None = None
    allow: Maybe[list[str]] = Field(None, description="hardware.allow_processes: the processes allowed to share the GPUs.")
    checked_at: Maybe[float] = Field(None, description="Unix time of the census.")


class Allocation(RecordModel):
    """A fresh process allocating, filling and freeing a buffer on one GPU: ok, failed or skipped, and what it saw."""

    status: str
    evidence: Any = None
    seconds: Maybe[Number] = Field(None, description="How long the allocation took.")


class GpuCheck(RecordModel):
    """One selected GPU checked after a failure."""

    index: Any
    uuid: Any = None
    name: Maybe[str | None] = None
    pci_bus_id: Maybe[str | None] = None
    allocation: Allocation
    xid: Any
    healthy: bool | None = Field(description="null when the allocation could not be tried (no CUDA).")
    evidence: Any


class KernelLogAccess(RecordModel):
    """Whether the kernel log could be read for Xid lines."""

    available: bool = Field(description="The kernel log was read.")
    reason: str | None = Field(description="Why it could not be, or null.")


class GpuHealth(RecordModel):
    """Each selected GPU checked after a failure."""

    source: Maybe[str] = Field(None, description="cuda, or double when a test double played the GPUs.")
    gpus: Maybe[list[GpuCheck]] = None
    checked_at: Maybe[float] = Field(None, description="Unix time of the check.")
    kernel_log: Maybe[KernelLogAccess] = Field(None, description="Whether the kernel log could be read for Xid lines, "
                                               "and why not.")
    xid_other: Maybe[list[Any]] = Field(None, description="Xid lines on GPUs outside the selection.")


class EngineWarning(RecordModel):
    """One warning the engine printed (:func:`llmtrial.logs.engine_warnings.engine_warnings`)."""

    name: str = Field(description=(
        "untuned_moe_config, slower_quant_kernel, custom_allreduce_disabled (p2p_unsupported in records written "
        "before), compile_cache_load_failure or nccl_socket_transport."))
    line: str = Field(description="The first log line that said it, ANSI-stripped.")
    source: str = Field(description="That line's file and number (server.log:123).")
    process: str | None = Field(None, description="The vLLM process that logged it, when the line's prefix names one.")
    count: Annotated[int, Field(ge=1)] = Field(description=(
        "How many lines said it (each tensor-parallel rank prints its own)."))
    summary: str = Field(description="What it says, in one line.")
    advice: str = Field(description="What the seeds did about it.")
    kind: Literal["measured"] = Field(description="Read from the server log.")


# --------------------------------------------------------------------------- the cold start, telemetry, timing


class TokensFact(Fact):
    """A count of tokens with where it came from."""

    value: int | None = Field(description="The figure.")
    unit: Maybe[Literal["tokens"]] = Field(None, description="Unit of value.")


class RateFact(Fact):
    """A rate in tokens per second with where it came from."""

    value: float | None = Field(description="The figure.")
    unit: Maybe[Literal["tok/s"]] = Field(None, description="Unit of value.")


class Startup(RecordModel):
    """Facts by name, read from the server's start-up log: one field for each figure of
    :data:`llmtrial.logs.startup_log.STARTUP_LINES` (each present only where the log said it)."""

    vllm_version: Maybe[Fact] = None
    max_model_len: Maybe[Fact] = None
    model_load_gib: Maybe[Fact] = None
    model_load_seconds: Maybe[Fact] = None
    loading_weights_seconds: Maybe[Fact] = None
    model_init_seconds: Maybe[Fact] = None
    available_kv_gib: Maybe[Fact] = None
    kv_cache_tokens: Maybe[Fact] = None
    kv_pool: Maybe[Fact] = None
    max_concurrency: Maybe[Fact] = None
    max_concurrency_tokens_per_request: Maybe[Fact] = None
    gpu_blocks: Maybe[Fact] = None
    cpu_blocks: Maybe[Fact] = None
    engine_init_seconds: Maybe[Fact] = None
    cuda_graph_capture_seconds: Maybe[Fact] = None
    cuda_graph_capture_gib: Maybe[Fact] = None
    torch_compile_seconds: Maybe[Fact] = None
    memory_profiling_seconds: Maybe[Fact] = None
    gpu_free_on_startup_gib: Maybe[Fact] = None
    gpu_total_gib: Maybe[Fact] = None
    gpu_memory_utilization: Maybe[Fact] = None
    gpu_requested_gib: Maybe[Fact] = None
    consumed_gib: Maybe[Fact] = None
    weights_gib: Maybe[Fact] = None
    non_torch_gib: Maybe[Fact] = None
    peak_activation_gib: Maybe[Fact] = None
    cuda_graph_gib: Maybe[Fact] = None
    non_kv_cache_gib: Maybe[Fact] = None
    kv_cache_memory_to_fit_bytes: Maybe[Fact] = None
    kv_cache_memory_to_fill_bytes: Maybe[Fact] = None
    kv_cache_in_use_gib: Maybe[Fact] = None


class StartupPhase(RecordModel):
    """One phase of the server's start-up as its log gives it (:mod:`llmtrial.logs.startup_phases`)."""

    name: str = Field(description=(
        "before the log, process start, weights, compile, profiling and KV allocation, graph capture, engine "
        "warm-up, or API server start: the phase ending at the milestone of that name."))
    seconds: float | None = Field(description=(
        "From the line of the milestone before to this one's, by the lines' stamps (whole seconds); before the "
        "log: the launch-to-ready time less the log's span; null where the log begins at this milestone."))
    source: str = Field(description="The line that ends it (file:line).")
    logged_seconds: float | None = Field(description="The phase's own duration where vLLM prints it; null otherwise.")
    logged_source: str | None = Field(description="The line that prints it (file:line); null without one.")


class ColdStart(RecordModel):
    """The cold start: launch to ready, and the first streamed request after it."""

    ready_seconds: Maybe[Fact] = None
    first_ttft_s: Maybe[Fact] = None
    first_total_s: Maybe[Fact] = None
    first_output_tokens: Maybe[TokensFact] = None
    first_output_tok_s: Maybe[RateFact] = None


class NodeSample(NodeWindow):
    """What the sampler on one node saw over the job, or an error naming the node."""

    error: Maybe[str] = None
    interface: Maybe[str | None] = Field(None, description="The interface its traffic was counted on (all but lo "
                                         "when the node names none).")
    interval_s: Maybe[Number] = Field(None, description="Seconds between its samples.")


class NodesTelemetry(RecordModel):
    """The telemetry of a configuration across nodes (llmtrial.serve.nodetelemetry.NodeTelemetry's summary)."""

    file: Any
    interval_s: Any
    nodes: dict[str, NodeSample] = Field(description="Per node, what its sampler saw.")


class TelemetrySource(RecordModel):
    """One telemetry source's status (sampled, failed at times, or absent with the reason), the kernel log's
    events, NVML's lost GPUs."""

    status: str
    reason: str | None = None
    events: Maybe[list[Any]] = None
    lost_gpus: Any = None
    field_errors: Maybe[int] = Field(None, description="nvml: samples in which a field could not be read.")


class SamplerStats(RecordModel):
    """The sampler's own cost and cadence for one source (NaN below two calls)."""

    samples: Maybe[int] = None
    errors: Maybe[int] = None
    cpu_seconds_per_sample: Maybe[Number] = None
    achieved_interval_s: Maybe[Number] = None
    skipped_slots: Maybe[int] = None


class Telemetry(RecordModel):
    """Where the samples are and the sampler's own figures."""

    file: Any
    sources: Maybe[dict[str, TelemetrySource]] = Field(None, description="Each source's status, by name.")
    sampler: Maybe[dict[str, SamplerStats]] = Field(None, description="The sampler's own figures, by source name.")
    errors: Maybe[dict[str, list[str]]] = Field(None, description="Each source's failed samples (time and error), by source name.")
    startup_window: Maybe[WindowFigures] = Field(None, description="What telemetry sampled from launch to ready.")
    nodes: Maybe[NodesTelemetry] = Field(None, description=(
        "Only for a configuration across nodes: llmtrial.serve.nodetelemetry.NodeTelemetry's summary, the merged "
        "samples file of every node (column node), the interval and per node its samples, CPU peak and mean, "
        "memory used peak, bytes received and sent over its interface, first and last sample time, or an error "
        "naming the node."))


class Timing(RecordModel):
    """Wall time of the job and its parts, in seconds."""

    job_start: float = Field(description="When the job started (Unix time).")
    job_end: float = Field(description="When the job wrote its record (Unix time).")
    wall_s: float = Field(description="job_end minus job_start.")
    startup_s: float | None = Field(None, description=(
        "vLLM's launch to its first /health 200; null when it never answered."))
    bench_s: Maybe[float] = Field(None, description=(
        "The benchmark passes' wall time, summed (each pass's end minus start)."))
    bench_import_s: float | None = Field(None, description=(
        "Seconds the benchmark worker(s) this configuration started took to import vLLM's benchmark, summed over "
        "bench_workers; paid within "
        "the passes, so part of bench_s. Null when no worker got that far; absent in records from before the "
        "worker."))
    bench_workers: Maybe[int] = Field(None, description=(
        "Benchmark worker processes this configuration started for its passes: 1 where it started the trial's "
        "worker, 0 where it used the one an earlier configuration of the run started, plus one after each pass "
        "that timed out or whose worker died."))
    bench_worker_pids: Maybe[list[int]] = Field(None, description=(
        "The benchmark worker processes (pids) that ran this configuration's passes, in order: a pid another "
        "configuration's record of the same run names is one worker shared by both. Absent in records from "
        "before the shared worker."))


# --------------------------------------------------------------------------- the plan beside the measurement


class PlanVerdict(RecordModel):
    """The planner's verdict on this configuration before launch."""

    verdict: Verdict = Field(description="The verdict.")
    reasons: list[str] = Field(description="What a person can act on.")
    forced: bool = Field(description="Launched although the planner rejected it.")


class ThroughputBound(RecordModel):
    """An ok pass or sweep step beside the plan's estimated decode throughput bound at its concurrency."""

    scenario: str = Field(description="The scenario.")
    pass_: int | None = Field(alias="pass", description="The pass (or sweep step) number.")
    concurrency: Number = Field(description="Requests in flight the pass ran at.")
    bound_tok_s: float = Field(description="The bound at that concurrency, output tok/s.")
    bound_kind: Literal["estimated"] = Field(description="The bound is an estimate from measured bandwidths.")
    measured_tok_s: float = Field(description="The pass's measured output tok/s (vLLM's benchmark).")
    ratio: float | None = Field(description="measured / bound: how much of the ceiling the pass reached.")


class Prediction(RecordModel):
    """One planner figure beside vLLM's logged one."""

    name: Any
    predicted: Any
    predicted_kind: Any
    measured: Any
    measured_source: Any
    relative_error: Any


class Launch(RecordModel):
    """How a configuration across nodes was launched (llmtrial.serve.multinode_job.Spread.record)."""

    kind: Literal["native", "ray"] = Field(description="vLLM's own multi-node launch (native) or a Ray cluster (ray).")
    nnodes: int = Field(ge=2, description="Nodes the configuration spans.")
    master_addr: str = Field(description="The first node's address, where the other nodes meet.")
    master_port: int | None = Field(description="The rendezvous port of the native launch; null under Ray.")
    ray_address: Maybe[str] = Field(None, description="Under Ray: the head's address the workers join.")


class SpanNode(RecordModel):
    """One node of a configuration across nodes: its rank and role and how it was reached."""

    name: str = Field(description="The node's name in the trial file.")
    rank: int = Field(ge=0, description="Its node rank (0 serves the API).")
    role: str = Field(description="api server, headless (native launch), ray head or ray worker.")
    address: str = Field(description="The address the other nodes reach it at.")
    reach: Literal["local", "ssh", "slurm"] = Field(description="How the trial reaches it: local, over ssh, or as a step of the trial's SLURM allocation on its host.")
    slurm_host: Maybe[str | None] = Field(None, description="Inside a SLURM allocation: the SLURM node it ran on (the host group's own for the local node).")
    interface: str | None = Field(description="The network interface its ranks use (NCCL/GLOO_SOCKET_IFNAME), or null.")
    model_dir: str = Field(description="Where the node holds the staged model.")
    python: Maybe[str] = Field(None, description="The interpreter it ran with on that node.")
    args: Maybe[list[str]] = Field(None, description="Its command's arguments (a headless rank's vLLM flags, ray start's).")
    env_keys: Maybe[list[str]] = Field(None, description="The environment variables set for it on that node (names only).")
    pid: Maybe[int | None] = Field(None, description="Its process on that node.")
    pgid: Maybe[int | None] = Field(None, description="Its process group on that node.")
    remote_log: Maybe[str] = Field(None, description="Its log's path on that node.")
    ray: Maybe[dict[str, Any]] = Field(None, description="Ray launch: the head's address, the nodes Ray saw and after how long.")
    ray_log: Maybe[str] = Field(None, description="Ray launch: the node's ray start log, copied beside the record.")
    error_line: Maybe[ErrorLine | None] = Field(None, description=(
        "The first line of its log that names a failure, with its source and the failure pattern it matched."))
    patches: Maybe[list[Any]] = Field(None, description="The trial's patches as that node's processes saw them.")
    stop: Maybe[dict[str, Any] | None] = Field(None, description=(
        "How its process group was stopped on its node (signals, survivors), or the error; null when it "
        "had none to stop."))
    log: Maybe[str] = Field(None, description="The server's (or rank's) log on that node.")


class CollectiveSummary(RecordModel):
    """The all-reduce sanity check across the nodes before any server starts
    (llmtrial.host.collective.summarize's record, with wall_s and the nodes)."""

    ok: bool = Field(description="Every rank reported and the all-reduce finished.")
    world_size: int = Field(ge=0, description="Ranks asked for.")
    backend: str | None = Field(description="gloo on CPU hosts, nccl with GPUs.")
    ranks: Rows = Field(description="Each rank's own result.")
    reported: list[int] = Field(description="Ranks that wrote a result.")
    missing: list[int] = Field(description="Ranks that wrote none.")
    size_bytes: int | None = Field(description="Bytes all-reduced per iteration.")
    wall_s: float | None = Field(description="Seconds from the first rank's start to the last rank's end.")
    median_s: float | None = Field(description="The slowest rank's median all-reduce time.")
    algbw_gbps: float | None = Field(description="Algorithm bandwidth, GB/s (1e9 bytes).")
    busbw_gbps: float | None = Field(description="Bus bandwidth, GB/s (1e9 bytes).")
    phase: str | None = Field(description="done when ok, else where it failed (versions, init, all_reduce, ...).")
    diagnosis: str | None = Field(description="Why it failed, in words; null when ok.")
    nodes: Maybe[list[str]] = Field(None, description="The node of each rank, by rank.")


class ConfigurationRecord(RecordModel):
    """What one serving configuration's job measured (results/<trial>/configs/<name>/record.json).
    Written by llmtrial.serve.trial; read by cleanup, the report and benchmarks/overhead.py."""

    model_config = ConfigDict(title="configuration record")

    trial: str = Field(description="Trial name.")
    configuration: str = Field(description="Configuration name.")
    description: Maybe[str] = Field(None, description="What the configuration tests.")
    confirmation: Maybe[Confirmation] = Field(None, description=(
        "Only with failures.confirm, for a failed configuration that differs from another in one knob: the "
        "relaunches without that knob and with it again."))
    knobs: Maybe[dict[str, str]] = Field(None, description=(
        "What the trial's configurations are held against each other by when one fails: each vLLM arg (its name "
        "in the trial file), each environment variable set for the server (a patch's flag among them; secrets "
        "redacted), its nodes and its GPUs; values as text (JSON for what is not a string)."))
    status: Literal["ok", "failed", "skipped"] = Field(description=(
        "ok when the server started and every pass succeeded; skipped when the planner rejected it and it was "
        "not forced."))
    failure: Failure | None = Field(description="Why the configuration failed, or null.")
    server: Server = Field(description="How the server was started and stopped.")
    prefix_caching_server: Maybe[Server] = Field(None, description=(
        "Only when a scenario needs prefix caching on (prefix_repetition) and the configuration's args leave it off: "
        "the configuration's server launched again with --enable-prefix-caching once the other scenarios were done, "
        "which ran those scenarios (each marked relaunched)."))
    patches: Maybe[ServerPatches] = Field(None, description=(
        "The trial's vLLM patches as this configuration's server saw them (absent when it was not launched)."))
    startup: Startup = Field(description="Facts by name.")
    gpu_census: Maybe[GpuCensus] = Field(None, description=(
        "Before launch: every compute process NVML listed on a selected GPU (gpu, pid, user, command, "
        "memory_bytes, allowed_by), those not allowed by hardware.allow_processes (foreign: the configuration was "
        "not launched), and GPUs the ledger still held as failed (held_failed). source says whether NVML or a "
        "test double answered; reason why nothing was read."))
    gpu_health: GpuHealth | None = Field(None, description=(
        "After a failure, each selected GPU checked by a fresh process that initialises CUDA and allocates, fills "
        "and frees a buffer (allocation: status ok, failed or skipped, evidence) and by the Xid lines the kernel "
        "log gained since preflight (xid); healthy false puts a gpu_failed entry in the ledger, so cleanup leaves "
        "the services on that GPU stopped."))
    engine_warnings: list[EngineWarning] = Field([], description=(
        "Warnings vLLM (or NCCL under it) printed that the seeds acted on (llmtrial.logs.engine_warnings), one "
        "entry per name in the order first seen; absent from records written before they were collected."))
    startup_phases: list[StartupPhase] = Field([], description=(
        "The start-up split into its phases as the server's log gives them (llmtrial.logs.startup_phases), in "
        "order; absent from records written before they were read."))
    compile_cache: Maybe[str | None] = Field(None, description=(
        "What the start-up did with vLLM's compile cache, in words: loaded from it, compiled and saved to it, "
        "compiled again because it could not be loaded (with vLLM's reason), or nothing compiled."))
    cold_start: ColdStart = Field(description=(
        "The cold start: ready_seconds (launch to first /health 200), then the first streamed completion after "
        "ready: first_ttft_s, first_total_s, first_output_tokens (streamed chunks that carried text; vLLM streams "
        "one token per chunk) and first_output_tok_s (first_output_tokens / first_total_s)."))
    scenarios: list[Scenario] = Field(description=(
        "One entry per scenario, in config order (a relaunched one ran after the others). Records written before scenarios had a kind, warm-up or "
        "repetition have none of those keys: they read as fixed passes without a warm-up."))
    telemetry: Telemetry = Field(description="Where the samples are and the sampler's own figures.")
    timing: Timing = Field(description="Wall time of the job and its parts, in seconds.")
    plan: PlanVerdict = Field(description="The planner's verdict on this configuration before launch.")
    prediction: list[Prediction] = Field(description="The planner's figures beside vLLM's logged ones.")
    launch: Maybe[Launch] = Field(None, description=(
        "Only for a configuration across nodes: how it was launched (native or Ray), the nodes, the master."))
    nodes: Maybe[list[SpanNode]] = Field(None, description=(
        "Only for a configuration across nodes: each node, by rank, with its role, address, reach, interface "
        "and model folder."))
    collective: Maybe[CollectiveSummary] = Field(None, description=(
        "Only for a configuration across nodes: the all-reduce sanity check across them before the server."))
    answers: Maybe[Answers] = Field(None, description=(
        "The trial's task set (outputs) asked of the server after the passes, each answer graded, and of a server "
        "launched with the patch flags off where a flag was on; absent when no set was asked."))
    throughput_bound: list[ThroughputBound] = Field([], description=(
        "Each ok pass or sweep step beside the plan's estimated decode throughput bound (llmtrial.plan.ceiling) "
        "at its concurrency; empty when the plan has none (no memory bandwidth measured). Records written before "
        "the bound existed have no such key."))
