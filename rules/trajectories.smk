# Phase B: the LLM-as-RNN forward pass over train/val, scattered over trajectories.shards jobs per split
# (patients batched per visit step inside each job), gathered into verl parquets + a summary per split.


rule trajectory_shard:
    input:
        split=f"{COHORT}/splits/{{split}}.json",
        prompts=config["prompts"]["file"],
        models=plan.models.role_markers(),
    output:
        part=f"{TRAJECTORIES}/trajectories/shards/{{split}}/part_{{k}}.parquet",
        stats=f"{TRAJECTORIES}/trajectories/shards/{{split}}/part_{{k}}.stats.json",
    log:
        f"{LOGS}/trajectories/{{split}}/part_{{k}}.log",
    benchmark:
        f"{LOGS}/benchmarks/trajectory_shard/trajectories/{{split}}/part_{{k}}.tsv"
    wildcard_constraints:
        split="train|val",
        k=r"\d+",
    # on the training path: before the base model's eval shards, which only the report waits for
    priority: 10
    conda:
        plan.conda_env("forward")
    threads: plan.trajectories.threads()
    resources:
        **plan.trajectories.resources(),
    params:
        cfg=plan.trajectories.shard_cfg(),
        code=code_hash("trajectories shard"),
    shell:
        "llmrnn trajectories shard --split {wildcards.split:q} --split-file {input.split:q} "
        "--shard {wildcards.k:q} --prompts {input.prompts:q} --threads {threads:q} "
        "--out {output.part:q} --stats {output.stats:q} --cfg {params.cfg:q} 2> {log:q}"


rule dump_trajectories:
    input:
        parts=lambda w: plan.trajectories.shard_files(w.split, "parquet"),
        stats=lambda w: plan.trajectories.shard_files(w.split, "stats.json"),
        tokenizer=plan.models.memory_model_input(),
    output:
        parquet=f"{TRAJECTORIES}/trajectories/{{split}}.parquet",
        summary=f"{TRAJECTORIES}/trajectories/{{split}}.summary.json",
    log:
        f"{LOGS}/trajectories/{{split}}.gather.log",
    benchmark:
        f"{LOGS}/benchmarks/dump_trajectories/trajectories/{{split}}.gather.tsv"
    wildcard_constraints:
        split="train|val",
    priority: 10
    conda:
        plan.conda_env("cpu")
    params:
        code=code_hash("trajectories gather"),
    shell:
        "llmrnn trajectories gather --split {wildcards.split:q} --parts {input.parts:q} "
        "--stats {input.stats:q} --tokenizer {input.tokenizer:q} "
        "--out {output.parquet:q} --summary {output.summary:q} 2> {log:q}"
