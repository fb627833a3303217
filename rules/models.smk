# Base models as file-tracked targets: resources/models/<name>/ (HF folder) + its .ready marker.
# The models.<name> entry says where a model comes from (a wheel's GGUF, the Hub, a local folder).


rule prepare_base_model:
    output:
        marker=f"{MODELS}/{{name}}/.ready",
    log:
        "logs/models/{name}.log",
    wildcard_constraints:
        name=r"[A-Za-z0-9._-]+",
    conda:
        "../envs/cpu.yaml"
    threads: 1
    resources:
        mem_mb=model_mem_mb,
    params:
        cfg=model_cfg_json,
        code=code_hash("llmrnn.models"),
    shell:
        "llmrnn models prepare --name {wildcards.name:q} --cfg {params.cfg:q} --out {output.marker:q} 2> {log:q}"
