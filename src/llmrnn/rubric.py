"""Rubric files (config/rubrics/*.yaml): the single source of truth for the judge.

One file names the rubric text, the judge model, the judge prompt templates (scalar and pairwise), the
sampling of the judge call (T=0, max_tokens, logprobs) and the serving settings (engine, port,
max_model_len, gpu_memory_utilization, dtype). The judge server rule and the reward read the same file,
so they cannot drift apart (the reference kept rubric + model + serving in one YAML for that reason).

This module loads and validates a rubric (omegaconf; an unknown key is an error), renders judge
requests from a TrajectoryStep, and parses judge answers by the reference's edge table:

| condition                                         | score                    | parse_method   |
|---------------------------------------------------|--------------------------|----------------|
| logprobs asked for and digit tokens present       | expected digit / max     | expected       |
| answer has a `Score: N` line (the FIRST one)      | N / max                  | score_line     |
| short answer (< 20 chars) with a digit            | last digit / max         | short_digit    |
| anything else (long, no score; short, no digit)   | 0.5                      | fallback       |

(the policy-side row "invalid policy JSON -> 0.05" lives in llmrnn.reward, it needs no judge call).

The judge call stops at its answer: `request.stop` / `pairwise.stop` are sent as `stop` with vLLM's
`include_stop_str_in_output` (the score line that ends the answer stays in it), and a rubric that lets the
judge write more than SHORT_ANSWER_MAX_TOKENS tokens must name those stops. Without them a raw-prompt judge
writes on past its score (a new "example" with its own `Score:` line) until max_tokens; the parser reads
the FIRST score line, the answer's own, either way.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmrnn.errors import InputError
from llmrnn.io import read_yaml

ENGINES = ("llmrnn", "vllm")
JUDGE_SOURCE = "local"  # a rubric's judge.source when it names none: resources/models/<model>
APIS = ("chat", "completions")
SCORE_METHODS = ("text", "expected")
SHORT_ANSWER_CHARS = 20
SHORT_ANSWER_MAX_TOKENS = 64  # a judge allowed more tokens must name where its answer ends (stop)
FALLBACK_SCORE = 0.5

# Fields a template may use (all strings; lists/dicts are rendered as readable text).
SCALAR_FIELDS = {
    "rubric", "candidate_memory", "previous_memory", "reference_memory", "memory_prompt", "visit",
    "prediction", "evaluation", "ground_truth", "next_visit", "next_prediction", "next_primary",
    "next_evaluation", "next_ground_truth",
}
PAIRWISE_FIELDS = (SCALAR_FIELDS - {"candidate_memory"}) | {"memory_a", "memory_b"}

# A line that starts with "Score: N" (markdown allowed): "Clinical accuracy score: 3" inside a chain of
# thought does NOT match (the rubric-v1 bug grabbed such numbers); "Score: 7.5" does not match either.
_SCORE_LINE = re.compile(r"^[\s>*#_-]*(?:final\s+)?score[\s*_]*[:=][\s*_]*(\d+)(?!\d)(?![.,]\d)", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class Serving:
    engine: str = "llmrnn"
    host: str = "127.0.0.1"
    port: int = 0  # 0 = pick a free port at start
    max_model_len: int = 4096
    gpu_memory_utilization: float = 0.9
    dtype: str = "float32"
    startup_timeout_s: float = 900.0
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Request:
    api: str = "chat"
    temperature: float = 0.0
    max_tokens: int = 16
    score_method: str = "text"  # "expected": probability-weighted digit score from logprobs (G-Eval style)
    top_logprobs: int = 20
    assistant_prefix: str = ""  # continue the judge's answer from this text (e.g. "Score:")
    system: str = ""
    stop: tuple[str, ...] = ()  # the answer ends with one of these (kept in the answer), e.g. "Score: 7"


@dataclass(frozen=True)
class Pairwise:
    template: str = ""
    assistant_prefix: str = ""
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    verdict_regex: str = r"(?i)(?:winner|verdict|better(?: response)?)\s*[:=]?\s*\**\s*(?:response\s*)?\[*\s*(A|B|tie)\b"


@dataclass(frozen=True)
class Rubric:
    path: str
    name: str
    model: str  # a local model name under resources/models/, a path, or a hub repo id
    model_source: str  # "local" (resources/models/<model>, made by prepare_base_model) | "hub" | "path"
    served_model_name: str
    rubric: str
    template: str
    serving: Serving
    request: Request
    pairwise: Pairwise
    scale_max: int = 9
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def needs_gpu(self) -> bool:
        return self.serving.engine == "vllm"


# ----------------------------------------------------------------------------- loading
_TOP_KEYS = {"name", "description", "judge", "serving", "request", "scale", "rubric", "template", "pairwise"}


def _section(raw: dict, key: str, cls, path: str) -> Any:
    values = raw.get(key) or {}
    if not isinstance(values, dict):
        raise InputError(f"{path}: {key}: expected a mapping")
    allowed = set(cls.__dataclass_fields__)
    unknown = set(values) - allowed
    if unknown:
        raise InputError(f"{path}: {key}: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    for name in ("extra_args", "stop"):
        if name in values:
            items = values[name] or ()
            if isinstance(items, str) or not all(isinstance(a, str) and a for a in items):
                raise InputError(f"{path}: {key}.{name}: expected a list of non-empty strings")
            values = dict(values, **{name: tuple(items)})
    try:
        return cls(**values)
    except TypeError as exc:
        raise InputError(f"{path}: {key}: {exc}") from exc


def _placeholders(template: str) -> set[str]:
    names = set()
    for _, name, _, _ in string.Formatter().parse(template):
        if name is not None:
            names.add(name)
    return names


def load_rubric(path: str | Path) -> Rubric:
    """Load and validate a rubric YAML; a bad key, engine or template field is one clear InputError."""
    p = str(path)
    if not Path(p).is_file():
        raise InputError(f"{p}: rubric file not found")
    try:  # the one YAML policy (llmrnn.io.read_yaml), then OmegaConf for ${...} interpolation
        raw = read_yaml(p, "rubric file") or {}
    except (OSError, ValueError) as exc:
        raise InputError(f"{p}: not a readable rubric YAML: {exc}") from exc
    if "${" in json.dumps(raw, default=str):
        # only where a rubric interpolates: importing OmegaConf is a sixth of every Snakemake start
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        try:
            raw = OmegaConf.to_container(OmegaConf.create(raw), resolve=True)
        except (OmegaConfBaseException, ValueError) as exc:  # its message goes on over lines: the first says it
            raise InputError(f"{p}: not a readable rubric YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise InputError(f"{p}: expected a mapping at top level")
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise InputError(f"{p}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_TOP_KEYS)}")
    for key in ("name", "judge", "rubric", "template"):
        if not raw.get(key):
            raise InputError(f"{p}: {key}: missing")
    judge = raw["judge"]
    if not isinstance(judge, dict) or not judge.get("model"):
        raise InputError(f"{p}: judge.model: missing")
    unknown = set(judge) - {"model", "source", "served_model_name"}
    if unknown:
        raise InputError(f"{p}: judge: unknown key(s) {sorted(unknown)}")
    source = judge.get("source", JUDGE_SOURCE)
    if source not in ("local", "hub", "path"):
        raise InputError(f"{p}: judge.source: {source!r} is not one of local, hub, path")
    serving = _section(raw, "serving", Serving, p)
    request = _section(raw, "request", Request, p)
    pairwise = _section(raw, "pairwise", Pairwise, p)
    if serving.engine not in ENGINES:
        raise InputError(f"{p}: serving.engine: {serving.engine!r} is not one of {', '.join(ENGINES)}")
    if serving.host not in ("127.0.0.1", "localhost", "::1"):
        raise InputError(f"{p}: serving.host: {serving.host!r}: the judge binds to loopback only")
    if request.api not in APIS:
        raise InputError(f"{p}: request.api: {request.api!r} is not one of {', '.join(APIS)}")
    if request.score_method not in SCORE_METHODS:
        raise InputError(f"{p}: request.score_method: {request.score_method!r} is not one of text, expected")
    if request.api == "completions" and serving.engine == "llmrnn":
        raise InputError(
            f"{p}: request.api: completions (a raw prompt) needs serving.engine vllm; the llmrnn engine "
            "serves /v1/chat/completions"
        )
    for label, section in (("request", request), ("pairwise", pairwise)):
        if section.max_tokens > SHORT_ANSWER_MAX_TOKENS and not section.stop:
            raise InputError(
                f"{p}: {label}.max_tokens: {section.max_tokens} tokens allow a long answer, but {label}.stop "
                f"names no end for it (e.g. the score lines 'Score: 1' .. 'Score: 9'): the judge would write on "
                f"past its answer; add {label}.stop or keep max_tokens <= {SHORT_ANSWER_MAX_TOKENS}"
            )
    if request.temperature != 0:
        raise InputError(f"{p}: request.temperature: the judge samples greedily (0), got {request.temperature}")
    scale = raw.get("scale") or {}
    scale_max = int(scale.get("max", 9)) if isinstance(scale, dict) else 9
    if not 1 <= scale_max <= 9:
        raise InputError(f"{p}: scale.max: must be 1..9 (one digit), got {scale_max}")
    for label, template, allowed in (
        ("template", raw["template"], SCALAR_FIELDS),
        ("pairwise.template", pairwise.template, PAIRWISE_FIELDS),
    ):
        try:
            used = _placeholders(template)
        except ValueError as exc:
            raise InputError(f"{p}: {label}: bad placeholder syntax: {exc}") from exc
        bad = used - allowed
        if bad:
            raise InputError(f"{p}: {label}: unknown field(s) {sorted(bad)}; allowed: {sorted(allowed)}")
    if "candidate_memory" not in _placeholders(raw["template"]):
        raise InputError(f"{p}: template: must show the judge {{candidate_memory}}")
    try:
        re.compile(pairwise.verdict_regex)
    except re.error as exc:
        raise InputError(f"{p}: pairwise.verdict_regex: {exc}") from exc
    return Rubric(
        path=p,
        name=str(raw["name"]),
        model=str(judge["model"]),
        model_source=source,
        served_model_name=str(judge.get("served_model_name") or judge["model"]),
        rubric=str(raw["rubric"]).strip(),
        template=str(raw["template"]),
        serving=serving,
        request=request,
        pairwise=pairwise,
        scale_max=scale_max,
        raw=raw,
    )


# ----------------------------------------------------------------------------- rendering
def _text(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, str):
        return value.strip() or "(empty)"
    if isinstance(value, list):
        return "; ".join(_text(v) for v in value) or "(none)"
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def memory_text(memory: Any) -> str:
    """The evolving summary inside a memory JSON string (or the text itself when it is not JSON)."""
    if isinstance(memory, dict):
        return _text(memory.get("evolving_summary", memory))
    if isinstance(memory, str):
        try:
            parsed = json.loads(memory)
        except json.JSONDecodeError:
            return _text(memory)
        if isinstance(parsed, dict) and "evolving_summary" in parsed:
            return _text(parsed["evolving_summary"])
    return _text(memory)


def step_fields(step: dict, rubric: Rubric) -> dict[str, str]:
    """Template fields from a TrajectoryStep (the judge sees the next visit's outcome: rubric v2)."""
    next_prediction = step.get("next_prediction") or {}
    primary = next_prediction.get("primary_diagnosis") if isinstance(next_prediction, dict) else None
    return {
        "rubric": rubric.rubric,
        "previous_memory": memory_text(step.get("h_prev")),
        "reference_memory": memory_text(step.get("h_ref")),
        "memory_prompt": _text(step.get("update_prompt")),
        "visit": _text(step.get("visit")),
        "prediction": _text(step.get("prediction")),
        "evaluation": _text(step.get("evaluation")),
        "ground_truth": _text(step.get("ground_truth_diagnoses")),
        "next_visit": _text(step.get("next_visit")),
        "next_prediction": _text(next_prediction),
        "next_primary": _text(primary),
        "next_evaluation": _text(step.get("next_evaluation")),
        "next_ground_truth": _text(step.get("next_ground_truth_diagnoses")),
    }


def _request_body(rubric: Rubric, prompt: str, prefix: str, max_tokens: int, logprobs: bool,
                  stop: tuple[str, ...] = ()) -> dict:
    req = rubric.request
    body: dict[str, Any] = {
        "model": rubric.served_model_name,
        "temperature": req.temperature,
        "max_tokens": max_tokens,
        "n": 1,
    }
    if stop:  # vLLM's extension keeps the matched stop (the score line) in the answer
        body.update(stop=list(stop), include_stop_str_in_output=True)
    if req.api == "chat":
        messages = []
        if req.system:
            messages.append({"role": "system", "content": req.system})
        messages.append({"role": "user", "content": prompt})
        if prefix:
            # vLLM and our server continue the assistant turn from this prefix.
            messages.append({"role": "assistant", "content": prefix})
            body.update(continue_final_message=True, add_generation_prompt=False)
        body["messages"] = messages
        if logprobs:
            body.update(logprobs=True, top_logprobs=req.top_logprobs)
    else:
        body["prompt"] = prompt + prefix
        if logprobs:
            body["logprobs"] = req.top_logprobs
    return body


@dataclass(frozen=True)
class JudgeRequest:
    """One judge call: the HTTP body plus what the parser needs to read the answer."""

    path: str  # "/chat/completions" or "/completions"
    body: dict
    prompt: str
    prefix: str

    @property
    def wants_logprobs(self) -> bool:
        return self.body.get("logprobs") not in (None, False)

    def key(self) -> str:
        return hashlib.sha256(json.dumps([self.path, self.body], sort_keys=True).encode()).hexdigest()


def _path(rubric: Rubric) -> str:
    return "/chat/completions" if rubric.request.api == "chat" else "/completions"


def score_regex(rubric: Rubric, prefix: str) -> str:
    """The answer a scalar judge may write: anything, then a `Score: N` line with N in 1..scale_max (the
    SCORE_LINE the parser reads first); after an assistant prefix ending in "Score:" only the number."""
    numbers = "|".join(str(n) for n in range(rubric.scale_max, 0, -1))  # longest first: 10 before 1
    if re.search(r"(?i)score:\s*$", prefix):
        return f"{' ?' if not prefix.endswith(' ') else ''}({numbers})"
    return rf"([\s\S]*\n)?Score: ({numbers})"


def scalar_request(rubric: Rubric, step: dict, candidate_memory: str) -> JudgeRequest:
    fields = step_fields(step, rubric)
    fields["candidate_memory"] = memory_text(candidate_memory)
    prompt = rubric.template.format(**fields)
    prefix = rubric.request.assistant_prefix
    body = _request_body(
        rubric, prompt, prefix, rubric.request.max_tokens, rubric.request.score_method == "expected",
        rubric.request.stop,
    )
    if rubric.serving.engine == "vllm" and rubric.request.score_method == "text":
        # vLLM constrains the judge's answer to end in its score line, so no parse can fail. vLLM >= 0.12 (0.17.1
        # beside verl 0.7.1, and today's) reads only `structured_outputs`; the older `guided_regex` is ignored
        # there with a 200 (tests/test_vllm.py checks the served engine honours this one). Not for
        # score_method expected: a grammar mask would change the digit probabilities it reads. Not for the
        # policy's own sampling: that stays unconstrained (GRPO's rollouts must be on-policy).
        body["structured_outputs"] = {"regex": score_regex(rubric, prefix)}
    return JudgeRequest(_path(rubric), body, prompt, prefix)


def pairwise_request(rubric: Rubric, step: dict, memory_a: str, memory_b: str) -> JudgeRequest:
    if not rubric.pairwise.template:
        raise InputError(f"{rubric.path}: pairwise.template: missing (needed for reward.mode: pairwise)")
    fields = step_fields(step, rubric)
    fields.update(memory_a=memory_text(memory_a), memory_b=memory_text(memory_b))
    prompt = rubric.pairwise.template.format(**fields)
    prefix = rubric.pairwise.assistant_prefix
    body = _request_body(rubric, prompt, prefix, rubric.pairwise.max_tokens, False, rubric.pairwise.stop)
    return JudgeRequest(_path(rubric), body, prompt, prefix)


# ----------------------------------------------------------------------------- parsing
def _lp_entry_problem(entry: Any) -> str | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("token"), str):
        return "a logprobs entry has no token"
    if not _finite(entry.get("logprob")):
        return "a logprobs entry has no numeric logprob"
    tops = entry.get("top_logprobs") or []
    if not isinstance(tops, list) or any(
            not isinstance(t, dict) or not isinstance(t.get("token"), str) or not _finite(t.get("logprob"))
            for t in tops):
        return "top_logprobs is not a list of {token, logprob}"
    return None


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _logprobs_problem(lp: Any, chat: bool) -> str | None:
    if not isinstance(lp, dict):
        return "logprobs were asked for but the answer has none"
    if chat:
        content = lp.get("content")
        if not isinstance(content, list) or not content:
            return "logprobs.content is missing or empty"
        return next((p for p in map(_lp_entry_problem, content) if p), None)
    tokens, values, tops = lp.get("tokens"), lp.get("token_logprobs"), lp.get("top_logprobs")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        return "logprobs.tokens is missing or empty"
    if not isinstance(values, list) or len(values) != len(tokens):
        return "logprobs.token_logprobs does not match logprobs.tokens"
    if not isinstance(tops, list) or any(t is not None and (not isinstance(t, dict) or not all(
            isinstance(k, str) and _finite(v) for k, v in t.items())) for t in tops):
        return "logprobs.top_logprobs is not a list of {token: logprob}"
    return None


def response_problem(payload: Any, logprobs: bool = False) -> str | None:
    """Why a judge's HTTP 200 payload is no answer at all (None when it is one): no choices, a choice
    without text, empty content, or missing/malformed logprobs when they were asked for. Such payloads
    are transport-level failures (the client retries, then raises JudgeUnavailable), never a parsed
    score: a server that answers nothing must not turn into the 0.5 fallback."""
    if not isinstance(payload, dict):
        return "the answer is not a JSON object"
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices:
        return "the answer has no choices"
    choice = choices[0]
    if not isinstance(choice, dict):
        return "choices[0] is not an object"
    chat = "message" in choice
    if chat and not isinstance(choice["message"], dict):
        return "choices[0].message is not an object"
    text = choice["message"].get("content") if chat else choice.get("text")
    if not isinstance(text, str):
        return "choices[0] has no text content"
    if not text.strip():
        return "the answer's content is empty"
    if logprobs:
        return _logprobs_problem(choice.get("logprobs"), chat)
    return None


def response_text(payload: dict) -> str:
    """The first choice's text from an OpenAI chat or completions response that passed response_problem."""
    choice = payload["choices"][0]
    if "message" in choice:
        return choice["message"]["content"]
    return choice["text"]


def _position_alternatives(payload: dict) -> list[tuple[str, dict[str, float]]]:
    """Per generated token: (chosen token, {alternative token: logprob}) for chat or completions logprobs."""
    choice = (payload.get("choices") or [{}])[0]
    lp = choice.get("logprobs")
    if not lp:
        return []
    if "content" in lp:  # chat format
        out = []
        for entry in lp.get("content") or []:
            alts = {a["token"]: a["logprob"] for a in entry.get("top_logprobs") or []}
            alts.setdefault(entry["token"], entry["logprob"])
            out.append((entry["token"], alts))
        return out
    tokens = lp.get("tokens") or []
    tops = lp.get("top_logprobs") or []
    out = []
    for i, tok in enumerate(tokens):
        alts = dict(tops[i]) if i < len(tops) and tops[i] else {}
        if i < len(lp.get("token_logprobs") or []):
            alts.setdefault(tok, lp["token_logprobs"][i])
        out.append((tok, alts))
    return out


def _is_digit(text: str) -> bool:
    """One ASCII digit. str.isdigit() also accepts superscripts ('¹') and other marks int() refuses: a
    judge's top logprobs do hold such tokens (SmolLM2's did)."""
    return len(text) == 1 and text in "0123456789"


def expected_digit(payload: dict, scale_max: int = 9) -> tuple[float, dict[str, float]] | None:
    """G-Eval style: at the first generated position whose chosen token is a digit, the probability-
    weighted mean of the digit tokens 1..scale_max among the top logprobs (renormalised)."""
    for chosen, alts in _position_alternatives(payload):
        if not _is_digit(chosen.strip()[:1]):
            continue
        probs: dict[str, float] = {}
        for tok, logprob in alts.items():
            t = tok.strip()
            if _is_digit(t) and 1 <= int(t) <= scale_max and logprob is not None:
                probs[t] = probs.get(t, 0.0) + math.exp(logprob)
        total = sum(probs.values())
        if total <= 0:
            return None
        mean = sum(int(d) * p for d, p in probs.items()) / total
        return mean, {d: round(p / total, 6) for d, p in sorted(probs.items())}
    return None


@dataclass(frozen=True)
class Parsed:
    score: float
    parse_method: str
    raw_score: float | None = None  # the judge's number before scaling (N, digit, or expected value)
    digit_probs: dict | None = None


def parse_scalar(text: str, scale_max: int = 9, payload: dict | None = None, prefix: str = "",
                 use_logprobs: bool = False) -> Parsed:
    """The reference's edge table (module docstring); `prefix` is the assistant prefix the judge continued.
    The FIRST score line is the answer's: whatever follows it is a continuation past the answer."""
    if use_logprobs and payload is not None:
        exp = expected_digit(payload, scale_max)
        if exp is not None:
            value, probs = exp
            return Parsed(value / scale_max, "expected", value, probs)
    full = prefix + text
    matches = [int(m) for m in _SCORE_LINE.findall(full) if 1 <= int(m) <= scale_max]
    if matches:
        n = matches[0]
        return Parsed(n / scale_max, "score_line", float(n))
    stripped = text.strip()
    if len(stripped) < SHORT_ANSWER_CHARS:
        digits = [c for c in stripped if _is_digit(c)]
        if digits:
            d = min(int(digits[-1]), scale_max)
            return Parsed(d / scale_max, "short_digit", float(d))
    return Parsed(FALLBACK_SCORE, "fallback")


def parse_verdict(text: str, rubric: Rubric) -> str | None:
    """'A', 'B', 'tie' or None (unparsed) from a pairwise judge answer; the FIRST verdict is the answer's
    (a later one belongs to a continuation past it)."""
    full = rubric.pairwise.assistant_prefix + text
    found = re.findall(rubric.pairwise.verdict_regex, full)
    if not found:
        return None
    first = found[0]
    first = first if isinstance(first, str) else next((g for g in first if g), "")
    first = first.strip()
    if first.upper() in ("A", "B"):
        return first.upper()
    if first.lower() == "tie":
        return "tie"
    return None
