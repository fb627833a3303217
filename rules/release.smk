# Model card + MANIFEST.json for the merged model, the PHI guard over the exact bundle (its reference, what
# must not leak, is the recipe's data: plan.recipe.release_reference), and the Hub upload
# when release.upload is on and a token is in the environment (else the receipt says why not).
# Deliberately independent of eval: the release never waits for (or reruns with) the evaluation.
# A local rule: the Hub upload needs the internet, which the login node running Snakemake has and compute
# nodes often lack (the bundle is small text plus the merged model's files, read once for the PHI scan).


rule release:
    input:
        unpack(plan.recipe.release_reference),
        unpack(plan.release.rubric_input),
        merged=rules.merge_model.output.merged,
        check=rules.merge_model.output.check,
        metrics=plan.train.outputs().metrics,
        train_summary=plan.train.outputs().summary,
    output:
        card=f"{RUN}/release/README.md",
        manifest=f"{RUN}/release/MANIFEST.json",
        receipt=f"{RUN}/release/upload_receipt.json",
    log:
        f"{LOGS}/release.log",
    benchmark:
        f"{LOGS}/benchmarks/release/release.tsv"
    localrule: True
    conda:
        plan.conda_env("cpu")
    params:
        cfg=plan.release.build_cfg(),
        split_format=plan.release.split_format(),
        rubric=input_flag("--rubric", "rubric"),
        code=code_hash("release build"),
    shell:
        "llmrnn release build --merged {input.merged:q} --merge-check {input.check:q} "
        "--splits {input.splits:q} --split-files {input.split_files:q} {params.split_format:q} "
        "--metrics {input.metrics:q} --train-summary {input.train_summary:q} "
        "{params.rubric:q} --cfg {params.cfg:q} --card {output.card:q} "
        "--manifest {output.manifest:q} --receipt {output.receipt:q} 2> {log:q}"
