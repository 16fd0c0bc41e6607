"""The host through a trial, borrowed and given back: preflight before anything changes, readiness before a
configuration serves (re-quiet, re-patch, census), and cleanup from the ledger alone.

- :mod:`llmtrial.lifecycle.cleanup`: Cleanup: give the host back, from the trial's ledger alone.
- :mod:`llmtrial.lifecycle.ledger_tables`: What the trial's ledger says was changed and given back, one
  row per change: each quieted service, each patched file or plugin folder, each server, group and
  job. The cleanup record carries these tables (:func:`llmtrial.lifecycle.cleanup.run_cleanup`);
  they are read from the ledger alone, so any run's cleanup tells every run's changes apart.
- :mod:`llmtrial.lifecycle.on_node`: Cleanup on the host that made the changes: on a cluster, the node
  the ledger names (sent there through ``srun``).
- :mod:`llmtrial.lifecycle.preflight`: Preflight: what the trial runs on and whether it can run, before
  anything changes the host.
- :mod:`llmtrial.lifecycle.readiness`: Host readiness before a configuration serves, one function for
  each step the quiet and patch stages do and a configuration's job does again when a cleanup has
  undone them: quiet the services (restoring first what an earlier run left changed), apply the
  trial's patches, take the GPU census, and build the serving environment.

Imports from: core, logs, host, plan, weights, patch. (tests/test_structure.py holds the order.)
"""

__all__ = ["cleanup", "ledger_tables", "on_node", "preflight", "readiness"]
