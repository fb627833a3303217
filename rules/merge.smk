# Fold a trained LoRA into its base (PEFT merge_and_unload, never verl's merger for LoRA) and verify it:
# merge_check.json lists every check; a failing one exits non-zero and leaves no merged/. merge_model merges
# the GRPO adapter (both recipes); recipe qa's qa_merge_sft, the same job, merges the SFT warm start's.


rule merge_model:
    input:
        base=plan.merge.base_input(),
        # the adapter of the checkpoint train.select chose (last | best_val; summary.json says which)
        adapter=grpo_rule().output.adapter,
    output:
        merged=directory(f"{RUN}/merged"),
        check=f"{RUN}/merge_check.json",
    log:
        f"{LOGS}/merge_model.log",
    benchmark:
        f"{LOGS}/benchmarks/merge_model/merge_model.tsv"
    conda:
        plan.conda_env("cpu")
    threads: config["merge"]["resources"]["cpus_per_task"]
    resources:
        # the config's GPU count decides the GPU request, partition and model (llmrnn.slurm)
        **plan.merge.resources(),
    params:
        cfg=plan.merge.run_cfg(),
        code=code_hash("merge run"),
    shell:
        "llmrnn merge run --base {input.base:q} --adapter {input.adapter:q} --out {output.merged:q} "
        "--check {output.check:q} --cfg {params.cfg:q} 2> {log:q}"


if plan.recipe_is("qa"):

    # The SFT warm start's merge: merge_model's job (command, resources, code) on the base qa model and the
    # SFT adapter, checked against the SFT LoRA's rank/alpha; GRPO starts from its merged/.
    use rule merge_model as qa_merge_sft with:
        input:
            base=plan.qa.model_input(),
            adapter=rules.qa_sft.output.adapter,
        output:
            merged=directory(f"{QA}/sft/merged"),
            check=f"{QA}/sft/merge_check.json",
        log:
            f"{LOGS}/qa_merge_sft.log",
        benchmark:
            f"{LOGS}/benchmarks/qa_merge_sft/qa_merge_sft.tsv"
        params:
            cfg=plan.qa.sft_merge_cfg(),
