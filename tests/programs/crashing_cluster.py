"""A process that makes a SLURM test cluster, starts a job in it, prints the cluster's folder, its
slurm.conf and the job's id, then sleeps until it is killed (SIGKILL: the cluster's daemons and the job
are left running for the next cluster to remove).

    python tests/programs/crashing_cluster.py
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: the cluster helper

from slurm_cluster import slurm_cluster  # noqa: E402

if __name__ == "__main__":
    with slurm_cluster(link_etc=False) as cluster:
        proc = cluster.run("sbatch", "--parsable", "--chdir", "/tmp", "-o", "/dev/null", "--wrap", "sleep 300")
        print(cluster.root, cluster.conf, proc.stdout.strip(), flush=True)
        time.sleep(120)
