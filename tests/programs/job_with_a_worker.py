"""A trial job's stand-in: starts a benchmark worker, prints its pid, then runs one pass that hangs (the
server never answers) until the job is killed, as SLURM or an operator's kill -9 kills a job.

    python tests/programs/job_with_a_worker.py WORKER_LOG PASS_ARGV_JSON
"""

import json
import sys
from pathlib import Path

from llmtrial.serve.bench import BenchWorker

if __name__ == "__main__":
    log = Path(sys.argv[1])
    worker = BenchWorker(log_path=log)
    worker.start()
    print(worker.proc.pid, flush=True)
    worker.run(json.loads(sys.argv[2]), log_path=log.with_name("pass.log"), timeout=600)
