# GRPO training: verl (GPU clusters) or TRL (CPU), chosen by train.engine, one set of knobs. Resumes from
# its latest checkpoint after a kill; fails (never exits 0) if it ends short of the planned steps. Runs
# beside the judge service (one group job on SLURM) when the reward asks the judge; reward.mode outcome
# asks none (no endpoint input, no judge_server).
# One rule for both recipes: train_grpo (the memory head, after preflight) or qa_train_grpo (recipe qa,
# after qa_preflight, with the QA rewards). They never meet in one run, so `use rule` cannot join them; their
# name, inputs, params and flags come from plan.train (llmrnn.plan.train).


rule:
    name:
        plan.train.rule_name()
    input:
        unpack(judge_endpoint_input),
        **plan.train.inputs(),
    output:
        adapter=directory(f"{RUN}/train/adapter"),
        metrics=f"{RUN}/train/metrics.jsonl",
        summary=f"{RUN}/train/summary.json",
    log:
        f"{LOGS}/{plan.train.rule_name()}.log",
    benchmark:
        f"{LOGS}/benchmarks/{plan.train.rule_name()}/{plan.train.rule_name()}.tsv"
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
        # --endpoint, --preflight and the recipe's --judge-gpus | --reward-func (a function of the inputs)
        flags=plan.train.run_flags,
        # the rewards are code of this job too: the QA rewards' module, or your own reward's file
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
