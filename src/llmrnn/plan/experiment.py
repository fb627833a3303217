"""An experiment's plan (config `experiment`): its members (each variant, times each training seed), the config
each member runs, and the folders of the stages members share.

A stage an experiment's members may share is keyed by what it reads: a hash of the params the plan gives the
stage's rules (the same `--cfg` subsets a change of which reruns them) and the keys of the stages it reads
from. Members whose settings agree for a stage get the same key, so the same folder (results/RUN/<stage>-<key>),
so the same jobs: two variants that differ only in train.lora.rank share the cohort, trajectories, judge and the
untrained models' evaluation; one that changes cohort.mimic_iv.mode gets its own cohort and everything after
it. What no key names (preflight, training, merge, the trained model's evaluation, report, release) is the
member's own, under results/RUN/<member>.

The Snakefile loads rules/experiment.smk for such a config: one Snakemake module per member over that
member's config, so one DAG; a shared file's rules exist in every member that shares it, and the first
member's are the ones Snakemake runs (ruleorder), as their outputs and params are the same by construction.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from collections.abc import Mapping

from llmrnn.errors import InputError
from llmrnn.io import deep_merge
from llmrnn.plan.common import Paths, PlanBase, to_json
from llmrnn.runconfig import with_defaults

# the stages members may share, in DAG order; the others are each member's own
SHARED_STAGES = ("cohort", "trajectories", "judge", "untrained_eval")
OWN_STAGES = ("train", "merge", "trained_eval", "report")


def is_experiment(config: Mapping) -> bool:
    """Whether the config names variants (and is not already one member's config)."""
    experiment = config.get("experiment") or {}
    return bool(experiment.get("variants")) and not experiment.get("member")


def member_of(config: Mapping) -> str | None:
    """The member a config is (the workflow sets experiment.member for each member's module), or None."""
    return (config.get("experiment") or {}).get("member")


def digest(*parts) -> str:
    """A short stable key of JSON-able parts."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:10]


def member_names(experiment: Mapping) -> dict[str, tuple[str, int | None]]:
    """member name -> (variant, seed): each variant once per seed (`<variant>-s<seed>`), or once without seeds."""
    seeds = experiment.get("seeds") or [None]
    return {(variant if seed is None else f"{variant}-s{seed}"): (variant, seed)
            for variant in experiment["variants"] for seed in seeds}


def member_configs(config: Mapping) -> dict[str, dict]:
    """Each member's effective config: the experiment's config, its variant's overrides and its seed (train.seed)
    layered on it, the schema's defaults filled in, and experiment.member naming it."""
    experiment = config["experiment"]
    base = {k: v for k, v in config.items() if k != "experiment"}
    out = {}
    for name, (variant, seed) in member_names(experiment).items():
        layered = deep_merge(base, experiment["variants"][variant])
        if seed is not None:
            layered = deep_merge(layered, {"train": {"seed": seed}})
        member = with_defaults(layered)
        member["experiment"] = {**experiment, "member": name}
        out[name] = member
    models = {}
    for name, member in out.items():
        for model, spec in member["models"].items():
            if models.setdefault(model, (name, spec))[1] != spec:
                raise InputError(f"experiment: models.{model} differs between {models[model][0]} and {name}; "
                                 "a prepared model is shared by every member (name the other model differently)")
    return out


def stage_keys(plan) -> dict[str, str]:
    """The key of each shared stage of one member's plan: the params its rules get from the plan, and the keys
    of the stages it reads. The judge is shared only when no training job asks it (reward.mode outcome: it
    serves the agreement check); a judge the reward asks is a service of its member's training."""
    c = plan.config
    source = c["cohort"]["source"]
    cohort = {"source": source, "raw_sha256": plan.cohort.raw_sha256(), "split": plan.cohort.split_cfg()}
    if source == "synthetic":
        cohort["synthetic"] = c["cohort"]["synthetic"]
    elif source == "mimic_iv":
        cohort["mimic_iv"] = [plan.cohort.mimic_iv_cfg(), c["cohort"]["mimic_iv"]["hosp"], c["cohort"]["mimic_iv"]["note"]]
    keys = {"cohort": digest(cohort)}
    keys["trajectories"] = digest(keys["cohort"], plan.trajectories.shard_cfg(), c["prompts"]["file"],
                                  plan.models.memory_model_input())
    if not plan.judge.planned():
        keys["judge"] = digest(keys["trajectories"], plan.cfg_json("judge"), plan.judge.agreement_cfg())
    used = {r["model"] for r in c["roles"].values()}
    keys["untrained_eval"] = digest(keys["cohort"], plan.evaluate.forward_cfg(),
                                    plan.evaluate.section_cfg("final_judge", "grade_visits"), c["eval"]["shards"],
                                    c["prompts"]["file"], to_json({n: m for n, m in c["models"].items() if n in used}))
    return keys


def member_paths(plan, member: str) -> Paths:
    """A member's paths: its own folder results/RUN/<member> (logs/RUN/<member>), and each shared stage's
    folder results/RUN/<stage>-<key>."""
    run_name = plan.config["run_name"]
    roots = {stage: f"results/{run_name}/{stage}-{key}" for stage, key in stage_keys(plan).items()}
    return Paths(run=f"results/{run_name}/{member}", logs=f"logs/{run_name}/{member}", stage_roots=roots)


class ExperimentPlan(PlanBase):
    """The plan of a config with an `experiment` section: each member's Plan (`members`), the sharing of stages
    between them (`sharing`), and the comparison of them all (`comparison_*`)."""

    def __init__(self, config: Mapping):
        super().__init__(config)
        from llmrnn.plan import Plan  # the members' plans are whole plans (llmrnn.plan imports this module)

        self.experiment = config["experiment"]
        self.names = member_names(self.experiment)
        self.members = {name: Plan(cfg) for name, cfg in member_configs(config).items()}
        self.control = self.experiment.get("control") or next(iter(self.experiment["variants"]))

    def rule_prefix(self, member: str) -> str:
        """The prefix of a member's rules in the experiment's DAG (a rule name is an identifier)."""
        return "".join(ch if ch.isalnum() else "_" for ch in member) + "__"

    def sharing(self) -> list[dict]:
        """One row per distinct job group: the stage, its key (a member's name for its own stages), its folder and
        the members that share it, in DAG order."""
        rows = []
        for stage in SHARED_STAGES:
            groups: dict[str, list[str]] = {}
            for name, plan in self.members.items():
                key = plan.paths.stage_roots.get(stage)
                groups.setdefault(key or plan.paths.run, []).append(name)
            for folder, names in groups.items():
                rows.append({"stage": stage, "folder": folder, "members": names})
        for stage in OWN_STAGES:
            rows += [{"stage": stage, "folder": plan.paths.run, "members": [name]} for name, plan in self.members.items()]
        return rows

    def jobs_per_stage(self) -> dict[str, int]:
        """How many distinct job groups each stage plans (1 = every member shares it)."""
        counts: dict[str, int] = {}
        for row in self.sharing():
            counts[row["stage"]] = counts.get(row["stage"], 0) + 1
        return counts

    def sharing_lines(self) -> list[str]:
        """The sharing table as text (`llmrnn experiment plan`)."""
        head = (f"experiment {self.config['run_name']}: {len(self.members)} members "
                f"({', '.join(self.members)}); control {self.control}")
        lines = [head]
        width = max(len(s) for s in (*SHARED_STAGES, *OWN_STAGES))
        for row in self.sharing():
            share = "all" if len(row["members"]) == len(self.members) > 1 else ", ".join(row["members"])
            lines.append(f"  {row['stage']:<{width}}  {row['folder']:<48}  {share}")
        return lines

    # ------------------------------------------------------------------------- the comparison of the members
    def comparison_folder(self) -> str:
        return f"results/{self.config['run_name']}/eval"

    def comparison_targets(self) -> list[str]:
        return [f"{self.comparison_folder()}/comparison.json", f"{self.comparison_folder()}/forest.png"]

    def comparison_runs(self, wildcards=None) -> dict[str, list[str]]:
        """`llmrnn evaluate compare`'s runs, by argument: each member's trained model as VARIANT@SEED, the base and
        the baselines of the control's first member (every member is evaluated on the same test patients)."""
        first = next(name for name, (variant, _) in self.names.items() if variant == self.control)
        control = self.members[first]
        runs: dict[str, list[str]] = {}
        for variant in control.evaluate.variants():
            if variant != "trained":
                runs[variant] = control.evaluate.variant_files(variant)
        for name, (variant, seed) in self.names.items():
            plan = self.members[name]
            seed = plan.config["train"]["seed"] if seed is None else seed
            runs[f"{variant}@{seed}"] = plan.evaluate.variant_files("trained")
        return runs

    def comparison_inputs(self, wildcards=None) -> list[str]:
        return sorted({path for paths in self.comparison_runs().values() for path in paths})

    def comparison_args(self, wildcards=None) -> list[str]:
        """--variant NAME=PATH for every graded shard, a list for `{params.variants:q}`."""
        return [arg for name, paths in self.comparison_runs().items() for path in paths
                for arg in ("--variant", f"{name}={path}")]

    def comparison_cfg(self) -> str:
        """params of compare_variants: the statistics knobs of the control (`eval.stats`)."""
        return to_json({"stats": self.config["eval"]["stats"]})

    def products(self) -> list[str]:
        """What `all` builds: every member's products and the comparison."""
        return [*(p for plan in self.members.values() for p in plan.products()), *self.comparison_targets()]

    def heldout_targets(self) -> list[str]:
        return [*(p for plan in self.members.values() for p in plan.recipe.heldout_targets()),
                *self.comparison_targets()]


# ----------------------------------------------------------------------------- llmrnn experiment plan
def experiment_plan(configfiles: list[str | os.PathLike]) -> ExperimentPlan:
    """The experiment of config files layered as the Snakefile layers them; one line when they name none."""
    from llmrnn.plan import Plan

    plan = Plan.from_configfiles(*configfiles)
    if plan.experiment is None:
        raise InputError(f"experiment plan: {' '.join(map(str, configfiles)) or 'config/config.yaml'} has no "
                         "`experiment` section (variants); a config without one is a single run")
    return plan.experiment


def _cmd_plan(args: argparse.Namespace) -> int:
    experiment = experiment_plan(args.configfile)
    if args.json:
        print(json.dumps({"members": list(experiment.members), "control": experiment.control,
                          "jobs_per_stage": experiment.jobs_per_stage(), "sharing": experiment.sharing()}, indent=1))
    else:
        print("\n".join(experiment.sharing_lines()))
    return 0


def register(sub) -> None:
    p = sub.add_parser("experiment", help="an experiment's variants and seeds: which stages they share")
    verbs = p.add_subparsers(dest="verb", required=True)
    s = verbs.add_parser("plan", help="each stage's job groups and the members that share each (no Snakemake run)")
    s.add_argument("--configfile", nargs="+", default=[],
                   help="config files layered in order, as snakemake --configfile; none: config/config.yaml")
    s.add_argument("--json", action="store_true", help="print the sharing as JSON")
    s.set_defaults(func=_cmd_plan)
