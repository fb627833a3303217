# One member of an experiment (rules/experiment.smk loads it as a module over the member's config): the
# run's validation, plan and rule files, with the member's folders (llmrnn.plan.member_paths).

# The experiment's config layers are its top level's (the Snakefile): changes since the last run are listed there.
CONFIG_LAYERS = []


include: "../rules/common.smk"


for rule_file in plan.rule_files():

    include: f"../{rule_file}"
