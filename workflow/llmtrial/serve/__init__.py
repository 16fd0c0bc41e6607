"""Serving and measuring one configuration: the server process, vLLM's serving benchmark, scenarios and
sweeps and their datasets, telemetry, multi-node serving, and the trial job in its phases.

- :mod:`llmtrial.serve.answers_job`: A configuration's answers: the set asked of the passes'
  server and of a launch with the patch flags off.
- :mod:`llmtrial.serve.confirm`: A relaunch that confirms the cause of a crash (the trial file's
  ``failures.confirm``).
- :mod:`llmtrial.serve.bench`: Benchmark scenarios: vLLM's serving benchmark per pass, and the cold
  first request.
- :mod:`llmtrial.serve.bench_worker`: The process that runs vLLM's serving benchmark for the passes:
  one a configuration, or one a trial (started by its first configuration, stopped by its cleanup).
- :mod:`llmtrial.serve.datasets`: What a scenario's benchmark sends, mapped onto vLLM bench's own
  dataset flags: vLLM's random dataset (with its range ratio), the operator's own prompts (a
  ``custom`` JSONL file or a ShareGPT JSON file), or vLLM's ``prefix_repetition`` dataset.
- :mod:`llmtrial.serve.energy`: A window's energy: each GPU's NVML counter checked against the
  integral of its sampled power, and the CPU packages' RAPL energy, named apart.
- :mod:`llmtrial.serve.idle`: A server held idle after its passes (``serving.idle_watch_s``), and what
  a server found down was doing: an idle crash when its last /metrics sample showed no request, with
  the kernel log's lines and the telemetry of that window.
- :mod:`llmtrial.serve.log_review`: The review phase of one configuration's job, after its
  server stopped: what the log explains (the failure's line and the GPUs' health after it, the
  start-up facts, the engine's warnings, each patch's evidence) and the measured figures beside the
  plan's (the predicted start-up terms, the throughput bound).
- :mod:`llmtrial.serve.measure`: The measurement phase of one configuration's job: start the server
  under the telemetry sampler, wait for it, time the cold first request, run every scenario's passes
  (warm-up, repeated passes, a sweep's steps) each in its own telemetry window, and stop the server.
- :mod:`llmtrial.serve.multinode`: One configuration served across several nodes with vLLM's own
  multi-node launch.
- :mod:`llmtrial.serve.multinode_job`: The multi-node side of one configuration's job, beside
  :class:`~llmtrial.serve.multinode.MultiNodeServer`: the launch and the nodes' roles, the
  collective sanity check across them before any server starts, where each node holds the model,
  every node's serving environment, the server with the other nodes' ranks (headless vLLM ranks or a
  Ray cluster), and what ran on each node afterwards.
- :mod:`llmtrial.serve.nodetelemetry`: Telemetry on every node of a multi-node configuration, merged
  into one CSV with a node column.
- :mod:`llmtrial.serve.onset`: Where a sweep starts to preempt: the planner's arithmetic against
  what /metrics showed.
- :mod:`llmtrial.serve.passes`: The scenarios' passes on one running server: each scenario's warm-up, then
  its passes until they agree (or a sweep's steps), each in its own telemetry window.
- :mod:`llmtrial.serve.progress`: What a person watching a run sees of a configuration's job, on the
  terminal as well as in the job's log.
- :mod:`llmtrial.serve.scenarios`: What a scenario asks for: fixed passes or a sweep's steps, how
  many passes, and its latency target.
- :mod:`llmtrial.serve.server`: The vLLM server process: argv building, launch in its own session,
  readiness, teardown.
- :mod:`llmtrial.serve.telemetry`: Telemetry: a per-second sampler that runs beside one serving
  configuration's job.
- :mod:`llmtrial.serve.trial`: One serving configuration's job: make the host ready, serve and
  measure, compare, stop.
- :mod:`llmtrial.serve.vllm_bench`: Run vLLM's own serving benchmark (``vllm.benchmarks.serve``) as
  a module.

Imports from: core, logs, host, plan, weights, patch, lifecycle. (tests/test_structure.py holds the
order.)
"""

__all__ = ["answers_job", "bench", "bench_worker", "confirm", "datasets", "energy", "idle", "log_review", "measure", "multinode", "multinode_job", "nodetelemetry", "onset", "passes", "progress", "scenarios", "server", "telemetry", "trial", "vllm_bench"]
