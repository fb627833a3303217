# The pre-submit rules, of one run and of an experiment alike (rules/experiment.smk includes this file at its top
# level: one check and one cost plan covering every member). The check (`snakemake --profile profiles/slurm
# check`): runs here, on the login node, never queued; lists every problem of the config and its inputs at once (llmrnn check). No output file, so
# it runs each time it is asked for. `umask 077`: tee creates the log, which may quote the cohort's file
# names and problems, owner-only (0600), like the logs the patient-text stages make private.
rule check:
    log:
        f"{LOGS}/check.log",
    # its whole job is to fail on a bad config: the same config fails again (profiles' retries: not here)
    retries: 0
    localrule: True
    conda:
        plan.conda_env("data")
    params:
        configfiles=check_configfiles(),
        # the jobs' software-deployment method (--sdm): the packages they need come from it, not from here
        sdm=deployment_methods(),
    shell:
        "umask 077; llmrnn check --sdm={params.sdm:q} --configfile {params.configfiles:q} 2>&1 | tee {log:q}; "
        "exit ${{PIPESTATUS[0]}}"


# The cost plan before submitting (`snakemake --profile profiles/slurm cost_plan`; `llmrnn check` prints its
# total): GPU-hours and wall time per stage from the rules' resources, and from this run's earlier benchmark
# files where they exist (an experiment's: every member's, a job members share counted once, from each member's
# logs/RUN/<member>/benchmarks). No output: it runs, on this machine, each time it is asked for.
rule cost_plan:
    log:
        f"{LOGS}/cost_plan.log",
    retries: 0
    localrule: True
    conda:
        plan.conda_env("data")
    params:
        configfiles=check_configfiles(),
        benchmarks=f"{LOGS}/benchmarks",
    shell:
        "umask 077; llmrnn report cost-plan --configfile {params.configfiles:q} "
        "--benchmarks {params.benchmarks:q} 2>&1 | tee {log:q}; exit ${{PIPESTATUS[0]}}"
