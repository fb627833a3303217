# Cost per stage (wall time, peak memory, GPU hours) from the benchmark files of every job of the run, in
# both recipes: after the run (`snakemake --profile profiles/slurm cost_report`, then `snakemake --report
# report.html cost_report`, which reports the whole run with it). Not part of `all`: its input is all of it,
# and a rerun of any stage would rerun it (the rerun table is the stages').
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
