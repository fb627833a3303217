"""The PHI guard's scan of a large card: seconds for a 1 MiB and a 4 MiB card, and their ratio.

    .venv/bin/python benchmarks/phi_guard_scan.py [--mib 1] [--factor 4] [--repeat 2]

Writes a synthetic cohort (llmrnn.cohort.synthesize_cohort, 12 patients) as split files and a card of prose
(words drawn from a fixed list, lines of 12 words, none of them the cohort's) of --mib MiB and of --factor
times that, and scans each one with `llmrnn release guard` machinery (phi_guard.scan_bundle over a folder
holding only README.md: the card is scanned as free text). Both sizes run in turn --repeat times in one run
(default 2) and the best of each counts, so the two see the same load. A linear scan gives a ratio near the
factor (4); the quadratic letters-only pass of round 5 (a 1 MiB card took 374 s) gave about its square.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from llmrnn import cohort, io, phi_guard

WORDS = ("model", "memory", "update", "trained", "merged", "adapter", "weights", "summary", "release", "card",
         "evaluation", "held", "out", "split", "reward", "group", "policy", "gradient", "rollout", "tokens")


def card(n_bytes: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    lines, size = ["# card"], 7
    while size < n_bytes:
        line = " ".join(rng.choice(WORDS) for _ in range(12))
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=float, default=1.0)
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        split = root / "train.json"
        io.write_text(split, cohort.dump_cohort(cohort.synthesize_cohort(12, 3)))
        sizes = [int(args.mib * (1 << 20)), int(args.factor * args.mib * (1 << 20))]
        folders = {}
        for n in sizes:
            folders[n] = root / f"card_{n}"
            folders[n].mkdir()
            (folders[n] / "README.md").write_text(card(n))
        best = dict.fromkeys(sizes, float("inf"))
        for _ in range(args.repeat):
            for n in sizes:
                t0 = time.perf_counter()
                report = phi_guard.scan_bundle(folders[n], [split])
                best[n] = min(best[n], time.perf_counter() - t0)
                assert report["ok"], report["findings"][:1]
    small, large = sizes
    print(f"{small / (1 << 20):g} MiB card: {best[small]:.2f} s")
    print(f"{large / (1 << 20):g} MiB card: {best[large]:.2f} s")
    print(f"ratio {large // small}x input: {best[large] / best[small]:.2f}x time (linear: about {large // small})")


if __name__ == "__main__":
    main()
