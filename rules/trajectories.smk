# Phase B: the LLM-as-RNN forward pass over train/val, scattered over trajectories.shards jobs per split
# (patients batched per visit step inside each job), gathered into verl parquets + a summary per split.
from llmrnn.plan.models import ModelsPlan
from llmrnn.plan.trajectories import TrajectoriesPlan

# The plan's decisions the rules below call, bound to this run's plan (rules/common.smk `helper`).
role_model_markers = helper(ModelsPlan.role_model_markers)
trajectories_cfg_json = helper(TrajectoriesPlan.trajectories_cfg_json)
trajectory_shard_files = helper(TrajectoriesPlan.trajectory_shard_files)
trajectory_resources = helper(TrajectoriesPlan.trajectory_resources)


rule trajectory_shard:
    input:
        split=f"{RUN}/splits/{{split}}.json",
        prompts=config["prompts"]["file"],
        models=role_model_markers(),
    output:
        part=f"{RUN}/trajectories/shards/{{split}}/part_{{k}}.parquet",
        stats=f"{RUN}/trajectories/shards/{{split}}/part_{{k}}.stats.json",
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
        conda_env("forward")
    threads: config["trajectories"]["threads"]
    resources:
        **trajectory_resources(),
    params:
        cfg=trajectories_cfg_json(),
        code=code_hash("trajectories shard"),
    shell:
        "llmrnn trajectories shard --split {wildcards.split:q} --split-file {input.split:q} "
        "--shard {wildcards.k:q} --prompts {input.prompts:q} --threads {threads:q} "
        "--out {output.part:q} --stats {output.stats:q} --cfg {params.cfg:q} 2> {log:q}"


rule dump_trajectories:
    input:
        parts=lambda w: trajectory_shard_files(w.split, "parquet"),
        stats=lambda w: trajectory_shard_files(w.split, "stats.json"),
        tokenizer=memory_model_input(),
    output:
        parquet=f"{RUN}/trajectories/{{split}}.parquet",
        summary=f"{RUN}/trajectories/{{split}}.summary.json",
    log:
        f"{LOGS}/trajectories/{{split}}.gather.log",
    benchmark:
        f"{LOGS}/benchmarks/dump_trajectories/trajectories/{{split}}.gather.tsv"
    wildcard_constraints:
        split="train|val",
    priority: 10
    conda:
        conda_env("cpu")
    params:
        code=code_hash("trajectories gather"),
    shell:
        "llmrnn trajectories gather --split {wildcards.split:q} --parts {input.parts:q} "
        "--stats {input.stats:q} --tokenizer {input.tokenizer:q} "
        "--out {output.parquet:q} --summary {output.summary:q} 2> {log:q}"
