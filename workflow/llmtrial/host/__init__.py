"""The host and the nodes a trial spans: reaching them, process groups, disk headroom, the GPUs and who
else is on them, the other services, bandwidth probes and collectives, the checks of a host's
environment.

- :mod:`llmtrial.host.checks`: One preflight check's shape, and the checks of a host's serving
  environment.
- :mod:`llmtrial.host.collective`: A short collective across a configuration's ranks before any
  server starts.
- :mod:`llmtrial.host.crossnode`: Preflight across the nodes of a configuration: what each node has,
  and whether they agree.
- :mod:`llmtrial.host.demo_service`: A small resident HTTP service on loopback, so every trial shows
  quieting and restoring.
- :mod:`llmtrial.host.disk`: Disk headroom: whether the filesystems a stage writes to keep their
  reserve.
- :mod:`llmtrial.host.gpus`: The GPUs a trial uses: which ones (the selection), who else computes on
  them (the census before launch), and whether they are still healthy after a configuration failed.
- :mod:`llmtrial.host.nodes`: The hosts a trial spans: each a :class:`Node`, reached on this host or
  over ssh.
- :mod:`llmtrial.host.probe_program`: The probe program: copies timed with the serving environment's
  torch, printed as one JSON line.
- :mod:`llmtrial.host.probes`: Host probes, a part of preflight: memory and link bandwidths measured
  with the serving torch.
- :mod:`llmtrial.host.process_groups`: Process groups on any node: started in their own session, found, and
  stopped there.
- :mod:`llmtrial.host.scratch`: A vLLM server's own temporary folder, removed with the server.
- :mod:`llmtrial.host.services`: The host's other services: quiet them before a trial, give them
  back after it.
- :mod:`llmtrial.host.slurm_hosts`: The hosts of the SLURM allocation a job runs in, and the argv
  that runs a command on one of them.
- :mod:`llmtrial.host.telemetry_sources`: Telemetry sources: what the sampler
  (:mod:`llmtrial.serve.telemetry`) polls each second.

Imports from: core, logs. (tests/test_structure.py holds the order.)
"""

__all__ = ["checks", "collective", "crossnode", "demo_service", "disk", "gpus", "nodes", "probe_program", "probes", "process_groups", "scratch", "services", "slurm_hosts", "telemetry_sources"]
