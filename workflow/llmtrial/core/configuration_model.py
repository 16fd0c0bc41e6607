"""The configuration record's model: what one serving configuration's job measured
(``results/<trial>/configs/<name>/record.json``), its passes, scenarios, server, failure and telemetry."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from llmtrial.core.record_base import Fact, Maybe, NonNegInt, RecordModel, Rows, Verdict

# --------------------------------------------------------------------------- a benchmark pass


class RequestSpread(RecordModel):
    """n, min, median and max of request_output_tok_s (null figures when n is 0)."""

    n: NonNegInt = Field(description="Successful requests counted.")
    min: float | None = Field(description="Slowest request, tok/s.")
    median: float | None = Field(description="Median request, tok/s.")
    max: float | None = Field(description="Fastest request, tok/s.")


class Goodput(RecordModel):
    """How many requests met every latency target given, and whether the share reaches the target's percentile."""

    targets: Maybe[dict[str, Any]] = Field(None, description="The targets given: ttft_ms, tpot_ms, e2el_ms.")
    percentile: Maybe[float] = Field(None, description="Share of requests (%) that must meet the targets.")
    request_goodput: float | None = Field(None, description="Requests per second meeting every target (vLLM's figure).")
    requests_meeting: Maybe[int] = Field(None, description="Requests that met every target.")
    requests: Maybe[int] = Field(None, description="Requests completed.")
    share: float | None = Field(None, description="requests_meeting / requests.")
    met: Maybe[bool] = Field(None, description="share is at least percentile / 100.")


class PassSummary(RecordModel):
    """Figures copied from vLLM's result file, and each request's own output throughput."""

    request_output_tok_s: Maybe[list[float]] = Field(None, description=(
        "Per request (per stream): output tokens over its latency, tok/s, 3 decimals, for each successful request "
        "in the result file's order (failed or zero-latency requests left out)."))
    request_output_tok_s_summary: Maybe[RequestSpread] = Field(None, description=(
        "n, min, median and max of request_output_tok_s (null figures when n is 0)."))
    goodput: Maybe[Goodput] = Field(None, description=(
        "Only when the scenario has a latency target (slo): how many requests met every target given (vLLM's "
        "--goodput rule) and whether the share reaches the target's percentile."))


class Pass(RecordModel):
    """One benchmark pass (or warm-up pass, or sweep step)."""

    pass_: Any = Field(alias="pass")
    seed: Any
    start: float = Field(description="Unix time the pass began (telemetry window start).")
    end: float = Field(description="Unix time the pass ended (telemetry window end).")
    status: Literal["ok", "failed"] = Field(description="Whether the benchmark produced a result.")
    argv: Any
    log: Any
    summary: Maybe[PassSummary] = Field(None, description=(
        "Figures copied from vLLM's result file, and each request's own output throughput."))
    server_metrics: Maybe[dict[str, float]] = Field(None, description="/metrics deltas over the pass.")


class Step(Pass):
    """A sweep step: a pass entry plus its step number, its values and its figures."""

    step: Maybe[Annotated[int, Field(ge=1)]] = Field(None, description="The step's number, from 1.")
    concurrency: Maybe[int] = Field(None, description="Requests in flight at most during the step.")
    input_len: Maybe[int] = Field(None, description="Prompt tokens per request.")
    output_len: Maybe[int] = Field(None, description="Output tokens per request.")
    num_prompts: Maybe[int] = Field(None, description="Requests sent in the step.")
    figures: Maybe[dict[str, Any]] = Field(None, description=(
        "The step's figures: preemptions (the change of vllm:num_preemptions_total over its window), "
        "kv_cache_usage_peak and kv_cache_usage_mean (0-1), running_peak, waiting_peak (/metrics gauges sampled in "
        "the window), output_tok_s, ttft_median_ms, ttft_p99_ms, tpot_median_ms, tpot_p99_ms and failed (the "
        "benchmark's), each null when its source had nothing; goodput as in a pass summary when the scenario has "
        "a target."))


# --------------------------------------------------------------------------- a scenario


class OnsetComparison(RecordModel):
    """The first step predicted to show it against the first step that did (null where none)."""

    predicted_step: int | None = Field(None, description="First step predicted (null none).")
    predicted_concurrency: int | None = Field(None, description="Its concurrency.")
    observed_step: int | None = Field(None, description="First step observed (null none).")
    observed_concurrency: int | None = Field(None, description="Its concurrency.")
    error_steps: int | None = Field(None, description=(
        "Observed step minus predicted step (positive: later than predicted)."))
    error_requests: int | None = Field(None, description=(
        "Requests in flight at the observed step minus at the predicted one."))


class Onset(RecordModel):
    """A sweep's predicted against observed onset of preemption and of waiting requests."""

    kv_cache_tokens: float | None = Field(None, description="KV cache tokens vLLM logged (the prediction's basis).")
    kv_cache_tokens_source: str | None = Field(None, description="The log line it was read from.")
    block_size: float | None = Field(None, description="KV cache block size of the plan.")
    assumption: Maybe[str] = Field(None, description="The rule the prediction follows, in words.")
    unpredicted: Maybe[str] = Field(None, description="Why nothing was predicted (no KV cache size or block size).")
    per_step: Maybe[list[Any]] = Field(None, description=(
        "Per step: in_flight, blocks_per_request, tokens_needed, predicted_preempts, predicted_waits."))
    preemption: Maybe[OnsetComparison] = None
    waiting: Maybe[OnsetComparison] = None


class Repetition(RecordModel):
    """How many passes ran and why they stopped (fixed scenarios only; absent in older records)."""

    min: Maybe[int] = Field(None, description="Fewest passes asked for.")
    max: Maybe[int] = Field(None, description="Most passes asked for.")
    agreement: float | None = Field(None, description=(
        "Spread of output tok/s ((max - min) / mean) at which passes stop early; null for a fixed count."))
    passes_run: Maybe[int] = Field(None, description="Passes that ran (the warm-up not counted).")
    spread: float | None = Field(None, description="Spread of output tok/s over the passes that succeeded.")
    stopped: Maybe[Literal["agreed", "max_reached", "fixed", "failed"]] = Field(None, description=(
        "Why no further pass ran: the passes agreed, the maximum was reached, the fixed count was run, or a "
        "pass failed."))


class Scenario(RecordModel):
    """One scenario's passes (or a sweep's steps), its warm-up and how its repetition ended."""

    name: Any
    spec: Any
    kind: Maybe[Literal["fixed", "sweep"]] = Field(None, description=(
        "fixed: passes of one scenario (its count fixed, or until they agree); sweep: one pass per step, its spec "
        "listing per-step values (concurrency, input_len, output_len, num_prompts). Absent in older records "
        "(fixed)."))
    warmup: Pass | None = Field(None, description=(
        "The warm-up pass run before the scenario's passes or steps (a pass entry with pass 0), kept out of every "
        "figure; null when none was asked for. Absent in older records."))
    repetition: Maybe[Repetition] = Field(None, description=(
        "How many passes ran and why they stopped (fixed scenarios only; absent in older records)."))
    agreement: Maybe[dict[str, Any]] = Field(None, description=(
        "Spread ((max - min) / mean) of output throughput and of median TTFT over the passes that succeeded."))
    pass_results: list[Pass] = Field(description="The results of the scenario's passes (empty for a sweep; the warm-up is never among them).")
    steps: Maybe[list[Step]] = Field(None, description=(
        "A sweep's steps in order, each a pass entry plus its step number, its values and its figures."))
    onset: Maybe[Onset] = Field(None, description=(
        "A sweep's predicted against observed onset of preemption and of waiting requests."))


# --------------------------------------------------------------------------- the server and its failure


class ErrorLine(RecordModel):
    """The log line that explains the failure."""

    line: Any
    source: Any
    pattern: str = Field(description=(
        "The failure's kind (a name of llmtrial.logs.failures.FAILURE_PATTERNS), or unknown when none explains "
        "the log."))
    diagnosis: Any


class Failure(RecordModel):
    """Why the configuration failed."""

    phase: Literal["gpu_check", "sanity_check", "startup", "cold_start", "benchmark"] = Field(description=(
        "Where it failed: gpu_check (a foreign process or a failed GPU: not launched), sanity_check (the "
        "collective across nodes), or a serving phase."))
    reason: str = Field(description="exited, timeout, port_in_use, request_failed or pass_failed.")
    message: str = Field(description="One sentence.")
    returncode: int | None = Field(None, description="The server's exit code when it exited.")
    error_line: ErrorLine | None = Field(None, description=(
        "The log line that explains the failure, or null when none matched."))
    log_tail: Maybe[list[str]] = Field(None, description="Last lines of the server log.")


class ServerStop(RecordModel):
    """Teardown by process group."""

    signals: Any
    survivors: Any
    port_closed: Any


class Server(RecordModel):
    """How the server was started and stopped."""

    argv: list[str] = Field(description="The exact command (no shell).")
    env: dict[str, str] = Field(description="Environment added for the server, secrets redacted.")
    host: str = Field(description="Bind address.")
    port: int = Field(description="Port.")
    log: str = Field(description="Server log, relative to the configuration folder.")
    stop: Maybe[ServerStop] = Field(None, description="Teardown by process group.")


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


class GpuCensus(RecordModel):
    """Every compute process on a selected GPU before launch, and those not allowed."""

    source: str
    gpus: list[int]
    processes: list[GpuProcess]
    foreign: Rows
    held_failed: Maybe[Rows] = None
    reason: str | None = None


class GpuCheck(RecordModel):
    """One selected GPU checked after a failure."""

    index: Any
    allocation: Any
    xid: Any
    healthy: bool | None = Field(description="null when the allocation could not be tried (no CUDA).")
    evidence: Any


class GpuHealth(RecordModel):
    """Each selected GPU checked after a failure."""

    source: Maybe[str] = Field(None, description="cuda, or double when a test double played the GPUs.")
    gpus: Maybe[list[GpuCheck]] = None


class EngineWarning(RecordModel):
    """One warning the engine printed (:func:`llmtrial.logs.engine_warnings.engine_warnings`)."""

    name: str = Field(description=(
        "untuned_moe_config, slower_quant_kernel, p2p_unsupported, custom_allreduce_disabled or "
        "nccl_socket_transport."))
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


class ColdStart(RecordModel):
    """Facts by name."""

    __pydantic_extra__: dict[str, Fact]

    first_output_tokens: Maybe[TokensFact] = None
    first_output_tok_s: Maybe[RateFact] = None


class NodesTelemetry(RecordModel):
    """The telemetry of a configuration across nodes (llmtrial.serve.nodetelemetry.NodeTelemetry's summary)."""

    file: Any
    interval_s: Any
    nodes: Any


class Telemetry(RecordModel):
    """Where the samples are and the sampler's own figures."""

    file: Any
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
        "Seconds the benchmark worker(s) took to import vLLM's benchmark, summed over bench_workers; paid within "
        "the passes, so part of bench_s. Null when no worker got that far; absent in records from before the "
        "worker."))
    bench_workers: Maybe[int] = Field(None, description=(
        "Benchmark worker processes started for the passes: 1, plus one after each pass that timed out or whose "
        "worker died."))


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
    concurrency: float = Field(description="Requests in flight the pass ran at.")
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
    reach: Literal["local", "ssh"] = Field(description="How the trial reaches it: local, or over ssh.")
    interface: str | None = Field(description="The network interface its ranks use (NCCL/GLOO_SOCKET_IFNAME), or null.")
    model_dir: str = Field(description="Where the node holds the staged model.")
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
    status: Literal["ok", "failed", "skipped"] = Field(description=(
        "ok when the server started and every pass succeeded; skipped when the planner rejected it and it was "
        "not forced."))
    failure: Failure | None = Field(description="Why the configuration failed, or null.")
    server: Server = Field(description="How the server was started and stopped.")
    patches: Maybe[ServerPatches] = Field(None, description=(
        "The trial's vLLM patches as this configuration's server saw them (absent when it was not launched)."))
    startup: dict[str, Fact] = Field(description="Facts by name.")
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
    cold_start: ColdStart = Field(description=(
        "The cold start: ready_seconds (launch to first /health 200), then the first streamed completion after "
        "ready: first_ttft_s, first_total_s, first_output_tokens (streamed chunks that carried text; vLLM streams "
        "one token per chunk) and first_output_tok_s (first_output_tokens / first_total_s)."))
    scenarios: list[Scenario] = Field(description=(
        "One entry per scenario, in config order. Records written before scenarios had a kind, warm-up or "
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
    throughput_bound: list[ThroughputBound] = Field([], description=(
        "Each ok pass or sweep step beside the plan's estimated decode throughput bound (llmtrial.plan.ceiling) "
        "at its concurrency; empty when the plan has none (no memory bandwidth measured). Records written before "
        "the bound existed have no such key."))
