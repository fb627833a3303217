# The qa recipe (recipe: qa): QA data -> optional LoRA SFT warm start (merged + verified) -> GRPO with
# verifiable rewards (qa_train_grpo) -> merge_model / release (shared) -> pass@k evaluation of base vs SFT vs
# GRPO. Included after the shared rule files (the Snakefile; llmrnn.plan.recipe.QaRecipe). Decisions: plan.qa
# (llmrnn.plan.qa), and what the recipe decides in the shared stages, plan.recipe.
rule qa_synth:
    input:
        cohort=rules.synth_cohort.output.cohort,
    output:
        questions=f"{QA_SYNTH}/synthetic.jsonl",
        ood=f"{QA_SYNTH}/synthetic_ood.jsonl",
    log:
        f"{SHARED_LOGS}/qa_synth.log",
    benchmark:
        f"{SHARED_LOGS}/benchmarks/qa_synth/qa_synth.tsv"
    conda:
        plan.conda_env("data")
    params:
        cfg=plan.qa.synth_cfg(),
        code=code_hash("qa synth"),
    shell:
        "llmrnn qa synth --cohort {input.cohort:q} --out {output.questions:q} --ood {output.ood:q} "
        "--cfg {params.cfg:q} 2> {log:q}"


rule qa_data:
    input:
        source=plan.qa.source_path,
        ood=plan.qa.ood_path,
    output:
        train=f"{QA}/train.jsonl",
        val=f"{QA}/val.jsonl",
        test=f"{QA}/test.jsonl",
        ood=f"{QA}/ood.jsonl",
        train_parquet=f"{QA}/train.parquet",
        val_parquet=f"{QA}/val.parquet",
        sft_train=f"{QA}/sft_train.jsonl",
        sft_val=f"{QA}/sft_val.jsonl",
        summary=f"{QA}/splits.json",
    log:
        f"{LOGS}/qa_data.log",
    benchmark:
        f"{LOGS}/benchmarks/qa_data/qa_data.tsv"
    conda:
        plan.conda_env("data")
    params:
        source=plan.qa.source_param,
        ood=plan.qa.ood_param,
        cfg=plan.qa.data_cfg(),
        code=code_hash("qa data"),
    shell:
        "llmrnn qa data --source {params.source:q} --ood {params.ood:q} --cfg {params.cfg:q} "
        "--train {output.train:q} --val {output.val:q} --test {output.test:q} --ood-out {output.ood:q} "
        "--train-parquet {output.train_parquet:q} --val-parquet {output.val_parquet:q} "
        "--sft-train {output.sft_train:q} --sft-val {output.sft_val:q} --summary {output.summary:q} 2> {log:q}"


rule qa_sft:
    input:
        train=rules.qa_data.output.sft_train,
        val=rules.qa_data.output.sft_val,
        model=plan.qa.model_input(),
    output:
        adapter=directory(f"{QA}/sft/adapter"),
        metrics=f"{QA}/sft/metrics.jsonl",
        summary=f"{QA}/sft/summary.json",
    log:
        f"{LOGS}/qa_sft.log",
    benchmark:
        f"{LOGS}/benchmarks/qa_sft/qa_sft.tsv"
    conda:
        plan.conda_env("sft")
    threads: plan.qa.sft_threads()
    resources:
        **plan.qa.sft_resources(),
    params:
        cfg=plan.qa.sft_cfg(),
        code=code_hash("qa sft"),
    shell:
        "llmrnn qa sft --train {input.train:q} --val {input.val:q} --model {input.model:q} "
        "--adapter {output.adapter:q} --metrics {output.metrics:q} --summary {output.summary:q} "
        "--cfg {params.cfg:q} 2> {log:q}"


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


rule qa_preflight:
    input:
        train=rules.qa_data.output.train_parquet,
        val=rules.qa_data.output.val_parquet,
        policy=plan.qa.policy_input(),
    output:
        report=f"{RUN}/train/qa_preflight.json",
    log:
        f"{LOGS}/qa_preflight.log",
    benchmark:
        f"{LOGS}/benchmarks/qa_preflight/qa_preflight.tsv"
    conda:
        plan.conda_env("cpu")
    params:
        cfg=plan.cfg_json("train"),
        out_dir=lambda w, output: os.path.dirname(output.report),
        code=code_hash("preflight training"),
    shell:
        "llmrnn preflight training --cfg {params.cfg:q} --train {input.train:q} --val {input.val:q} "
        "--model {input.policy:q} --out-dir {params.out_dir:q} --out {output.report:q} > {log:q} 2>&1"


# GRPO of the qa recipe: train_grpo's job (rules/train.smk) on the QA data, after qa_preflight, with the QA
# rewards; its inputs, params and flags are the recipe's (plan.train asks llmrnn.plan.recipe.QaRecipe).
rule qa_train_grpo:
    input:
        unpack(judge_endpoint_input),
        **plan.train.inputs(),
    output:
        adapter=directory(plan.train.outputs().adapter),
        metrics=plan.train.outputs().metrics,
        summary=plan.train.outputs().summary,
    log:
        f"{LOGS}/qa_train_grpo.log",
    benchmark:
        f"{LOGS}/benchmarks/qa_train_grpo/qa_train_grpo.tsv"
    priority: plan.train.priority()
    conda:
        plan.conda_env("train")
    threads: plan.train.threads()
    resources:
        **plan.train.resources(),
    params:
        # checkpoints/, state/, audit/, samples/ beside the outputs but not outputs themselves: Snakemake
        # deletes outputs before a rerun, and a rerun after a kill must find the checkpoints to resume
        work=lambda w, output: os.path.dirname(output.metrics),
        cfg=plan.train.run_cfg(),
        # --endpoint, --preflight and --reward-func (a function of the inputs)
        flags=plan.train.run_flags,
        # the QA rewards' module is code of this job too
        code=code_hash("train run", *plan.train.reward_code()),
    # progress on the console, umask and SIGTERM as train_grpo's (rules/train.smk)
    shell:
        "umask 077; exec llmrnn train run --cfg {params.cfg:q} --train {input.train:q} --val {input.val:q} "
        "--model {input.model:q} --work-dir {params.work:q} --adapter {output.adapter:q} "
        "--metrics {output.metrics:q} --summary {output.summary:q} {params.flags:q} "
        "2> >(trap '' TERM; tee {log:q} | grep --line-buffered -E 'step [0-9]+/[0-9]+' >&2)"


rule qa_eval_model:
    input:
        unpack(plan.qa.eval_model),
        questions=f"{QA}/{{split}}.jsonl",
    output:
        f"{QA_EVAL}/{{variant}}/{{split}}.jsonl",
    log:
        f"{LOGS}/eval/{{variant}}/{{split}}.log",
    benchmark:
        f"{LOGS}/benchmarks/qa_eval_model/eval/{{variant}}/{{split}}.tsv"
    wildcard_constraints:
        variant=plan.qa.VARIANT_PATTERN,
        split="test|ood",
    conda:
        plan.conda_env("cpu")
    threads: plan.qa.eval_threads()
    resources:
        **plan.qa.eval_resources(),
    params:
        cfg=plan.qa.eval_cfg(),
        code=code_hash("qa eval"),
    shell:
        "llmrnn qa eval --model {input.model:q} --questions {input.questions:q} "
        "--variant {wildcards.variant:q} --split {wildcards.split:q} --threads {threads:q} --out {output:q} "
        "--cfg {params.cfg:q} 2> {log:q}"


# The judge that grades the answers: judge_server's own rule under another name, so it can live in the
# grading job's SLURM group (a service runs in its consumers' group; training's judge is in train_node).
use rule judge_server as qa_eval_judge_server with:
    output:
        endpoint=service(f"{QA_EVAL}/judge/endpoint.json"),
    log:
        f"{LOGS}/eval/judge_server.log",


rule qa_judge_eval:
    input:
        answers=plan.qa.answer_files(),
        endpoint=rules.qa_eval_judge_server.output.endpoint,
        rubric=plan.qa.grading_rubric(),
    output:
        judged=plan.qa.judged_files(),
        audit=directory(f"{QA_EVAL}/judge/audit"),
    log:
        f"{LOGS}/eval/qa_judge_eval.log",
    benchmark:
        f"{LOGS}/benchmarks/qa_judge_eval/eval/qa_judge_eval.tsv"
    conda:
        plan.conda_env("cpu")
    # a core of its own while the judge service beside it computes (the service takes 0)
    threads: plan.qa.judge_threads()
    resources:
        **plan.qa.judge_resources(),
    params:
        cfg=plan.qa.judge_cfg(),
        code=code_hash("qa judge"),
    shell:
        "llmrnn qa judge --inputs {input.answers:q} --outputs {output.judged:q} --endpoint {input.endpoint:q} "
        "--rubric {input.rubric:q} --audit-dir {output.audit:q} --cfg {params.cfg:q} 2> {log:q}"


rule qa_eval_gather:
    input:
        files=plan.qa.eval_files(),
        train=rules.qa_data.output.train,
    output:
        metrics=f"{QA_EVAL}/metrics.json",
        comparison=f"{QA_EVAL}/comparison.json",
    log:
        f"{LOGS}/eval/gather.log",
    benchmark:
        f"{LOGS}/benchmarks/qa_eval_gather/eval/gather.tsv"
    conda:
        plan.conda_env("data")
    params:
        cfg=plan.qa.eval_cfg(),
        code=code_hash("qa gather"),
    shell:
        "llmrnn qa gather --inputs {input.files:q} --train {input.train:q} --metrics {output.metrics:q} "
        "--comparison {output.comparison:q} --cfg {params.cfg:q} 2> {log:q}"


rule qa_report:
    input:
        metrics=rules.qa_eval_gather.output.metrics,
        comparison=rules.qa_eval_gather.output.comparison,
        files=plan.qa.eval_files(),
    output:
        plot=report(
            f"{QA_EVAL}/plots/pass_at_k.png",
            category="Held-out evaluation",
            caption="../workflow/report/qa_pass_at_k.rst",
        ),
        summary=report(
            f"{QA_EVAL}/plots/summary.tsv",
            category="Held-out evaluation",
            caption="../workflow/report/qa_summary.rst",
        ),
        questions=f"{QA_EVAL}/plots/questions.tsv",
    log:
        f"{LOGS}/eval/qa_report.log",
    benchmark:
        f"{LOGS}/benchmarks/qa_report/eval/qa_report.tsv"
    conda:
        plan.conda_env("data")
    params:
        code=code_hash("qa report"),
    shell:
        "llmrnn qa report --metrics {input.metrics:q} --comparison {input.comparison:q} "
        "--inputs {input.files:q} --plot {output.plot:q} --summary {output.summary:q} "
        "--questions {output.questions:q} 2> {log:q}"
