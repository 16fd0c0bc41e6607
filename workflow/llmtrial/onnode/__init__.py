"""What runs on a trial's node with that node's own Python, where the node may lack this project's
venv: each a module of the standard library only (``headless_serve``: vLLM, which that node has),
sent to the node as its own file's source (``python -c``; :func:`llmtrial.host.nodes.program_argv`).
Each reads its inputs (JSON on stdin, or its arguments) and prints one JSON object, its entry under
the ``__main__`` guard; the library imports them for their source, their tests as modules.

- :mod:`llmtrial.onnode.file_hashes`: the sha256 of files
- :mod:`llmtrial.onnode.gpu_health`: CUDA initialised and a buffer allocated in a fresh process
- :mod:`llmtrial.onnode.headless_serve`: a headless rank of vLLM's native multi-node launch
- :mod:`llmtrial.onnode.node_facts`: what preflight compares across the nodes of a multi-node trial
- :mod:`llmtrial.onnode.node_probe`: hostname, interpreter, Python version, machine
- :mod:`llmtrial.onnode.plugin_folder`: a patch plugin folder's state, and its removal
- :mod:`llmtrial.onnode.process_group`: start, list or stop a process group
- :mod:`llmtrial.onnode.service_health`: a service's health check (http, tcp, completion)
- :mod:`llmtrial.onnode.telemetry_sampler`: CPU, memory, load and network, a CSV row per interval
- :mod:`llmtrial.onnode.weights_folder`: a staged weights folder resolved, sized or deleted
"""

__all__ = ["file_hashes", "gpu_health", "headless_serve", "node_facts", "node_probe", "plugin_folder",
           "process_group", "service_health", "telemetry_sampler", "weights_folder"]
