"""vLLM's logs read: a server's log as lines, the start-up figures, why a server failed and its crash's
signature, the engine's own warnings; failures read across configurations, beside which knob acts in
which start-up phase.

- :mod:`llmtrial.logs.across`: Failures compared across a trial's configurations: which knob did not
  cause a crash, which one did.
- :mod:`llmtrial.logs.engine_warnings`: The engine's own warnings: start-up lines of vLLM (and of
  NCCL under it) that the seeds acted on.
- :mod:`llmtrial.logs.failures`: Why a vLLM server failed: the line of its log that explains it, and
  what to change.
- :mod:`llmtrial.logs.knob_phases`: Which vLLM knob acts in which start-up phase, as data, with the
  vLLM source lines that show it.
- :mod:`llmtrial.logs.lines`: A vLLM server's log as lines: read, cleaned, their prefixes told apart
  from their message.
- :mod:`llmtrial.logs.phases`: Which start-up phase a vLLM function or a vLLM line belongs to.
- :mod:`llmtrial.logs.signature`: A crash's signature: what was raised, where in vLLM, and in which
  start-up phase.
- :mod:`llmtrial.logs.startup_log`: Start-up figures from a vLLM server's log, in the wordings of
  every engine generation.
- :mod:`llmtrial.logs.startup_phases`: A server's start-up split into its phases, as its log gives them.

Imports from: core. (tests/test_structure.py holds the order.)
"""

__all__ = ["across", "engine_warnings", "failures", "knob_phases", "lines", "phases", "signature", "startup_log", "startup_phases"]
