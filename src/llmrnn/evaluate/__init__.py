"""Stage `evaluate`: held-out LLM-as-RNN evaluation of trained vs base memory model (and baselines).

Three steps, each a Snakemake job:
  shard   the forward pass (llmrnn.rnn.run_forward) over one shard of the test split with one memory model
          variant: base | trained (memory = "rnn", memory role's weights swapped) | zero_shot (no memory) |
          full_history (concatenated history) | memprompt (its own recent errors and their corrections);
          one JSON line per patient -> RUN/eval/<variant>/shard_<k>.jsonl
  grade   the final judge grades every visit's prediction against that visit's ground truth: the
          deterministic matcher (llmrnn.matching) or an LLM judge through the openai backend
          -> RUN/eval/<variant>/graded_<k>.jsonl
  gather  all graded shards -> RUN/eval/metrics.json (Acc@1/Acc@5 at each patient's last visit with
          Wilson CIs, accuracy by visit index, unparsable rates per role, memory length, memory recall) and
          RUN/eval/comparison.json (each variant vs base: paired bootstrap CI of the difference, McNemar;
          memory recall: paired bootstrap CI + Wilcoxon signed-rank; memory specificity: the same test on
          each patient's gap between own-patient and other-patient memory recall).
  compare (a command; no rule runs it yet) many variants and training seeds on the same patients
          (llmrnn.evaluate.comparison): each variant vs the base and each trained variant vs a control, Holm
          over the family, seed-pooled CIs, a forest plot.
Memory recall (judge-free): at every visit t >= 1, the share of visit t's discharge diagnoses that the
memory shown to the prediction model (h_{t-1}) names (llmrnn.reward.outcome_share, the quantity the outcome
reward pays for); a patient's value is the mean over its transitions. Its control, memory specificity:
the same memory scored against OTHER test patients' visit t (a fixed, seeded set per patient,
eval.stats.specificity); a memory that lists conditions common in the cohort scores there too.
Metrics depend only on the union of shards, never on how patients were split across them.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from llmrnn import io
from llmrnn.errors import InputError
from llmrnn.evaluate.gather import gather
from llmrnn.evaluate.grading import FinalJudge, grade_records, parse_judge_verdict
from llmrnn.evaluate.recall import (
    BASELINES,
    MEMORY_VARIANTS,
    memory_recall_metrics,
    recall_by_patient,
    select_patients,
)
from llmrnn.evaluate.shard import run_shard
from llmrnn.evaluate.specificity import memory_words, other_patients, specificity_by_patient
from llmrnn.runconfig import filled
from llmrnn.trajectories import shard_of

log = logging.getLogger(__name__)

__all__ = [
    "FinalJudge",
    "gather",
    "grade_records",
    "memory_recall_metrics",
    "memory_words",
    "other_patients",
    "parse_judge_verdict",
    "recall_by_patient",
    "run_shard",
    "select_patients",
    "specificity_by_patient",
]


# ----------------------------------------------------------------------------- CLI
def _cmd_shard(args: argparse.Namespace) -> None:
    import os

    import torch

    from llmrnn.cohort import load_cohort

    torch.set_num_threads(max(1, int(args.threads or os.environ.get("OMP_NUM_THREADS", "1"))))
    cfg = args.cfg
    ev = filled("eval", cfg.get("eval"))  # the models' defaults under what --cfg names
    if "roles" not in cfg:
        raise InputError("evaluate shard: --cfg has no 'roles' section")
    patients = select_patients(load_cohort(args.test), ev.get("max_patients"), int(ev["patient_seed"]))
    if ev.get("max_visits"):  # each patient's first N visits (the demo's budget); the patient sample is unchanged
        patients = [{**p, "visits": p["visits"][: int(ev["max_visits"])]} for p in patients]
    part = shard_of(patients, args.shard, args.shards)  # the trajectories' policy: balanced by visits
    label = f"eval {args.variant} shard {args.shard + 1}/{args.shards}"
    log.info("%s: %d of %d selected test patients", label, len(part), len(patients))
    # finished rows survive a kill (SLURM time limit, preemption): llmrnn.kept, valid only for this very shard
    from llmrnn import kept

    fingerprint = kept.fingerprint("evaluate shard", cfg, args.variant, args.memory_model, args.memory_adapter,
                                   io.sha256_file(args.prompts), [p.get("subject_id") for p in part])

    replay = io.read_jsonl(args.replay) if args.replay else None
    if replay is not None and sorted(str(r.get("patient_id")) for r in replay) != sorted(
            str(p.get("subject_id")) for p in part):
        raise InputError(f"{label}: --replay {args.replay} is not of this shard's patients (another eval config?)")

    def work(chunk: list[dict]) -> tuple[list[dict], dict]:
        return run_shard(chunk, args.variant, cfg["roles"], args.prompts, int(ev["seed"]),
                         memory_model=args.memory_model, label=label, memory_adapter=args.memory_adapter,
                         replay=replay)

    results, stats = kept.run_kept(part, work, args.out, fingerprint, label) if part else ([], {})
    io.write_jsonl(args.out, results)
    kept.finish(args.out)
    log.info("%s: done; backend calls %s, unparsable %s%s", label, stats.get("calls"), stats.get("unparsable"),
             f", outputs replayed from {args.replay} {stats['replayed']}" if stats.get("replayed") else "")


def _cmd_grade(args: argparse.Namespace) -> None:
    cfg = filled("eval", args.cfg)
    records = io.read_jsonl(args.shard)
    judge = FinalJudge(cfg["final_judge"])
    grade_records(records, judge, visits=cfg["grade_visits"])
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


def parse_runs(items: list[str]) -> dict[str, dict[str | None, list[Path]]]:
    """`NAME=PATH` (a single run) or `NAME@SEED=PATH` (one seed of a trained variant), repeated; several
    paths of one run are its shards."""
    runs: dict[str, dict[str | None, list[Path]]] = {}
    for item in items:
        name, sep, path = item.partition("=")
        variant, at, seed = name.partition("@")
        if not sep or not variant or not path or (at and not seed):
            raise InputError(f"--variant {item!r}: expected NAME=PATH or NAME@SEED=PATH (a graded shard)")
        if not Path(path).is_file():
            raise InputError(f"--variant {item!r}: {path}: graded shard not found")
        runs.setdefault(variant, {}).setdefault(seed if at else None, []).append(Path(path))
    return runs


def _cmd_compare(args: argparse.Namespace) -> None:
    from llmrnn.evaluate.comparison import compare_variants, plot_forest

    runs = {variant: {seed: [rec for p in paths for rec in io.read_jsonl(p)] for seed, paths in seeds.items()}
            for variant, seeds in parse_runs(args.variant).items()}
    base_of = {}
    for item in args.base_of:
        variant, sep, own = item.partition("=")
        if not sep or not variant or not own:
            raise InputError(f"--base-of {item!r}: expected VARIANT=BASE (a trained variant and its own base run)")
        base_of[variant] = own
    comparison = compare_variants(runs, base=args.base, control=args.control, stats=args.cfg.get("stats"),
                                  alpha=args.alpha, base_of=base_of)
    io.write_json(args.out, comparison)
    if args.plot:
        plot_forest(comparison, args.plot)
    significant = [t for t in comparison["family"]["tests"] if t["significant"]]
    log.info("compare: %d variants, %d comparisons, %d of %d tests significant after Holm (alpha %g)",
             len(runs), len(comparison["comparisons"]), len(significant), comparison["family"]["size"], args.alpha)


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
    p.add_argument("--replay", default=None,
                   help="the base variant's shard of the same patients (and eval config): the calls whose prompts "
                        "are all the base's (the first visit's prediction and evaluation) take its outputs")
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

    p = esub.add_parser("compare", help="many variants (and seeds) on the same patients -> comparison.json, forest plot")
    p.add_argument("--variant", action="append", required=True, metavar="NAME[@SEED]=PATH",
                   help="a graded shard of a variant (repeat: several shards, seeds and variants); NAME@SEED marks "
                        "one training seed of a trained variant")
    p.add_argument("--base", default="base", help="the frozen base every variant is compared with (default base)")
    p.add_argument("--base-of", action="append", default=[], metavar="VARIANT=BASE",
                   help="a trained variant's own frozen base (a single run) in place of --base, repeated")
    p.add_argument("--control", default=None, help="a variant every other trained variant is compared with")
    p.add_argument("--alpha", type=float, default=0.05, help="family-wise error rate of the Holm correction")
    p.add_argument("--out", required=True, help="output: comparison.json")
    p.add_argument("--plot", default=None, help="output: the forest plot of the differences (PNG)")
    p.add_argument("--cfg", type=json_arg, default={}, help="JSON: the eval section's stats (bootstrap, McNemar)")
    p.set_defaults(func=_cmd_compare)
