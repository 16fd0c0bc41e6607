"""A trial job's stand-in: starts a benchmark worker (or, given a socket name and a ledger, connects to the
trial's shared one, starting it when none listens), prints its pid, then runs one pass that hangs (the server
never answers) until the job is killed, as SLURM or an operator's kill -9 kills a job.

    python tests/programs/job_with_a_worker.py WORKER_LOG PASS_ARGV_JSON [SOCKET_NAME LEDGER]
"""

import json
import os
import sys
import time
from pathlib import Path

from llmtrial.core.ledger import Ledger
from llmtrial.host.nodes import local_node
from llmtrial.serve.bench_worker import BenchWorker, SharedWorker

if __name__ == "__main__":
    log = Path(sys.argv[1])
    shared = None
    if len(sys.argv) == 5:
        shared = SharedWorker(name=sys.argv[3], ledger=Ledger(Path(sys.argv[4])), node=local_node(),
                              label="test/benchmark worker", owner=os.getppid(), log_path=log)
    worker = BenchWorker(log_path=log, shared=shared)
    worker.start(time.monotonic() + 120)
    print(worker.pid, flush=True)
    worker.run(json.loads(sys.argv[2]), log_path=log.with_name("pass.log"), timeout=600)
