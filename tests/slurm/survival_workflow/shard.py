"""STAND-IN for an eval/trajectory shard (no model here): 8 rows through the real llmrnn.kept, one a chunk.
Each chunk's start is logged with its job, node and pid (worked.log); row 3 waits while `hold` exists."""

import json
import os
import sys
import time

from llmrnn import io, kept


def work(chunk):
    (item,) = chunk
    with open("worked.log", "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"item": item, "job": os.environ.get("SLURM_JOB_ID"),
                             "node": os.environ.get("SLURMD_NODENAME"), "pid": os.getpid()}) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    while item == 3 and os.path.exists("hold"):
        time.sleep(0.2)
    return [{"item": item, "square": item * item}], {"rows": 1}


out = sys.argv[1]
rows, stats = kept.run_kept(list(range(8)), work, out, "survival-v1", "shard", chunk=1)
io.write_text(out, "".join(json.dumps(r) + "\n" for r in rows))
kept.finish(out)
