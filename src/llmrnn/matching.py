"""Deterministic final judge: does a predicted diagnosis match a ground-truth one? (no model needed)

Both names are normalised (case, accents, numbering, punctuation, plural "s"), abbreviations are expanded
(CHF -> congestive heart failure, ...; extendable with synonym groups from the config), and then two names
match when they are equal, or when their content words overlap with a Jaccard index >= `threshold`
(broader/narrower terms such as "hypertension" vs "essential hypertension" reach 0.5).

Acc@1: the primary prediction matches the first ground-truth diagnosis (`primary_target: first`, the
principal discharge diagnosis) or any of them (`primary_target: any`). Acc@5: any of the top five
predictions matches any ground-truth diagnosis.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from llmrnn.settings.evaluation import EvalFinalJudgeMatcher

# Abbreviations common in discharge summaries -> their expansion (matched as whole words).
ABBREVIATIONS: dict[str, str] = {
    "afib": "atrial fibrillation",
    "a fib": "atrial fibrillation",
    "af": "atrial fibrillation",
    "aki": "acute kidney injury",
    "cad": "coronary artery disease",
    "cap": "community acquired pneumonia",
    "c diff": "clostridioides difficile colitis",
    "cdiff": "clostridioides difficile colitis",
    "chf": "congestive heart failure",
    "hf": "heart failure",
    "ckd": "chronic kidney disease",
    "copd": "chronic obstructive pulmonary disease",
    "cva": "stroke",
    "dka": "diabetic ketoacidosis",
    "dm": "diabetes mellitus",
    "dm2": "type 2 diabetes mellitus",
    "t2dm": "type 2 diabetes mellitus",
    "dmii": "type 2 diabetes mellitus",
    "dvt": "deep vein thrombosis",
    "esrd": "end stage renal disease",
    "gerd": "gastroesophageal reflux disease",
    "gib": "gastrointestinal bleed",
    "gi": "gastrointestinal",
    "htn": "hypertension",
    "mi": "myocardial infarction",
    "nstemi": "non st elevation myocardial infarction",
    "stemi": "st elevation myocardial infarction",
    "pe": "pulmonary embolism",
    "pna": "pneumonia",
    "sbo": "small bowel obstruction",
    "uti": "urinary tract infection",
    "etoh": "alcohol",
}
# Words that carry no diagnostic content for the overlap test.
STOPWORDS = frozenset(
    ["a", "an", "and", "the", "of", "with", "without", "on", "in", "to", "due", "for", "from", "secondary", "primary", "principal", "diagnosis", "unspecified", "nos", "type", "status", "post", "s", "p"]
)
_NUMBERING = re.compile(r"^\s*(?:\(?\d+[\.\):]|[-*\u2022])\s*")
_PREFIX = re.compile(r"^\s*(?:primary|secondary|principal)(?:\s+diagnos[ie]s)?\s*[:\-]\s*", re.IGNORECASE)
_NON_WORD = re.compile(r"[^a-z0-9]+")


def normalise(text: str) -> str:
    """Lower case, accents and numbering removed, punctuation -> space, abbreviations expanded."""
    text = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode("ascii")
    text = _PREFIX.sub("", _NUMBERING.sub("", text))
    text = _NON_WORD.sub(" ", text.lower()).strip()
    words = text.split()
    out: list[str] = []
    i = 0
    while i < len(words):
        pair = " ".join(words[i : i + 2])
        if len(words) > i + 1 and pair in ABBREVIATIONS:
            out.append(ABBREVIATIONS[pair])
            i += 2
            continue
        out.append(ABBREVIATIONS.get(words[i], words[i]))
        i += 1
    return " ".join(out)


def _stem(word: str) -> str:
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "is", "us")):
        return word[:-1]
    return word


def content_words(normalised: str) -> frozenset[str]:
    return frozenset(_stem(w) for w in normalised.split() if w not in STOPWORDS)


def coverage(text: str, diagnosis: str) -> float | None:
    """Share of a diagnosis's content words that `text` mentions (the normalisation `Matcher.match` uses);
    None when the diagnosis has no content words."""
    wanted = content_words(normalise(diagnosis))
    if not wanted:
        return None
    return len(wanted & content_words(normalise(text))) / len(wanted)


def anticipated_share(text: str, diagnoses: Iterable[str] | None) -> float:
    """How much of a list of diagnoses a free text (a memory) anticipates: the mean `coverage` per diagnosis.
    Partial credit keeps the signal graded, so memories of one GRPO group rarely tie."""
    shares = [c for c in (coverage(text, d) for d in diagnoses or []) if c is not None]
    return sum(shares) / len(shares) if shares else 0.0


def diagnosis_name(item: Any) -> str:
    """A prediction item as text: plain text, or an object with name/diagnosis (the reference's format)."""
    if isinstance(item, dict):
        for key in ("name", "diagnosis", "primary_diagnosis"):
            if isinstance(item.get(key), str):
                return item[key]
        return ""
    return item if isinstance(item, str) else ("" if item is None else str(item))


_DEFAULT = EvalFinalJudgeMatcher.model_fields  # eval.final_judge.matcher: the defaults are the model's


@dataclass
class Matcher:
    """Normalised text / synonym matcher; `synonyms` are extra groups of equivalent names. Defaults:
    eval.final_judge.matcher (llmrnn.settings)."""

    threshold: float = _DEFAULT["threshold"].default
    primary_target: str = _DEFAULT["primary_target"].default  # "first" | "any"
    synonyms: list[list[str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.primary_target not in ("first", "any"):
            raise ValueError(f"primary_target must be 'first' or 'any', got {self.primary_target!r}")
        self._canon: dict[str, str] = {}
        for group in self.synonyms:
            names = [normalise(n) for n in group if str(n).strip()]
            for name in names:
                self._canon[name] = names[0]

    def canonical(self, name: str) -> str:
        norm = normalise(name)
        return self._canon.get(norm, norm)

    def match(self, predicted: str, truth: str) -> bool:
        a, b = self.canonical(predicted), self.canonical(truth)
        if not a or not b:
            return False
        if a == b:
            return True
        wa, wb = content_words(a), content_words(b)
        if not wa or not wb:
            return False
        return len(wa & wb) / len(wa | wb) >= self.threshold

    def match_any(self, predicted: Iterable[str], truths: Iterable[str]) -> bool:
        truths = list(truths)
        return any(self.match(p, t) for p in predicted for t in truths)

    def grade(self, prediction: dict | None, ground_truth: list[str]) -> dict:
        """{primary_correct, any_top5_correct} of one parsed prediction against the visit's diagnoses."""
        if not isinstance(prediction, dict) or not ground_truth:
            return {"primary_correct": False, "any_top5_correct": False}
        primary = diagnosis_name(prediction.get("primary_diagnosis"))
        top5 = prediction.get("top_5_diagnoses") or []
        top5 = [diagnosis_name(x) for x in (top5 if isinstance(top5, list) else [top5])][:5]
        targets = ground_truth[:1] if self.primary_target == "first" else ground_truth
        primary_ok = bool(primary) and self.match_any([primary], targets)
        any5 = self.match_any([p for p in top5 if p], ground_truth) or primary_ok
        return {"primary_correct": primary_ok, "any_top5_correct": any5}

    def missed(self, prediction: dict | None, ground_truth: list[str]) -> list[str]:
        """The ground-truth diagnoses that neither the primary nor any top-5 prediction matches."""
        prediction = prediction if isinstance(prediction, dict) else {}
        top5 = prediction.get("top_5_diagnoses") or []
        names = [diagnosis_name(x) for x in [*(top5 if isinstance(top5, list) else [top5])[:5],
                                             prediction.get("primary_diagnosis")]]
        names = [n for n in names if n]
        return [t for t in ground_truth if not self.match_any(names, [t])]
