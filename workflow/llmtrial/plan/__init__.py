"""Will it fit: a model's shape from config.json, what its checkpoint weighs, vLLM's memory accounting
by version, the planner, the checks before launch, the throughput bound, what a trial asks of SLURM.

- :mod:`llmtrial.plan.allocation`: What a trial asks of SLURM: the resources of its host group, from
  the trial file's ``slurm:`` key.
- :mod:`llmtrial.plan.budget`: vLLM's GPU memory accounting per rank, term by term, before launch.
- :mod:`llmtrial.plan.ceiling`: The decode throughput a configuration can reach at most, from
  measured bandwidths and the model's shape: an ``estimated`` figure put beside the measured output
  tok/s.
- :mod:`llmtrial.plan.checkpoint`: What a checkpoint weighs before it is downloaded: parameters by
  part, bytes by quantization.
- :mod:`llmtrial.plan.hf_config`: A Hugging Face model's ``config.json``, the fields the planner reads.
- :mod:`llmtrial.plan.launch_checks`: Checks before launch: what vLLM would refuse a configuration
  for within seconds of starting, and the checks of its args and env against the host (allocator,
  NCCL interfaces, CPU thread binding, GPU peer access, DeepGEMM on this GPU). Each names the
  argument and the model's field at fault.
- :mod:`llmtrial.plan.plan_inputs`: What a plan is given: the hardware and the vLLM arguments of one
  configuration that change memory.
- :mod:`llmtrial.plan.planner`: Will it fit? The planner: memory arithmetic for a model on given
  hardware, before launch.
- :mod:`llmtrial.plan.prediction`: The planner's figures beside what vLLM logged at start-up, with
  the relative error of each: the configuration record's ``prediction`` rows (llmtrial.serve.trial
  writes them, the report shows them).
- :mod:`llmtrial.plan.shape`: A model's shape and the KV arithmetic vLLM applies to it.

Imports from: core, logs, host. (tests/test_structure.py holds the order.)
"""

__all__ = ["allocation", "budget", "ceiling", "checkpoint", "hf_config", "launch_checks", "plan_inputs", "planner", "prediction", "shape"]
