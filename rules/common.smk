# Validation and thin glue. Every decision (targets, conda envs, flags, resources, the config subsets rules
# pass as params) lives in llmrnn.plan (tested by tests/test_plan.py); what stays here needs Snakemake:
# its `rules`/`workflow` objects, WorkflowError, or the code hashes of the modules a job runs.
import functools
import os
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.io import is_flagged
from snakemake.utils import validate

from llmrnn.configcheck import shard_problems, value_problems
from llmrnn.errors import LlmrnnError
from llmrnn.plan import Plan, PlanBase
from llmrnn.plan.evaluate import EvaluatePlan
from llmrnn.plan.judge import JudgePlan
from llmrnn.plan.models import ModelsPlan
from llmrnn.plan.qa import QaPlan
from llmrnn.plan.release import ReleasePlan
from llmrnn.plan.train import TrainPlan
from llmrnn.plan.trajectories import TrajectoriesPlan
from llmrnn.provenance import code_identity
from llmrnn.upload import env_problems

# before validate: a schema error would echo a key typed in place of a variable name into the log
if env_problems(config):
    raise WorkflowError(f"config: {env_problems(config)[0]}")
# what the schema cannot state (llmrnn.configcheck): finite numbers, no credentials (also before
# validate, which would echo them), shard counts the work can fill (after it: defaults filled in)
if value_problems(config):
    raise WorkflowError("\n".join(f"config: {p}" for p in value_problems(config)))
# the generated schema as JSON (config.schema.yaml's twin): Snakemake parses JSON ~50x faster than YAML
validate(config, schema="../workflow/schemas/config.schema.json")
if shard_problems(config):
    raise WorkflowError("\n".join(f"config: {p}" for p in shard_problems(config)))

# envs/*.yaml install llmrnn from ${LLMRNN_REPO} (conda's pip expands it): this workflow's own folder
os.environ.setdefault("LLMRNN_REPO", str(Path(workflow.basedir)))


def as_workflow_error(helper):
    """The plan's one-line InputError as Snakemake's WorkflowError. functools.wraps keeps the helper's
    signature visible (inspect.signature follows __wrapped__): Snakemake passes an input or params
    function only the arguments it names (wildcards, input)."""

    @functools.wraps(helper)
    def call(*args, **kwargs):
        try:
            return helper(*args, **kwargs)
        except LlmrnnError as exc:
            raise WorkflowError(str(exc)) from None

    return call


# The run's one plan. Each rule file imports the plan classes it uses by name (llmrnn.plan.<stage>) and
# binds the methods it calls with `helper`; the names several files (or `all`) call are bound here.
plan = Plan(config)


def helper(method):
    """`method` (a function of a llmrnn.plan class, e.g. TrainPlan.train_resources) bound to this run's plan,
    its InputError raised as WorkflowError."""
    return as_workflow_error(method.__get__(plan))


RUN = plan.paths.run
LOGS = plan.paths.logs
MODELS = plan.paths.models
QA = plan.paths.qa
QA_EVAL = plan.paths.qa_eval
QA_SYNTH = plan.paths.qa_synth
recipe_is = helper(PlanBase.recipe_is)
cfg_json = helper(PlanBase.cfg_json)
conda_env = helper(PlanBase.conda_env)
memory_model_input = helper(ModelsPlan.memory_model_input)
judge_needed = helper(
    JudgePlan.judge_planned
)  # the reward asks the judge (llmrnn.reward.asks_judge)
judge_agreement_on = helper(JudgePlan.judge_agreement_on)
preflight_rubric_input = helper(JudgePlan.preflight_rubric_input)
train_resources = helper(TrainPlan.train_resources)
train_threads = helper(TrainPlan.train_threads)
trajectory_targets = helper(TrajectoriesPlan.trajectory_targets)
release_targets = helper(ReleasePlan.release_targets)
eval_heldout_targets = helper(EvaluatePlan.eval_heldout_targets)
qa_targets = helper(QaPlan.qa_targets)


def code_hash(verb, *also):
    """params: the code identity of a job running `llmrnn <verb>` (+ modules `also` its command line
    names): a hash of the package modules the verb can run (llmrnn.provenance, from the imports).
    """
    try:
        return code_identity(verb, *also)
    except (LlmrnnError, ValueError) as exc:
        raise WorkflowError(f"code_hash({verb!r}): {exc}") from exc


# ----------------------------------------------------------------------------- glue over `rules`/`workflow`
# rules.X exists once every rule file is included, so these run from rule bodies or `all` (never earlier).
def all_targets(wildcards):
    """Input of `all`: this run's products and every durable output of the jobs that make them
    (planned_outputs). Snakemake takes a missing file as done while the outputs of its consumers are
    up to date, so a job killed after it removed its outputs (a forced rerun: `-R merge_model`) would
    look complete; requested here, a missing output replans its job, then the jobs that read it.
    A function: evaluated only when `all` is planned (never for `snakemake check`)."""
    products = [str(f) for f in run_products()]
    return [*products, *(f for f in planned_outputs(products) if f not in products)]


def planned_outputs(targets):
    """Every output of the jobs Snakemake plans for `targets`, found as it finds them: the first rule
    whose output pattern (wildcard constraints included) matches a file, its outputs and inputs (input
    functions included) under those wildcards, then the producers of those inputs. Left out: services
    (a judge's endpoint lives only as long as its consumers) and temp() outputs. A rule whose inputs do
    not resolve is left to the DAG, which names the problem (e.g. a missing cohort file).
    """
    seen, todo, outputs = set(), list(targets), []
    while todo:
        path = str(todo.pop())
        if path in seen:
            continue
        seen.add(path)
        for maker in workflow.rules:
            if not maker.is_producer(path):
                continue
            wildcards = maker.get_wildcards(path)
            try:
                inputs = maker.expand_input(wildcards)[0]
            except WorkflowError:
                continue
            produced = maker.expand_output(wildcards)[0]
            seen.update(str(f) for f in produced)
            outputs += [
                str(f)
                for f in produced
                if not is_flagged(f, "service") and not is_flagged(f, "temp")
            ]
            todo += inputs
            break
    return outputs


def run_products():
    """What a run is for: the splits, plots, release and held-out evaluation of its recipe."""
    if recipe_is("qa"):
        return qa_targets()
    return [
        f"{RUN}/splits/splits.json",
        *trajectory_targets(),
        rules.preflight.output.report,
        *rules.train_plots.output,
        *judge_agreement_targets(),
        *release_targets(),
        *eval_heldout_targets(),
    ]


def judge_endpoint_input(wildcards):
    """The judge service's endpoint for preflight and train_grpo, when the reward asks the judge."""
    return {"endpoint": rules.judge_server.output.endpoint} if judge_needed() else {}


def preflight_judge_input(wildcards):
    """Preflight's judge inputs: the endpoint and the rubric it checks, when the reward asks the judge."""
    return {**judge_endpoint_input(wildcards), **preflight_rubric_input()}


def judge_agreement_source():
    """Where the judge agreement is measured: preflight.json when the reward asks the judge (preflight runs
    the check), else the judge_agreement rule's own check beside the training path."""
    if judge_needed():
        return rules.preflight.output.report
    return rules.judge_agreement.output.report


def judge_agreement_targets():
    """The judge agreement figure, unless preflight.agreement_pairs is 0."""
    return rules.judge_agreement_plot.output if judge_agreement_on() else []


def grpo_rule():
    """The GRPO job of this recipe (train_grpo or qa_train_grpo): merge_model and release read its
    outputs through it."""
    return rules.qa_train_grpo if recipe_is("qa") else rules.train_grpo


def release_reference(wildcards):
    """Inputs of release that say what must not leak from the bundle (its PHI guard's reference): the
    cohort's splits (memory_head), or the QA data stage's records (recipe qa: its questions, contexts and
    answers came from the user's data, for ECG QA from patients), with the splits.json the manifest records.
    """
    if recipe_is("qa"):
        out = rules.qa_data.output
        return {
            "splits": out.summary,
            "split_files": [out.train, out.val, out.test, out.ood],
        }
    out = rules.split_cohort.output
    return {"splits": out.summary, "split_files": [out.train, out.val, out.test]}


def check_configfiles():
    """The config files of this run in layering order (the Snakefile's, then --configfile
    ones), for `llmrnn check` (rule check).
    A list, so `{params.configfiles:q}` quotes each one."""
    cli = [str(f) for f in workflow.overwrite_configfiles or []]
    own = [str(f) for f in workflow.configfiles if str(f) not in cli]
    return own + cli


def workflow_container():
    """Image all jobs run in under `--sdm apptainer`: $LLMRNN_CONTAINER (e.g. an image built
    from profiles/slurm/llmrnn-verl.def over the reference verl image); None: on the host.
    """
    return os.environ.get("LLMRNN_CONTAINER") or None
