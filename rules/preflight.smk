# Preflight: before any GPU hour is spent, prove that the real judge follows the score format and gives
# distinct rewards, and that the training run is possible (batch geometry, prompt lengths, LR, GPUs,
# disk). Runs in the judge/trainer service group; preflight.json must say ok before train_grpo starts.
# reward.mode outcome asks no judge: no endpoint input (judge_server is not planned), the reference
# memories are scored with the outcome reward.


rule preflight:
    input:
        unpack(preflight_judge_input),
        train=f"{RUN}/trajectories/train.parquet",
        val=f"{RUN}/trajectories/val.parquet",
        policy=memory_model_input(),
    output:
        report=f"{RUN}/train/preflight.json",
        audit=directory(f"{RUN}/train/preflight_audit"),
    log:
        f"{LOGS}/preflight.log",
    # on the training path: before the base model's eval shards
    priority: 10
    conda:
        conda_env("cpu")
    # Beside the judge service (one group; Snakemake sums a service group's cores) preflight mostly waits on
    # the judge: 0 (llmrnn runs a 0-thread job single-threaded: cli.sanitize_thread_env). Without a judge it
    # computes: a core of its own (with 0 it ran beside two eval shards on the demo's 2 cores: 53 s, not ~5).
    threads: 0 if judge_needed() else 1
    params:
        endpoint=input_flag("--endpoint", "endpoint"),
        cfg=preflight_cfg(),
        code=code_hash("preflight run"),
    shell:
        "llmrnn preflight run --train-parquet {input.train:q} --val-parquet {input.val:q} "
        "{params.endpoint:q} --out {output.report:q} --audit-dir {output.audit:q} "
        "--tokenizer-dir {input.policy:q} --cfg {params.cfg:q} 2> {log:q}"
