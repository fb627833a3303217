"""`generation: prefix_cache` (llmrnn.prefix_engine) vs `generation: generate` (plain model.generate()).

    .venv/bin/python benchmarks/bench_generation_engines.py --patients 32 [--threads 1] [--repeats 2]

Both settings run the batched forward pass (llmrnn.rnn.run_forward) of the same synthetic patients with the
same tiny random Llama (built in a temp dir), prompt file and seeds, alternating A/B `--repeats` times so
both see the same machine load. Prints each setting's best wall time, the prompt tokens it ran through the
model before decoding, the ratio, and how many visits gave identical outputs (they should all: the two
settings decode the same tokens).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the test model builder lives in tests/, not in the package
SETTINGS = ("prefix_cache", "generate")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patients", type=int, default=32)
    parser.add_argument("--max-visits", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--prompts", default=str(REPO / "config" / "prompts" / "llmrnn.yaml"))
    args = parser.parse_args()

    import torch

    from llmrnn.backends import make_backend
    from llmrnn.cohort import synthesize_cohort
    from llmrnn.prompts import load_prompts
    from llmrnn.rnn import ROLES, Role, run_forward
    from tests.tiny_model import build_tiny_model

    torch.set_num_threads(args.threads)
    prompts = load_prompts(args.prompts)
    patients = synthesize_cohort(args.patients, seed=0)
    for p in patients:
        p["visits"] = p["visits"][: args.max_visits]
    visits = sum(len(p["visits"]) for p in patients)
    print(f"patients={args.patients} visits={visits} max_tokens={args.max_tokens} threads={args.threads}")
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "tiny")
        engines = {g: make_backend({"backend": "transformers", "batch_size": args.batch_size, "generation": g},
                                   model, cache=False) for g in SETTINGS}
        roles = {g: {r: Role(r, e, temperature=0.7, top_p=0.95, max_tokens=args.max_tokens) for r in ROLES}
                 for g, e in engines.items()}
        best, tokens, outputs = {g: float("inf") for g in SETTINGS}, {}, {}
        for g in SETTINGS:
            run_forward(patients[:2], roles[g], prompts)  # warm-up
        for _ in range(args.repeats):
            for g in SETTINGS:
                before, t0 = engines[g].prefill_tokens, time.perf_counter()
                outputs[g] = run_forward(patients, roles[g], prompts, seed=1)
                best[g] = min(best[g], time.perf_counter() - t0)
                tokens[g] = engines[g].prefill_tokens - before
        same = sum(a.get("memory_raw") == b.get("memory_raw") and a["prediction_raw"] == b["prediction_raw"]
                   for pa, pb in zip(outputs["prefix_cache"], outputs["generate"])
                   for a, b in zip(pa["visits"], pb["visits"]))
        for g in SETTINGS:
            print(f"  {g:13s} {best[g]:8.2f} s  {tokens[g]:8d} prompt tokens prefilled")
        print(f"  identical outputs: {same}/{visits} visits")
        print(f"  speed-up (generate / prefix_cache): {best['generate'] / best['prefix_cache']:.2f}x")


if __name__ == "__main__":
    main()
