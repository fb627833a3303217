"""QA evaluation: per-question outputs per model, then metrics with Wilson CIs and paired tests.

Modes, never conflated (each metric carries its mode in the output):
- `greedy_pass@1`: temperature 0 (argmax), n = 1: is the one greedy answer correct;
- `sampling_pass@k`: temperature T > 0, n = k samples: is at least one of the k answers correct;
- `nondeterminism_proxy` (diagnostic, not a score): share of questions whose k sampled answers do not
  all agree with the greedy answer (how much sampling changes the model's answer).
Correctness is the exact-match reward (llmrnn.qa.rewards): the same extraction and normalisation as
training. Pairs of variants are compared per metric with McNemar's test on the paired per-question
outcomes and a paired bootstrap CI of the difference.
"""

from __future__ import annotations

import logging
import os
import time
from itertools import combinations
from pathlib import Path

from llmrnn import io
from llmrnn.errors import InputError
from llmrnn.models import model_folder
from llmrnn.qa.data import messages
from llmrnn.qa.rewards import exact_match

log = logging.getLogger(__name__)

EVAL_DEFAULTS = {"k": 4, "temperature": 0.8, "top_p": 0.95, "max_new_tokens": 96, "max_questions": None,
                 "seed": 1234, "batch_size": 8, "system": None}
METRICS = ("greedy_pass@1", "sampling_pass@k")


class Generator:
    """A chat model answering prompts with transformers (CPU or one GPU), greedy or sampled."""

    def __init__(self, model_dir: str | os.PathLike, threads: int = 1):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(max(1, threads))
        model_dir = model_folder(model_dir)
        if not (Path(model_dir) / "config.json").is_file():
            raise InputError(f"{model_dir}: not an HF model folder (no config.json)")
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        cuda = torch.cuda.is_available()
        self.device = "cuda" if cuda else "cpu"
        dtype = torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(self.device).eval()

    def generate(self, chats: list[list[dict]], n: int = 1, temperature: float = 0.0, top_p: float = 1.0,
                 max_new_tokens: int = 96, seed: int = 0) -> list[list[str]]:
        """n answers per chat; temperature 0 = greedy (n must be 1)."""
        import torch

        if temperature == 0 and n != 1:
            raise ValueError("greedy decoding gives one answer: n must be 1")
        texts = [self.tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        torch.manual_seed(seed)
        kwargs = {"do_sample": False} if temperature == 0 else {
            "do_sample": True, "temperature": temperature, "top_p": top_p, "num_return_sequences": n}
        with torch.no_grad():
            out = self.model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=self.tokenizer.pad_token_id,
                                      **kwargs)
        decoded = self.tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        return [decoded[i * n:(i + 1) * n] for i in range(len(chats))]


def _graded(text: str, rec: dict) -> dict:
    em = exact_match(text, rec["answer"], rec.get("options"))
    return {"text": text, "extracted": em["extracted"], "normalized": em["normalized"],
            "correct": bool(em["exact_match"])}


def evaluate_model(model_dir: str, questions: str, out: str, variant: str, split: str, cfg: dict,
                   threads: int = 1) -> dict:
    """Per-question JSONL (greedy answer, k samples, both outcomes) for one model on one question set."""
    cfg = {**EVAL_DEFAULTS, **(cfg or {})}
    if int(cfg["k"]) < 1 or not float(cfg["temperature"]) > 0:
        raise InputError("qa.eval: k must be >= 1 and temperature > 0 (sampling_pass@k samples; greedy is T=0)")
    records = io.read_jsonl(questions)
    if cfg["max_questions"]:
        records = records[: int(cfg["max_questions"])]
    rows = []
    t0 = time.perf_counter()
    if records:
        gen = Generator(model_dir, threads)
        size = int(cfg["batch_size"])
        for start in range(0, len(records), size):
            batch = records[start:start + size]
            chats = [messages(r, cfg["system"]) if cfg["system"] else messages(r) for r in batch]
            greedy = gen.generate(chats, 1, 0.0, 1.0, int(cfg["max_new_tokens"]))
            sampled = gen.generate(chats, int(cfg["k"]), float(cfg["temperature"]), float(cfg["top_p"]),
                                   int(cfg["max_new_tokens"]), seed=int(cfg["seed"]) + start)
            for rec, g, s in zip(batch, greedy, sampled):
                g_out = _graded(g[0], rec)
                samples = [_graded(t, rec) for t in s]
                rows.append({
                    "id": rec["id"], "variant": variant, "split": split, "question": rec["question"],
                    "options": rec.get("options"), "answer": rec["answer"],
                    "greedy": g_out, "samples": samples,
                    "greedy_pass@1": g_out["correct"],
                    "sampling_pass@k": any(x["correct"] for x in samples),
                    "samples_correct": sum(x["correct"] for x in samples),
                    "disagrees": any(x["normalized"] != g_out["normalized"] for x in samples),
                })
            log.info("%s/%s: %d/%d questions", variant, split, len(rows), len(records))
    header = {"variant": variant, "split": split, "model": str(model_dir), "questions": len(rows),
              "seconds": round(time.perf_counter() - t0, 2), "cfg": cfg}
    io.write_jsonl(out, [{"header": header}, *rows])
    return header


# ----------------------------------------------------------------------------- gather
def _metric(outcomes: list[bool], mode: str) -> dict:
    from llmrnn.stats import wilson_ci

    n, c = len(outcomes), sum(outcomes)
    lo, hi = wilson_ci(c, n)
    lo, hi = (0.0 if c == 0 else lo), (1.0 if c == n else hi)  # exact ends (float error gave 5e-17 at 0/n)
    return {"mode": mode, "value": c / n if n else None, "correct": c, "n": n, "ci95": [lo, hi]}


def gather(files: list[str], cfg: dict) -> tuple[dict, dict]:
    """(metrics, comparison) over every per-question file: metrics per split and variant, tests per pair."""
    from llmrnn.stats import mcnemar, paired_bootstrap

    cfg = {**EVAL_DEFAULTS, **(cfg or {})}
    boot = (cfg.get("stats") or {}).get("bootstrap") or {"samples": 2000, "seed": 0}
    modes = {"greedy_pass@1": "greedy: temperature 0, n 1",
             "sampling_pass@k": f"sampling: temperature {cfg['temperature']}, top_p {cfg['top_p']}, n {cfg['k']}"}
    by: dict[str, dict[str, dict[str, dict]]] = {}
    for path in files:
        rows = io.read_jsonl(path)
        if not rows or "header" not in rows[0]:
            raise InputError(f"{path}: not a qa eval file (no header line)")
        head = rows[0]["header"]
        by.setdefault(head["split"], {})[head["variant"]] = {r["id"]: r for r in rows[1:]}
    metrics: dict = {"k": cfg["k"], "splits": {}}
    comparison: dict = {"test": "McNemar (exact below 25 discordant pairs) + paired bootstrap of the difference",
                        "splits": {}}
    for split, variants in by.items():
        metrics["splits"][split] = {}
        for variant, rows in variants.items():
            ordered = [rows[i] for i in sorted(rows)]
            m = {name: _metric([bool(r[name]) for r in ordered], modes[name]) for name in METRICS}
            m["nondeterminism_proxy"] = {
                "mode": "diagnostic: share of questions whose k samples disagree with the greedy answer",
                "value": (sum(r["disagrees"] for r in ordered) / len(ordered)) if ordered else None,
                "n": len(ordered)}
            metrics["splits"][split][variant] = m
        comparison["splits"][split] = {}
        for a, b in combinations(sorted(variants, key=_variant_order), 2):
            ids = sorted(set(variants[a]) & set(variants[b]))
            pair = {}
            for name in METRICS:
                xa = [bool(variants[a][i][name]) for i in ids]
                xb = [bool(variants[b][i][name]) for i in ids]
                pair[name] = {"mode": modes[name], "n_pairs": len(ids), "mcnemar": mcnemar(xa, xb),
                              "bootstrap": paired_bootstrap(xa, xb, int(boot["samples"]), int(boot["seed"]))}
            comparison["splits"][split][f"{b}_vs_{a}"] = pair
    return metrics, comparison


VARIANT_ORDER = ("base", "sft", "grpo")


def _variant_order(name: str) -> tuple[int, str]:
    return (VARIANT_ORDER.index(name) if name in VARIANT_ORDER else len(VARIANT_ORDER), name)
