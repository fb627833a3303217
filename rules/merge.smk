# Fold a trained LoRA into its base (PEFT merge_and_unload, never verl's merger for LoRA) and verify it:
# merge_check.json lists every check; a failing one exits non-zero and leaves no merged/. merge_model merges
# the GRPO adapter (both recipes); recipe qa's qa_merge_sft, the same job, merges the SFT warm start's.
from llmrnn.plan.merge import MergePlan
from llmrnn.plan.qa import QaPlan

# The plan's decisions the rules below call, bound to this run's plan (rules/common.smk `helper`).
merge_base_input = helper(MergePlan.merge_base_input)
merge_cfg_json = helper(MergePlan.merge_cfg_json)
merge_resources = helper(MergePlan.merge_resources)
qa_sft_merge_cfg = helper(QaPlan.qa_sft_merge_cfg)


rule merge_model:
    input:
        base=merge_base_input(),
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
        conda_env("cpu")
    threads: config["merge"]["resources"]["cpus_per_task"]
    resources:
        # the config's GPU count decides the GPU request, partition and model (llmrnn.slurm)
        **merge_resources(),
    params:
        cfg=merge_cfg_json(),
        code=code_hash("merge run"),
    shell:
        "llmrnn merge run --base {input.base:q} --adapter {input.adapter:q} --out {output.merged:q} "
        "--check {output.check:q} --cfg {params.cfg:q} 2> {log:q}"


if recipe_is("qa"):

    # The SFT warm start's merge: merge_model's job (command, resources, code) on the base qa model and the
    # SFT adapter, checked against the SFT LoRA's rank/alpha; GRPO starts from its merged/.
    use rule merge_model as qa_merge_sft with:
        input:
            base=qa_model_input(),
            adapter=rules.qa_sft.output.adapter,
        output:
            merged=directory(f"{QA}/sft/merged"),
            check=f"{QA}/sft/merge_check.json",
        log:
            f"{LOGS}/qa_merge_sft.log",
        benchmark:
            f"{LOGS}/benchmarks/qa_merge_sft/qa_merge_sft.tsv"
        params:
            cfg=qa_sft_merge_cfg(),
