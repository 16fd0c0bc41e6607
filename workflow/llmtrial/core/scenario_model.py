"""A scenario's parts in the configuration record: its benchmark passes with their summaries,
windows and server metrics, a sweep's steps and their preemption onset, the repetition rule's
outcome and the passes' agreement."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator
from pydantic.json_schema import SkipJsonSchema

from llmtrial.core.record_base import Maybe, NonNegInt, Number, RecordModel, Sha256

# --------------------------------------------------------------------------- a benchmark pass


class RequestSpread(RecordModel):
    """n, min, median and max of request_output_tok_s (null figures when n is 0)."""

    n: NonNegInt = Field(description="Successful requests counted.")
    min: float | None = Field(description="Slowest request, tok/s.")
    median: float | None = Field(description="Median request, tok/s.")
    max: float | None = Field(description="Fastest request, tok/s.")


class Goodput(RecordModel):
    """How many requests met every latency target given, and whether the share reaches the target's percentile."""

    targets: Maybe[dict[Literal["ttft_ms", "tpot_ms", "e2el_ms"], Number]] = Field(None, description=(
        "The targets given: ttft_ms, tpot_ms, e2el_ms."))
    percentile: Maybe[float] = Field(None, description="Share of requests (%) that must meet the targets.")
    request_goodput: Number | None = Field(None, description="Requests per second meeting every target (vLLM's figure).")
    requests_meeting: Maybe[int] = Field(None, description="Requests that met every target.")
    requests: Maybe[int] = Field(None, description="Requests completed.")
    share: float | None = Field(None, description="requests_meeting / requests.")
    met: Maybe[bool] = Field(None, description="share is at least percentile / 100.")


#: A percentile of a latency as vLLM's result file names it (``p90_ttft_ms``, ``p99.9_e2el_ms``): one per
#: percentile ``bench.percentiles`` asks, so the names are the trial's.
PERCENTILE_KEY = re.compile(r"p\d+(\.\d+)?_(ttft|tpot|itl|e2el)_ms")


class PassSummary(RecordModel):
    """Figures copied from vLLM's result file (null where it has none), and each request's own output throughput.
    Besides its fields it holds one latency percentile for each name :data:`PERCENTILE_KEY` matches, and no
    other key: read and written beside the fields, as vLLM's result file has them, and held in
    :attr:`percentiles`."""

    model_config = ConfigDict(json_schema_extra={
        "patternProperties": {PERCENTILE_KEY.pattern: {"type": ["number", "null"]}}})

    percentiles: SkipJsonSchema[dict[str, Number | None]] = Field(default_factory=dict, exclude=True, description=(
        "The latency percentiles the trial asked for (bench.percentiles) that no field names, by vLLM's name."))

    @model_validator(mode="before")
    @classmethod
    def _gather_percentiles(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        unknown = [k for k in data if k not in cls.model_fields and k != "percentiles"]
        odd = sorted(k for k in unknown if not PERCENTILE_KEY.fullmatch(k))
        if odd:
            raise ValueError(f"not a field of a pass summary nor a latency percentile (p90_ttft_ms): {', '.join(odd)}")
        named = {**data.get("percentiles", {}), **{k: data[k] for k in unknown}}
        return {**{k: v for k, v in data.items() if k not in unknown}, "percentiles": named}

    @model_serializer(mode="wrap")
    def _percentiles_beside_the_fields(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {**handler(self), **self.percentiles}

    def percentile_ms(self, name: str) -> Number | None:
        """One latency percentile by vLLM's name (``p99_e2el_ms``); None where the trial did not ask for it."""
        return self.percentiles.get(name)

    completed: int | None = None
    failed: int | None = None
    total_input_tokens: Maybe[int | None] = Field(None, description="Prompt tokens the pass sent (vLLM's figure).")
    total_output_tokens: Maybe[int | None] = Field(None, description="Output tokens the pass served (vLLM's figure).")
    output_throughput: Number | None = Field(None, description="Output tok/s over the pass.")
    duration: Maybe[Number | None] = Field(None, description="The benchmark's duration, s (vLLM's figure).")
    request_throughput: Maybe[Number | None] = Field(None, description="Requests completed per second (vLLM's figure).")
    total_token_throughput: Maybe[Number | None] = Field(None, description="Prompt and output tok/s (vLLM's figure).")
    mean_e2el_ms: Maybe[Number | None] = Field(None, description="Mean end-to-end latency of a request, ms.")
    std_e2el_ms: Maybe[Number | None] = Field(None, description=(
        "Standard deviation of the requests' end-to-end latency, ms (vLLM's: numpy's, over the population)."))
    mean_ttft_ms: Number | None = None
    median_ttft_ms: Number | None = None
    p99_ttft_ms: Number | None = None
    median_tpot_ms: Number | None = None
    p99_tpot_ms: Number | None = None
    median_itl_ms: Number | None = None
    p99_itl_ms: Number | None = None
    std_ttft_ms: Maybe[Number | None] = None
    mean_tpot_ms: Maybe[Number | None] = None
    std_tpot_ms: Maybe[Number | None] = None
    mean_itl_ms: Maybe[Number | None] = None
    std_itl_ms: Maybe[Number | None] = None
    median_e2el_ms: Maybe[Number | None] = None
    max_concurrency: Maybe[int | None] = Field(None, description="The most requests in flight (vLLM's figure).")
    request_output_tok_s: Maybe[list[float]] = Field(None, description=(
        "Per request (per stream): output tokens over its latency, tok/s, 3 decimals, for each successful request "
        "in the result file's order (failed or zero-latency requests left out)."))
    request_output_tok_s_summary: Maybe[RequestSpread] = Field(None, description=(
        "n, min, median and max of request_output_tok_s (null figures when n is 0)."))
    request_ttft_ms: Maybe[list[float]] = Field(None, description=(
        "Per successful request: its time to first token, ms, 3 decimals, in the result file's order (the "
        "samples of the TTFT figures' bootstrap intervals)."))
    request_tpot_ms: Maybe[list[float]] = Field(None, description=(
        "Per successful request with more than one output token: (latency - TTFT) / (output tokens - 1), ms, "
        "3 decimals (vLLM's TPOT; the samples of the TPOT figures' bootstrap intervals)."))
    request_itl_ms: Maybe[list[float]] = Field(None, description=(
        "Each successful request's inter-token gaps (vLLM's itls: between successive output tokens), ms, 3 "
        "decimals, the requests one after another in the result file's order (the samples of vLLM's ITL)."))
    request_e2el_ms: Maybe[list[float]] = Field(None, description=(
        "Per successful request: its end-to-end latency, ms, 3 decimals, in the result file's order."))
    request_start_s: Maybe[list[float]] = Field(None, description=(
        "Per successful request, beside request_ttft_ms and request_e2el_ms: when it was sent, s after the pass's "
        "first request was sent, 3 decimals (vLLM's start_times, on the benchmark's own monotonic clock)."))
    goodput: Maybe[Goodput] = Field(None, description=(
        "Only when the scenario has a latency target (slo): how many requests met every target given (vLLM's "
        "--goodput rule) and whether the share reaches the target's percentile."))


class Window(RecordModel):
    """A window of time, in Unix seconds."""

    start: Maybe[float] = None
    end: Maybe[float] = None


class WindowStat(RecordModel):
    """One sampled metric over a window: mean, median, max, min and the number of samples."""

    mean: Maybe[Number] = None
    p50: Maybe[Number] = None
    max: Maybe[Number] = None
    min: Maybe[Number] = None
    n: Maybe[int] = None


class GpuEnergy(RecordModel):
    """One GPU's energy over a window two ways: the change of NVML's total-energy counter, and the trapezoid
    integral of its sampled power over the same samples' times."""

    counter_j: float | None = Field(description="The change of nvmlDeviceGetTotalEnergyConsumption, J; null without it.")
    integral_j: float | None = Field(description="The trapezoid integral of power_w over the window, J; null below two samples.")
    power_samples: NonNegInt = Field(description="Power samples integrated.")
    difference: float | None = Field(description="(integral_j - counter_j) / counter_j; null when either is missing.")
    disagrees: bool | None = Field(description="abs(difference) is above the check's tolerance; null when not checked.")


class EnergyCheck(RecordModel):
    """Each GPU's counter against the integral of its sampled power (they have been seen to disagree)."""

    tolerance: float = Field(description="The share of the counter the two may differ by (0.10).")
    gpus: dict[str, GpuEnergy] = Field(description="Per GPU (source.gpu<i>, as nvml.gpu0).")
    disagrees: bool = Field(description="Some GPU's counter and integral differ by more than the tolerance.")


class WindowFigures(Window):
    """What telemetry sampled in one window (llmtrial.serve.telemetry.window_figures): per source.metric its
    figures, the change of each counter, and the GPU energy with the tokens per joule where known."""

    summary: Maybe[dict[str, WindowStat]] = Field(None, description="Per source.metric (host.cpu_percent, ...).")
    deltas: Maybe[dict[str, float]] = Field(None, description="The change of each counter over the window.")
    energy_j: Maybe[float] = Field(None, description=(
        "GPU energy over the window, J, summed over the GPUs sampled: each GPU's counter, or where it has none the "
        "integral of its sampled power (energy_kind says which)."))
    energy_kind: Maybe[Literal["measured", "estimated"]] = Field(None, description=(
        "measured: every GPU's figure is NVML's energy counter; estimated: some GPU's is the integral of its "
        "sampled power (no counter)."))
    energy_check: Maybe[EnergyCheck] = Field(None, description=(
        "Each GPU's counter against the integral of its sampled power, and whether they differ by more than the "
        "tolerance."))
    tokens_per_joule: Maybe[float] = None
    cpu_package_energy_j: Maybe[float] = Field(None, description=(
        "CPU package energy over the window, J, summed over the packages (the kernel's RAPL counters under "
        "/sys/class/powercap): the CPUs' energy, never the GPUs'."))


class ServerMetrics(RecordModel):
    """/metrics deltas over the pass, by name (llmtrial.serve.measure.SERVER_COUNTERS)."""

    preemptions: Maybe[Number] = None
    prompt_tokens: Maybe[Number] = None
    generation_tokens: Maybe[Number] = None
    requests_finished: Maybe[Number] = None
    prefix_cache_queries: Maybe[Number] = Field(None, description="Prompt tokens looked up in the prefix cache.")
    prefix_cache_hits: Maybe[Number] = Field(None, description="Prompt tokens found there (0 with prefix caching off).")


class NodeWindow(RecordModel):
    """What one node's sampler saw in a window (llmtrial.serve.nodetelemetry.node_window_figures): its samples,
    CPU and memory peaks, load, and the bytes its interface received and sent."""

    samples: Maybe[int] = None
    cpu_percent_peak: Number | None = None
    cpu_percent_mean: Number | None = None
    mem_used_peak_bytes: int | None = None
    net_rx_bytes: int | None = None
    net_tx_bytes: int | None = None
    load1_peak: Maybe[Number | None] = Field(None, description="The highest one-minute load average.")
    first: Maybe[float | None] = Field(None, description="Unix time of its first sample.")
    last: Maybe[float | None] = Field(None, description="Unix time of its last sample.")


class Pass(RecordModel):
    """One benchmark pass (or warm-up pass, or sweep step)."""

    pass_: Any = Field(alias="pass")
    seed: Any
    start: float = Field(description="Unix time the pass began (telemetry window start).")
    end: float = Field(description="Unix time the pass ended (telemetry window end).")
    status: Literal["ok", "failed"] = Field(description="Whether the benchmark produced a result.")
    argv: Any
    log: Any
    returncode: int | None = None
    timed_out: Maybe[bool] = Field(None, description="The pass ran past its scenario's timeout_s.")
    result_file: Maybe[str] = Field(None, description="vLLM's result file (ok only).")
    stall: Maybe[bool] = Field(None, description="The mean TTFT is more than 1.5 times the median (ok only).")
    summary: Maybe[PassSummary] = Field(None, description=(
        "Figures copied from vLLM's result file, and each request's own output throughput."))
    window: Maybe[Window] = Field(None, description="The telemetry window around the pass.")
    telemetry: Maybe[WindowFigures] = Field(None, description="What telemetry sampled in the window.")
    server_metrics: Maybe[ServerMetrics] = Field(None, description="/metrics deltas over the pass.")
    node_telemetry: Maybe[dict[str, NodeWindow]] = Field(None, description=(
        "Across nodes: each node's samples inside the pass's window, by node (a node without a sample there is "
        "absent)."))


class StepFigures(RecordModel):
    """A sweep step's figures (each null when its source had nothing; see Step.figures)."""

    preemptions: Number | None = None
    kv_cache_usage_peak: Number | None = None
    kv_cache_usage_mean: Number | None = None
    running_peak: Number | None = None
    waiting_peak: Number | None = None
    output_tok_s: Number | None = None
    ttft_median_ms: Number | None = None
    ttft_p99_ms: Number | None = None
    tpot_median_ms: Number | None = None
    tpot_p99_ms: Number | None = None
    failed: int | None = None
    goodput: Maybe[Goodput] = None


class Step(Pass):
    """A sweep step: a pass entry plus its step number, its values and its figures."""

    step: Maybe[Annotated[int, Field(ge=1)]] = Field(None, description="The step's number, from 1.")
    concurrency: Maybe[int] = Field(None, description="Requests in flight at most during the step.")
    input_len: Maybe[int] = Field(None, description="Prompt tokens per request.")
    output_len: Maybe[int] = Field(None, description="Output tokens per request.")
    num_prompts: Maybe[int] = Field(None, description="Requests sent in the step.")
    figures: Maybe[StepFigures] = Field(None, description=(
        "The step's figures: preemptions (the change of vllm:num_preemptions_total over its window), "
        "kv_cache_usage_peak and kv_cache_usage_mean (0-1), running_peak, waiting_peak (/metrics gauges sampled in "
        "the window), output_tok_s, ttft_median_ms, ttft_p99_ms, tpot_median_ms, tpot_p99_ms and failed (the "
        "benchmark's), each null when its source had nothing; goodput as in a pass summary when the scenario has "
        "a target."))


# --------------------------------------------------------------------------- a scenario


class Slo(RecordModel):
    """A latency target (vLLM's --goodput): TTFT, TPOT and end-to-end latency at most these ms, for at least
    ``percentile`` % of requests."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None
    percentile: Maybe[float] = None


class ScenarioSpec(RecordModel):
    """The scenario as the trial file gives it (schema defaults filled); a list in concurrency, num_prompts,
    input_len or output_len makes it a sweep."""

    concurrency: Maybe[int | list[int]] = None
    num_prompts: Maybe[int | list[int]] = None
    input_len: Maybe[int | list[int]] = None
    output_len: Maybe[int | list[int]] = None
    request_rate: Maybe[Number | str] = Field(None, description='Requests per second, or "inf".')
    passes: Maybe[int | dict[str, Any]] = Field(None, description="A count, or {min, max, agreement}.")
    slo: Slo | None = None
    dataset: Maybe[Literal["random", "custom", "sharegpt", "prefix_repetition"]] = Field(None, description=(
        "vLLM bench's --dataset-name (absent in older records: random)."))
    prompts: Maybe[str | None] = Field(None, description=(
        "custom or sharegpt: the operator's prompt file as the trial file names it."))
    chat_template: Maybe[bool] = Field(None, description="custom: each prompt wrapped in the model's chat template.")
    range_ratio: Maybe[float | dict[str, float] | None] = Field(None, description=(
        "random: --random-range-ratio, one ratio or {input, output}; null for vLLM's default (0)."))
    prefix_len: Maybe[int | None] = Field(None, description=(
        "prefix_repetition: tokens of the prefix prompts share (the rest of input_len is each one's own suffix)."))
    num_prefixes: Maybe[int] = Field(None, description="prefix_repetition: distinct prefixes.")
    prompts_staged: Maybe[str] = Field(None, description=(
        "custom or sharegpt: the staged copy the benchmark read (--dataset-path), as the prompts record names it."))
    prompts_sha256: Maybe[Sha256] = Field(None, description="custom or sharegpt: sha256 of the staged copy.")
    prompts_count: Maybe[int] = Field(None, description="custom or sharegpt: the prompts the file holds.")
    warmup: Maybe[bool] = Field(None, description="A warm-up pass ran first, kept out of the figures.")
    timeout_s: Maybe[Number] = Field(None, description="The most seconds one pass may take.")


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


class OnsetStep(RecordModel):
    """The planner's view of one step."""

    step: Maybe[int] = None
    in_flight: Maybe[int] = None
    blocks_per_request: Maybe[int] = None
    tokens_needed: Maybe[int] = None
    predicted_preempts: Maybe[bool] = None
    predicted_waits: Maybe[bool] = None
    concurrency: Maybe[int] = Field(None, description="The step's concurrency.")
    blocks_needed: Maybe[int] = Field(None, description="KV blocks the step's requests need together.")


class Onset(RecordModel):
    """A sweep's predicted against observed onset of preemption and of waiting requests."""

    kv_cache_tokens: Number | None = Field(None, description="KV cache tokens vLLM logged (the prediction's basis).")
    kv_cache_tokens_source: str | None = Field(None, description="The log line it was read from.")
    block_size: Number | None = Field(None, description="KV cache block size of the plan.")
    assumption: Maybe[str] = Field(None, description="The rule the prediction follows, in words.")
    unpredicted: Maybe[str] = Field(None, description=(
        "Why nothing was predicted (no KV cache size or block size, or requests without one length: a prompt file's, "
        "or random ones under a range ratio)."))
    per_step: Maybe[list[OnsetStep]] = Field(None, description=(
        "Per step: in_flight, blocks_per_request, tokens_needed, predicted_preempts, predicted_waits."))
    preemption: Maybe[OnsetComparison] = None
    waiting: Maybe[OnsetComparison] = None


class Repetition(RecordModel):
    """How many passes ran and why they stopped (fixed scenarios only; absent in older records)."""

    min: Maybe[int] = Field(None, description="Fewest passes asked for.")
    max: Maybe[int] = Field(None, description="Most passes asked for.")
    agreement: float | None = Field(None, description=(
        "Spread of output tok/s ((max - min) / mean) at which passes stop early; null for a fixed count or "
        "when the spread is not a rule."))
    interval: Maybe[float | None] = Field(None, description=(
        "Width of output tok/s's confidence interval over the median at which passes stop early; null when "
        "the interval is not a rule."))
    level: Maybe[float] = Field(None, description="Confidence level of that interval.")
    interval_width: Maybe[float | None] = Field(None, description=(
        "Width of output tok/s's Student t interval at level over the median of the passes that succeeded "
        "(null below two)."))
    passes_run: Maybe[int] = Field(None, description="Passes that ran (the warm-up not counted).")
    spread: float | None = Field(None, description="Spread of output tok/s over the passes that succeeded.")
    stopped: Maybe[Literal["agreed", "max_reached", "fixed", "failed"]] = Field(None, description=(
        "Why no further pass ran: the passes agreed, the maximum was reached, the fixed count was run, or a "
        "pass failed."))


class Agreement(RecordModel):
    """Spread ((max - min) / mean) of two figures over the passes that succeeded (null below two passes)."""

    output_throughput: float | None = None
    median_ttft_ms: float | None = None


class Scenario(RecordModel):
    """One scenario's passes (or a sweep's steps), its warm-up and how its repetition ended."""

    name: Any
    spec: ScenarioSpec
    prefix_caching: Maybe[bool] = Field(None, description=(
        "The server that ran the scenario had prefix caching on: a prefix_repetition scenario (on a server launched "
        "again with it on, see relaunched), or every scenario of a configuration whose args turn it on. Absent in "
        "older records (off)."))
    relaunched: Maybe[bool] = Field(None, description=(
        "It ran after the other scenarios, on the configuration's server launched again with --enable-prefix-caching "
        "(the record's prefix_caching_server)."))
    kind: Maybe[Literal["fixed", "sweep"]] = Field(None, description=(
        "fixed: passes of one scenario (its count fixed, or until they agree); sweep: one pass per step, its spec "
        "listing per-step values (concurrency, input_len, output_len, num_prompts). Absent in older records "
        "(fixed)."))
    warmup: Pass | None = Field(None, description=(
        "The warm-up pass run before the scenario's passes or steps (a pass entry with pass 0), kept out of every "
        "figure; null when none was asked for. Absent in older records."))
    repetition: Maybe[Repetition] = Field(None, description=(
        "How many passes ran and why they stopped (fixed scenarios only; absent in older records)."))
    agreement: Maybe[Agreement] = Field(None, description=(
        "Spread ((max - min) / mean) of output throughput and of median TTFT over the passes that succeeded."))
    pass_results: list[Pass] = Field(description="The results of the scenario's passes (empty for a sweep; the warm-up is never among them).")
    steps: Maybe[list[Step]] = Field(None, description=(
        "A sweep's steps in order, each a pass entry plus its step number, its values and its figures."))
    onset: Maybe[Onset] = Field(None, description=(
        "A sweep's predicted against observed onset of preemption and of waiting requests."))

    def ok_passes(self) -> list[Pass]:
        """The passes every figure of the scenario is made of: those that succeeded with a summary (never the
        warm-up, never a sweep's steps)."""
        return [p for p in self.pass_results if p.status == "ok" and p.summary]

    def runs(self) -> list[tuple[str, Pass]]:
        """Every benchmark run with its label, in the order they ran: the warm-up, each pass, each sweep step."""
        out: list[tuple[str, Pass]] = [(f"{self.name} warm-up", self.warmup)] if self.warmup else []
        out += [(f"{self.name} pass {p.pass_}", p) for p in self.pass_results]
        return out + [(f"{self.name} step {s.step}", s) for s in self.steps or []]
