# Held-out evaluation: forward pass over the test split per variant (base | trained memory model, and the
# configured baselines) scattered over eval.shards jobs, graded by the final judge, gathered into
# metrics.json + comparison.json. Decisions: plan.evaluate (llmrnn.plan.evaluate).


rule eval_shard:
    input:
        test=f"{COHORT}/splits/test.json",
        prompts=config["prompts"]["file"],
        models=plan.evaluate.shard_inputs,
    output:
        f"{UNTRAINED_EVAL}/eval/{{variant}}/shard_{{shard}}.jsonl",
    log:
        f"{LOGS}/eval/{{variant}}/shard_{{shard}}.log",
    benchmark:
        f"{LOGS}/benchmarks/eval_shard/eval/{{variant}}/shard_{{shard}}.tsv"
    wildcard_constraints:
        variant=plan.evaluate.shard_variant_pattern(),
        shard=r"\d+",
    conda:
        plan.conda_env("forward")
    threads: plan.evaluate.threads()
    resources:
        **plan.evaluate.resources(),
    params:
        cfg=plan.evaluate.forward_cfg(),
        memory=plan.evaluate.memory_arg,
        shards=config["eval"]["shards"],
        code=code_hash("evaluate shard"),
    # progress on the console, as train_grpo's: the visit-step lines of the log (numbers only)
    shell:
        "umask 077; llmrnn evaluate shard --test {input.test:q} --variant {wildcards.variant:q} {params.memory:q} "
        "--prompts {input.prompts:q} --threads {threads:q} "
        "--shard {wildcards.shard:q} --shards {params.shards:q} --out {output:q} --cfg {params.cfg:q} "
        "2> >(trap '' TERM; tee {log:q} | grep --line-buffered -E 'visit step [0-9]+/[0-9]+' >&2)"


rule eval_grade:
    input:
        rules.eval_shard.output,
    output:
        f"{UNTRAINED_EVAL}/eval/{{variant}}/graded_{{shard}}.jsonl",
    log:
        f"{LOGS}/eval/{{variant}}/graded_{{shard}}.log",
    benchmark:
        f"{LOGS}/benchmarks/eval_grade/eval/{{variant}}/graded_{{shard}}.tsv"
    wildcard_constraints:
        variant=plan.evaluate.shard_variant_pattern(),
        shard=r"\d+",
    conda:
        plan.conda_env("data")
    params:
        cfg=plan.evaluate.section_cfg("final_judge", "grade_visits"),
        code=code_hash("evaluate grade"),
    shell:
        "llmrnn evaluate grade --shard {input:q} --out {output:q} --cfg {params.cfg:q} 2> {log:q}"


# an experiment's member (llmrnn.plan, ExperimentPlan): the trained model's shards in the member's own folder, the
# untrained models' in the folder members share
if plan.evaluate.trained_apart():

    use rule eval_shard as eval_shard_trained with:
        output:
            f"{RUN}/eval/{{variant}}/shard_{{shard}}.jsonl",
        wildcard_constraints:
            variant="trained",
            shard=r"\d+",

    use rule eval_grade as eval_grade_trained with:
        input:
            rules.eval_shard_trained.output,
        output:
            f"{RUN}/eval/{{variant}}/graded_{{shard}}.jsonl",
        wildcard_constraints:
            variant="trained",
            shard=r"\d+",


rule eval_gather:
    input:
        plan.evaluate.shard_files("graded"),
    output:
        metrics=f"{RUN}/eval/metrics.json",
        comparison=f"{RUN}/eval/comparison.json",
    log:
        f"{LOGS}/eval/gather.log",
    benchmark:
        f"{LOGS}/benchmarks/eval_gather/eval/gather.tsv"
    conda:
        plan.conda_env("data")
    params:
        cfg=plan.evaluate.section_cfg("final_judge", "stats"),
        code=code_hash("evaluate gather"),
    shell:
        "llmrnn evaluate gather --graded {input:q} --metrics {output.metrics:q} "
        "--comparison {output.comparison:q} --cfg {params.cfg:q} 2> {log:q}"
