# Preflight: before any GPU hour is spent, prove that the real judge follows the score format and gives
# distinct rewards, and that the training run is possible (batch geometry, prompt lengths, LR, GPUs,
# disk). Runs in the judge/trainer service group; preflight.json must say ok before train_grpo starts.
# reward.mode outcome: preflight asks no judge (no endpoint input), the reference memories are scored with
# the outcome reward; judge_server then serves only judge_agreement (below).
from llmrnn.reward.custom import code_files as reward_code_files


rule preflight:
    input:
        unpack(preflight_judge_input),
        train=f"{TRAJECTORIES}/trajectories/train.parquet",
        val=f"{TRAJECTORIES}/trajectories/val.parquet",
        policy=plan.models.memory_model_input(),
    output:
        report=f"{RUN}/train/preflight.json",
        audit=directory(f"{RUN}/train/preflight_audit"),
    log:
        f"{LOGS}/preflight.log",
    benchmark:
        f"{LOGS}/benchmarks/preflight/preflight.tsv"
    # on the training path: before the base model's eval shards
    priority: 10
    conda:
        plan.conda_env("cpu")
    # 0 beside the judge service (Snakemake sums a service group's cores), else a core of its own (plan)
    threads: plan.judge.preflight_threads()
    params:
        endpoint=input_flag("--endpoint", "endpoint"),
        cfg=plan.judge.preflight_cfg(),
        # your own reward (reward.custom.path) is code of this job too: its content is hashed
        code=code_hash("preflight run", *reward_code_files(config)),
    shell:
        "llmrnn preflight run --train-parquet {input.train:q} --val-parquet {input.val:q} "
        "{params.endpoint:q} --out {output.report:q} --audit-dir {output.audit:q} "
        "--tokenizer-dir {input.policy:q} --cfg {params.cfg:q} 2> {log:q}"


# Judge agreement beside the training path, for a run whose reward asks no judge (reward.mode outcome, the
# demo): the judge of judge.rubric is started for this check only, scores preflight.agreement_pairs pairs
# (a patient's reference memory vs a wrong one) and the result goes to the report; it never blocks or
# stops training (a judged run's preflight runs the same check and stops on it).
rule judge_agreement:
    input:
        endpoint=rules.judge_server.output.endpoint,
        rubric=config["judge"]["rubric"],
        train=f"{TRAJECTORIES}/trajectories/train.parquet",
    output:
        report=f"{JUDGE}/judge/agreement.json",
        audit=directory(f"{JUDGE}/judge/agreement_audit"),
    log:
        f"{LOGS}/judge_agreement.log",
    benchmark:
        f"{LOGS}/benchmarks/judge_agreement/judge_agreement.tsv"
    conda:
        plan.conda_env("cpu")
    # a core of its own while the judge service beside it computes (the service takes 0)
    threads: plan.judge.agreement_threads()
    params:
        cfg=plan.judge.agreement_cfg(),
        code=code_hash("preflight agreement"),
    shell:
        "llmrnn preflight agreement --train-parquet {input.train:q} --endpoint {input.endpoint:q} "
        "--out {output.report:q} --audit-dir {output.audit:q} --cfg {params.cfg:q} 2> {log:q}"
