"""QA evaluation: per-question outputs per model, then metrics with CIs, chance baselines and paired tests.

Modes, never conflated (each metric carries its mode in the output):
- `greedy_pass@1`: temperature 0 (argmax), n = 1: is the one greedy answer correct;
- `sampling_pass@j` for every j <= n (n = qa.eval.k samples per question at temperature T > 0): the
  unbiased estimator of Chen et al. 2021, per question 1 - C(n-c, j) / C(n, j) with c correct samples,
  averaged over questions (`sampling_pass@k` is j = n: at least one of the n samples is correct);
- `sampling_maj@j`: the majority answer of j samples is correct, averaged over every j-subset of the n
  samples (ties split evenly);
- `nondeterminism_proxy` (diagnostic, not a score): share of questions whose sampled answers do not all
  agree with the greedy answer.
Every metric carries `chance` beside it: `uniform_guess` (guessing an option uniformly: 1/m per try, so
pass@j = 1 - (1 - 1/m)^j and maj@j = 1/m; none for free text) and `most_common_train_answer` (always
answering the train split's most common normalised answer; needs the train split).
Correctness is the exact-match reward (llmrnn.qa.rewards): the same extraction and normalisation as
training. Where a judge is configured (`qa eval --endpoint`), free-text answers are also graded by it
(`judge_*` metrics: judge score >= qa.eval.judge_threshold), a second metric beside exact match.
Pairs of variants are compared on the binary metrics with McNemar's test on the paired per-question
outcomes and a paired bootstrap CI of the difference.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections import Counter
from itertools import combinations
from pathlib import Path

from llmrnn import io
from llmrnn.errors import InputError
from llmrnn.models import model_folder
from llmrnn.qa.data import SYSTEM_PROMPT, messages
from llmrnn.qa.rewards import exact_match, judge_scores, normalize_answer
from llmrnn.settings import section_defaults
from llmrnn.stats import mcnemar, paired_bootstrap, wilson_ci

log = logging.getLogger(__name__)

EVAL_DEFAULTS = {k: v for k, v in section_defaults("qa.eval").items()  # the one home: llmrnn.settings
                 if k not in ("judge", "stats", "resources")}
METRICS = ("greedy_pass@1", "sampling_pass@k")  # the binary per-question outcomes the paired tests compare
JUDGE_METRICS = ("judge_greedy_pass@1", "judge_sampling_pass@k")  # the same outcomes graded by the judge
JUDGED = "graded by the judge (score >= qa.eval.judge_threshold; a fallback score is not correct)"


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
    return {"text": text, "extracted": em["extracted"], "extract_method": em["extract_method"],
            "normalized": em["normalized"], "correct": bool(em["exact_match"])}


def system_prompt(cfg: dict) -> str:
    """The system prompt of the evaluation: qa.eval.system, else qa.prompt.system (what training saw), else
    the built-in format prompt."""
    return cfg.get("system") or (cfg.get("prompt") or {}).get("system") or SYSTEM_PROMPT


def _judge_grades(items: list[tuple[dict, dict]], endpoint: str, rubric: str | None, audit_dir: str,
                  threshold: float, reward_cfg: dict | None = None) -> None:
    """Judge-grade each (record, graded answer) in place, the calls sent concurrently: judge_score,
    judge_parse_method and judge_correct (score >= threshold from a parseable judge answer)."""
    scores = judge_scores([(rec["question"], str(rec["answer"]), graded["extracted"] or "") for rec, graded in items],
                          {"rubric": rubric}, endpoint_file=endpoint, audit_dir=audit_dir, reward_cfg=reward_cfg)
    for (rec, graded), (score, method) in zip(items, scores):
        # a judge answer with no parseable score (0.5 by the reward's edge table) grades nothing as correct
        graded.update(judge_score=score, judge_parse_method=method,
                      judge_correct=method != "fallback" and score >= threshold)


def judge_eval_files(inputs: list[str], outputs: list[str], endpoint: str, rubric: str | None, cfg: dict,
                     max_fallback_rate: float, audit_dir: str, reward_cfg: dict | None = None) -> dict[str, float]:
    """Judge-grade every answer (greedy and samples) of finished eval files into judged copies (same rows,
    plus judge_score / judge_parse_method / judge_correct; header judge: true). All files are graded before
    any is written: a judge that falls back on more than max_fallback_rate of one file's answers (a judged
    metric made of 0.5s) stops with one line and writes nothing. Every judge call is audited in audit_dir.
    Every wait on the judge is bounded by reward_cfg (config section `reward`: reward.judge_wait_cfg).
    Returns each input's fallback rate."""
    if len(inputs) != len(outputs):
        raise InputError(f"qa judge: {len(inputs)} inputs but {len(outputs)} outputs; name one output per input")
    cfg = {**EVAL_DEFAULTS, **(cfg or {})}
    threshold = float(cfg["judge_threshold"])
    Path(audit_dir).mkdir(parents=True, exist_ok=True, mode=0o700)  # an output, even with no answers
    texts, rates = {}, {}
    for src, dst in zip(inputs, outputs):
        head, rows, _ = _read_eval(src, int(cfg["k"]))
        items = [(r, g) for r in rows for g in (r["greedy"], *r["samples"])]
        if items:
            _judge_grades(items, endpoint, rubric, audit_dir, threshold, reward_cfg)
        fallbacks = sum(g["judge_parse_method"] == "fallback" for _, g in items)
        rates[src] = fallbacks / len(items) if items else 0.0
        if rates[src] > max_fallback_rate:
            raise InputError(
                f"{src}: the judge gave no parseable score for {fallbacks} of {len(items)} answers "
                f"({rates[src]:.0%} > preflight.max_fallback_rate {max_fallback_rate:.0%}); a judged metric of "
                "fallback scores means nothing: check the judge's log and rubric")
        header = {**head, "judge": True, "judge_rubric": rubric, "judge_threshold": threshold,
                  "judge_fallback_rate": rates[src]}
        texts[dst] = io.jsonl_text([{"header": header}, *rows])
        log.info("%s: %d answers judged, %.0f%% fallbacks", src, len(items), 100 * rates[src])
    io.write_texts(texts)
    return rates


def evaluate_model(model_dir: str, questions: str, out: str, variant: str, split: str, cfg: dict,
                   threads: int = 1, endpoint: str | None = None, rubric: str | None = None,
                   reward_cfg: dict | None = None) -> dict:
    """Per-question JSONL (greedy answer, k samples, both outcomes) for one model on one question set;
    with a judge endpoint every answer is also judge-graded."""
    cfg = {**EVAL_DEFAULTS, **(cfg or {})}
    if int(cfg["k"]) < 1 or not float(cfg["temperature"]) > 0:
        raise InputError("qa.eval: k must be >= 1 and temperature > 0 (sampling_pass@k samples; greedy is T=0)")
    system = system_prompt(cfg)
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
            chats = [messages(r, system) for r in batch]
            greedy = gen.generate(chats, 1, 0.0, 1.0, int(cfg["max_new_tokens"]))
            sampled = gen.generate(chats, int(cfg["k"]), float(cfg["temperature"]), float(cfg["top_p"]),
                                   int(cfg["max_new_tokens"]), seed=int(cfg["seed"]) + start)
            for rec, g, s in zip(batch, greedy, sampled):
                g_out = _graded(g[0], rec)
                samples = [_graded(t, rec) for t in s]
                if endpoint:
                    audit = str(Path(out).parent / f".judge_audit_{Path(out).stem}")
                    _judge_grades([(rec, g_out)] + [(rec, x) for x in samples], endpoint, rubric, audit,
                                  float(cfg["judge_threshold"]), reward_cfg)
                rows.append({
                    "id": rec["id"], "variant": variant, "split": split, "question": rec["question"],
                    "options": rec.get("options"), "answer": rec["answer"],
                    "greedy": g_out, "samples": samples, "n_samples": len(samples),
                    "greedy_pass@1": g_out["correct"],
                    "sampling_pass@k": any(x["correct"] for x in samples),
                    "samples_correct": sum(x["correct"] for x in samples),
                    "disagrees": any(x["normalized"] != g_out["normalized"] for x in samples),
                })
            log.info("%s/%s: %d/%d questions", variant, split, len(rows), len(records))
    header = {"variant": variant, "split": split, "model": str(model_dir), "questions": len(rows),
              "samples_per_question": int(cfg["k"]), "system_prompt": system, "judge": bool(endpoint),
              "seconds": round(time.perf_counter() - t0, 2), "cfg": cfg}
    io.write_jsonl(out, [{"header": header}, *rows])
    return header


# ----------------------------------------------------------------------------- estimators
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


MAJ_SUBSETS = 5000  # above this many k-subsets maj@k averages over a seeded sample of them


def maj_at_k(answers: list[str], correct: list[bool], k: int, seed: int = 0) -> float:
    """Expected correctness of the majority answer of k of the samples: over every k-subset (or a seeded
    sample of MAJ_SUBSETS), ties split evenly among the tied answers; an empty answer never wins."""
    n = len(answers)
    if not 1 <= k <= n:
        raise ValueError(f"maj@k needs 1 <= k <= n, got k={k}, n={n}")
    right = {a for a, ok in zip(answers, correct) if ok and a}
    if not right:
        return 0.0
    if math.comb(n, k) <= MAJ_SUBSETS:
        subsets = list(combinations(range(n), k))
    else:
        rng = random.Random(seed)
        subsets = [tuple(rng.sample(range(n), k)) for _ in range(MAJ_SUBSETS)]
    total = 0.0
    for subset in subsets:
        votes = Counter(answers[i] for i in subset if answers[i])
        if votes:
            top = max(votes.values())
            tied = [a for a, v in votes.items() if v == top]
            total += sum(a in right for a in tied) / len(tied)
    return total / len(subsets)


def chance_baselines(rows: list[dict], train_answers: list[str] | None) -> dict:
    """Per question: the chance a uniform guess over its m options is right (1/m; None without options)
    and whether the train split's most common normalised answer is right (None without a train split)."""
    uniform = [1 / len(r["options"]) if r.get("options") else None for r in rows]
    most_common = None
    if train_answers:
        most_common = Counter(a for a in train_answers if a).most_common(1)[0][0]
    common = [None if most_common is None else normalize_answer(r["answer"], r.get("options")) == most_common
              for r in rows]
    return {"uniform": uniform, "common": common, "most_common": most_common}


def _chance(base: dict, kind: str, j: int) -> dict:
    """The two chance baselines of one metric (kind pass or maj, j tries), means over the questions."""
    def mean(values):
        values = [v for v in values if v is not None]
        return sum(values) / len(values) if values and len(values) == len(base["uniform"]) else None

    if kind == "pass":
        uniform = mean([None if u is None else 1 - (1 - u) ** j for u in base["uniform"]])
    else:  # the majority of uniform guesses is itself a uniform guess
        uniform = mean(base["uniform"])
    common = mean([None if c is None else float(c) for c in base["common"]])
    return {"uniform_guess": uniform, "most_common_train_answer": common,
            "most_common_answer": base["most_common"]}


def train_answers(path: str) -> list[str]:
    """The normalised answers of the train split (for the always-the-most-common-answer baseline)."""
    return [normalize_answer(r["answer"], r.get("options")) for r in io.read_jsonl(path)]


# ----------------------------------------------------------------------------- gather
def _metric(outcomes: list[bool], mode: str) -> dict:
    n, c = len(outcomes), sum(outcomes)
    lo, hi = wilson_ci(c, n)
    lo, hi = (0.0 if c == 0 else lo), (1.0 if c == n else hi)  # exact ends (float error gave 5e-17 at 0/n)
    return {"mode": mode, "value": c / n if n else None, "correct": c, "n": n, "ci95": [lo, hi]}


def _mean_metric(values: list[float], mode: str, boot: dict) -> dict:
    """A mean of per-question values in [0, 1] with a bootstrap 95% CI over questions."""
    if not values:
        return {"mode": mode, "value": None, "n": 0, "ci95": [None, None]}
    b = paired_bootstrap([0.0] * len(values), values, int(boot["samples"]), int(boot["seed"]))
    return {"mode": mode, "value": sum(values) / len(values), "n": len(values), "ci95": b["ci95"],
            "ci_method": "bootstrap over questions"}


def _read_eval(path: str, default_k: int) -> tuple[dict, list[dict], int]:
    """(header, rows, samples per question) of one eval file; one line if its rows disagree on it. A file
    whose rows keep no samples counts the header's samples_per_question, else qa.eval.k."""
    rows = io.read_jsonl(path)
    if not rows or "header" not in rows[0]:
        raise InputError(f"{path}: not a qa eval file (no header line)")
    counts = {len(r.get("samples") or []) for r in rows[1:]}
    if len(counts) > 1:
        raise InputError(f"{path}: mixed sample counts per question {sorted(counts)}; re-run its evaluation")
    head = rows[0]["header"]
    n = counts.pop() if counts else 0
    return head, rows[1:], n or int(head.get("samples_per_question") or default_k)


def gather(files: list[str], cfg: dict, train: str | None = None) -> tuple[dict, dict]:
    """(metrics, comparison) over every per-question file: metrics per split and variant (each with its mode
    and chance baselines), tests per pair. `train`: the train split's records (most-common-answer baseline)."""
    cfg = {**EVAL_DEFAULTS, **(cfg or {})}
    boot = (cfg.get("stats") or {}).get("bootstrap") or {"samples": 2000, "seed": 0}
    sampling = f"sampling: temperature {cfg['temperature']}, top_p {cfg['top_p']}"
    by: dict[str, dict[str, dict[str, dict]]] = {}
    counts: dict[str, dict[int, list[str]]] = {}
    for path in files:
        head, rows, n = _read_eval(path, int(cfg["k"]))
        by.setdefault(head["split"], {})[head["variant"]] = {r["id"]: r for r in rows}
        counts.setdefault(head["split"], {}).setdefault(n, []).append(path)
    mixed = {split: c for split, c in counts.items() if len(c) > 1}
    if mixed:
        split, c = min(mixed.items())
        names = "; ".join(f"{n} per question: {', '.join(paths)}" for n, paths in sorted(c.items()))
        raise InputError(f"qa gather: split {split} mixes sample counts ({names}); evaluate every model "
                         "with the same qa.eval.k")
    answers = train_answers(train) if train else None
    k_used = {split: max(c) for split, c in counts.items()}
    metrics: dict = {"k": cfg["k"], "samples_per_question": k_used, "splits": {},
                     "chance": {"uniform_guess": "guess one option uniformly: pass@j 1-(1-1/m)^j, maj@j and "
                                                 "greedy 1/m (multiple choice only)",
                                "most_common_train_answer": "always answer the train split's most common "
                                                            "normalised answer" + ("" if train else
                                                                                   " (no train split given)")}}
    comparison: dict = {"test": "McNemar (exact below 25 discordant pairs) + paired bootstrap of the difference",
                        "splits": {}}
    for split, variants in by.items():
        n = k_used[split]
        modes = {"greedy_pass@1": "greedy: temperature 0, n 1", "sampling_pass@k": f"{sampling}, n {n}"}
        modes.update({f"judge_{name}": f"{modes[name]}; {JUDGED}" for name in METRICS})
        metrics["splits"][split] = {}
        for variant, rows in variants.items():
            ordered = [rows[i] for i in sorted(rows)]
            base = chance_baselines(ordered, answers)
            m = {name: _metric([bool(r[name]) for r in ordered], modes[name]) for name in METRICS}
            m["greedy_pass@1"]["chance"] = _chance(base, "maj", 1)
            m["sampling_pass@k"]["chance"] = _chance(base, "pass", n)
            kept = all(len(r["samples"]) == n for r in ordered)  # the samples themselves (not only outcomes)
            for j in range(1, n + 1 if kept and ordered else 1):
                mode = f"{sampling}, unbiased estimate from n {n} samples"
                m[f"sampling_pass@{j}"] = _mean_metric(
                    [pass_at_k(n, sum(s["correct"] for s in r["samples"]), j) for r in ordered], mode, boot)
                m[f"sampling_pass@{j}"]["chance"] = _chance(base, "pass", j)
                m[f"sampling_maj@{j}"] = _mean_metric(
                    [maj_at_k([s["normalized"] for s in r["samples"]], [s["correct"] for s in r["samples"]], j)
                     for r in ordered], f"{sampling}, majority vote over every {j} of n {n} samples", boot)
                m[f"sampling_maj@{j}"]["chance"] = _chance(base, "maj", j)
            if _judged(ordered):
                for name in JUDGE_METRICS:
                    m[name] = _metric([_outcome(r, name) for r in ordered], modes[name])
                m["judge_greedy_pass@1"]["chance"] = m["greedy_pass@1"]["chance"]
                m["judge_sampling_pass@k"]["chance"] = m["sampling_pass@k"]["chance"]
                graded = [g for r in ordered for g in (r["greedy"], *r["samples"])]
                m["judge_fallback_rate"] = {
                    "mode": "diagnostic: share of judged answers the judge gave no parseable score (not correct)",
                    "value": sum(g.get("judge_parse_method") == "fallback" for g in graded) / len(graded),
                    "n": len(graded)}
            m["nondeterminism_proxy"] = {
                "mode": "diagnostic: share of questions whose k samples disagree with the greedy answer",
                "value": (sum(r["disagrees"] for r in ordered) / len(ordered)) if ordered else None,
                "n": len(ordered)}
            metrics["splits"][split][variant] = m
        comparison["splits"][split] = {}
        for a, b in combinations(sorted(variants, key=_variant_order), 2):
            ids = sorted(set(variants[a]) & set(variants[b]))
            pair = {}
            both_judged = _judged([variants[a][i] for i in ids]) and _judged([variants[b][i] for i in ids])
            for name in METRICS + (JUDGE_METRICS if both_judged else ()):
                xa = [_outcome(variants[a][i], name) for i in ids]
                xb = [_outcome(variants[b][i], name) for i in ids]
                pair[name] = {"mode": modes[name], "n_pairs": len(ids), "mcnemar": mcnemar(xa, xb),
                              "bootstrap": paired_bootstrap(xa, xb, int(boot["samples"]), int(boot["seed"]))}
            comparison["splits"][split][f"{b}_vs_{a}"] = pair
    return metrics, comparison


def _judged(rows: list[dict]) -> bool:
    """Whether every answer of these rows carries a judge grade (a judged eval file)."""
    return bool(rows) and all("judge_correct" in g for r in rows for g in (r["greedy"], *r["samples"]))


def _outcome(row: dict, name: str) -> bool:
    """One question's binary outcome under a METRICS or JUDGE_METRICS name."""
    if name == "judge_greedy_pass@1":
        return bool(row["greedy"]["judge_correct"])
    if name == "judge_sampling_pass@k":
        return any(s["judge_correct"] for s in row["samples"])
    return bool(row[name])


VARIANT_ORDER = ("base", "sft", "grpo")


def _variant_order(name: str) -> tuple[int, str]:
    return (VARIANT_ORDER.index(name) if name in VARIANT_ORDER else len(VARIANT_ORDER), name)
