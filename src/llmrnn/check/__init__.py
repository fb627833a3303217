"""`llmrnn check`: the pre-submit check. Runs on a login node (no GPU) and lists ALL problems at once,
before anything is queued: config schema, cohort file, base models + chat templates (or hub ids that
resolve), the judge rubric and model, batch geometry, the verl command composed against the installed
verl config, the Hub token and target repo when upload is on, and the SLURM profile's GPU counts. An
experiment's config (section `experiment`, docs/compare.md) is checked as each of its variants runs it: a
problem only some variants have names them (`experiment.variants.rank8: ...`).

    llmrnn check [--configfile config/reproduce.yaml ...] [--out check.json]

Exit 0 when no problem was found, 1 otherwise (every problem on its own line).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

# one module per concept; the names below are `llmrnn.check`'s API (tests and other modules use them)
from llmrnn.check.cohort import check_cohort, check_qa_data, withhold_ids
from llmrnn.check.config import VALUE_ERRORS, load_config
from llmrnn.check.gpus import check_engine_budget, check_gpu_stack
from llmrnn.check.judge import check_judge
from llmrnn.check.models import chat_template_problem, check_models, hub_problem
from llmrnn.check.outside import check_env_names, check_external_endpoints, check_upload
from llmrnn.check.prompts import check_prompt_lengths, check_shown_sections
from llmrnn.check.reward import check_custom_reward
from llmrnn.check.slurm import (
    PROFILE_GPU_DEFAULTS,
    benchmark_advice,
    check_partition_time,
    check_profile_env,
    check_profile_gpus,
)
from llmrnn.check.training import check_attention, check_training, check_verl_command, compose_verl
from llmrnn.errors import doc_summary

__all__ = ["CHECKS", "PROFILE_GPU_DEFAULTS", "RECIPE_ONLY", "SMOKE_COMMAND", "VALUE_ERRORS", "chat_template_problem",
           "check_attention", "check_cohort", "check_custom_reward", "check_engine_budget", "check_env_names", "check_external_endpoints",
           "check_gpu_stack", "check_judge", "check_models", "check_partition_time", "check_profile_gpus", "check_prompt_lengths",
           "check_qa_data", "check_shown_sections", "check_training", "check_upload", "check_verl_command", "compose_verl", "hub_problem",
           "load_config", "register", "run_checks", "smoke_advice", "withhold_ids"]

log = logging.getLogger(__name__)


CHECKS: list[tuple[str, Callable[[dict], list[str]]]] = [
    ("secrets", check_env_names),
    ("patient text", check_external_endpoints),
    ("cohort", check_cohort),
    ("qa data", check_qa_data),
    ("models", check_models),
    ("judge", check_judge),
    ("own reward", check_custom_reward),
    ("training", check_training),
    ("prompt length", check_prompt_lengths),
    ("shown sections", check_shown_sections),
    ("gpu memory", check_engine_budget),
    ("gpu stack", check_gpu_stack),
    ("slurm time limits", check_partition_time),
    ("slurm profile", check_profile_env),
    ("upload", check_upload),
]


# checks that belong to one recipe (the rest apply to both)
RECIPE_ONLY = {"qa data": "qa"}


def run_checks(config_paths: list[Path]) -> dict:
    """Every check, each isolated (one crashing check is a problem, not the end of the list)."""
    from llmrnn.check import skips

    config, problems = load_config(config_paths)
    schema_ok = not any(p.startswith("config: ") for p in problems)
    targets = check_targets(config, problems) if schema_ok else {"": config}
    ran = ["schema"]
    skips.reset()
    for name, fn in CHECKS:
        if RECIPE_ONLY.get(name, config.get("recipe")) != config.get("recipe"):
            continue  # each recipe's own checks only
        found: dict[str, list[str]] = {}  # problem -> the variants that have it
        checked = False
        for variant, target in targets.items():
            skips.start(name)
            before = len(skips.SKIPPED)
            try:
                lines = fn(target)
            except Exception as exc:  # noqa: BLE001 - report and go on: the point is to list everything
                if schema_ok:
                    lines = [f"{name}: check crashed: {type(exc).__name__}: {exc}"]
                else:  # a value the schema already named (e.g. a list where a number belongs) tripped it
                    lines = [f"{name}: not checked: fix the config problems above first"]
            for line in lines:
                found.setdefault(line, []).append(variant)
            # a check that could check nothing here is listed as skipped or not needed only
            checked |= not any(why.startswith(("all:", skips.UNUSED)) for _, why in skips.SKIPPED[before:])
        # a problem every variant has is the config's; one that some have names them
        problems += [line if len(variants) == len(targets) else
                     f"experiment.variants.{','.join(variants)}: {line}" for line, variants in found.items()]
        if checked:
            ran.append(name)
    said = list(dict.fromkeys(skips.SKIPPED))  # each variant's pass says the same skip once
    skipped = [f"{n} ({why.removeprefix('all:').strip()})" for n, why in said if not why.startswith(skips.UNUSED)]
    unused = [f"{n} ({why.removeprefix(skips.UNUSED).strip()})" for n, why in said
              if why.startswith(skips.UNUSED) and n not in ran]  # not needed by any variant
    return {"ok": not problems, "problems": problems, "checks": ran, "skipped": skipped, "not_needed": unused,
            "configfiles": [str(p) for p in config_paths], "run_name": config.get("run_name"),
            "advice": smoke_advice(config) + _benchmark_advice(config) + _cost_plan_advice(config, schema_ok)}


def check_targets(config: dict, problems: list[str]) -> dict[str, dict]:
    """The configs the checks read, by variant: one run's own (variant ""); an experiment's, each variant's (its
    first member's config, llmrnn.plan.member_configs: a variant's members differ in train.seed alone), so a
    variant's own models, judge, cohort or training is checked as that variant runs it. A config whose members
    cannot be made (they differ in what resources/ holds for all) is checked as it is, the reason in problems."""
    from llmrnn.errors import InputError
    from llmrnn.plan import is_experiment, member_configs, member_names

    if not is_experiment(config):
        return {"": config}
    try:
        members = member_configs(config)
    except InputError as exc:
        problems.append(str(exc))
        return {"": config}
    targets: dict[str, dict] = {}
    for member, (variant, _) in member_names(config["experiment"]).items():
        targets.setdefault(variant, members[member])
    return targets


def _cost_plan_advice(config: dict, schema_ok: bool) -> list[str]:
    """The cost plan's total (llmrnn.cost_plan), before anything is queued; its table: `llmrnn report cost-plan`."""
    from llmrnn.plan.recipe import RECIPES

    recipe = RECIPES.get(config.get("recipe")) if schema_ok else None
    if recipe is None or not recipe.cost_stages:  # a recipe whose cost is not planned yet
        return []
    from llmrnn.cost_plan import plan_stages, summary_line

    try:
        return [summary_line(plan_stages(config, f"logs/{config.get('run_name')}/benchmarks"))]
    except Exception as exc:  # noqa: BLE001 - advice only: a bad benchmark file must not hide the problems
        return [f"cost plan: not computed: {exc}"]


def _benchmark_advice(config: dict) -> list[str]:
    try:
        return benchmark_advice(config)
    except Exception as exc:  # noqa: BLE001 - advice only: a bad benchmark file must not hide the problems
        return [f"the last run's benchmark files were not read: {exc}"]


SMOKE_COMMAND = "snakemake --profile profiles/slurm all --configfile config/smoke.yaml"


def smoke_advice(config: dict) -> list[str]:
    """A long verl run (more steps than the smoke test's few) gets told to run the cluster smoke test first."""
    from llmrnn.runconfig import filled

    train = config.get("train") or {}
    steps = train.get("total_steps")
    if not isinstance(train, dict) or filled("train", train)["engine"] != "verl" or (isinstance(steps, int) and steps <= 4):
        return []
    return [(f"first run the cluster smoke test on this cluster ({SMOKE_COMMAND}: a few verl steps on one GPU node; "
             "docs/cluster.md 'Smoke test first'): it fails in minutes where this run would fail after hours")]


def _cmd_check(args: argparse.Namespace) -> int:
    # like the Snakefile: the given files alone, config/config.yaml only when none is given
    from llmrnn.runconfig import configfiles_for

    if args.sdm is not None:  # the gpu stack check reads it where the profile does
        os.environ["LLMRNN_SDM"] = args.sdm
    report = run_checks(configfiles_for(args.configfile))
    if args.out:
        from llmrnn.io import write_json

        write_json(args.out, report)
    files = " + ".join(report["configfiles"])
    for advice in report["advice"]:
        print(f"llmrnn check: {advice}", file=sys.stderr)
    if report["ok"]:
        skipped = f"; skipped: {'; '.join(report['skipped'])}" if report["skipped"] else ""
        unused = f"; not needed: {'; '.join(report['not_needed'])}" if report["not_needed"] else ""
        print(f"llmrnn check: OK ({files}; checked {', '.join(report['checks'])}{skipped}{unused})")
        return 0
    print(f"llmrnn check: {len(report['problems'])} problem(s) with {files}:", file=sys.stderr)
    for problem in report["problems"]:
        print(f"  - {problem}", file=sys.stderr)
    return 1


def register(sub) -> None:
    p = sub.add_parser(
        "check",
        help="pre-submit check: list every problem of the config and its inputs before queueing",
        description=doc_summary(__doc__),
    )
    p.add_argument("--configfile", nargs="*", default=[],
                   help="config files layered in order, as snakemake --configfile; none: config/config.yaml")
    p.add_argument("--out", help="also write the report as JSON")
    p.add_argument("--sdm", default=None,
                   help="the jobs' software-deployment method (snakemake --sdm: conda, apptainer; empty: the "
                        "environment this runs in); default: $LLMRNN_SDM, as profiles/slurm reads it")
    p.set_defaults(func=_cmd_check)
