"""The cohort build's per-note work, this tree against a git revision, side by side: reading the first
--notes notes of a discharge file (tables.rows), splitting them (sections.split_note, the floor) and the
whole record a build's worker makes of each (build.note_record in the default mode: the split, the
target, the leak audit and the JSON; one admission date, 2150-01-01, for every note).

    .venv/bin/python benchmarks/note_stream.py --file DIR/note/discharge.csv.gz [--against main]
                                               [--notes 30000] [--repeat 3]

The revision's src/ is exported (git archive) to a temp folder; each tree runs in a subprocess of its own
(both are the package llmrnn), in turn --repeat times, and the best CPU time of each part counts (a shared
machine's load moves minute by minute; alternating keeps both under the same load). Prints us per note of
each part and the revision/this-tree ratios. The files: benchmarks/cohort_build.py --dir DIR --keep.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PARTS = ("read", "split", "record")  # record: note_record, the split included
CHILD = r"""
import json, sys, time
from pathlib import Path
from llmrnn.mimic.build import DEFAULTS, Shown, _admitted, note_record
from llmrnn.mimic.sections import split_note
from llmrnn.mimic.tables import rows

path, n = Path(sys.argv[1]), int(sys.argv[2])
start, texts = time.process_time(), []
for _, r in rows(path, "discharge"):
    texts.append(r["text"])
    if len(texts) == n:
        break
read = time.process_time() - start
start = time.process_time()
for text in texts:
    split_note(text)
split = time.process_time() - start
shown, admitted = Shown.of(DEFAULTS), _admitted("2150-01-01")  # tables.rows reads no note date
start = time.process_time()
for text in texts:
    note_record(text, shown, admitted)
print(json.dumps({"notes": len(texts), "read": read, "split": split, "record": time.process_time() - start}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", required=True, help="a discharge.csv.gz (benchmarks/cohort_build.py --keep writes one)")
    ap.add_argument("--against", default="main", help="the git revision to compare with")
    ap.add_argument("--notes", type=int, default=30_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="note_stream.") as tmp:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.against, "src"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        trees = {args.against: Path(tmp) / "src", "this tree": REPO / "src"}
        best: dict[tuple[str, str], float] = {}
        for _ in range(args.repeat):
            for name, src in trees.items():
                out = subprocess.run([sys.executable, "-c", CHILD, args.file, str(args.notes)], check=True,
                                     capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                     env={"PYTHONPATH": str(src), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
                got = json.loads(out.stdout)
                for part in PARTS:
                    best[name, part] = min(best.get((name, part), float("inf")), got[part] / got["notes"])
    old, new = trees
    for part in PARTS:
        print(f"{part}: {old} {best[old, part] * 1e6:.0f} us/note, this tree {best[new, part] * 1e6:.0f} us/note, "
              f"{best[old, part] / best[new, part]:.2f}x")
    for part in ("split", "record"):
        total = {name: best[name, "read"] + best[name, part] for name in trees}
        print(f"read + {part}: {total[old] * 1e6:.0f} vs {total[new] * 1e6:.0f} us/note, "
              f"{total[old] / total[new]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
