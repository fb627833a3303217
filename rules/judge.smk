# Judge server (a Snakemake service: it lives exactly as long as its consumers) and the preflight that
# proves the real judge follows the score format before training. The rubric file is the single source
# of truth for model, prompts, sampling and serving.


rule judge_server:
    input:
        rubric=config["judge"]["rubric"],
        model=judge_model_input,
    output:
        endpoint=service(f"{RUN}/judge/endpoint.json"),
    log:
        f"{LOGS}/judge_server.log",
    conda:
        "../envs/vllm.yaml" if judge_gpus() else "../envs/cpu.yaml"
    # 0: the service must not take the cores its consumers (same group) need; `-n --cores 1` stays valid.
    threads: 0
    resources:
        gpu=judge_gpus(),
        mem_mb=config["judge"]["resources"]["mem_mb"],
        runtime=config["judge"]["resources"]["runtime"],
        cpus_per_task=config["judge"]["resources"]["cpus_per_task"],
    params:
        cfg=cfg_json("judge"),
        code=code_hash(
            "llmrnn.judge",
            "llmrnn.judge.client",
            "llmrnn.judge.launcher",
            "llmrnn.judge.server",
            "llmrnn.backends",
            "llmrnn.models",
            "llmrnn.retry",
            "llmrnn.rubric",
        ),
    shell:
        # exec: Snakemake's SIGTERM at the end of the consumers reaches the launcher, which stops the server.
        "exec llmrnn judge server --rubric {input.rubric:q} --endpoint {output.endpoint:q} "
        "--cfg {params.cfg:q} > {log:q} 2>&1"


rule preflight:
    input:
        train=f"{RUN}/trajectories/train.parquet",
        val=f"{RUN}/trajectories/val.parquet",
        endpoint=rules.judge_server.output.endpoint,
        rubric=config["judge"]["rubric"],
        policy=memory_model_input(),
    output:
        report=f"{RUN}/train/preflight.json",
        audit=directory(f"{RUN}/train/preflight_audit"),
    log:
        f"{LOGS}/preflight.log",
    conda:
        "../envs/cpu.yaml"
    # 0: preflight mostly waits on the judge; it shares the service group with train_grpo, whose cores
    # count (llmrnn runs a 0-thread job single-threaded: cli.sanitize_thread_env).
    threads: 0
    params:
        cfg=preflight_cfg(),
        code=code_hash(
            "llmrnn.preflight",
            "llmrnn.reward",
            "llmrnn.rubric",
            "llmrnn.judge.client",
            "llmrnn.retry",
            "llmrnn.train.preflight",
            "llmrnn.jsonparse",
            "llmrnn.matching",
            "llmrnn.stats",
            "llmrnn.models",
        ),
    shell:
        "llmrnn preflight run --train-parquet {input.train:q} --val-parquet {input.val:q} "
        "--endpoint {input.endpoint:q} --out {output.report:q} --audit-dir {output.audit:q} "
        "--tokenizer-dir {input.policy:q} --cfg {params.cfg:q} 2> {log:q}"
