# GRPO training of the memory head: verl (GPU clusters) or TRL (CPU), chosen by train.engine, one set of
# knobs. Resumes from its latest checkpoint after a kill; fails (never exits 0) if it ends short of the planned
# steps. Runs beside the judge service (one group job on SLURM) when the reward asks the judge; reward.mode
# outcome asks none (no endpoint input, no judge_server). Recipe qa's twin is qa_train_grpo (rules/qa.smk):
# the two never meet in one run, so `use rule` cannot join them; both take what differs from the recipe
# (plan.train asks llmrnn.plan.recipe).


rule train_grpo:
    input:
        unpack(judge_endpoint_input),
        **plan.train.inputs(),
    output:
        adapter=directory(plan.train.outputs().adapter),
        metrics=plan.train.outputs().metrics,
        summary=plan.train.outputs().summary,
    log:
        f"{LOGS}/train_grpo.log",
    benchmark:
        f"{LOGS}/benchmarks/train_grpo/train_grpo.tsv"
    priority: plan.train.priority()
    conda:
        plan.conda_env("train")
    threads: plan.train.threads()
    resources:
        **plan.train.resources(),
    params:
        # checkpoints/, state/, audit/, samples/ beside the outputs but not outputs themselves: Snakemake
        # deletes outputs before a rerun, and a rerun after a kill must find the checkpoints to resume
        work=lambda w, output: os.path.dirname(output.metrics),
        cfg=plan.train.run_cfg(),
        # --endpoint, --preflight and --judge-gpus (a function of the inputs)
        flags=plan.train.run_flags,
        # your own reward's file (reward.custom.path) is code of this job too
        code=code_hash("train run", *plan.train.reward_code()),
    # progress on the console: the log is tee'd, its step lines (step, reward, time: numbers, never patient
    # text) go to Snakemake's output too; umask 077: tee makes the log, owner-only; tee and grep ignore a
    # preemption's SIGTERM (SLURM signals every process of the job), so the trainer saving meanwhile still has
    # its stderr and exits 75, and they end when it does
    shell:
        "umask 077; exec llmrnn train run --cfg {params.cfg:q} --train {input.train:q} --val {input.val:q} "
        "--model {input.model:q} --work-dir {params.work:q} --adapter {output.adapter:q} "
        "--metrics {output.metrics:q} --summary {output.summary:q} {params.flags:q} "
        "2> >(trap '' TERM; tee {log:q} | grep --line-buffered -E 'step [0-9]+/[0-9]+' >&2)"
