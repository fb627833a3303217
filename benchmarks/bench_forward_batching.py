"""Forward pass batched across patients vs one patient at a time: same tiny model, backend, prompts.

    .venv/bin/python benchmarks/bench_forward_batching.py --patients 64 [--threads 1,2]

Both modes run llmrnn.rnn.run_forward with the same transformers backend (a tiny random Llama built in a
temp dir by tests/tiny_model.py), the same prompt file and the same seeds; "batched" sends all patients of a visit
step in one call per role, "one at a time" calls run_forward once per patient. For each thread count
(default: 1 and every core this process may use) it prints both wall times, the speed-up ratio (target:
>= 5x at 64 patients on CPU) and the prompt tokens each mode ran through the model before decoding
(a batched call computes the prefix its prompts share once). Outputs are compared too: per-row seeded
sampling makes them equal.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the test model builder lives in tests/, not in the package


def _thread_counts(text: str | None) -> list[int]:
    if text:
        return [int(x) for x in text.split(",")]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return sorted({1, cores})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patients", type=int, default=64)
    parser.add_argument("--max-visits", type=int, default=4, help="first N visits of each synthetic patient")
    parser.add_argument("--max-tokens", type=int, default=96, help="as the demo roles (96-128)")
    parser.add_argument("--batch-size", type=int, default=64, help="sequences per generate() pass")
    parser.add_argument("--threads", help="comma-separated torch thread counts (default: 1 and all cores)")
    parser.add_argument("--prompts", default=str(REPO / "config" / "prompts" / "llmrnn.yaml"))
    args = parser.parse_args()

    import torch

    from llmrnn.backends import make_backend
    from llmrnn.cohort import synthesize_cohort
    from llmrnn.prompts import load_prompts
    from llmrnn.rnn import ROLES, Role, run_forward
    from tests.tiny_model import build_tiny_model

    prompts = load_prompts(args.prompts)
    patients = synthesize_cohort(args.patients, seed=0)
    for p in patients:
        p["visits"] = p["visits"][: args.max_visits]
    visits = sum(len(p["visits"]) for p in patients)
    print(f"patients={args.patients} visits={visits} max_tokens={args.max_tokens} prompts={args.prompts}")
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "tiny")
        backend = make_backend({"backend": "transformers", "batch_size": args.batch_size}, model, cache=False)
        roles = {r: Role(r, backend, temperature=0.7, top_p=0.95, max_tokens=args.max_tokens) for r in ROLES}
        run_forward(patients[:2], roles, prompts)  # warm-up

        def timed(fn):
            calls, tokens, t0 = backend.calls, backend.prefill_tokens, time.perf_counter()
            out = fn()
            return out, time.perf_counter() - t0, backend.calls - calls, backend.prefill_tokens - tokens

        for threads in _thread_counts(args.threads):
            torch.set_num_threads(threads)
            batched, t_b, calls_b, tok_b = timed(lambda: run_forward(patients, roles, prompts, seed=1))
            single, t_s, calls_s, tok_s = timed(
                lambda: [run_forward([p], roles, prompts, seed=1)[0] for p in patients]
            )
            same = sum(
                a.get("memory_raw") == b.get("memory_raw") and a["prediction_raw"] == b["prediction_raw"]
                for pa, pb in zip(batched, single)
                for a, b in zip(pa["visits"], pb["visits"])
            )
            print(f"threads={threads}")
            print(f"  batched:        {t_b:8.2f} s  {calls_b:5d} backend calls  {tok_b:8d} prompt tokens prefilled")
            print(f"  one at a time:  {t_s:8.2f} s  {calls_s:5d} backend calls  {tok_s:8d} prompt tokens prefilled")
            print(f"  identical outputs: {same}/{visits} visits")
            print(f"  speed-up (one at a time / batched): {t_s / t_b:.1f}x")


if __name__ == "__main__":
    main()
