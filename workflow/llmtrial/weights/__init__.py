"""The model's weights: sources (tiny, local, Hub), staging with a manifest, copies on other nodes, and
the keep / archive / delete policy after a trial.

- :mod:`llmtrial.weights.gguf`: A GGUF checkpoint as a model source: found, its header read,
  dequantized into a Hugging Face folder.
- :mod:`llmtrial.weights.hub`: Staging from the Hugging Face Hub: commit, headroom, download,
  verification, resume.
- :mod:`llmtrial.weights.manifest`: A staged model's manifest: every file with its size and sha256,
  built and checked.
- :mod:`llmtrial.weights.model_source`: A model's source before it is staged: its config.json, its
  weight bytes, its folder.
- :mod:`llmtrial.weights.node_weights`: Staged weights on the other nodes of a trial: copied from
  the first node, verified there, and undone there from the ledger alone.
- :mod:`llmtrial.weights.policy`: What happens to staged weights after a trial: ``keep``,
  ``archive`` or ``delete``.
- :mod:`llmtrial.weights.staging`: Model stage: put a servable Hugging Face-format model folder in
  place and describe it.
- :mod:`llmtrial.weights.tiny`: The tiny model: a small Llama-architecture model generated locally
  from a seed.
- :mod:`llmtrial.weights.tiny_cache`: Generated tiny models kept for the next staging that asks for
  the same one.

Imports from: core, logs, host, plan. (tests/test_structure.py holds the order.)
"""

__all__ = ["gguf", "hub", "manifest", "model_source", "node_weights", "policy", "staging", "tiny", "tiny_cache"]
