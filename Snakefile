from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "rules/common.smk"


# Used only with --software-deployment-method apptainer (profiles/slurm: LLMRNN_SDM); see README.
container: workflow_container()


include: "rules/cohort.smk"
include: "rules/models.smk"


# recipe: memory_head (trajectories, GRPO of the memory head, its eval) | qa (rules/qa.smk)
if recipe_is("memory_head"):

    include: "rules/trajectories.smk"


include: "rules/judge.smk"


if recipe_is("memory_head"):

    include: "rules/preflight.smk"
    include: "rules/train.smk"

else:

    include: "rules/qa.smk"


include: "rules/merge.smk"
include: "rules/release.smk"


if recipe_is("memory_head"):

    include: "rules/evaluate.smk"
    include: "rules/report.smk"


include: "rules/check.smk"


rule all:
    default_target: True
    input:
        all_targets(),


# the held-out evaluation of either recipe (memory head: rules/evaluate.smk; qa: rules/qa.smk)
rule eval_heldout:
    input:
        eval_heldout_targets(),
