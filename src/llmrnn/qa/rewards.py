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
| `1234567` vs `1234568`, `100.0001` vs `100.0002` | any   | different numbers: 0                |
| `-0` vs `0`, `1e3` vs `1000`, `042` vs `42` | any        | equal numbers: 1                    |
| `The  Syncope!`                            | any         | `syncope` (case, punctuation, article) |
| empty / whitespace                         | none        | 0                                   |

Numbers are compared EXACTLY as decimals (no rounding, no tolerance: every digit given counts; the
sign of zero does not). Tag names are matched case-insensitively everywhere: `<Answer>B</Answer>`
counts for the answer AND for the format reward, like `<answer>`.

format: 1 when each required tag pair (default reasoning, answer) opens and closes exactly once, in
that order, each with non-blank content, with nothing after the last closing tag but whitespace; else 0.

judge: the rubric judge service (llmrnn.reward.Scorer, the same client, cache and audit as the memory
head) scores the answer against the reference; the rubric's template sees the question as {visit}, the
reference as {ground_truth} and the answer as {candidate_memory}. Every judged sample goes through the
memory head's fallback guard (llmrnn.reward.FallbackGuard): an unparseable judge answer scores 0.5 AND is
counted, the batch's fallback rate is logged, and too many fallbacks stop training (JudgeDegraded).

fluency: 1 - ln(ppl) / ln(max_ppl) clipped to [0, 1], ppl = perplexity of the response under the base
model (qa.reward.fluency_model); an empty response scores 0.

Per-step diagnostics (STEP_KEYS, both engines): `correct` (exact match), the extraction method as 0/1
flags (`extract_tag`, `extract_answer_line`, `extract_last_line`, `extract_none`), and
`high_reward_but_wrong`: the answer is wrong by exact match yet its reward is at least half the most a
response can earn (sum of the weights) -- a judge or format reward paying for wrong answers.

The verl entry point is `compute_score(data_source, solution_str, ground_truth, extra_info, **kw)`;
TRL's `trl_reward_func(prompts, completions, **columns)` returns the same scores.
"""

from __future__ import annotations

import functools
import json
import math
import re
import string
import unicodedata
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal, InvalidOperation
from typing import Any

from llmrnn.errors import InputError
from llmrnn.reward import JudgeDegraded, JudgeUnavailable, get_scorer, judge_wait_cfg
from llmrnn.reward.config import settings
from llmrnn.reward.entry import verl_values
from llmrnn.reward.modes import ScalarMode
from llmrnn.rubric import scalar_request
from llmrnn.settings import section_defaults

# the per-step keys both engines log live with the training metrics (verl's rollout stats read them there)
from llmrnn.train.metrics import EXTRACT_METHODS, STEP_KEYS, step_metrics  # noqa: F401

DATA_SOURCE = "llmrnn_qa"
# the defaults' one home is llmrnn.settings (qa.reward); fluency_model is set by the train stage, not a config key
DEFAULTS: dict[str, Any] = {**section_defaults("qa.reward"), "fluency_model": None}
DEFAULT_WEIGHTS = DEFAULTS["weights"]
DEFAULT_TAGS = tuple(DEFAULTS["tags"])

_ANSWER_LINE = re.compile(r"(?:final\s+)?answer\s*(?:is|:|=)\s*(.+)", re.IGNORECASE)
_LETTER = re.compile(r"^\(?([a-z])\)?(?:[.):,]|\s|$)")
_NUMBER = re.compile(r"^[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?%?$", re.IGNORECASE)
_ARTICLES = {"a", "an", "the"}
_PUNCT = str.maketrans({c: " " for c in string.punctuation})


# ----------------------------------------------------------------------------- configuration
def reward_config(value: Any = None) -> dict:
    """The reward settings given as the `reward_cfg=` argument (a mapping or its JSON; None: the defaults;
    llmrnn.reward.kwargs); unknown keys are refused."""
    value = settings(value, "qa.reward")
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
    blocks = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, re.DOTALL | re.IGNORECASE)
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
    """The canonical decimal string of a number (exact: Decimal, never float rounding), else None."""
    if not _NUMBER.match(text):
        return None
    try:
        value = Decimal(text.rstrip("%").replace(",", ""))
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    # a context as wide as the text: normalize() never rounds a digit away nor overflows (1e999999999)
    ctx = Context(prec=max(28, len(text)), Emax=MAX_EMAX, Emin=MIN_EMIN)
    value = Decimal(0) if value.is_zero() else value.normalize(ctx)  # -0 == 0; 3.0 == 3
    plain = -40 <= value.adjusted() <= 40  # 1e999999 stays in exponent form, never a million digits
    return (format(value, "f") if plain else str(value)) + ("%" if text.endswith("%") else "")


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
    """1.0 when every tag opens and closes exactly once (tag names in any case), tags in the given order,
    each enclosing non-blank text, and nothing follows the last closing tag."""
    text = text or ""
    pos = 0
    for tag in tags:
        opens = list(re.finditer(rf"<{re.escape(tag)}>", text, re.IGNORECASE))
        closes = list(re.finditer(rf"</{re.escape(tag)}>", text, re.IGNORECASE))
        if len(opens) != 1 or len(closes) != 1 or not pos <= opens[0].start() < closes[0].start():
            return 0.0
        if not text[opens[0].end():closes[0].start()].strip():
            return 0.0
        pos = closes[0].end()
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
    """Score from the running judge service (endpoint and settings from the arguments, like the memory head).
    The result passes the memory head's fallback guard: a judge that stops giving parseable scores during
    training stops it (JudgeDegraded) instead of paying every answer 0.5."""
    return judge_scores([(question, reference, answer)], cfg, **kwargs)[0]


def judge_scores(items: list[tuple[str, str, str]], cfg: dict, **kwargs) -> list[tuple[float, str]]:
    """(score, parse method) of each (question, reference, answer), the judge calls sent concurrently (the
    scorer's pool; identical calls share one request); audited and guarded as judge_score."""
    # the judge is always asked here (whatever reward.mode trains with); its waits are the config's
    scorer = get_scorer(kwargs.get("endpoint_file"), kwargs.get("rubric_file") or cfg.get("rubric"),
                        kwargs.get("audit_dir"), reward_cfg=judge_wait_cfg(kwargs.get("reward_cfg")),
                        guard=kwargs.get("guard"))
    steps = [{"visit": q, "ground_truth_diagnoses": ref} for q, ref, _ in items]
    try:
        calls = scorer.judge_many([scalar_request(scorer.rubric, step, answer or "(empty)")
                                   for step, (_, _, answer) in zip(steps, items)])
    except JudgeUnavailable as exc:
        scorer.stop_reason(str(exc))
        raise
    out = []
    for (question, reference, answer), call in zip(items, calls):
        result = ScalarMode.read_answer(scorer.rubric, call)
        scorer.audit.write({"kind": "qa_judge", "question": question, "answer": answer, "reference": reference,
                            "response": call.response, "score": result["judge_score"],
                            "parse_method": result["parse_method"]})
        out.append((float(result["judge_score"]), result["parse_method"]))
    if scorer.guard is not None:
        try:  # valid_json: the guard's "the judge was asked" flag (qa answers are always sent)
            scorer.guard.record([{"valid_json": True, "parse_method": method} for _, method in out])
        except JudgeDegraded as exc:
            scorer.stop_reason(str(exc))
            raise
    return out


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


def step_diagnostics(result: dict, weights: dict) -> dict:
    """The STEP_KEYS of one scored response (numbers, so verl can average them per step)."""
    correct = float(result["exact_match"])
    out = {"correct": correct}
    out.update({f"extract_{m}": float(result["extract_method"] == m) for m in EXTRACT_METHODS})
    best = sum(weights.values())
    out["high_reward_but_wrong"] = float(not correct and result["score"] >= 0.5 * best)
    return out


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None,
                  **kwargs) -> dict:
    """verl's reward signature; returns {"score", one key per component, STEP_KEYS, extraction diagnostics}.
    numeric_only=True (verl averages every key it gets back) keeps numbers only; with the judge on it adds
    the memory head's `valid_json`/`parse_fallback` flags, which llmrnn's verl step stats count."""
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
            str(gt["question"]) if "question" in gt else "", str(gt["answer"]), answer, cfg, **kwargs)
    score = float(sum(weights[name] * value for name, value in parts.items()))
    diagnostics = step_diagnostics({**em, "score": score}, weights)
    if numeric_only:
        judged = {}
        if "judge_parse_method" in out:
            judged = {"valid_json": 1.0, "parse_fallback": float(out["judge_parse_method"] == "fallback")}
        out = {"extracted_by_tag": diagnostics["extract_tag"], **judged}
        return verl_values({"score": score, **parts, **diagnostics, **out}, "llmrnn.qa.rewards.compute_score")
    return {"score": score, **parts, **diagnostics, **out}


def _completion_text(completion: Any) -> str:
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return completion[-1].get("content") or ""
    if isinstance(completion, dict):
        return completion.get("content") or ""
    return str(completion or "")


def trl_reward_func(prompts: list, completions: list, **columns) -> list[float]:
    """TRL GRPOTrainer reward: the parquet columns arrive as lists; same values as compute_score. The
    batch's step_metrics go to TRL's `log_metric` (metrics.jsonl raw: qa/correct, qa/extract_*,
    qa/high_reward_but_wrong[_count], judge_fallback_rate)."""
    n = len(completions)
    reward_model = columns.get("reward_model") or [None] * n
    sources = columns.get("data_source") or [DATA_SOURCE] * n
    extra = columns.get("extra_info") or [{}] * n
    kw = {k: columns[k] for k in ("reward_cfg", "endpoint_file", "rubric_file", "audit_dir", "guard") if k in columns}
    results = []
    for completion, rm, source, info in zip(completions, reward_model, sources, extra):
        gt = rm.get("ground_truth") if isinstance(rm, dict) else rm
        if gt is None:
            raise InputError("qa trl_reward_func: column reward_model.ground_truth missing (verl parquet format)")
        results.append(compute_score(source, _completion_text(completion), gt, info, **kw))
    if callable(columns.get("log_metric")):  # TRL >= 1.x hands reward functions a per-step logger
        for name, value in step_metrics(results).items():
            columns["log_metric"](name, value)
    return [r["score"] for r in results]
