from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version

from llmrnn.errors import InputError
from llmrnn.runconfig import layer_problems, snakemake_layers, write_run_config

min_version("9.0")


# The embedded CPU demo is the config only when the command line names none: `--configfile F` (and a
# profile's `configfile:`) runs F alone over the schema's defaults, never F layered on the demo.
# Layer on the demo by naming it first: --configfile config/config.yaml F (docs/configuration.md "How configs combine").
if not workflow.config_settings.configfiles:

    configfile: "config/config.yaml"


# The layers this run reads (config files, then --config values); they never cross recipes. Each file
# is read again by llmrnn.io.read_yaml, which refuses what Snakemake's own load let through (an alias
# bomb, duplicate keys) before validate() walks it: one line, no traceback.
try:
    CONFIG_LAYERS = snakemake_layers(
        workflow.configfiles, workflow.config_settings.config
    )
except InputError as exc:
    raise WorkflowError(str(exc)) from None
if layer_problems(CONFIG_LAYERS):
    raise WorkflowError(layer_problems(CONFIG_LAYERS)[0])


report: "workflow/report/workflow.rst"


include: "rules/common.smk"


# Used only with --software-deployment-method apptainer (profiles/slurm: LLMRNN_SDM); see
# docs/cluster.md "Software environments: gpu-env, conda, containers".
container: workflow_container()


# One run: the stages both recipes run (the memory head's DAG and recipe qa's share cohort, models, judge,
# merge, release, check and cost), then the recipe's own, after the shared ones they build on
# (llmrnn.plan.Plan.rule_files; memory_head: rules/trajectories, preflight, train (train_grpo), evaluate,
# report; qa: rules/qa.smk). An experiment (config `experiment`): one module of those per member, and the
# comparison of them all (rules/experiment.smk).
if plan.experiment is None:
    for rule_file in plan.rule_files():

        include: rule_file

else:

    include: "rules/experiment.smk"


rule all:
    default_target: True
    input:
        all_targets,


# the held-out evaluation of either recipe (memory head: rules/evaluate.smk; qa: rules/qa.smk), or of every
# member of an experiment
rule eval_heldout:
    input:
        plan.heldout_targets(),


# Every run records what it runs: RUN/config.yaml, each value with its source (`llmrnn config show`).
onstart:
    write_run_config(f"{RUN}/config.yaml", config, CONFIG_LAYERS)
    clear_not_retriable()
