rule synth_cohort:
    output:
        cohort="resources/cohort/synthetic.json",
        meta="resources/cohort/synthetic.json.meta.json",
    log:
        f"{SHARED_LOGS}/synth_cohort.log",
    benchmark:
        f"{SHARED_LOGS}/benchmarks/synth_cohort/synth_cohort.tsv"
    conda:
        plan.conda_env("data")
    params:
        patients=config["cohort"]["synthetic"]["patients"],
        seed=config["cohort"]["synthetic"]["seed"],
        code=code_hash("cohort synth"),
    shell:
        "llmrnn cohort synth --patients {params.patients:q} --seed {params.seed:q} "
        "--out {output.cohort:q} --meta {output.meta:q} 2> {log:q}"


rule synth_mimic_iv:
    output:
        patients="resources/cohort/mimic_iv_synthetic/hosp/patients.csv.gz",
        admissions="resources/cohort/mimic_iv_synthetic/hosp/admissions.csv.gz",
        diagnoses_icd="resources/cohort/mimic_iv_synthetic/hosp/diagnoses_icd.csv.gz",
        d_icd_diagnoses="resources/cohort/mimic_iv_synthetic/hosp/d_icd_diagnoses.csv.gz",
        discharge="resources/cohort/mimic_iv_synthetic/note/discharge.csv.gz",
    log:
        f"{SHARED_LOGS}/synth_mimic_iv.log",
    benchmark:
        f"{SHARED_LOGS}/benchmarks/synth_mimic_iv/synth_mimic_iv.tsv"
    conda:
        plan.conda_env("data")
    params:
        out=lambda wildcards, output: os.path.dirname(os.path.dirname(output.patients)),
        patients=config["cohort"]["synthetic"]["patients"],
        seed=config["cohort"]["synthetic"]["seed"],
        code=code_hash("cohort synth"),
    shell:
        "llmrnn cohort synth --format mimic-iv --patients {params.patients:q} --seed {params.seed:q} "
        "--out {params.out:q} --expect {output.patients:q} {output.admissions:q} {output.diagnoses_icd:q} "
        "{output.d_icd_diagnoses:q} {output.discharge:q} 2> {log:q}"


rule build_cohort:
    input:
        unpack(plan.cohort.mimic_iv_inputs),
    output:
        cohort=f"{COHORT}/cohort/built.json",
        report=f"{COHORT}/cohort/build_report.json",
    log:
        f"{LOGS}/build_cohort.log",
    benchmark:
        f"{LOGS}/benchmarks/build_cohort/build_cohort.tsv"
    conda:
        plan.conda_env("data")
    threads: plan.cohort.build_workers()
    params:
        hosp=config["cohort"]["mimic_iv"]["hosp"],
        note=config["cohort"]["mimic_iv"]["note"],
        cfg=plan.cohort.mimic_iv_cfg(),
        code=code_hash("cohort build"),
    shell:
        "llmrnn cohort build --hosp {params.hosp:q} --note {params.note:q} --out {output.cohort:q} "
        "--report {output.report:q} --cfg {params.cfg:q} --workers {threads:q} 2> {log:q}"


rule clean_cohort:
    input:
        cohort=plan.cohort.raw_path,
    output:
        cleaned=f"{COHORT}/cohort/cleaned.json",
        report=f"{COHORT}/cohort/cleaning_report.json",
    log:
        f"{LOGS}/clean_cohort.log",
    benchmark:
        f"{LOGS}/benchmarks/clean_cohort/clean_cohort.tsv"
    conda:
        plan.conda_env("data")
    params:
        raw_cohort_sha256=plan.cohort.raw_sha256,
        code=code_hash("cohort clean"),
    shell:
        "llmrnn cohort clean --cohort {input.cohort:q} --out {output.cleaned:q} "
        "--report {output.report:q} 2> {log:q}"


rule split_cohort:
    input:
        cleaned=rules.clean_cohort.output.cleaned,
    output:
        train=f"{COHORT}/splits/train.json",
        val=f"{COHORT}/splits/val.json",
        test=f"{COHORT}/splits/test.json",
        summary=f"{COHORT}/splits/splits.json",
    log:
        f"{LOGS}/split_cohort.log",
    benchmark:
        f"{LOGS}/benchmarks/split_cohort/split_cohort.tsv"
    conda:
        plan.conda_env("data")
    params:
        cfg=plan.cohort.split_cfg(),
        code=code_hash("cohort split"),
    shell:
        "llmrnn cohort split --cohort {input.cleaned:q} --train {output.train:q} --val {output.val:q} --test {output.test:q} "
        "--summary {output.summary:q} "
        "--cfg {params.cfg:q} 2> {log:q}"
