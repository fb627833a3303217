# An experiment (config `experiment`; llmrnn.plan.ExperimentPlan): one Snakemake module per member (a variant, times
# each training seed) over that member's config, so one DAG. A stage members share has the same folder and
# params in each of them (its folder is keyed by what it reads); the first member's rules are the ones
# Snakemake runs for it (ruleorder below), so a shared job runs once. The comparison of every member's trained
# model with the frozen base, the baselines and the control, on the same test patients, closes it.
MEMBER_PREFIXES = {}
for member in plan.experiment.members:
    MEMBER_PREFIXES[member] = member_prefix = plan.experiment.rule_prefix(member)

    module:
        name: member
        snakefile:
            "../workflow/member.smk"
        config:
            plan.experiment.members[member].config

    # the pre-submit rules are the experiment's own (below), not each member's: they read the whole experiment
    use rule * from member exclude check, cost_plan as member_prefix*


# `snakemake check` and `snakemake cost_plan` as in one run: llmrnn check and llmrnn report cost-plan over the
# experiment's config files, which check and plan every member (llmrnn.cost_plan.experiment_stages)
include: "check.smk"


# a file several members can make (a shared stage's) is made by the first member's rule
for rule_name in member_rule_names(MEMBER_PREFIXES):
    workflow.ruleorder(*(prefix + rule_name for prefix in MEMBER_PREFIXES.values()))


rule compare_variants:
    input:
        plan.experiment.comparison_inputs(),
    output:
        comparison=plan.experiment.comparison_targets()[0],
        forest=report(
            plan.experiment.comparison_targets()[1],
            category="Comparison",
            caption="../workflow/report/forest.rst",
        ),
    log:
        f"{LOGS}/compare_variants.log",
    benchmark:
        f"{LOGS}/benchmarks/compare_variants/compare_variants.tsv"
    conda:
        plan.conda_env("data")
    params:
        variants=plan.experiment.comparison_args(),
        control=plan.experiment.control,
        cfg=plan.experiment.comparison_cfg(),
        code=code_hash("evaluate compare"),
    shell:
        "llmrnn evaluate compare {params.variants:q} --control {params.control:q} --out {output.comparison:q} "
        "--plot {output.forest:q} --cfg {params.cfg:q} 2> {log:q}"
