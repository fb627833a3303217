# Judge server (a Snakemake service: it lives exactly as long as its consumers: preflight and train_grpo in
# the judged reward modes; in outcome mode only judge_agreement, the judge's own check beside training).
# The rubric file is the single source of truth for model, prompts, sampling and serving.


rule judge_server:
    input:
        rubric=config["judge"]["rubric"],
        model=plan.judge.model_input,
    output:
        endpoint=service(f"{JUDGE}/judge/endpoint.json"),
    log:
        f"{LOGS}/judge_server.log",
    conda:
        plan.conda_env("judge")
    # 0: the service must not take the cores its consumers (same group) need
    threads: plan.judge.server_threads()
    resources:
        **plan.judge.resources(),
    params:
        cfg=plan.cfg_json("judge"),
        code=code_hash("judge server"),
    shell:
        # exec: Snakemake's SIGTERM at the end of the consumers reaches the launcher, which stops the server.
        "exec llmrnn judge server --rubric {input.rubric:q} --endpoint {output.endpoint:q} "
        "--cfg {params.cfg:q} > {log:q} 2>&1"
