from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "rules/common.smk"


# Used only with --software-deployment-method apptainer (profiles/slurm: LLMRNN_SDM); see README.
container: workflow_container()


include: "rules/cohort.smk"
include: "rules/models.smk"
include: "rules/trajectories.smk"
include: "rules/judge.smk"
include: "rules/preflight.smk"
include: "rules/train.smk"
include: "rules/merge.smk"
include: "rules/release.smk"
include: "rules/evaluate.smk"
include: "rules/report.smk"
include: "rules/check.smk"


rule all:
    default_target: True
    input:
        all_targets(),
