"""Config section `qa` (recipe: qa)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from llmrnn.settings.base import Section, job_resources


class QaSynthetic(Section):
    """`qa.synthetic`"""

    seed: int = Field(0, le=2**32 - 1, ge=0, description='seed of the synthetic questions (distractor sampling)')
    max_questions: int | None = Field(None, le=1_000_000_000, ge=1, description='cap on the synthetic questions; null = all')



class QaFields(Section):
    """`qa.fields`"""

    id: str = Field('id', description='the field of your records holding the id')
    question: str = Field('question', description='the field of your records holding the question')
    answer: str = Field('answer', description='the field of your records holding the answer')
    options: str = Field('options', description='the field of your records holding the options')
    context: str = Field('context', description='the field of your records holding the context')
    reasoning: str = Field('reasoning', description='the field of your records holding the reasoning')
    group: str = Field('group', description='the field of your records holding the group')



class QaDataset(Section):
    """`qa.dataset`"""

    split: str = Field('train', description='hf: sources: the dataset split read')
    config: str | None = Field(None, description="hf: sources: the dataset configuration name; null = the dataset's default")



class QaFilter(Section):
    """`qa.filter`"""

    min_question_chars: int = Field(10, le=1 << 30, ge=0, description='questions shorter than this many characters are dropped (counts in RUN/qa/splits.json)')
    max_question_chars: int = Field(4000, le=1 << 30, ge=1, description='questions longer than this many characters are dropped')
    max_answer_chars: int = Field(200, le=1 << 30, ge=1, description='records whose answer is longer than this many characters are dropped')
    dedupe: bool = Field(True, description='drop a question whose normalised text was seen before (the same question with other options is a duplicate)')



class QaSplit(Section):
    """`qa.split`"""

    val_size: int = Field(2, le=1_000_000_000, ge=1, description='groups (patients / records) in val')
    test_size: int = Field(4, le=1_000_000_000, ge=1, description='groups in test')
    seed: int = Field(42, le=2**32 - 1, ge=0, description='seed of the split into train, val and test groups')



class QaPrompt(Section):
    """`qa.prompt`"""

    system: str | None = Field(None, description='null: the built-in <reasoning>/<answer> format prompt')



class QaRewardWeights(Section):
    """`qa.reward.weights`"""

    exact_match: float = Field(1.0, le=1000, ge=0, description='weight of exact match of the answer (the reward is the weighted sum of components in [0, 1]; weight 0 = not computed)')
    format: float = Field(0.2, le=1000, ge=0, description='weight of the format term (each tag once, in order, nothing after)')
    judge: float = Field(0.0, le=1000, ge=0, description="weight of the judge's score (asks the judge service)")
    fluency: float = Field(0.0, le=1000, ge=0, description='weight of fluency under the base model (1 - ln(ppl)/ln(fluency_max_ppl))')



class QaReward(Section):
    """`qa.reward`"""

    weights: QaRewardWeights = Field(default_factory=QaRewardWeights)
    tags: list[str] = Field(default_factory=lambda: ['reasoning', 'answer'], description='the tags a response holds, each once, in this order, nothing after (the format term)')
    answer_tag: str = Field('answer', description='the tag the answer is read from (the last one in the response)')
    fluency_max_ppl: float = Field(1000.0, le=1e30, gt=1, description='fluency = 1 - ln(ppl)/ln(max_ppl), ppl of the response under the base model')
    rubric: str | None = Field(None, description='judge reward: rubric file (default judge.rubric)')



class QaSftLora(Section):
    """`qa.sft.lora`"""

    rank: int = Field(16, le=65536, ge=1, description='LoRA rank of the SFT adapter')
    alpha: int = Field(32, le=1_000_000, ge=1, description='LoRA alpha of the SFT adapter')
    dropout: float = Field(0.0, le=1, ge=0, description='LoRA dropout of the SFT adapter')
    target_modules: list[str] = Field(default_factory=lambda: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'], description='modules the SFT LoRA adapts')



QaSftResources = job_resources("QaSftResources", "qa.sft.resources", "the qa_sft job", gpu=0, mem_mb=8000, runtime=120,
                               cpus_per_task=2)



class QaSft(Section):
    """`qa.sft`"""

    enabled: bool = Field(True, description="LoRA SFT warm start (TRL SFTTrainer, loss on the answer only), merged and checked like GRPO's adapter; GRPO starts from it")
    seed: int = Field(42, le=2**32 - 1, ge=0, description='seed of the SFT run (data order, adapter init)')
    lora: QaSftLora = Field(default_factory=QaSftLora)
    lr: float = Field(0.0002, le=1, gt=0, description='SFT learning rate (a change reruns SFT onwards)')
    epochs: int = Field(1, le=1_000_000_000, ge=1, description='passes over the SFT data')
    batch_size: int = Field(4, le=1_000_000_000, ge=1, description='SFT examples per step and device')
    grad_accum: int = Field(1, le=1_000_000_000, ge=1, description='gradient accumulation steps of SFT')
    max_length: int = Field(1024, le=1 << 24, ge=1, description='SFT examples are cut to this many tokens')
    max_steps: int | None = Field(None, le=1_000_000_000, ge=1, description='cap on SFT steps; null = epochs decide')
    num_threads: int = Field(1, le=1024, ge=1, description='torch CPU threads of SFT')
    resources: QaSftResources = Field(default_factory=QaSftResources, description='SLURM resources of the qa_sft job')



class QaEvalStatsBootstrap(Section):
    """`qa.eval.stats.bootstrap`"""

    model_config = ConfigDict(extra="allow")
    samples: int = Field(..., le=1_000_000, ge=1, description='bootstrap resamples')
    seed: int = Field(..., le=2**32 - 1, ge=0, description='seed of the bootstrap resampling')



class QaEvalStats(Section):
    """`qa.eval.stats`"""

    model_config = ConfigDict(extra="allow")
    bootstrap: QaEvalStatsBootstrap = Field(default_factory=lambda: QaEvalStatsBootstrap(samples=2000, seed=0), description="paired bootstrap of each pair's difference (with McNemar's test)")



QaEvalResources = job_resources("QaEvalResources", "qa.eval.resources", "the qa_eval_model job", gpu=0, mem_mb=6000,
                                runtime=60, cpus_per_task=1)



class QaEval(Section):
    """`qa.eval`"""

    k: int = Field(4, le=4096, ge=1, description='samples per question of sampling_pass@k')
    temperature: float = Field(0.8, le=10, gt=0, description='sampling_pass@k only; greedy_pass@1 is T=0')
    top_p: float = Field(0.95, gt=0, le=1, description='nucleus sampling of sampling_pass@k (greedy_pass@1 is always T = 0, n = 1)')
    max_new_tokens: int = Field(96, le=1 << 24, ge=1, description='most new tokens per answer')
    max_questions: int | None = Field(None, le=1_000_000_000, ge=1, description='cap on the evaluated questions per split; null = all')
    seed: int = Field(1234, le=2**32 - 1, ge=0, description='sampling seed of the evaluation')
    batch_size: int = Field(8, le=1_000_000_000, ge=1, description='questions per generate() batch')
    system: str | None = Field(None, description='system prompt of the evaluation; null = qa.prompt.system (what training saw), else the built-in one')
    judge: Literal['auto', True, False] = Field('auto', description='judge-grade the answers too (judge_* metrics beside exact match; the judge service of judge.rubric grades by qa.reward.rubric or judge.rubric): auto = where the QA reward asks the judge (free text)')
    judge_threshold: float = Field(0.5, ge=0, le=1, description='judge score (0-1) at or above which a judge-graded answer counts as correct')
    stats: QaEvalStats = Field(default_factory=QaEvalStats)
    resources: QaEvalResources = Field(default_factory=QaEvalResources, description='SLURM resources of the qa_eval_model job')



class Qa(Section):
    """`qa`"""

    model: str = Field('smollm2-135m-instruct', description='base policy: a models.<name> or an HF folder')
    source: str = Field('synthetic', description='"synthetic" (from the synthetic cohort), a JSON/JSONL file, or hf:<dataset name or path>')
    ood: str | None = Field('synthetic', description='OOD question set: "synthetic" (held-out acute diagnoses), a file, hf:..., or null')
    synthetic: QaSynthetic = Field(default_factory=QaSynthetic)
    fields: QaFields = Field(default_factory=QaFields)
    dataset: QaDataset = Field(default_factory=QaDataset)
    filter: QaFilter = Field(default_factory=QaFilter)
    split: QaSplit = Field(default_factory=QaSplit)
    prompt: QaPrompt = Field(default_factory=QaPrompt)
    reward: QaReward = Field(default_factory=QaReward)
    sft: QaSft = Field(default_factory=QaSft)
    eval: QaEval = Field(default_factory=QaEval)

