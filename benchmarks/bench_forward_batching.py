"""Forward pass batched across patients vs one patient at a time: same tiny model, backend, prompts.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_forward_batching.py --patients 64

Both modes run llmrnn.rnn.run_forward with the same transformers backend (a tiny random Llama built in a
temp dir, FINDINGS §2) and the same seeds; "batched" sends all patients of a visit step in one call per
role, "one at a time" calls run_forward once per patient. Prints both wall times and the speed-up ratio
(target: >= 5x at 64 patients on CPU). Outputs are compared too: per-row seeded sampling makes them equal.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patients", type=int, default=64)
    parser.add_argument("--max-visits", type=int, default=4, help="first N visits of each synthetic patient")
    parser.add_argument("--max-tokens", type=int, default=96, help="as the demo roles (96-128)")
    parser.add_argument("--batch-size", type=int, default=64, help="sequences per generate() pass")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from llmrnn.backends import make_backend
    from llmrnn.cohort import synthesize_cohort
    from llmrnn.prompts import load_prompts
    from llmrnn.rnn import ROLES, Role, run_forward
    from llmrnn.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "tiny")
        backend = make_backend({"backend": "transformers", "batch_size": args.batch_size}, model, cache=False)
        roles = {r: Role(r, backend, temperature=0.7, top_p=0.95, max_tokens=args.max_tokens) for r in ROLES}
        prompts = load_prompts(REPO / "config" / "prompts" / "llmrnn.yaml")
        patients = synthesize_cohort(args.patients, seed=0)
        for p in patients:
            p["visits"] = p["visits"][: args.max_visits]
        visits = sum(len(p["visits"]) for p in patients)
        run_forward(patients[:2], roles, prompts)  # warm-up

        calls0 = backend.calls
        t0 = time.perf_counter()
        batched = run_forward(patients, roles, prompts, seed=1)
        t_batched = time.perf_counter() - t0
        calls_batched = backend.calls - calls0

        calls0 = backend.calls
        t0 = time.perf_counter()
        single = [run_forward([p], roles, prompts, seed=1)[0] for p in patients]
        t_single = time.perf_counter() - t0
        calls_single = backend.calls - calls0

    same = sum(
        a.get("memory_raw") == b.get("memory_raw") and a["prediction_raw"] == b["prediction_raw"]
        for pa, pb in zip(batched, single)
        for a, b in zip(pa["visits"], pb["visits"])
    )
    print(f"patients={args.patients} visits={visits} max_tokens={args.max_tokens} threads={args.threads}")
    print(f"batched:        {t_batched:8.2f} s  {calls_batched:5d} backend calls")
    print(f"one at a time:  {t_single:8.2f} s  {calls_single:5d} backend calls")
    print(f"identical outputs: {same}/{visits} visits")
    print(f"speed-up (one at a time / batched): {t_single / t_batched:.1f}x")


if __name__ == "__main__":
    main()
