# Fold a trained LoRA into its base (PEFT merge_and_unload, never verl's merger for LoRA) and verify it:
# merge_check.json lists every check; a failing one exits non-zero and leaves no merged/. merge_model merges
# the GRPO adapter (both recipes); recipe qa's qa_merge_sft (rules/qa.smk), the same job, merges the SFT warm
# start's.


rule merge_model:
    input:
        base=plan.merge.base_input(),
        # the adapter of the checkpoint train.select chose (last | best_val; summary.json says which)
        adapter=plan.train.outputs().adapter,
    output:
        merged=directory(f"{RUN}/merged"),
        check=f"{RUN}/merge_check.json",
    log:
        f"{LOGS}/merge_model.log",
    benchmark:
        f"{LOGS}/benchmarks/merge_model/merge_model.tsv"
    conda:
        plan.conda_env("cpu")
    threads: plan.merge.threads()
    resources:
        # the config's GPU count decides the GPU request, partition and model (llmrnn.slurm)
        **plan.merge.resources(),
    params:
        cfg=plan.merge.run_cfg(),
        code=code_hash("merge run"),
    shell:
        "llmrnn merge run --base {input.base:q} --adapter {input.adapter:q} --out {output.merged:q} "
        "--check {output.check:q} --cfg {params.cfg:q} 2> {log:q}"
