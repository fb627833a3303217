# Every plot of the workflow, marked for `snakemake --report report.html`; captions in workflow/report/.


rule train_plots:
    input:
        metrics=rules.train_grpo.output.metrics,
        summary=rules.train_grpo.output.summary,
    output:
        reward=report(
            plan.train.plots().reward,
            caption="../workflow/report/train_reward.rst",
            labels=plan.report_labels("reward"),
            category="Training",
        ),
        kl=report(
            plan.train.plots().kl,
            caption="../workflow/report/train_kl.rst",
            labels=plan.report_labels("KL"),
            category="Training",
        ),
        truncation=report(
            plan.train.plots().truncation,
            caption="../workflow/report/train_truncation.rst",
            labels=plan.report_labels("truncation"),
            category="Training",
        ),
    log:
        f"{LOGS}/train_plots.log",
    benchmark:
        f"{LOGS}/benchmarks/train_plots/train_plots.tsv"
    conda:
        plan.conda_env("data")
    params:
        code=code_hash("report training"),
    shell:
        "llmrnn report training --metrics {input.metrics:q} --summary {input.summary:q} --reward {output.reward:q} "
        "--kl {output.kl:q} --truncation {output.truncation:q} 2> {log:q}"


rule eval_plots:
    input:
        metrics=rules.eval_gather.output.metrics,
        comparison=rules.eval_gather.output.comparison,
    output:
        bars=report(
            f"{RUN}/eval/plots/acc_bars.png",
            category="Held-out evaluation",
            caption="../workflow/report/acc_bars.rst",
            labels=plan.report_labels("Acc@k"),
        ),
        by_visit=report(
            f"{RUN}/eval/plots/acc_by_visit.png",
            category="Held-out evaluation",
            caption="../workflow/report/acc_by_visit.rst",
            labels=plan.report_labels("Acc@k by visit"),
        ),
        memory_recall=report(
            f"{RUN}/eval/plots/memory_recall.png",
            category="Held-out evaluation",
            caption="../workflow/report/memory_recall.rst",
            labels=plan.report_labels("memory recall"),
        ),
        specificity=report(
            f"{RUN}/eval/plots/memory_specificity.png",
            category="Held-out evaluation",
            caption="../workflow/report/memory_specificity.rst",
            labels=plan.report_labels("memory specificity"),
        ),
        summary=f"{RUN}/eval/plots/summary.tsv",
        # the same table as a page: the report shows HTML inline, a TSV only as a download
        summary_html=report(
            f"{RUN}/eval/plots/summary.html",
            category="Held-out evaluation",
            caption="../workflow/report/summary.rst",
            labels=plan.report_labels("summary"),
        ),
    log:
        f"{LOGS}/eval/plots.log",
    benchmark:
        f"{LOGS}/benchmarks/eval_plots/eval/plots.tsv"
    conda:
        plan.conda_env("data")
    params:
        code=code_hash("report plots"),
    shell:
        "llmrnn report plots --metrics {input.metrics:q} --comparison {input.comparison:q} "
        "--bars {output.bars:q} --by-visit {output.by_visit:q} "
        "--memory-recall {output.memory_recall:q} --specificity {output.specificity:q} "
        "--summary {output.summary:q} --summary-html {output.summary_html:q} 2> {log:q}"


# The report's landing page: workflow/report/workflow.rst takes overview.html in whole, so the report opens
# with what was trained, the headline and what next (llmrnn.overview).
rule report_overview:
    input:
        unpack(plan.evaluate.overview_inputs),
    output:
        overview=report(
            plan.evaluate.overview_target(),
            category="Overview",
            caption="../workflow/report/overview.rst",
            labels=plan.report_labels("overview"),
        ),
    log:
        f"{LOGS}/report_overview.log",
    benchmark:
        f"{LOGS}/benchmarks/report_overview/report_overview.tsv"
    conda:
        plan.conda_env("data")
    params:
        cfg=plan.evaluate.overview_cfg(),
        train_summary=input_flag("--train-summary", "train_summary"),
        rubric=input_flag("--rubric", "rubric"),
        code=code_hash("report overview"),
    shell:
        "llmrnn report overview --comparison {input.comparison:q} --splits {input.splits:q} "
        "{params.train_summary:q} {params.rubric:q} --cfg {params.cfg:q} --out {output.overview:q} 2> {log:q}"


rule judge_agreement_plot:
    input:
        agreement=judge_agreement_source(),
    output:
        plot=report(
            plan.paths.judge_agreement_plot,
            category="Judge",
            caption="../workflow/report/judge_agreement.rst",
        ),
    log:
        f"{LOGS}/judge_agreement_plot.log",
    benchmark:
        f"{LOGS}/benchmarks/judge_agreement_plot/judge_agreement_plot.tsv"
    conda:
        plan.conda_env("data")
    params:
        code=code_hash("report agreement"),
    shell:
        "llmrnn report agreement --agreement {input.agreement:q} --plot {output.plot:q} 2> {log:q}"
