# GRPO training of the memory head: verl (GPU clusters) or TRL (CPU), chosen by train.engine, one set of
# knobs. Resumes from its latest checkpoint after a kill; fails (never exits 0) if it ends short of the
# planned steps. Runs beside the judge service (one group job on SLURM).


rule train_grpo:
    input:
        train=f"{RUN}/trajectories/train.parquet",
        val=f"{RUN}/trajectories/val.parquet",
        endpoint=rules.judge_server.output.endpoint,
        preflight=rules.preflight.output.report,
        model=merge_base_input(),
    output:
        adapter=directory(f"{RUN}/train/adapter"),
        metrics=f"{RUN}/train/metrics.jsonl",
        summary=f"{RUN}/train/summary.json",
        reward_plot=report(
            f"{RUN}/train/plots/reward.png",
            caption="../workflow/report/train_reward.rst",
            category="Training",
        ),
        kl_plot=report(
            f"{RUN}/train/plots/kl.png",
            caption="../workflow/report/train_kl.rst",
            category="Training",
        ),
    log:
        f"{LOGS}/train_grpo.log",
    conda:
        conda_env("train")
    threads: train_threads()
    resources:
        gpu=train_gpus(),
        mem_mb=config["train"]["resources"]["mem_mb"],
        runtime=config["train"]["resources"]["runtime"],
        cpus_per_task=config["train"]["resources"]["cpus_per_task"],
    params:
        cfg=cfg_json("train", "reward"),
        judge_gpus=judge_gpus(),
        code=code_hash(
            "llmrnn.train",
            "llmrnn.train.checkpoints",
            "llmrnn.train.config",
            "llmrnn.train.data",
            "llmrnn.train.metrics",
            "llmrnn.train.trl_engine",
            "llmrnn.train.verl_cmd",
            "llmrnn.reward",
            "llmrnn.rubric",
            "llmrnn.judge",
        ),
    shell:
        "llmrnn train run --cfg {params.cfg:q} --train {input.train} --val {input.val} "
        "--model {input.model} --metrics {output.metrics} --endpoint {input.endpoint} "
        "--preflight {input.preflight} --judge-gpus {params.judge_gpus} 2> {log}"
