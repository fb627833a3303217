"""The LLM-as-RNN forward pass, batched across patients.

For patient p at visit t:
    prediction model  (h_{t-1}, x_t)              -> y_t = {top_5_diagnoses, primary_diagnosis}
    evaluation model  (y_t, ground truth of t)    -> e_t = {primary_correct, any_top5_correct, ...}
    memory model      (h_{t-1}, x_t, y_t, e_t)    -> h_t = {"evolving_summary": "..."}
The recurrence runs over time only: at visit step t every patient that has a visit t goes to the model
in ONE batched call per role (at most 3 backend calls per step, whatever the number of patients).

Small models often write unparsable JSON; the pass never stops for it, it records and counts it:
  prediction unparsable -> an empty prediction is shown to the evaluation model (prediction_ok False);
  evaluation unparsable -> a rule-based evaluation (llmrnn.matching against the ground truth) is
                           used downstream (evaluation_ok False, evaluation_source "fallback_match");
  memory unparsable     -> h_t = h_{t-1} (memory_ok False, memory_fallback "kept_h_prev").
Memory modes: "rnn" (the memory model writes h_t), "none" (h stays the initial memory; no memory
calls), "full_history" (the memory shown is every earlier visit with its diagnoses; no memory calls),
"memprompt" (MemPrompt, the LLM-as-RNN paper's comparison: the memory shown is the model's own most recent
errors with their corrections, "predicted X; the visit's diagnoses were Y", for the earlier visits whose
prediction missed diagnoses; no memory calls).
Sampling is seeded per (seed, patient, visit, role), so a patient's outputs do not depend on which
other patients share its batch or shard.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from llmrnn import jsonparse
from llmrnn.backends import make_backend
from llmrnn.engine_budget import plan_engines
from llmrnn.errors import InputError
from llmrnn.matching import Matcher, diagnosis_name
from llmrnn.models import resolve_model
from llmrnn.prompts import PromptSet, show_json
from llmrnn.runconfig import filled

log = logging.getLogger(__name__)

ROLES = ("prediction", "evaluation", "memory")
MEMORY_MODES = ("rnn", "none", "full_history", "memprompt")
SHOWN_MEMORY_MODES = ("full_history", "memprompt")  # modes whose memory is text built here, not h
MEMPROMPT_ERRORS_SHOWN = 3  # the most recent errors shown; MemPrompt retrieves a few, not the whole log
EMPTY_PREDICTION = {"top_5_diagnoses": [], "primary_diagnosis": ""}


# ----------------------------------------------------------------------------- ground truth
_NUMBERING = re.compile(r"^\s*(?:\(?\d+[\.\):]|[-*\u2022#]|[a-z][\.\)])\s+", re.IGNORECASE)
_HEADERS = {"primary", "secondary", "primary diagnosis", "secondary diagnoses", "secondary diagnosis",
            "discharge diagnosis", "discharge diagnoses", "diagnoses", "diagnosis"}


def parse_diagnoses(text: str | None) -> list[str]:
    """A free-text discharge diagnosis -> list of names.

    Numbered/bulleted lines give one name each (numbering dropped, section headers like "Primary:" dropped);
    a single line is split on semicolons, then commas. Order kept, duplicates (case-insensitive) dropped.
    """
    if not text or not str(text).strip():
        return []
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    if len(lines) == 1:
        line = _NUMBERING.sub("", lines[0])
        parts = re.split(r";", line) if ";" in line else re.split(r",", line)
    else:
        parts = []
        for ln in lines:
            parts.extend(p for p in re.split(r";", ln))
    names, seen = [], set()
    for part in parts:
        name = _NUMBERING.sub("", part).strip().strip(" .,:")
        if not name:
            continue
        low = name.lower()
        if low in _HEADERS:
            continue
        if ":" in name and name.split(":", 1)[0].strip().lower() in _HEADERS:
            name = name.split(":", 1)[1].strip()
            low = name.lower()
            if not name:
                continue
        if low not in seen:
            seen.add(low)
            names.append(name)
    return names


def fallback_evaluation(prediction: dict | None, truth: Sequence[str]) -> dict:
    """A rule-based e_t used when the evaluation model's output is unparsable: the held-out matcher's
    verdict (llmrnn.matching), so the forward pass and the final judge call the same prediction correct."""
    matcher = Matcher()
    grade = matcher.grade(prediction or EMPTY_PREDICTION, list(truth))
    return {
        **grade,
        "missed_diagnoses": matcher.missed(prediction, list(truth)),
        "why_missed": "",
        "improvement_suggestions": "",
    }


def error_correction(t: int, prediction: dict | None, truth: Sequence[str]) -> str | None:
    """MemPrompt's memory entry for visit t: what was predicted and what the visit's diagnoses were, when the
    prediction missed any of them (the fallback evaluation's matcher decides, so the entry does not hang on
    whether the evaluation model wrote parsable JSON); None when nothing was missed or nothing is known."""
    if not truth or not Matcher().missed(prediction, list(truth)):
        return None
    pred = prediction or EMPTY_PREDICTION
    primary = diagnosis_name(pred.get("primary_diagnosis")) or "nothing"
    top5 = pred.get("top_5_diagnoses") or []
    others = [n for n in (diagnosis_name(x) for x in (top5 if isinstance(top5, list) else [top5])[:5]) if n]
    shown = f"{primary} (top 5: {'; '.join(others)})" if others else primary
    return f"Visit {t + 1}: predicted {shown}; the visit's diagnoses were {'; '.join(truth)}"


# ----------------------------------------------------------------------------- roles
@dataclass
class Role:
    """A model role: its engine and its sampling settings (from config roles.<name>)."""

    name: str
    backend: Any
    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int = 256
    context: int | None = None  # the engine's context window (roles.<name>.max_model_len), when one is set

    def prompt_room(self, conversations: Sequence[list[dict]]) -> list[int] | None:
        """Tokens left in the context after each prompt and max_tokens (None: no window set or no tokenizer)."""
        lengths = getattr(self.backend, "prompt_lengths", None)
        if not self.context or lengths is None:
            return None
        return [self.context - n - self.max_tokens for n in lengths(conversations)]

    def generate(self, conversations: Sequence[list[dict]], seeds: Sequence[int] | None = None) -> list[str]:
        if not conversations:
            return []
        out = self.backend.generate(
            conversations, temperature=self.temperature, top_p=self.top_p, max_tokens=self.max_tokens, seeds=seeds
        )
        if len(out) != len(conversations):
            raise InputError(f"role {self.name}: backend returned {len(out)} outputs for {len(conversations)} prompts")
        # a final assistant message is a response prefix the engine continued: the answer starts with it
        return [
            (conv[-1]["content"] + text) if conv[-1]["role"] == "assistant" else text
            for conv, text in zip(conversations, out)
        ]


def make_roles(roles_cfg: dict, model_paths: dict[str, str] | None = None, cache: bool = True,
               memory_adapter: str | None = None) -> dict[str, Role]:
    """Role objects from config roles.<name> = {model, backend, temperature, top_p, max_tokens, ...}.

    model_paths overrides where a role's model is loaded from (e.g. {"memory": "results/RUN/merged"});
    otherwise `model` is a configured model name (resources/models/<name>) or a path. Roles with the
    same engine settings share one loaded engine.
    """
    # vLLM engines fit one GPU's memory together: the memory adapter as a LoRA on the base engine, or the
    # memory share split among the engines (llmrnn.engine_budget.plan_engines; `llmrnn check` runs the same plan)
    plan = plan_engines(roles_cfg, model_paths, memory_adapter)
    for note in plan.notes:
        log.info("engines: %s", note)
    roles_cfg, model_paths = plan.roles_cfg, plan.model_paths
    roles = {}
    for name in ROLES:
        if name not in roles_cfg:
            raise InputError(f"roles.{name}: missing (need {', '.join(ROLES)})")
        cfg = filled(f"roles.{name}", roles_cfg[name])  # the role's own defaults (memory: max_tokens 128)
        if name in model_paths:
            path = str(model_paths[name])
        elif cfg.get("backend") == "openai":
            path = cfg.get("model")
        else:
            path = str(resolve_model(cfg["model"]))
        roles[name] = Role(
            name=name,
            backend=make_backend(cfg, path, cache=cache),
            temperature=float(cfg["temperature"]),
            top_p=float(cfg["top_p"]),
            max_tokens=int(cfg["max_tokens"]),
            context=int(cfg["max_model_len"]) if cfg.get("max_model_len") else None,
        )
    return roles


def row_seed(seed: int, patient_id: Any, visit_index: int, role: str) -> int:
    digest = hashlib.sha256(f"{seed}:{patient_id}:{visit_index}:{role}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 2


# ----------------------------------------------------------------------------- the forward pass
def summary_text(h: str) -> str:
    """The evolving_summary inside a memory string h (h itself when it is not that JSON)."""
    try:
        obj = json.loads(h)
    except (json.JSONDecodeError, TypeError):
        return str(h)
    return obj.get("evolving_summary", h) if isinstance(obj, dict) else str(h)


def run_forward(
    patients: Sequence[dict],
    roles: dict[str, Role],
    prompts: PromptSet,
    memory: str = "rnn",
    seed: int = 0,
    last_visit: Callable[[dict], int] | None = None,
    update_last: bool = False,
    stats: dict | None = None,
    label: str = "forward",
    replay: Sequence[dict] | None = None,
) -> list[dict]:
    """Run the LLM-as-RNN over `patients` (cohort records); one dict per patient:

    {"patient_id": str, "n_visits": int, "visits": [record per processed visit]} where a record holds
    visit_index, visit_id, ground_truth, h_prev, prediction(_raw/_ok/_parse), evaluation(_raw/_ok/_parse/
    _source), and for memory updates update_messages (the policy prompt), update_prompt (its question),
    memory_raw, memory_ok, memory_parse, memory_fallback, h_new, memory_words. Visits 0..last_visit(p) are processed (default: all); the memory update runs for
    t < last (and at the last visit too when update_last). `stats` (if given) is filled with calls per
    role and step, outputs and unparsable counts per role.

    `replay`: run_forward's results for the same patients, in the same order, from a run whose prediction and
    evaluation roles were these (the base variant of an eval shard, for the trained one: only the memory
    model differs). A visit step's prediction (evaluation) call whose every prompt equals that run's is not
    sent again: its outputs are that run's, the ones the same call gives (the same prompts in the same
    batch, the same per-row seeds). In practice the first visit step, where every memory is the initial one.
    """
    if memory not in MEMORY_MODES:
        raise InputError(f"run_forward: memory {memory!r}; expected one of {', '.join(MEMORY_MODES)}")
    if replay is not None:
        if memory != "rnn":
            raise InputError(f"run_forward: replay needs memory 'rnn', not {memory!r}")
        ids = [str(p["subject_id"]) for p in patients]
        if [str(r.get("patient_id")) for r in replay] != ids:
            raise InputError("run_forward: the replayed results are not of these patients in this order")
    run = _ForwardRun(roles, prompts, memory, seed, update_last, stats if stats is not None else {})
    if replay is not None:
        run.replay = {(str(r["patient_id"]), int(v["visit_index"])): v for r in replay for v in r["visits"]}
        run.st.setdefault("replayed", {r: 0 for r in ROLES})  # outputs taken from the replayed run, per role
    last_of = last_visit or (lambda p: len(p["visits"]) - 1)
    initial = jsonparse.memory_json(prompts.initial_memory)
    states = [
        {"patient": p, "pid": str(p["subject_id"]), "last": min(last_of(p), len(p["visits"]) - 1),
         "h": initial, "history": [], "errors": [], "records": []}
        for p in patients
    ]
    steps = max((s["last"] + 1 for s in states), default=0)
    for t in range(steps):
        t_step = time.time()
        active = [s for s in states if t <= s["last"]]
        n_updates = run.step(t, active)
        log.info(
            "%s: visit step %d/%d: %d patients, %d memory updates, %.1f s (unparsable so far: %s)",
            label, t + 1, steps, len(active), n_updates, time.time() - t_step,
            ", ".join(f"{k} {v}" for k, v in run.st["unparsable"].items()),
        )
    return [{"patient_id": s["pid"], "n_visits": len(s["patient"]["visits"]), "visits": s["records"]} for s in states]


class _ForwardRun:
    """One visit step of the recurrence for every active patient: predict, evaluate, update the memory.

    Each role is called once per step with the whole batch of patients (one engine call per role)."""

    def __init__(self, roles: dict[str, Role], prompts: PromptSet, memory: str, seed: int, update_last: bool,
                 st: dict) -> None:
        self.roles, self.prompts, self.memory, self.seed, self.update_last = roles, prompts, memory, seed, update_last
        self.st = st
        st.setdefault("calls", {r: 0 for r in ROLES})
        st.setdefault("calls_per_step", [])
        st.setdefault("outputs", {r: 0 for r in ROLES})
        st.setdefault("unparsable", {r: 0 for r in ROLES})
        st.setdefault("parse_methods", {r: {} for r in ROLES})
        st.setdefault("seconds", {r: 0.0 for r in ROLES})
        self.replay: dict[tuple[str, int], dict] | None = None

    def replayed(self, recs: list[dict], keys: list[tuple[str, int]], same: Sequence[str]) -> list[dict] | None:
        """The replayed run's outputs of this call (`same`: the record fields its prompts are made of, besides
        the patient's visit), when every row's are equal; None otherwise (the call is made)."""
        if self.replay is None or not recs:
            return None
        earlier = [self.replay.get(key) for key in keys]
        if any(e is None or e.get("visit_id") != r["visit_id"] or any(e.get(f) != r[f] for f in same)
               for e, r in zip(earlier, recs)):
            return None
        return earlier

    def call(self, role: str, convs: list, keys: list[tuple[str, int]]) -> list[str]:
        if not convs:
            return []
        t0 = time.time()
        out = self.roles[role].generate(convs, [row_seed(self.seed, pid, t, role) for pid, t in keys])
        self.st["calls"][role] += 1
        self.st["outputs"][role] += len(out)
        self.st["seconds"][role] += time.time() - t0
        self.step_calls[role] += 1
        return out

    def count(self, role: str, ok: bool, method: str) -> None:
        if not ok:
            self.st["unparsable"][role] += 1
        methods = self.st["parse_methods"][role]
        methods[method] = methods.get(method, 0) + 1

    def step(self, t: int, active: list[dict]) -> int:
        """Process visit t of every active patient; returns the number of memory updates made."""
        self.step_calls = {r: 0 for r in ROLES}
        recs = [self.start_record(s, t) for s in active]
        keys = [(s["pid"], t) for s in active]
        self.predict(t, recs, keys)
        self.evaluate(t, recs, keys)
        n_updates = self.update_memory(t, active, recs)
        for s, r in zip(active, recs):
            if self.memory == "full_history":
                s["history"].append(
                    f"Visit {t + 1}:\n{r['_visit_text']}\nDISCHARGE DIAGNOSES: {'; '.join(r['ground_truth'])}"
                )
            if self.memory == "memprompt" and (error := error_correction(t, r["prediction"], r["ground_truth"])):
                s["errors"].append(error)
            r.setdefault("memory_ok", None)
            r.pop("_visit_text")
            r.pop("_memory_text")
            s["records"].append(r)
        self.st["calls_per_step"].append(self.step_calls)
        return n_updates

    def start_record(self, s: dict, t: int) -> dict:
        visit = s["patient"]["visits"][t]
        truth = parse_diagnoses((visit.get("clinical_sections") or {}).get("discharge_diagnosis"))
        visit_text = self.prompts.render_visit(visit)
        omitted = 0
        if self.memory == "full_history":
            shown, omitted = self.fit_history(s["history"], visit_text, t)
        elif self.memory == "memprompt":
            shown, omitted = self.fit_history(s["errors"][-MEMPROMPT_ERRORS_SHOWN:], visit_text, t, "earlier error")
        else:
            shown = summary_text(s["h"])
        return {
            "visit_index": t,
            "visit_id": str(visit.get("visit_id")),
            "ground_truth": truth,
            "h_prev": s["h"],
            "_visit_text": visit_text,
            "_memory_text": shown,
            # full_history's and memprompt's memory is not h: keep what was shown (eval's memory recall reads
            # it), and how many of its earliest entries were left out to fit the prediction model's context
            **({"memory_shown": shown, "history_omitted": omitted} if self.memory in SHOWN_MEMORY_MODES else {}),
        }

    def fit_history(self, history: list[str], visit_text: str, t: int, entry: str = "earlier visit") -> tuple[str, int]:
        """full_history's (and memprompt's) memory: the most recent entries whose prediction prompt fits the
        prediction role's context (max_model_len - max_tokens, counted with its engine's tokenizer); the
        earliest are left out first and the text says how many. vLLM refuses a whole batch when one prompt is
        too long."""
        role = self.roles["prediction"]

        def text(kept: list[str]) -> str:
            body = "\n\n".join(kept) or self.prompts.initial_memory
            left = len(history) - len(kept)
            return (f"({left} {entry}{'s' if left != 1 else ''} left out to fit the model's context)\n\n"
                    + body) if left else body

        def room(kept: list[str]) -> int | None:
            conv = self.prompts.prediction.messages({"memory": text(kept), "visit": visit_text, "visit_number": t + 1})
            rooms = role.prompt_room([conv])
            return None if rooms is None else rooms[0]

        kept = list(history)
        if room(kept) is None:
            return text(kept), 0
        lo, hi = 0, len(kept)  # the fewest visits to leave out (room shrinks as more visits are kept)
        while lo < hi:
            mid = (lo + hi) // 2
            if room(kept[mid:]) >= 0:
                hi = mid
            else:
                lo = mid + 1
        return text(kept[lo:]), lo

    def predict(self, t: int, recs: list[dict], keys: list[tuple[str, int]]) -> None:
        """(h_{t-1}, x_t) -> y_t"""
        convs = [
            self.prompts.prediction.messages(
                {"memory": r["_memory_text"], "visit": r["_visit_text"], "visit_number": t + 1})
            for r in recs
        ]
        earlier = self.replayed(recs, keys, ("h_prev",))
        outs = [e["prediction_raw"] for e in earlier] if earlier else self.call("prediction", convs, keys)
        if earlier:
            self.st["replayed"]["prediction"] += len(earlier)
        for r, raw in zip(recs, outs):
            parsed, method = jsonparse.parse_prediction(raw)
            r.update(prediction_raw=raw, prediction=parsed, prediction_ok=parsed is not None, prediction_parse=method)
            self.count("prediction", parsed is not None, method)

    def evaluate(self, t: int, recs: list[dict], keys: list[tuple[str, int]]) -> None:
        """(y_t, ground truth) -> e_t; an unparsable evaluation falls back to the deterministic matcher."""
        convs = [
            self.prompts.evaluation.messages({
                "prediction": show_json(r["prediction"]) if r["prediction"] else (r["prediction_raw"][:500] or "(none)"),
                "ground_truth": "\n".join(f"{i + 1}. {d}" for i, d in enumerate(r["ground_truth"])),
                "visit_number": t + 1,
            })
            for r in recs
        ]
        earlier = self.replayed(recs, keys, ("ground_truth", "prediction_raw"))
        outs = [e["evaluation_raw"] for e in earlier] if earlier else self.call("evaluation", convs, keys)
        if earlier:
            self.st["replayed"]["evaluation"] += len(earlier)
        for r, raw in zip(recs, outs):
            parsed, method = jsonparse.parse_evaluation(raw)
            ok = parsed is not None
            if not ok:
                parsed = fallback_evaluation(r["prediction"], r["ground_truth"])
            r.update(evaluation_raw=raw, evaluation=parsed, evaluation_ok=ok, evaluation_parse=method,
                     evaluation_source="model" if ok else "fallback_match")
            self.count("evaluation", ok, method)

    def update_memory(self, t: int, active: list[dict], recs: list[dict]) -> int:
        """(h_{t-1}, x_t, y_t, e_t) -> h_t; an unparsable memory keeps h_{t-1}."""
        upd = [(s, r) for s, r in zip(active, recs)
               if self.memory == "rnn" and (t < s["last"] or self.update_last)]
        convs = []
        for s, r in upd:
            msgs = self.prompts.memory_update.policy_messages({
                "memory": r["_memory_text"],
                "visit": r["_visit_text"],
                "prediction": show_json(r["prediction"] or EMPTY_PREDICTION),
                "evaluation": show_json(r["evaluation"]),
                # the evaluation's missed diagnoses as plain names (short prompts for small models)
                "missed_diagnoses": "; ".join(map(str, r["evaluation"].get("missed_diagnoses") or [])) or "none",
                "visit_number": t + 1,
            })
            # the policy's prompt (a training row's `prompt`); the question alone for the judge's rubric
            r["update_messages"] = msgs
            r["update_prompt"] = msgs[-1]["content"]
            convs.append(msgs)
        for (s, r), raw in zip(upd, self.call("memory", convs, [(s["pid"], t) for s, _ in upd])):
            summary, method = jsonparse.parse_memory(raw)
            ok = summary is not None
            h_new = jsonparse.memory_json(summary) if ok else r["h_prev"]
            r.update(memory_raw=raw, memory_ok=ok, memory_parse=method, h_new=h_new,
                     memory_fallback=None if ok else "kept_h_prev", memory_words=len(summary_text(h_new).split()))
            self.count("memory", ok, method)
            s["h"] = h_new
        return len(upd)
