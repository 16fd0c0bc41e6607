"""vLLM patched behind a flag: patches as data, applied and verified as a file diff or a plugin,
carried to other nodes, reverted.

- :mod:`llmtrial.patch.node_patches`: A mode-plugin patch on the other nodes of a trial: the plugin
  folder carried to each node, verified there, and removed there from the ledger alone.
- :mod:`llmtrial.patch.patchdata`: vLLM patches as data: a patch's folder (``patch.yaml``, its diff
  and hook), unified diffs applied in memory, and the installed vLLM's ``RECORD`` that target files
  are checked against.
- :mod:`llmtrial.patch.patching`: Patch vLLM behind a flag, reversibly: patches as data, two ways
  in, one way out.
- :mod:`llmtrial.patch.plugin`: Mode plugin: a patch's hook in a folder of the trial's own, loaded by
  every vLLM process, and each node of a configuration spanning several given the patches in its mode.

Imports from: core, logs, host, plan, weights. (tests/test_structure.py holds the order.)
"""

__all__ = ["node_patches", "patchdata", "patching", "plugin"]
