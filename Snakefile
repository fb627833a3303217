from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "rules/common.smk"
include: "rules/cohort.smk"


rule all:
    default_target: True
    input:
        all_targets(),
