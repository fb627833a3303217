# Cost per stage (wall time, peak memory, GPU hours) from the benchmark files of every job of the run, in
# both recipes: after the run (`snakemake --profile profiles/slurm cost_report`, then `snakemake --report
# report.html cost_report`, which reports the whole run with it). Not part of `all`: its input is all of it,
# and a rerun of any stage would rerun it (the rerun table is the stages').


# The cost plan before submitting (`snakemake --profile profiles/slurm cost_plan`; `llmrnn check` prints its
# total): GPU-hours and wall time per stage from the rules' resources, and from this run's earlier benchmark
# files where they exist. No output: it runs, on this machine, each time it is asked for.
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


rule cost_report:
    input:
        all_targets,
    output:
        table=f"{RUN}/report/cost.tsv",
        html=report(
            f"{RUN}/report/cost.html",
            category="Cost",
            caption="../workflow/report/cost.rst",
        ),
        plot=report(
            f"{RUN}/report/cost.png",
            category="Cost",
            caption="../workflow/report/cost.rst",
        ),
    log:
        f"{LOGS}/cost_report.log",
    conda:
        plan.conda_env("data")
    params:
        benchmarks=f"{LOGS}/benchmarks",
        code=code_hash("report cost"),
    shell:
        "llmrnn report cost --benchmarks {params.benchmarks:q} --table {output.table:q} "
        "--html {output.html:q} --plot {output.plot:q} 2> {log:q}"
