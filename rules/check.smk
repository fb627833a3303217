# Pre-submit check (`snakemake --profile profiles/slurm check`): runs here, on the login node, never
# queued; lists every problem of the config and its inputs at once (llmrnn check). No output file, so
# it runs each time it is asked for.
localrules:
    check,


rule check:
    log:
        f"{LOGS}/check.log",
    conda:
        conda_env("data")
    params:
        configfiles=check_configfiles(),
    shell:
        "llmrnn check --configfile {params.configfiles:q} 2>&1 | tee {log:q}; exit ${{PIPESTATUS[0]}}"
