# Held-out evaluation: forward pass over the test split per variant (base | trained memory model, and the
# configured baselines) scattered over eval.shards jobs, graded by the final judge, gathered into
# metrics.json + comparison.json. Helpers (eval_*): llmrnn.plan.
from llmrnn.plan.evaluate import EVAL_VARIANT_PATTERN, EvaluatePlan

# The plan's decisions the rules below call, bound to this run's plan (rules/common.smk `helper`).
eval_cfg_json = helper(EvaluatePlan.eval_cfg_json)
eval_forward_cfg = helper(EvaluatePlan.eval_forward_cfg)
eval_shard_inputs = helper(EvaluatePlan.eval_shard_inputs)
eval_memory_arg = helper(EvaluatePlan.eval_memory_arg)
eval_shard_files = helper(EvaluatePlan.eval_shard_files)
eval_resources = helper(EvaluatePlan.eval_resources)


rule eval_shard:
    input:
        test=rules.split_cohort.output.test,
        prompts=config["prompts"]["file"],
        models=eval_shard_inputs,
    output:
        f"{RUN}/eval/{{variant}}/shard_{{shard}}.jsonl",
    log:
        f"{LOGS}/eval/{{variant}}/shard_{{shard}}.log",
    benchmark:
        f"{LOGS}/benchmarks/eval_shard/eval/{{variant}}/shard_{{shard}}.tsv"
    wildcard_constraints:
        variant=EVAL_VARIANT_PATTERN,
        shard=r"\d+",
    conda:
        conda_env("forward")
    threads: config["eval"]["threads"]
    resources:
        **eval_resources(),
    params:
        cfg=eval_forward_cfg(),
        memory=eval_memory_arg,
        shards=config["eval"]["shards"],
        code=code_hash("evaluate shard"),
    shell:
        "llmrnn evaluate shard --test {input.test:q} --variant {wildcards.variant:q} {params.memory:q} "
        "--prompts {input.prompts:q} --threads {threads:q} "
        "--shard {wildcards.shard:q} --shards {params.shards:q} --out {output:q} --cfg {params.cfg:q} 2> {log:q}"


rule eval_grade:
    input:
        rules.eval_shard.output,
    output:
        f"{RUN}/eval/{{variant}}/graded_{{shard}}.jsonl",
    log:
        f"{LOGS}/eval/{{variant}}/graded_{{shard}}.log",
    benchmark:
        f"{LOGS}/benchmarks/eval_grade/eval/{{variant}}/graded_{{shard}}.tsv"
    wildcard_constraints:
        variant=EVAL_VARIANT_PATTERN,
        shard=r"\d+",
    conda:
        conda_env("data")
    params:
        cfg=eval_cfg_json("final_judge", "grade_visits"),
        code=code_hash("evaluate grade"),
    shell:
        "llmrnn evaluate grade --shard {input:q} --out {output:q} --cfg {params.cfg:q} 2> {log:q}"


rule eval_gather:
    input:
        eval_shard_files("graded"),
    output:
        metrics=f"{RUN}/eval/metrics.json",
        comparison=f"{RUN}/eval/comparison.json",
    log:
        f"{LOGS}/eval/gather.log",
    benchmark:
        f"{LOGS}/benchmarks/eval_gather/eval/gather.tsv"
    conda:
        conda_env("data")
    params:
        cfg=eval_cfg_json("final_judge", "stats"),
        code=code_hash("evaluate gather"),
    shell:
        "llmrnn evaluate gather --graded {input:q} --metrics {output.metrics:q} "
        "--comparison {output.comparison:q} --cfg {params.cfg:q} 2> {log:q}"
