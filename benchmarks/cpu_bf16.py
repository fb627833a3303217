"""bfloat16 vs float32 on this CPU: why the demo's `dtype: auto` / `cpu_bf16: auto` pick bf16 only where the
CPU computes it natively (AVX512-BF16 or AMX-BF16).

    .venv/bin/python benchmarks/cpu_bf16.py [--model resources/models/smollm2-135m-instruct] [--repeats 3]

Loads the model (after `make demo`: SmolLM2-135M-Instruct) once per dtype, on one thread, and times the two
things the demo spends its CPU on, side by side in one run: a batch of greedy generations (the forward pass
and the evaluation) and a forward + backward pass (a GRPO update; LoRA-free, which only adds weights).
Prints each best-of-N time, the bf16/fp32 ratio, the CPU's bf16 flags and what `auto` resolves to here.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPT = ("You keep a short clinical memory of a patient. Visit 3: chest pain on exertion, troponin normal, "
          "ECG with ST depression. Write the updated memory as JSON.")


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(model_dir: str, dtype: str, repeats: int) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    batch = tok([PROMPT] * 8, return_tensors="pt", padding=True)

    def generate():
        with torch.no_grad():
            model.generate(**batch, max_new_tokens=32, do_sample=False, pad_token_id=tok.eos_token_id)

    def update():
        model.zero_grad(set_to_none=True)
        model(**batch, labels=batch["input_ids"]).loss.backward()

    generate()  # warm-up: first-call kernel selection is not what a run pays per step
    return {"generate 8 x 32 tokens": best_of(repeats, generate), "forward + backward, batch 8": best_of(repeats, update)}


def main() -> int:
    import torch

    from llmrnn.gpus import NATIVE_BF16_FLAGS, cpu_dtype, cpu_has_native_bf16

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(REPO / "resources/models/smollm2-135m-instruct"))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    results = {dtype: measure(args.model, dtype, args.repeats) for dtype in ("float32", "bfloat16")}
    print(f"CPU native bf16 ({' or '.join(NATIVE_BF16_FLAGS)}): {cpu_has_native_bf16()}; "
          f"dtype auto here = {cpu_dtype('auto')}; model {Path(args.model).name}, 1 thread, best of {args.repeats}")
    for task in results["float32"]:
        fp32, bf16 = results["float32"][task], results["bfloat16"][task]
        print(f"{task}: float32 {fp32:.2f} s, bfloat16 {bf16:.2f} s, bf16/fp32 = {bf16 / fp32:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
