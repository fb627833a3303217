# Validation and thin glue. Every decision (targets, conda envs, flags, resources, the config subsets rules
# pass as params) lives in llmrnn.plan (tested by tests/test_plan.py), and the rules call it as written
# (`threads: plan.train.threads()`); what stays here needs Snakemake: its `rules`/`workflow` objects,
# WorkflowError, or the code hashes of the modules a job runs.
import functools
import os
import shutil
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.io import is_flagged
from snakemake.utils import validate

from llmrnn.configcheck import model_problems, shard_problems, value_problems
from llmrnn.errors import NOT_RETRIABLE_DIR, LlmrnnError
from llmrnn.plan import Plan, PlanBase, config_changes, input_flag, schema_error_line
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
# A schema error is one line naming the key (Snakemake's own message dumps the whole schema: ~1,000 lines)
try:
    validate(config, schema="../workflow/schemas/config.schema.json")
except WorkflowError as exc:
    raise WorkflowError(
        schema_error_line(
            config, Path(workflow.basedir, "workflow", "schemas", "config.schema.json")
        )
    ) from None
if shard_problems(config):
    raise WorkflowError("\n".join(f"config: {p}" for p in shard_problems(config)))
# the settings models (strict types: `9.0` passes the schema's integer) and their cross-field rules
if model_problems(config):
    raise WorkflowError("\n".join(f"config: {p}" for p in model_problems(config)))

# envs/*.yaml install llmrnn from ${LLMRNN_REPO} (conda's pip expands it): this workflow's own folder
os.environ.setdefault("LLMRNN_REPO", str(Path(workflow.basedir)))
# a job's failure no retry can change (llmrnn.errors.NotRetriable) leaves its line here; the next attempt of
# any job stops the run on it (llmrnn.plan.common.grows). The jobs (local or SLURM) inherit the variable.
os.environ.setdefault(
    NOT_RETRIABLE_DIR, str(Path(".snakemake", "llmrnn_not_retriable").resolve())
)


def clear_not_retriable():
    """At the start of a run (onstart): the lines earlier runs left are not this run's."""
    shutil.rmtree(os.environ[NOT_RETRIABLE_DIR], ignore_errors=True)


def as_workflow_error(method):
    """The plan's one-line InputError as Snakemake's WorkflowError. functools.wraps keeps the method's
    signature visible (inspect.signature follows __wrapped__): Snakemake passes an input or params
    function only the arguments it names (wildcards, input)."""

    @functools.wraps(method)
    def call(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except LlmrnnError as exc:
            raise WorkflowError(str(exc)) from None

    return call


class WorkflowPlan:
    """A plan as the rules call it: `plan.train.resources()` is the plan's own method, raising its error
    as WorkflowError (one line, no traceback); a stage's plan comes wrapped the same way, any other
    attribute (paths, config, a constant) as it is."""

    def __init__(self, plan):
        self._plan = plan

    def __getattr__(self, name):
        value = getattr(self._plan, name)
        if isinstance(value, PlanBase):
            return WorkflowPlan(value)
        return as_workflow_error(value) if callable(value) else value


# The run's one plan (llmrnn.plan.Plan: one object per stage, plan.cohort ... plan.qa, and its recipe).
plan = WorkflowPlan(Plan(config))
RUN = plan.paths.run
LOGS = plan.paths.logs
SHARED_LOGS = plan.paths.shared_logs
MODELS = plan.paths.models
QA = plan.paths.qa
QA_EVAL = plan.paths.qa_eval
QA_SYNTH = plan.paths.qa_synth
# the stages an experiment's variants may share (llmrnn.plan, ExperimentPlan); in one run, each is RUN
COHORT = plan.paths.cohort
TRAJECTORIES = plan.paths.trajectories
JUDGE = plan.paths.judge
UNTRAINED_EVAL = plan.paths.untrained_eval

# Rerun reasons a person can read: Snakemake prints a changed param as its whole JSON before and after;
# the config keys that changed since this run's RUN/config.yaml, and the command that lists them all
if workflow.is_main_process:
    for line in config_changes(f"{RUN}/config.yaml", CONFIG_LAYERS):
        print(line, file=sys.stderr)


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


def member_rule_names(prefixes):
    """The names each member of an experiment gives its rules, without the member's prefix (read from the
    first member's; rules/experiment.smk)."""
    first = next(iter(prefixes.values()))
    return [r.name[len(first) :] for r in workflow.rules if r.name.startswith(first)]


def run_products():
    """What a run is for: its recipe's products, the release and the held-out evaluation (llmrnn.plan.Plan.products;
    a new product goes into its recipe's `products`, llmrnn.plan.recipe)."""
    return plan.products()


def judge_endpoint_input(wildcards):
    """The judge service's endpoint for preflight and the GRPO job (train_grpo | qa_train_grpo), when the
    reward asks the judge."""
    return (
        {"endpoint": rules.judge_server.output.endpoint} if plan.judge.planned() else {}
    )


def preflight_judge_input(wildcards):
    """Preflight's judge inputs: the endpoint and the rubric it checks, when the reward asks the judge."""
    return {**judge_endpoint_input(wildcards), **plan.judge.preflight_rubric_input()}


def judge_agreement_source():
    """Where the judge agreement is measured: preflight.json when the reward asks the judge (preflight runs
    the check), else the judge_agreement rule's own check beside the training path."""
    if plan.judge.planned():
        return rules.preflight.output.report
    return rules.judge_agreement.output.report


def check_configfiles():
    """The config files of this run in layering order (the Snakefile's, then --configfile
    ones), for `llmrnn check` (rule check).
    A list, so `{params.configfiles:q}` quotes each one."""
    cli = [str(f) for f in workflow.overwrite_configfiles or []]
    own = [str(f) for f in workflow.configfiles if str(f) not in cli]
    return own + cli


def deployment_methods():
    """This run's --sdm (conda, apptainer; empty: the environment snakemake runs in), for `llmrnn check`."""
    return " ".join(
        sorted(
            str(m.name).lower() for m in workflow.deployment_settings.deployment_method
        )
    )


def workflow_container():
    """Image all jobs run in under `--sdm apptainer`: $LLMRNN_CONTAINER (e.g. an image built
    from profiles/slurm/llmrnn-verl.def over the reference verl image); None: on the host.
    """
    return os.environ.get("LLMRNN_CONTAINER") or None
