"""STAND-IN for a job that needs 400 MB, held to its SLURM allocation as a cgroup would hold it (the local
SLURM has no cgroups): the job's memory (scontrol MinMemoryNode, what the executor asked with --mem)
becomes its address-space limit, so an attempt asking too little dies of memory (MemoryError, exit 1)."""

import os
import re
import resource
import subprocess
import sys

job = os.environ["SLURM_JOB_ID"]
record = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, check=True).stdout
value, unit = re.search(r"MinMemoryNode=(\d+)([MGT])", record).groups()
mb = int(value) * {"M": 1, "G": 1024, "T": 1024 * 1024}[unit]
with open("attempts_hungry.log", "a", encoding="utf-8") as fh:
    fh.write(f"{job} {mb}\n")
resource.setrlimit(resource.RLIMIT_AS, (mb << 20, mb << 20))
need = bytearray(400 << 20)
with open(sys.argv[1], "w", encoding="utf-8") as fh:
    fh.write("ok\n")
