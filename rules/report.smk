# Plots and the summary table of the held-out evaluation (and the training curves), marked for
# `snakemake --report report.html`; captions in workflow/report/.


rule eval_plots:
    input:
        metrics=rules.eval_gather.output.metrics,
        comparison=rules.eval_gather.output.comparison,
        train=eval_train_metrics(),
    output:
        bars=report(
            f"{RUN}/eval/plots/acc_bars.png",
            category="Held-out evaluation",
            caption="../workflow/report/acc_bars.rst",
        ),
        by_visit=report(
            f"{RUN}/eval/plots/acc_by_visit.png",
            category="Held-out evaluation",
            caption="../workflow/report/acc_by_visit.rst",
        ),
        training=report(
            f"{RUN}/eval/plots/training.png",
            category="Training",
            caption="../workflow/report/training.rst",
        ),
        summary=report(
            f"{RUN}/eval/plots/summary.tsv",
            category="Held-out evaluation",
            caption="../workflow/report/summary.rst",
        ),
    log:
        f"{LOGS}/eval/plots.log",
    conda:
        "../envs/data.yaml"
    params:
        outdir=lambda w, output: os.path.dirname(output.bars),
        train=eval_train_metrics_arg(),
        code=code_hash("llmrnn.report"),
    shell:
        "llmrnn report plots --metrics {input.metrics:q} --comparison {input.comparison:q} "
        "{params.train:q} --outdir {params.outdir:q} 2> {log:q}"
