"""The report's landing page (`llmrnn report overview`, rule report_overview): what was trained (model, reward
and its code identity, steps, seeds, patients), the headline comparison with its CI and what it rests on,
and what to do next, from the run's own files. workflow/report/workflow.rst takes the page in whole, so the
report opens with it; `make demo` ends with the same headline line (`llmrnn report headline`)."""

from __future__ import annotations

import re
from html import escape
from pathlib import Path

from llmrnn import html_table, io
from llmrnn.errors import InputError
from llmrnn.provenance import code_identity
from llmrnn.release.manifest import own_reward
from llmrnn.reward import reward_mode, reward_settings
from llmrnn.reward.custom import code_files


def _recall(comparison: dict) -> dict:
    c = (comparison.get("comparisons", {}).get("trained") or {}).get("memory_recall")
    if not c:
        raise InputError("comparison: no trained-vs-base memory_recall comparison (did the evaluation run?)")
    return c


def headline(comparison: dict, seeds: int | None = 1) -> str:
    """The run's result in one line: held-out memory recall, trained vs base, with its CI, test and n (and the
    training seeds it rests on; None: a model trained elsewhere, eval.trained_model, whose seeds are not known)."""
    c = _recall(comparison)
    lo, hi = c["ci95"]
    rests = f"on {c['n_pairs']} held-out patients"
    if seeds is not None:
        rests += f" and {seeds} training seed{'s' if seeds != 1 else ''}"
    return (f"held-out memory recall: base {c['a']:.3f} -> trained {c['b']:.3f}, {c['diff']:+.3f} "
            f"[95% CI {lo:+.3f}, {hi:+.3f}], Wilcoxon p {c['wilcoxon']['p_value']:.4f}, {rests}")


def control_line(comparison: dict) -> str | None:
    """The patient-specificity control in one line: trained - base on the gap (own - other patients' recall)."""
    s = (comparison.get("comparisons", {}).get("trained") or {}).get("memory_specificity")
    if not s:
        return None
    lo, hi = s["ci95"]
    return (f"memory recall against the patient's own visits minus other patients': gap base "
            f"{s['a']:+.3f} -> trained {s['b']:+.3f}, {s['diff']:+.3f} [95% CI {lo:+.3f}, {hi:+.3f}], "
            f"Wilcoxon p {s['wilcoxon']['p_value']:.4f}, on {s['n_pairs']} patients")


def significant(comparison: dict) -> bool:
    """The headline's interval excludes 0 and its Wilcoxon p is below 0.05."""
    c = _recall(comparison)
    lo, hi = c["ci95"]
    return (lo > 0 or hi < 0) and c["wilcoxon"]["p_value"] < 0.05


def training_code(cfg: dict) -> str:
    """The training job's code identity, as its rule's `code` param has it (rules/train.smk): the modules
    `llmrnn train run` can run, the reward's among them, and your own reward's file."""
    return code_identity("train run", *code_files({"reward": cfg.get("reward") or {}}))


def reward_rows(cfg: dict, rubric: str | None) -> list[tuple[str, str]]:
    """The reward the run trained with and its code identity: your own reward's file by sha256, else the
    built-in reward's modules inside the training job's code identity."""
    reward = cfg.get("reward") or {}
    code = f"the training job's code identity {training_code(cfg)} (the modules of llmrnn train run"
    own = own_reward(cfg)  # the card's and manifest's account of the same file
    if own:
        path, sha = own["path"], own["sha256"] or "(the file is gone)"
        return [("reward", f"your own: {own['name']} in {path} (reward.custom; no judge)"),
                ("reward code", f"{path}: sha256 {sha}; in {code} and that file)")]
    mode = reward_mode(reward_settings(reward))
    sha = f", sha256 {io.sha256_file(rubric)[:16]}" if mode.asks_judge and rubric and Path(rubric).is_file() else ""
    return [("reward", mode.report_reward(f"{rubric or '-'}{sha}")), ("reward code", f"llmrnn.reward, in {code})")]


def trained_rows(cfg: dict, splits: dict, comparison: dict, train_summary: dict | None,
                 rubric: str | None) -> list[tuple[str, str]]:
    """What was trained, and on whom it was measured, one (what, this run) row each."""
    sizes = splits.get("sizes") or {}
    ev, train = cfg.get("eval") or {}, cfg.get("train") or {}
    held_out = (f"{_recall(comparison)['n_pairs']} held-out patients of the {_count(sizes, 'test')} in the test "
                f"split (eval.max_patients {ev.get('max_patients') or 'null: all'})")
    if ev.get("trained_model"):
        return [("trained model", (f"eval.trained_model {ev['trained_model']}: trained outside this run, so its "
                                   "training, reward and seeds are not this run's to report")),
                ("base model", cfg.get("memory_model") or "-"), ("evaluated on", held_out)]
    if train_summary is None:
        raise InputError("overview: no --train-summary for this run's trained model (eval.trained_model is unset)")
    ck = train_summary.get("checkpoint") or {}
    steps = (f"{train_summary.get('steps')} of {train_summary.get('planned_steps')} planned GRPO steps "
             f"({train_summary.get('engine') or train.get('engine')}); the merged adapter is step {ck.get('step')} "
             f"(train.select {ck.get('select') or train.get('select')})")
    prompts = f" ({train_summary['train_rows']} prompts)" if train_summary.get("train_rows") else ""
    return [
        ("memory model", f"{cfg.get('memory_model')} with a LoRA of rank {(train.get('lora') or {}).get('rank')}"),
        *reward_rows(cfg, rubric),
        ("steps", steps),
        ("seeds", (f"one training seed (train.seed {train.get('seed')}): every interval here is over patients, "
                   "none over seeds")),
        ("patients", f"{_count(sizes, 'train')} in training{prompts}, {_count(sizes, 'val')} in validation"),
        ("evaluated on", held_out),
    ]


def _count(sizes: dict, split: str) -> str:
    """A split's patient count from splits.json ("?" where the file does not give it)."""
    n = sizes.get(split)
    return "?" if n is None else str(n)


def next_steps(cfg: dict, comparison: dict, splits: dict) -> list[str]:
    """What to do next, from what this run measured and how it was configured."""
    steps = []
    ev, train = cfg.get("eval") or {}, cfg.get("train") or {}
    if not significant(comparison):
        steps.append("The interval includes 0 (or p >= 0.05): train longer (train.total_steps) or evaluate more "
                     "patients before reading a gain into it.")
    most, test = ev.get("max_patients"), (splits.get("sizes") or {}).get("test")
    if most and test and most < test:
        steps.append(f"eval.max_patients {most} evaluates {most} of the {test} test patients: raise it (null: "
                     "all) for a narrower interval.")
    if not ev.get("trained_model"):
        seed = train.get("seed")
        others = [s for s in (1, 2, 3) if s != seed][:2]
        spread = (f"`PATH=.venv/bin:$PATH .venv/bin/python benchmarks/demo_seeds.py --seeds {seed} "
                  f"{' '.join(map(str, others))}` retrains the demo with other seeds (docs/results.md)"
                  if cfg.get("run_name") == "demo" else "rerun with another train.seed under a run_name of its own")
        steps.append(f"The spread over seeds: {spread}.")
    if not ((cfg.get("reward") or {}).get("custom") or {}).get("path"):
        steps.append("Your own reward: docs/rewards.md (`llmrnn reward try` scores it before any training).")
    steps.append("The cluster route: docs/cluster.md (`llmrnn check` and `snakemake --profile profiles/slurm "
                 "cost_plan` first: GPU-hours before submitting).")
    return steps


def _with_code(text: str) -> str:
    """Escaped text with its `backticked` commands as <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(text))


def overview_html(cfg: dict, comparison: dict, splits: dict, train_summary: dict | None,
                  rubric: str | None = None) -> str:
    """The landing page: the headline, what was trained, what next."""
    seeds = None if (cfg.get("eval") or {}).get("trained_model") else 1
    control = control_line(comparison)
    body = (f"<p><strong>Headline</strong>: {escape(headline(comparison, seeds))}.</p>\n"
            + (f"<p><strong>Control</strong>: {escape(control)}.</p>\n" if control else "")
            + "<p><strong>What was trained</strong>:</p>\n"
            + html_table.table(("what", "this run"),
                               trained_rows(cfg, splits, comparison, train_summary, rubric))
            + "<p><strong>Next</strong>:</p>\n<ul>\n"
            + "".join(f"<li>{_with_code(step)}</li>\n" for step in next_steps(cfg, comparison, splits)) + "</ul>\n")
    return html_table.page(f"Run {cfg.get('run_name')}: overview", body)


def write_overview(args) -> None:
    """`llmrnn report overview`: read the run's files (one line naming a missing one), write the page."""
    for path in (args.comparison, args.splits, args.train_summary):
        if path and not Path(path).is_file():
            raise InputError(f"{path}: not found (snakemake eval_heldout makes it)")
    summary = io.read_json(args.train_summary) if args.train_summary else None
    io.write_text(args.out, overview_html(args.cfg, io.read_json(args.comparison), io.read_json(args.splits),
                                          summary, args.rubric))
