"""Verifiable rewards of the qa recipe, composable with weights (config `qa.reward.weights`).

Every component is in [0, 1]; the score is the weighted SUM of the enabled components (weight 0 = off,
never computed). Edge tables (tests/test_qa_rewards.py pins every row):

exact_match (answer extracted, then normalised; the reference is normalised the same way)
| response                                   | extraction  | compared as                         |
|--------------------------------------------|-------------|-------------------------------------|
| `... <answer> B </answer>`                 | tag (last)  | MC letter `b`                       |
| `... Answer: (b).`                         | answer_line | MC letter `b`                       |
| option text with options given            | any         | its letter (`Syncope` -> `c`)       |
| `1,000.50` vs `1000.5`                     | any         | number `1000.5` (also `+3` = `3.0`) |
| `The  Syncope!`                            | any         | `syncope` (case, punctuation, article) |
| empty / whitespace                         | none        | 0                                   |

format: 1 when each required tag pair (default reasoning, answer) opens and closes exactly once, in
that order, with nothing after the last closing tag but whitespace; else 0.

judge: the rubric judge service (llmrnn.reward.Scorer, the same client, cache and audit as the memory
head) scores the answer against the reference; the rubric's template sees the question as {visit}, the
reference as {ground_truth} and the answer as {candidate_memory}.

fluency: 1 - ln(ppl) / ln(max_ppl) clipped to [0, 1], ppl = perplexity of the response under the base
model (qa.reward.fluency_model); an empty response scores 0.

The verl entry point is `compute_score(data_source, solution_str, ground_truth, extra_info, **kw)`;
TRL's `trl_reward_func(prompts, completions, **columns)` returns the same scores.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import string
import unicodedata
from typing import Any

from llmrnn.errors import InputError

DATA_SOURCE = "llmrnn_qa"
DEFAULT_WEIGHTS = {"exact_match": 1.0, "format": 0.0, "judge": 0.0, "fluency": 0.0}
DEFAULT_TAGS = ("reasoning", "answer")
DEFAULTS: dict[str, Any] = {
    "weights": DEFAULT_WEIGHTS,
    "tags": list(DEFAULT_TAGS),
    "answer_tag": "answer",
    "fluency_model": None,
    "fluency_max_ppl": 1000.0,
    "rubric": None,
}

_ANSWER_LINE = re.compile(r"(?:final\s+)?answer\s*(?:is|:|=)\s*(.+)", re.IGNORECASE)
_LETTER = re.compile(r"^\(?([a-z])\)?(?:[.):,]|\s|$)")
_NUMBER = re.compile(r"^[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?%?$")
_ARTICLES = {"a", "an", "the"}
_PUNCT = str.maketrans({c: " " for c in string.punctuation})


# ----------------------------------------------------------------------------- configuration
def reward_config(value: Any = None) -> dict:
    """The reward settings: a dict, a JSON string, or (None) the environment; unknown keys are refused."""
    if value is None:  # the train stage exports the reward section (llmrnn.reward.reward_env)
        from llmrnn.reward import ENV_CFG

        value = os.environ.get(ENV_CFG) or "{}"
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise InputError(f"qa.reward: not JSON: {exc}") from exc
    unknown = sorted(set(value) - set(DEFAULTS))
    if unknown:
        raise InputError(f"qa.reward: unknown key(s) {unknown}")
    cfg = {**DEFAULTS, **value}
    weights = {**DEFAULT_WEIGHTS, **(value.get("weights") or {})}
    bad = sorted(set(weights) - set(DEFAULT_WEIGHTS))
    if bad:
        raise InputError(f"qa.reward.weights: unknown reward(s) {bad}; known: {sorted(DEFAULT_WEIGHTS)}")
    for name, w in weights.items():
        if not isinstance(w, (int, float)) or isinstance(w, bool) or w < 0:
            raise InputError(f"qa.reward.weights.{name}: expected a number >= 0, got {w!r}")
    if not any(weights.values()):
        raise InputError("qa.reward.weights: every weight is 0; GRPO would see constant rewards")
    if weights["fluency"] and not cfg["fluency_model"]:
        raise InputError("qa.reward.weights.fluency > 0 needs qa.reward.fluency_model (the base model folder)")
    cfg["weights"] = weights
    return cfg


# ----------------------------------------------------------------------------- extraction + normalisation
def extract_answer(text: str, tag: str = "answer") -> tuple[str | None, str]:
    """(answer, method): the last <tag>...</tag>, else the last `Answer: X` line, else the last line."""
    text = text or ""
    blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", text, re.DOTALL | re.IGNORECASE)
    if blocks and blocks[-1].strip():
        return blocks[-1].strip(), "tag"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        match = _ANSWER_LINE.search(line)
        if match and match.group(1).strip():
            return match.group(1).strip(), "answer_line"
    if lines:
        return lines[-1], "last_line"
    return None, "none"


def _number(text: str) -> str | None:
    if not _NUMBER.match(text):
        return None
    value = float(text.rstrip("%").replace(",", ""))
    return f"{value:g}" + ("%" if text.endswith("%") else "")


def normalize_text(text: str) -> str:
    """Lower case, NFKC, punctuation to spaces, articles dropped, whitespace collapsed."""
    text = unicodedata.normalize("NFKC", text).lower().translate(_PUNCT)
    return " ".join(w for w in text.split() if w not in _ARTICLES)


def normalize_answer(text: str | None, options: dict | None = None) -> str:
    """The comparable form of an answer: an MC letter, a canonical number, or normalised text."""
    if text is None:
        return ""
    raw = unicodedata.normalize("NFKC", text).strip().strip("*_`\"'").strip()
    number = _number(raw.rstrip(".").strip())
    if number is not None:
        return number
    low = raw.lower()
    letters = {str(k).strip().lower() for k in (options or {})}
    match = _LETTER.match(low)
    if match and (not options or match.group(1) in letters):
        rest = normalize_text(low[match.end():])
        # "(b) syncope" and "b." are the letter; "a fever" (article) is text, unless options name "a"
        if not rest or options and rest == normalize_text(str(_option(options, match.group(1)))):
            return match.group(1)
    norm = normalize_text(raw)
    for key, value in (options or {}).items():
        if norm and norm == normalize_text(str(value)):
            return str(key).strip().lower()
    return norm


def _option(options: dict, letter: str) -> Any:
    return next((v for k, v in options.items() if str(k).strip().lower() == letter), None)


def exact_match(solution: str, reference: str, options: dict | None = None, tag: str = "answer") -> dict:
    answer, method = extract_answer(solution, tag)
    got = normalize_answer(answer, options)
    want = normalize_answer(reference, options)
    valid = not options or want in {str(k).strip().lower() for k in options}  # else no answer can be right
    return {"exact_match": float(bool(got) and got == want and valid), "extracted": answer, "extract_method": method,
            "normalized": got}


def format_score(text: str, tags: tuple[str, ...] | list[str] = DEFAULT_TAGS) -> float:
    """1.0 when every tag opens and closes exactly once, tags in the given order, nothing after the last."""
    text = text or ""
    pos = 0
    for tag in tags:
        opens = [m.start() for m in re.finditer(rf"<{tag}>", text)]
        closes = [m.start() for m in re.finditer(rf"</{tag}>", text)]
        if len(opens) != 1 or len(closes) != 1 or not pos <= opens[0] < closes[0]:
            return 0.0
        pos = closes[0] + len(tag) + 3
    return float(not text[pos:].strip())


# ----------------------------------------------------------------------------- fluency (perplexity)
@functools.lru_cache(maxsize=2)
def _lm(model_dir: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return tokenizer, model


def perplexity(text: str, model_dir: str, max_tokens: int = 512) -> float | None:
    """Perplexity of `text` under the model (BOS-conditioned when the tokenizer has one); None if < 2 tokens."""
    import torch

    tokenizer, model = _lm(str(model_dir))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:max_tokens]
    if tokenizer.bos_token_id is not None:
        ids = [tokenizer.bos_token_id, *ids]
    if len(ids) < 2:
        return None
    with torch.no_grad():
        tensor = torch.tensor([ids])
        loss = model(input_ids=tensor, labels=tensor).loss
    return float(torch.exp(loss))


def fluency_score(text: str, model_dir: str, max_ppl: float = 1000.0) -> tuple[float, float | None]:
    if not (text or "").strip():
        return 0.0, None
    ppl = perplexity(text, model_dir)
    if ppl is None:
        return 0.0, None
    return max(0.0, min(1.0, 1.0 - math.log(max(ppl, 1.0)) / math.log(max_ppl))), ppl


# ----------------------------------------------------------------------------- judge (the rubric service)
def judge_score(question: str, reference: str, answer: str, cfg: dict, **kwargs) -> tuple[float, str]:
    """Score from the running judge service (endpoint from kwargs or the environment, like the memory head)."""
    from llmrnn.reward import get_scorer
    from llmrnn.rubric import scalar_request

    scorer = get_scorer(kwargs.get("endpoint_file"), kwargs.get("rubric_file") or cfg.get("rubric"),
                        kwargs.get("audit_dir"), reward_cfg={})
    step = {"visit": question, "ground_truth_diagnoses": reference}
    call = scorer.judge(scalar_request(scorer.rubric, step, answer or "(empty)"))
    result = scorer._scalar_result(call)
    scorer.audit.write({"kind": "qa_judge", "question": question, "answer": answer, "reference": reference,
                        "response": call.response, "score": result["judge_score"]})
    return float(result["judge_score"]), result["parse_method"]


# ----------------------------------------------------------------------------- entry points
def parse_ground_truth(ground_truth: Any) -> dict:
    """The row's ground truth: JSON {answer, options?, question?} (or a bare answer string)."""
    if isinstance(ground_truth, dict):
        gt = ground_truth
    else:
        try:
            gt = json.loads(ground_truth)
        except (TypeError, json.JSONDecodeError):
            gt = {"answer": str(ground_truth)}
        if not isinstance(gt, dict):
            gt = {"answer": str(ground_truth)}
    if gt.get("answer") in (None, ""):
        raise InputError(f"qa reward: ground_truth has no answer: {str(ground_truth)[:80]!r}")
    return gt


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None,
                  **kwargs) -> dict:
    """verl's reward signature; returns {"score", one key per component, extraction diagnostics}.
    numeric_only=True (verl averages every key it gets back) drops the text diagnostics."""
    numeric_only = bool(kwargs.pop("numeric_only", False))
    cfg = reward_config(kwargs.pop("reward_cfg", None))
    gt = parse_ground_truth(ground_truth)
    weights = cfg["weights"]
    em = exact_match(solution_str, str(gt["answer"]), gt.get("options"), cfg["answer_tag"])
    parts = {"exact_match": em["exact_match"]}
    out: dict[str, Any] = {"extracted": em["extracted"], "extract_method": em["extract_method"]}
    if weights["format"]:
        parts["format"] = format_score(solution_str, cfg["tags"])
    if weights["fluency"]:
        parts["fluency"], out["perplexity"] = fluency_score(solution_str, cfg["fluency_model"],
                                                            float(cfg["fluency_max_ppl"]))
    if weights["judge"]:
        answer = em["extracted"] or ""
        parts["judge"], out["judge_parse_method"] = judge_score(
            str(gt.get("question", "")), str(gt["answer"]), answer, cfg, **kwargs)
    score = sum(weights[name] * value for name, value in parts.items())
    if numeric_only:
        out = {"extracted_by_tag": float(out["extract_method"] == "tag")}
    return {"score": float(score), **parts, **out}


def _completion_text(completion: Any) -> str:
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return completion[-1].get("content") or ""
    if isinstance(completion, dict):
        return completion.get("content") or ""
    return str(completion or "")


def trl_reward_func(prompts: list, completions: list, **columns) -> list[float]:
    """TRL GRPOTrainer reward: the parquet columns arrive as lists; same values as compute_score."""
    n = len(completions)
    reward_model = columns.get("reward_model") or [None] * n
    sources = columns.get("data_source") or [DATA_SOURCE] * n
    extra = columns.get("extra_info") or [{}] * n
    kw = {k: columns[k] for k in ("reward_cfg", "endpoint_file", "rubric_file", "audit_dir") if k in columns}
    scores = []
    for completion, rm, source, info in zip(completions, reward_model, sources, extra):
        gt = rm.get("ground_truth") if isinstance(rm, dict) else rm
        if gt is None:
            raise InputError("qa trl_reward_func: column reward_model.ground_truth missing (verl parquet format)")
        scores.append(compute_score(source, _completion_text(completion), gt, info, **kw)["score"])
    return scores
