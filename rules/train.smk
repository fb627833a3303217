# GRPO training of the memory head: verl (GPU clusters) or TRL (CPU), chosen by train.engine, one set of
# knobs. Resumes from its latest checkpoint after a kill; fails (never exits 0) if it ends short of the
# planned steps. Runs beside the judge service (one group job on SLURM) when the reward asks the judge;
# reward.mode outcome asks none (no endpoint input, no judge_server).
from llmrnn.plan.train import TrainPlan
from llmrnn.plan.common import input_flag

# The plan's decisions the rules below call, bound to this run's plan (rules/common.smk `helper`).
train_judge_gpus = helper(TrainPlan.train_judge_gpus)

from llmrnn.reward.custom import code_files as reward_code_files


rule train_grpo:
    input:
        unpack(judge_endpoint_input),
        train=f"{RUN}/trajectories/train.parquet",
        val=f"{RUN}/trajectories/val.parquet",
        preflight=rules.preflight.output.report,
        model=memory_model_input(),
    output:
        adapter=directory(f"{RUN}/train/adapter"),
        metrics=f"{RUN}/train/metrics.jsonl",
        summary=f"{RUN}/train/summary.json",
    log:
        f"{LOGS}/train_grpo.log",
    benchmark:
        f"{LOGS}/benchmarks/train_grpo/train_grpo.tsv"
    # on the training path: before the base model's eval shards, which only the report waits for
    priority: 10
    conda:
        conda_env("train")
    threads: train_threads()
    resources:
        **train_resources(),
    params:
        # checkpoints/, state/, audit/ beside the outputs but not outputs themselves: Snakemake deletes
        # outputs before a rerun, and a rerun after a kill must find the checkpoints to resume
        work=lambda w, output: os.path.dirname(output.metrics),
        # preflight: its max_fallback_rate/fallback_window also guard the reward during training
        cfg=cfg_json("train", "reward", "preflight"),
        judge_gpus=train_judge_gpus(),
        endpoint=input_flag("--endpoint", "endpoint"),
        # your own reward (reward.custom.path) is code of this job too: its content is hashed
        code=code_hash("train run", *reward_code_files(config)),
    shell:
        "exec llmrnn train run --cfg {params.cfg:q} --train {input.train:q} --val {input.val:q} "
        "--model {input.model:q} --work-dir {params.work:q} --adapter {output.adapter:q} "
        "--metrics {output.metrics:q} --summary {output.summary:q} {params.endpoint:q} "
        "--preflight {input.preflight:q} --judge-gpus {params.judge_gpus:q} 2> {log:q}"
