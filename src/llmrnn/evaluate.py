"""Stage `evaluate`: held-out LLM-as-RNN evaluation of trained vs base memory model (and baselines).

Three steps, each a Snakemake job:
  shard   the forward pass (llmrnn.rnn.run_forward) over one shard of the test split with one memory model
          variant: base | trained (memory = "rnn", memory role's weights swapped) | zero_shot (no memory) |
          full_history (concatenated history); one JSON line per patient -> RUN/eval/<variant>/shard_<k>.jsonl
  grade   the final judge grades every visit's prediction against that visit's ground truth: the
          deterministic matcher (llmrnn.matching) or an LLM judge through the openai backend
          -> RUN/eval/<variant>/graded_<k>.jsonl
  gather  all graded shards -> RUN/eval/metrics.json (Acc@1/Acc@5 at each patient's last visit with
          Wilson CIs, accuracy by visit index, unparsable rates per role, memory length, memory recall) and
          RUN/eval/comparison.json (each variant vs base: paired bootstrap CI of the difference, McNemar;
          memory recall: paired bootstrap CI + Wilcoxon signed-rank; memory specificity: the same test on
          each patient's gap between own-patient and other-patient memory recall).
Memory recall (judge-free): at every visit t >= 1, the share of visit t's discharge diagnoses that the
memory shown to the prediction model (h_{t-1}) names (llmrnn.reward.outcome_share, the quantity the outcome
reward pays for); a patient's value is the mean over its transitions. Its control, memory specificity:
the same memory scored against OTHER test patients' visit t (a fixed, seeded set per patient,
eval.stats.specificity); a memory that lists conditions common in the cohort scores there too.
Metrics depend only on the union of shards, never on how patients were split across them.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
from pathlib import Path
from typing import Any

from llmrnn import io, jsonparse
from llmrnn.errors import InputError
from llmrnn.trajectories import shard_of

log = logging.getLogger(__name__)

MEMORY_VARIANTS = ("base", "trained")  # memory = "rnn", only the memory role's weights differ
BASELINES = {"zero_shot": "none", "full_history": "full_history"}  # variant -> run_forward memory mode
ROLES = ("prediction", "evaluation", "memory")
REFERENCE = "base"


def variant_mode(variant: str) -> str:
    if variant in MEMORY_VARIANTS:
        return "rnn"
    if variant in BASELINES:
        return BASELINES[variant]
    raise InputError(f"eval: unknown variant {variant!r}; expected one of {[*MEMORY_VARIANTS, *BASELINES]}")


# ----------------------------------------------------------------------------- selecting test patients
def select_patients(patients: list[dict], max_patients: int | None, seed: int) -> list[dict]:
    """The evaluated patients: all of the test split, or a seeded sample of `max_patients` (file order kept)."""
    if max_patients is None or max_patients >= len(patients):
        return list(patients)
    if max_patients < 1:
        raise InputError(f"eval.max_patients must be >= 1 or null, got {max_patients}")
    keep = sorted(random.Random(seed).sample(range(len(patients)), max_patients))
    return [patients[i] for i in keep]


def memory_shown(visit: dict) -> str:
    """The memory the prediction model saw at this visit: h_{t-1}'s summary (rnn; the initial memory for
    no-memory baselines) or the concatenated history (full_history)."""
    from llmrnn.rnn import summary_text

    if visit.get("memory_shown") is not None:
        return str(visit["memory_shown"])
    return summary_text(visit.get("h_prev") or "")


def patient_memory_recall(record: dict) -> list[tuple[int, float]]:
    """(visit_index, recall) for every visit t >= 1 of a patient record with diagnoses."""
    from llmrnn.reward import outcome_share

    out = []
    for i, v in enumerate(record["visits"]):
        t = int(v.get("visit_index", i))
        if t >= 1 and v.get("ground_truth"):
            out.append((t, outcome_share(memory_shown(v), v["ground_truth"])))
    return out


def recall_by_patient(records: list[dict]) -> dict[str, float]:
    """Patient id -> mean memory recall over its transitions (patients with none are left out)."""
    out = {}
    for rec in records:
        values = [r for _, r in patient_memory_recall(rec)]
        if values:
            out[str(rec["patient_id"])] = statistics.fmean(values)
    return out


def memory_recall_metrics(records: list[dict]) -> dict | None:
    per_patient = recall_by_patient(records)
    if not per_patient:
        return None
    by_visit: dict[int, list[float]] = {}
    for rec in records:
        for t, r in patient_memory_recall(rec):
            by_visit.setdefault(t, []).append(r)
    return {
        "value": statistics.fmean(per_patient.values()),
        "unit": "patient (mean over its visit transitions)",
        "n_patients": len(per_patient),
        "n_transitions": sum(len(v) for v in by_visit.values()),
        "by_visit_index": {str(t): statistics.fmean(v) for t, v in sorted(by_visit.items())},
    }


# ----------------------------------------------------------------------------- patient specificity
SPECIFICITY_DEFAULTS = {"others": 20, "seed": 0}


def _transitions(record: dict) -> dict[int, tuple[str, list[str]]]:
    """visit index -> (memory shown, ground truth) for every visit t >= 1 with diagnoses."""
    out = {}
    for i, v in enumerate(record["visits"]):
        t = int(v.get("visit_index", i))
        if t >= 1 and v.get("ground_truth"):
            out[t] = (memory_shown(v), list(v["ground_truth"]))
    return out


def other_patients(pids: list[str], pid: str, others: int | None, seed: int) -> list[str]:
    """The fixed set of OTHER patients a patient's memories are scored against: all others, or a sample of
    `others` seeded by (seed, patient id), so every variant meets the same ones."""
    pool = sorted(p for p in pids if p != pid)
    if others is None or others >= len(pool):
        return pool
    return sorted(random.Random(f"{seed}:{pid}").sample(pool, int(others)))


def specificity_by_patient(records: list[dict], cfg: dict | None = None) -> dict[str, dict]:
    """Patient id -> {"own", "other", "gap"}: the recall of each memory h_{t-1} against the patient's own visit t
    ("own", the memory recall) and against the visit t of other patients ("other", mean over the fixed set of
    other_patients that have a visit t), averaged over the transitions that have both; gap = own - other.
    A memory that lists conditions common in the cohort scores on other patients' visits too; only what
    remembers THIS patient widens the gap."""
    from llmrnn.reward import outcome_share

    cfg = {**SPECIFICITY_DEFAULTS, **(cfg or {})}
    visits = {str(r["patient_id"]): _transitions(r) for r in records}
    pids = sorted(visits)
    out = {}
    for pid in pids:
        chosen = other_patients(pids, pid, cfg["others"], int(cfg["seed"]))
        own, other = [], []
        for t, (memory, truth) in sorted(visits[pid].items()):
            theirs = [visits[q][t][1] for q in chosen if t in visits[q]]
            if not theirs:
                continue
            own.append(outcome_share(memory, truth))
            other.append(statistics.fmean(outcome_share(memory, gt) for gt in theirs))
        if own:
            o, x = statistics.fmean(own), statistics.fmean(other)
            out[pid] = {"own": o, "other": x, "gap": o - x, "transitions": len(own)}
    return out


def specificity_metrics(records: list[dict], cfg: dict | None = None) -> dict | None:
    per = specificity_by_patient(records, cfg)
    if not per:
        return None
    cfg = {**SPECIFICITY_DEFAULTS, **(cfg or {})}
    return {
        "own_recall": statistics.fmean(p["own"] for p in per.values()),
        "other_recall": statistics.fmean(p["other"] for p in per.values()),
        "gap": statistics.fmean(p["gap"] for p in per.values()),
        "n_patients": len(per),
        "n_transitions": sum(p["transitions"] for p in per.values()),
        "others_per_patient": cfg["others"],
        "seed": cfg["seed"],
        "definition": "own = recall of each memory h_{t-1} against the patient's own visit t; other = its recall "
                      "against visit t of a fixed, seeded set of other test patients; gap = own - other, "
                      "per patient (mean over transitions)",
    }


def compare_specificity(reference: list[dict], other: list[dict], boot: dict, cfg: dict | None = None) -> dict | None:
    """The specificity gap (own - other-patient recall) of `other` vs the reference, paired by patient:
    bootstrap CI of the difference in gaps and Wilcoxon signed-rank."""
    from llmrnn.stats import paired_bootstrap, wilcoxon_signed_rank

    ref, oth = specificity_by_patient(reference, cfg), specificity_by_patient(other, cfg)
    pids = sorted(set(ref) & set(oth))
    if not pids:
        return None
    a, b = [ref[p]["gap"] for p in pids], [oth[p]["gap"] for p in pids]
    bs = paired_bootstrap(a, b, samples=int(boot.get("samples", 10_000)), seed=int(boot.get("seed", 0)))
    return {
        "metric": "specificity gap (own-patient minus other-patient memory recall)",
        "a": statistics.fmean(a),
        "b": statistics.fmean(b),
        "a_other_recall": statistics.fmean(ref[p]["other"] for p in pids),
        "b_other_recall": statistics.fmean(oth[p]["other"] for p in pids),
        "a_own_recall": statistics.fmean(ref[p]["own"] for p in pids),
        "b_own_recall": statistics.fmean(oth[p]["own"] for p in pids),
        "n_pairs": len(pids),
        "diff": bs["diff"],
        "ci95": bs["ci95"],
        "bootstrap": {"samples": bs["samples"], "seed": bs["seed"], "se": bs.get("se")},
        "wilcoxon": wilcoxon_signed_rank(a, b),
    }


def memory_words(text: Any) -> int | None:
    """Length of a memory h_t in words (its evolving_summary when it is the JSON form)."""
    from llmrnn.rnn import summary_text

    if text is None:
        return None
    return len(str(summary_text(text if isinstance(text, str) else json.dumps(text))).split())


# ----------------------------------------------------------------------------- grading
def grade_records(records: list[dict], judge: FinalJudge, visits: str = "all") -> list[dict]:
    """Add `grade` = {primary_correct, any_top5_correct, judge_ok} to the graded visits of every patient."""
    todo: list[tuple[dict, dict]] = []
    for rec in records:
        vs = rec["visits"]
        for i, v in enumerate(vs):
            if visits == "all" or i == len(vs) - 1:
                todo.append((rec, v))
            else:
                v["grade"] = None
    grades = judge.grade_many([(v.get("prediction"), v.get("ground_truth") or []) for _, v in todo])
    for (_, v), g in zip(todo, grades):
        v["grade"] = g
    return records


class FinalJudge:
    """Grades (parsed prediction, ground-truth list) pairs -> {primary_correct, any_top5_correct, judge_ok}."""

    def __init__(self, cfg: dict):
        self.mode = cfg.get("mode", "matcher")
        if self.mode == "matcher":
            from llmrnn.matching import Matcher

            m = cfg.get("matcher", {})
            self.matcher = Matcher(
                threshold=float(m.get("threshold", 0.5)),
                primary_target=m.get("primary_target", "first"),
                synonyms=m.get("synonyms", []),
            )
        elif self.mode == "llm":
            self.llm_cfg = dict(cfg.get("llm", {}))
            # test-patient text goes to this endpoint: a host outside the site only with the explicit opt-in
            from llmrnn.backends import external_problem

            problem = external_problem(self.llm_cfg.get("url"), bool(cfg.get("allow_external", False)),
                                       "eval.final_judge.llm.url", "eval.final_judge.allow_external")
            if problem:
                raise InputError(problem)
            self.llm_cfg.update(allow_external=bool(cfg.get("allow_external", False)),
                                opt_in_key="eval.final_judge.allow_external")
            self.primary_target = cfg.get("matcher", {}).get("primary_target", "first")
            self._backend = None
        else:
            raise InputError(f"eval.final_judge.mode: expected 'matcher' or 'llm', got {self.mode!r}")

    def describe(self) -> dict:
        if self.mode == "matcher":
            return {
                "mode": "matcher",
                "threshold": self.matcher.threshold,
                "primary_target": self.matcher.primary_target,
                "synonym_groups": len(self.matcher.synonyms),
            }
        return {"mode": "llm", "model": self.llm_cfg.get("model"), "url": self.llm_cfg.get("url")}

    def grade_many(self, items: list[tuple[dict | None, list[str]]]) -> list[dict]:
        if self.mode == "matcher":
            return [{**self.matcher.grade(pred, gt), "judge_ok": True} for pred, gt in items]
        return self._grade_llm(items)

    # -- LLM judge through the openai backend ----------------------------------------------------
    def _messages(self, prediction: dict | None, ground_truth: list[str]) -> list[dict]:
        from llmrnn.matching import diagnosis_name

        pred = prediction or {}
        top5 = pred.get("top_5_diagnoses") or []
        shown = {
            "top_5_diagnoses": [diagnosis_name(x) for x in (top5 if isinstance(top5, list) else [top5])][:5],
            "primary_diagnosis": diagnosis_name(pred.get("primary_diagnosis")),
        }
        target = (
            "the FIRST ground-truth diagnosis (the principal one)"
            if self.primary_target == "first"
            else "any ground-truth diagnosis"
        )
        template = self.llm_cfg.get("prompt") or FINAL_JUDGE_PROMPT
        text = template.format(
            prediction=json.dumps(shown, indent=2, ensure_ascii=False),
            ground_truth="\n".join(f"{i + 1}. {d}" for i, d in enumerate(ground_truth)),
            primary_target=target,
        )
        return [{"role": "user", "content": text}]

    def _grade_llm(self, items: list[tuple[dict | None, list[str]]]) -> list[dict]:
        from llmrnn import backends

        if self._backend is None:
            role_cfg = {**self.llm_cfg, "backend": "openai"}
            self._backend = backends.make_backend(role_cfg, self.llm_cfg.get("model"))
        out: list[dict | None] = [None] * len(items)
        asks = []
        for i, (pred, gt) in enumerate(items):
            if not isinstance(pred, dict) or not gt:
                # nothing to grade: an unparsable prediction is wrong, without asking the judge
                out[i] = {"primary_correct": False, "any_top5_correct": False, "judge_ok": True}
            else:
                asks.append(i)
        batch = int(self.llm_cfg.get("batch_size", 64))
        for start in range(0, len(asks), batch):
            idx = asks[start : start + batch]
            texts = self._backend.generate(
                [self._messages(*items[i]) for i in idx],
                temperature=float(self.llm_cfg.get("temperature", 0.0)),
                top_p=float(self.llm_cfg.get("top_p", 1.0)),
                max_tokens=int(self.llm_cfg.get("max_tokens", 128)),
            )
            for i, text in zip(idx, texts):
                out[i] = parse_judge_verdict(text)
            log.info("final judge: %d/%d graded", min(start + batch, len(asks)), len(asks))
        return out  # type: ignore[return-value]


FINAL_JUDGE_PROMPT = """You grade predicted discharge diagnoses against the ground truth of one hospital visit.
Use SEMANTIC matching: broader or narrower terms count as correct when clinically equivalent.

PREDICTION (JSON):
{prediction}

GROUND-TRUTH DISCHARGE DIAGNOSES:
{ground_truth}

primary_correct: is the predicted primary diagnosis the same condition as {primary_target}?
any_top5_correct: does any of the top five predictions match any ground-truth diagnosis?
Answer with JSON only: {{"primary_correct": true or false, "any_top5_correct": true or false}}"""


def parse_judge_verdict(text: str) -> dict:
    """{"primary_correct", "any_top5_correct"} from a judge answer; unparsable -> both False, judge_ok False."""
    obj, _method = jsonparse.parse_json(text)
    if isinstance(obj, dict):
        obj = obj.get("diagnosis_evaluation", obj)
    if isinstance(obj, dict) and "primary_correct" in obj and "any_top5_correct" in obj:
        p1, p5 = jsonparse.as_bool(obj["primary_correct"]), jsonparse.as_bool(obj["any_top5_correct"])
        if p1 is not None and p5 is not None:
            return {"primary_correct": p1, "any_top5_correct": p5 or p1, "judge_ok": True}
    return {"primary_correct": False, "any_top5_correct": False, "judge_ok": False}


# ----------------------------------------------------------------------------- metrics
def _rate(values: list[bool]) -> float | None:
    return sum(values) / len(values) if values else None


def _check_patients(variant: str, records: list[dict]) -> None:
    seen: set[str] = set()
    for rec in records:
        pid = str(rec["patient_id"])
        if pid in seen:
            raise InputError(f"eval {variant}: patient {pid} appears in more than one shard")
        seen.add(pid)
        if not rec.get("visits"):
            raise InputError(f"eval {variant}: patient {pid}: no visits")
        if rec["visits"][-1].get("grade") is None:
            raise InputError(f"eval {variant}: patient {pid}: last visit is not graded (run `llmrnn evaluate grade`)")


def variant_metrics(records: list[dict], specificity: dict | None = None) -> dict:
    """Metrics of one variant from its graded patient records (order-independent)."""
    from llmrnn.stats import wilson_ci

    records = sorted(records, key=lambda r: str(r["patient_id"]))
    last = [r["visits"][-1]["grade"] for r in records]
    n = len(last)
    out: dict[str, Any] = {"n_patients": n, "n_visits": sum(len(r["visits"]) for r in records)}
    for key, name in (("primary_correct", "acc_at_1"), ("any_top5_correct", "acc_at_5")):
        k = sum(bool(g[key]) for g in last)
        lo, hi = wilson_ci(k, n)
        out[name] = {"value": k / n if n else None, "correct": k, "n": n, "ci95": [lo, hi], "ci_method": "wilson"}
    by_visit: dict[int, list[dict]] = {}
    for r in records:
        for i, v in enumerate(r["visits"]):
            if v.get("grade") is not None:
                by_visit.setdefault(int(v.get("visit_index", i)), []).append(v["grade"])
    out["by_visit_index"] = [
        {
            "visit_index": i,
            "n": len(gs),
            "acc_at_1": _rate([bool(g["primary_correct"]) for g in gs]),
            "acc_at_5": _rate([bool(g["any_top5_correct"]) for g in gs]),
        }
        for i, gs in sorted(by_visit.items())
    ]
    visits = [v for r in records for v in r["visits"]]
    unparsable = {}
    for role in ROLES:
        flags = [not v[f"{role}_ok"] for v in visits if v.get(f"{role}_ok") is not None]
        unparsable[role] = {"rate": _rate(flags), "n": len(flags)}
    judged = [not v["grade"]["judge_ok"] for v in visits if v.get("grade") is not None]
    unparsable["final_judge"] = {"rate": _rate(judged), "n": len(judged)}
    out["unparsable"] = unparsable
    words = [v["memory_words"] for v in visits if v.get("memory_words") is not None]
    mem_by_visit: dict[int, list[int]] = {}
    for r in records:
        for i, v in enumerate(r["visits"]):
            if v.get("memory_words") is not None:
                mem_by_visit.setdefault(int(v.get("visit_index", i)), []).append(v["memory_words"])
    out["memory_words"] = (
        {
            "mean": statistics.fmean(words),
            "median": statistics.median(words),
            "max": max(words),
            "n": len(words),
            "mean_by_visit_index": {str(i): statistics.fmean(ws) for i, ws in sorted(mem_by_visit.items())},
        }
        if words
        else None
    )
    out["memory_recall"] = memory_recall_metrics(records)
    out["memory_specificity"] = specificity_metrics(records, specificity)
    return out


def compare_memory_recall(reference: list[dict], other: list[dict], boot: dict) -> dict | None:
    """Memory recall of `other` vs the reference on the patients both have transitions for."""
    from llmrnn.stats import paired_bootstrap, wilcoxon_signed_rank

    ref, oth = recall_by_patient(reference), recall_by_patient(other)
    pids = sorted(set(ref) & set(oth))
    if not pids:
        return None
    a, b = [ref[p] for p in pids], [oth[p] for p in pids]
    bs = paired_bootstrap(a, b, samples=int(boot.get("samples", 10_000)), seed=int(boot.get("seed", 0)))
    return {
        "a": statistics.fmean(a),
        "b": statistics.fmean(b),
        "n_pairs": len(pids),
        "diff": bs["diff"],
        "ci95": bs["ci95"],
        "bootstrap": {"samples": bs["samples"], "seed": bs["seed"], "se": bs.get("se")},
        "wilcoxon": wilcoxon_signed_rank(a, b),
    }


def compare(reference: list[dict], other: list[dict], name: str, boot: dict, exact_below: int,
            specificity: dict | None = None) -> dict:
    """`name` vs the reference on paired patients: difference + paired bootstrap CI + McNemar per metric."""
    from llmrnn.stats import mcnemar, paired_bootstrap

    ref = {str(r["patient_id"]): r["visits"][-1]["grade"] for r in reference}
    oth = {str(r["patient_id"]): r["visits"][-1]["grade"] for r in other}
    if set(ref) != set(oth):
        missing = sorted(set(ref) ^ set(oth))[:5]
        raise InputError(f"eval: {name} and {REFERENCE} graded different patients (e.g. {missing}); pairs must match")
    pids = sorted(ref)
    result: dict[str, Any] = {"a": REFERENCE, "b": name, "n_pairs": len(pids), "difference": "b - a"}
    for key, metric in (("primary_correct", "acc_at_1"), ("any_top5_correct", "acc_at_5")):
        a = [bool(ref[p][key]) for p in pids]
        b = [bool(oth[p][key]) for p in pids]
        bs = paired_bootstrap(a, b, samples=int(boot.get("samples", 10_000)), seed=int(boot.get("seed", 0)))
        result[metric] = {
            "a": sum(a) / len(a) if a else None,
            "b": sum(b) / len(b) if b else None,
            "diff": bs["diff"],
            "ci95": bs["ci95"],
            "bootstrap": {"samples": bs["samples"], "seed": bs["seed"], "se": bs.get("se")},
            "mcnemar": mcnemar(a, b, exact_below=exact_below),
        }
    result["memory_recall"] = compare_memory_recall(reference, other, boot)
    result["memory_specificity"] = compare_specificity(reference, other, boot, specificity)
    return result


def gather(graded: dict[str, list[Path]], cfg: dict) -> tuple[dict, dict]:
    """{variant: [graded shard files]} -> (metrics, comparison)."""
    per_variant = {}
    for variant, paths in graded.items():
        records = [rec for p in sorted(paths, key=str) for rec in io.read_jsonl(p)]
        _check_patients(variant, records)
        per_variant[variant] = records
    judge = FinalJudge(cfg.get("final_judge", {}))
    stats_cfg = cfg.get("stats", {})
    specificity = stats_cfg.get("specificity")
    metrics = {
        "final_judge": judge.describe(),
        "scored_visit": "last visit of each patient (Acc@1, Acc@5); by_visit_index grades every graded visit",
        "variants": {v: variant_metrics(r, specificity) for v, r in per_variant.items()},
    }
    boot = stats_cfg.get("bootstrap", {})
    exact_below = int(stats_cfg.get("mcnemar_exact_below", 25))
    if REFERENCE not in per_variant:
        raise InputError(f"eval gather: no {REFERENCE} variant among {sorted(per_variant)}")
    comparison = {
        "reference": REFERENCE,
        "primary": "trained",
        "comparisons": {
            v: compare(per_variant[REFERENCE], recs, v, boot, exact_below, specificity)
            for v, recs in per_variant.items()
            if v != REFERENCE
        },
    }
    return metrics, comparison


# ----------------------------------------------------------------------------- forward pass
def run_shard(
    patients: list[dict], variant: str, roles_cfg: dict, prompts_file: str, seed: int,
    memory_model: str | None = None, label: str = "eval", memory_adapter: str | None = None,
) -> tuple[list[dict], dict]:
    """The LLM-as-RNN forward pass (llmrnn.rnn.run_forward, batched per visit step) of one variant.

    base/trained: memory = "rnn" and only the memory role's weights differ (`memory_model`); baselines
    use the same prediction/evaluation roles with memory "none" or "full_history". Every variant gets
    the same roles config, prompts and seed, so sampling is paired per (patient, visit, role).
    """
    from llmrnn import rnn
    from llmrnn.prompts import load_prompts

    mode = variant_mode(variant)
    if variant in MEMORY_VARIANTS and variant != REFERENCE and not memory_model:
        raise InputError(f"eval {variant}: needs --memory-model (the merged trained model directory)")
    if memory_model and not (Path(memory_model) / "config.json").is_file():
        raise InputError(f"{memory_model}: not a HF model directory (no config.json); memory model of {variant}")
    prompts = load_prompts(prompts_file)
    if memory_adapter and not (Path(memory_adapter) / "adapter_config.json").is_file():
        raise InputError(f"{memory_adapter}: not a PEFT adapter folder (no adapter_config.json); memory adapter of {variant}")
    # with a vLLM memory role the trained model runs as its adapter on the base engine (one engine per GPU)
    roles = rnn.make_roles(roles_cfg, {"memory": memory_model} if memory_model else None,
                           memory_adapter=memory_adapter if variant == "trained" else None)
    stats: dict = {}
    results = rnn.run_forward(patients, roles, prompts, memory=mode, seed=seed, stats=stats, label=label)
    for rec in results:
        rec["variant"] = variant
    return results, stats


# ----------------------------------------------------------------------------- CLI
def _cmd_shard(args: argparse.Namespace) -> None:
    import os

    import torch

    from llmrnn.cohort import load_cohort

    torch.set_num_threads(max(1, int(args.threads or os.environ.get("OMP_NUM_THREADS", "1"))))
    cfg = args.cfg
    ev = cfg.get("eval", {})
    if "roles" not in cfg:
        raise InputError("evaluate shard: --cfg has no 'roles' section")
    patients = select_patients(load_cohort(args.test), ev.get("max_patients"), int(ev.get("patient_seed", 0)))
    if ev.get("max_visits"):  # each patient's first N visits (the demo's budget); the patient sample is unchanged
        patients = [{**p, "visits": p["visits"][: int(ev["max_visits"])]} for p in patients]
    part = shard_of(patients, args.shard, args.shards)  # the trajectories' policy: balanced by visits
    label = f"eval {args.variant} shard {args.shard + 1}/{args.shards}"
    log.info("%s: %d of %d selected test patients", label, len(part), len(patients))
    results, stats = run_shard(
        part, args.variant, cfg["roles"], args.prompts, int(ev.get("seed", 0)),
        memory_model=args.memory_model, label=label, memory_adapter=args.memory_adapter,
    ) if part else ([], {})
    io.write_jsonl(args.out, results)
    log.info("%s: done; backend calls %s, unparsable %s", label, stats.get("calls"), stats.get("unparsable"))


def _cmd_grade(args: argparse.Namespace) -> None:
    cfg = args.cfg
    records = io.read_jsonl(args.shard)
    judge = FinalJudge(cfg.get("final_judge", {}))
    grade_records(records, judge, visits=cfg.get("grade_visits", "all"))
    io.write_jsonl(args.out, records)
    log.info("graded %d patients of %s with the %s final judge", len(records), args.shard, judge.mode)


def _cmd_gather(args: argparse.Namespace) -> None:
    graded: dict[str, list[Path]] = {}
    for item in args.graded:  # RUN/eval/<variant>/graded_<k>.jsonl: the variant is the folder's name
        path = Path(item)
        if not path.is_file():
            raise InputError(f"{path}: graded shard not found")
        graded.setdefault(path.parent.name, []).append(path)
    metrics, comparison = gather(graded, args.cfg)
    io.write_json(args.metrics, metrics)
    io.write_json(args.comparison, comparison)
    for v, m in metrics["variants"].items():
        recall = (m.get("memory_recall") or {}).get("value")
        spec = m.get("memory_specificity") or {}
        log.info("%s: Acc@1 %.3f Acc@5 %.3f memory recall %s, other patients %s (n=%d)", v, m["acc_at_1"]["value"] or 0,
                 m["acc_at_5"]["value"] or 0, "n/a" if recall is None else f"{recall:.3f}",
                 "n/a" if spec.get("other_recall") is None else f"{spec['other_recall']:.3f}", m["n_patients"])


def register(sub: argparse._SubParsersAction) -> None:
    from llmrnn.cli import json_arg

    ev = sub.add_parser("evaluate", help="held-out evaluation: forward-pass shards, final judge, metrics")
    esub = ev.add_subparsers(dest="evaluate_command", required=True)

    p = esub.add_parser("shard", help="forward pass over one shard of the test split with one variant")
    p.add_argument("--test", required=True, help="the test split JSON")
    p.add_argument("--variant", required=True, choices=[*MEMORY_VARIANTS, *BASELINES])
    p.add_argument("--memory-model", default=None, help="HF dir replacing the memory role's model (trained)")
    p.add_argument("--memory-adapter", default=None,
                   help="the PEFT adapter --memory-model was merged from: a vLLM memory role serves it as a LoRA on "
                        "the base engine instead of opening a second engine")
    p.add_argument("--prompts", required=True, help="prompt templates (config prompts.file)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default OMP_NUM_THREADS or 1)")
    p.add_argument("--shard", type=int, required=True)
    p.add_argument("--shards", type=int, required=True)
    p.add_argument("--out", required=True, help="output: shard_<k>.jsonl, one line per patient")
    p.add_argument("--cfg", type=json_arg, required=True, help="JSON: {eval: forward-pass knobs, roles, prompts}")
    p.set_defaults(func=_cmd_shard)

    p = esub.add_parser("grade", help="final judge: grade every visit of a forward-pass shard")
    p.add_argument("--shard", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--cfg", type=json_arg, required=True, help="JSON: the eval section's final_judge etc.")
    p.set_defaults(func=_cmd_grade)

    p = esub.add_parser("gather", help="graded shards -> metrics.json + comparison.json")
    p.add_argument("--graded", nargs="+", required=True, help="graded shards, .../eval/<variant>/graded_<k>.jsonl")
    p.add_argument("--metrics", required=True)
    p.add_argument("--comparison", required=True)
    p.add_argument("--cfg", type=json_arg, required=True)
    p.set_defaults(func=_cmd_gather)

