"""Robust JSON extraction from LLM outputs, and the three LLM-as-RNN output shapes.

`parse_json(text)` tries, in order: the whole text as JSON ("plain"), the first ```json fenced block
("fenced"), the outermost {...} span ("braces"), the first balanced {...} object ("balanced"), an
object cut off by the token limit closed after its last complete value ("repaired"). It
returns (object, method), or (None, "unparsable"). It never raises: an unparsable output is recorded
and counted by the caller, the run goes on.

`parse_prediction / parse_evaluation / parse_memory` check the shape each role must produce and
normalise it; they return (normalised dict | None, method) where method says how the JSON was found
or why the output was rejected ("unparsable", "not_object", "missing:<key>").
"""

from __future__ import annotations

import json
import re
from typing import Any

FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)
UNPARSABLE = "unparsable"


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, ValueError, RecursionError):
        return _NOPE


_NOPE = object()


class JsonScanner:
    """Finds where the first top-level {...} object closes (braces inside JSON strings ignored), fed text
    piece by piece: `feed(text)` returns True once it has closed; `end` is then the index, in the text of
    that call, of the closing brace."""

    __slots__ = ("closed", "depth", "end", "escaped", "in_str", "started")

    def __init__(self) -> None:
        self.started, self.depth, self.in_str, self.escaped, self.closed = False, 0, False, False, False
        self.end = -1

    def feed(self, text: str) -> bool:
        if self.closed:
            return True
        for i, ch in enumerate(text):
            if not self.started:
                if ch != "{":
                    continue
                self.started = True
            if self.in_str:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_str = False
            elif ch == '"':
                self.in_str = True
            elif ch == "{":
                self.depth += 1
            elif ch == "}":
                self.depth -= 1
                if self.depth == 0:
                    self.closed, self.end = True, i
                    return True
        return False


def _first_balanced(text: str) -> str | None:
    """The first {...} span whose braces balance (braces inside JSON strings are skipped)."""
    start = text.find("{")
    while start != -1:
        scanner = JsonScanner()
        if scanner.feed(text[start:]):
            return text[start : start + scanner.end + 1]
        start = text.find("{", start + 1)
    return None


_CLOSE = {"{": "}", "[": "]"}


def _repair_truncated(text: str) -> Any:
    """A JSON object cut off by max_tokens: close it after its last complete value ("repaired")."""
    start = text.find("{")
    if start == -1:
        return _NOPE
    stack: list[str] = []
    cuts: list[tuple[int, str]] = []  # (end of a complete value, closers needed there)
    in_str = escaped = False
    for i in range(start, len(text)):
        ch = text[i]
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
                cuts.append((i + 1, "".join(_CLOSE[b] for b in reversed(stack))))
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            stack.append(ch)
        elif ch in "}]":
            if not stack or _CLOSE[stack.pop()] != ch:
                return _NOPE
            if not stack:
                return _NOPE  # complete object: not a truncation (the other methods failed on it)
            cuts.append((i + 1, "".join(_CLOSE[b] for b in reversed(stack))))
    for end, closers in reversed(cuts[-40:]):
        obj = _loads(text[start:end] + closers)
        if obj is not _NOPE and isinstance(obj, dict):
            return obj
    return _NOPE


def parse_json(text: str | None) -> tuple[Any, str]:
    """(parsed JSON value, method) with method in plain|fenced|braces|balanced|repaired, or
    (None, "unparsable"). "repaired": an object cut off mid-way (max_tokens), closed after its last
    complete value."""
    if not text or not text.strip():
        return None, UNPARSABLE
    stripped = text.strip()
    obj = _loads(stripped)
    if obj is not _NOPE:
        return obj, "plain"
    for block in FENCE.findall(text):
        obj = _loads(block.strip())
        if obj is not _NOPE:
            return obj, "fenced"
    first, last = text.find("{"), text.rfind("}")
    if first != -1 and last > first:
        obj = _loads(text[first : last + 1])
        if obj is not _NOPE:
            return obj, "braces"
    span = _first_balanced(text)
    if span is not None:
        obj = _loads(span)
        if obj is not _NOPE:
            return obj, "balanced"
    obj = _repair_truncated(text)
    if obj is not _NOPE:
        return obj, "repaired"
    return None, UNPARSABLE


# ----------------------------------------------------------------------------- role output shapes
PLACEHOLDER_TEXT = re.compile(r"^[\s.\u2026_-]*$")  # "...", "…", "" : a copied format placeholder


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return "" if PLACEHOLDER_TEXT.match(value) else value.strip()
    if isinstance(value, dict):
        for key in ("diagnosis", "name", "condition"):
            if isinstance(value.get(key), str):
                return value[key].strip()
    return json.dumps(value, ensure_ascii=False) if not isinstance(value, (int, float)) else str(value)


def as_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ("true", "yes", "correct", "1"):
            return True
        if low in ("false", "no", "incorrect", "0"):
            return False
    return None


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list):
        return [t for t in (_as_text(v) for v in value) if t]
    text = _as_text(value)
    return [t.strip() for t in re.split(r"[;\n]", text) if t.strip()] if text else []


def _json_object(text: str | None) -> tuple[dict | None, str]:
    """The JSON object in a role's output, or (None, why not): "unparsable" or "not_object"."""
    obj, method = parse_json(text)
    if obj is None:
        return None, method
    if not isinstance(obj, dict):
        return None, "not_object"
    return obj, method


def parse_prediction(text: str | None) -> tuple[dict | None, str]:
    """{"top_5_diagnoses": [<=5 str], "primary_diagnosis": str} or None."""
    obj, method = _json_object(text)
    if obj is None:
        return None, method
    top5 = _as_list(obj.get("top_5_diagnoses", obj.get("top_5", obj.get("diagnoses"))))
    primary_raw = obj.get("primary_diagnosis", obj.get("primary"))
    while isinstance(primary_raw, list) and primary_raw:  # ["x"] or [["x"]]: the first name
        primary_raw = primary_raw[0]
    primary = _as_text(primary_raw)
    if not top5 and not primary:
        return None, "missing:top_5_diagnoses"
    if not primary:
        primary = top5[0]
    if not top5:
        top5 = [primary]
    return {"top_5_diagnoses": top5[:5], "primary_diagnosis": primary}, method


EVALUATION_KEYS = ("primary_correct", "any_top5_correct", "missed_diagnoses", "why_missed", "improvement_suggestions")


def parse_evaluation(text: str | None) -> tuple[dict | None, str]:
    """{primary_correct, any_top5_correct, missed_diagnoses, why_missed, improvement_suggestions} or None."""
    obj, method = _json_object(text)
    if obj is None:
        return None, method
    if isinstance(obj.get("diagnosis_evaluation"), dict):  # the reference's nested shape
        obj = {**obj, **obj["diagnosis_evaluation"]}
    primary = as_bool(obj.get("primary_correct"))
    any5 = as_bool(obj.get("any_top5_correct"))
    if primary is None or any5 is None:
        return None, "missing:primary_correct" if primary is None else "missing:any_top5_correct"
    return {
        "primary_correct": primary,
        "any_top5_correct": any5 or primary,
        "missed_diagnoses": _as_list(obj.get("missed_diagnoses")),
        "why_missed": _as_text(obj.get("why_missed")),
        "improvement_suggestions": _as_text(obj.get("improvement_suggestions")),
    }, method


WHOLE_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL | re.IGNORECASE)


def parse_memory(text: str | None, strict: bool = False) -> tuple[str | None, str]:
    """The evolving summary text of a memory output {"evolving_summary": "..."}, or None.

    Lenient (the forward pass, which must go on): the object may sit in prose or be cut off, a non-text
    summary is kept as its JSON, and an empty one is rejected (the pass then keeps h_{t-1}). strict (the
    GRPO reward, as in the reference: "policy output is not valid JSON -> 0.05"): the whole output, or
    one ```json fence around all of it, must be the object and the summary text; an empty text is a
    valid (poor) memory for the judge to score. Whatever strict accepts non-empty, lenient accepts alike."""
    if strict:
        whole = (text or "").strip()
        fenced = WHOLE_FENCE.match(whole)
        obj = _loads(fenced.group(1) if fenced else whole) if whole else _NOPE
        if obj is _NOPE:
            return None, UNPARSABLE
        method = "fenced" if fenced else "plain"
        if not isinstance(obj, dict):
            return None, "not_object"
    else:
        obj, method = _json_object(text)
        if obj is None:
            return None, method
    summary = obj.get("evolving_summary")
    if isinstance(summary, (dict, list)) and not strict:
        summary = json.dumps(summary, ensure_ascii=False)
    if not isinstance(summary, str) or not (strict or summary.strip()):
        return None, "missing:evolving_summary"
    return summary.strip(), method


def memory_json(summary: str) -> str:
    """The canonical memory string h: JSON {"evolving_summary": summary}."""
    return json.dumps({"evolving_summary": summary}, ensure_ascii=False)
