"""Config sections eval, judge, reward and preflight."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from llmrnn.settings.base import ENV_NAME, Resources, Section, job_resources, parse


class EvalFinalJudgeMatcher(Section):
    """`eval.final_judge.matcher`"""

    threshold: float = Field(0.5, ge=0, le=1, description='two names match when equal after normalisation/abbreviation expansion, or when their content words overlap with Jaccard >= threshold')
    primary_target: Literal['first', 'any'] = Field('first', description='Acc@1 compares the primary prediction with the `first` ground-truth diagnosis (the principal one) or `any` of them; the LLM judge is told the same')
    synonyms: list[Annotated[list[str], Field(min_length=2)]] = Field(default_factory=list, description='extra groups of equivalent names, e.g. `[[myocardial infarction, heart attack]]`')



class EvalFinalJudgeLlm(Section):
    """`eval.final_judge.llm`"""

    url: str | None = Field(None, description='mode llm: OpenAI-compatible endpoint (base URL) of the judge')
    model: str | None = Field(None, description='mode llm: the model name served at url')
    api_key_env: str | None = Field(None, pattern=ENV_NAME, description='NAME of the environment variable holding the key (never the key itself)')
    temperature: float = Field(0.0, le=10, ge=0, description='sampling temperature of the judge')
    top_p: float = Field(1.0, gt=0, le=1, description='nucleus sampling of the judge')
    max_tokens: int = Field(128, le=1 << 24, ge=1, description='most tokens of one judge answer')
    batch_size: int = Field(64, le=1_000_000_000, ge=1, description='prompts per batched call to the judge')
    concurrency: int = Field(8, le=4096, ge=1, description='judge requests in flight')
    timeout_s: float = Field(120, le=7 * 24 * 3600, gt=0, description='per-request timeout (seconds); transport errors are retried, then stop the job')
    stall_s: float = Field(120, le=7 * 24 * 3600, gt=0, description='a judge that stops answering: while requests wait on it, some request must get an answer at least this often (or 4x the slowest answer so far, when longer; the first answer may take timeout_s), else every request fails at once with one line')



class EvalFinalJudge(Section):
    """`eval.final_judge`"""

    mode: Literal['matcher', 'llm'] = Field('matcher', description='`matcher`: deterministic normalised-text/synonym match, no model; `llm`: an LLM judge through the openai backend')
    allow_external: bool = Field(False, description='mode llm: allow a url outside this site (a hosted API), which then receives test-patient text; llmrnn check verifies it with the API key')
    matcher: EvalFinalJudgeMatcher = Field(default_factory=EvalFinalJudgeMatcher)
    llm: EvalFinalJudgeLlm = Field(default_factory=EvalFinalJudgeLlm)



class EvalStatsBootstrap(Section):
    """`eval.stats.bootstrap`"""

    samples: int = Field(10000, le=1_000_000, ge=100, description='paired bootstrap of the difference vs `base` (patients resampled with their pair)')
    seed: int = Field(0, le=2**32 - 1, ge=0, description='seed of the bootstrap resampling')



class EvalStatsSpecificity(Section):
    """`eval.stats.specificity`"""

    others: int | None = Field(20, le=1_000_000_000, ge=1, description='other patients per patient (a seeded sample); null = all others')
    seed: int = Field(0, le=2**32 - 1, ge=0, description='seed of the other-patient sample (drawn per patient id, the same for every variant)')



class EvalStats(Section):
    """`eval.stats`"""

    bootstrap: EvalStatsBootstrap = Field(default_factory=EvalStatsBootstrap)
    mcnemar_exact_below: int = Field(25, le=1_000_000_000, ge=0, description='McNemar: exact binomial test below this many discordant pairs, else chi-square with continuity correction')
    specificity: EvalStatsSpecificity = Field(default_factory=EvalStatsSpecificity, description="patient-specificity control of memory recall: each memory scored against OTHER test patients' visits (comparison.json memory_specificity)")



EvalResources = job_resources("EvalResources", "eval.resources", "each eval_shard job", gpu=0, mem_mb=8000, runtime=120,
                              cpus_per_task=2, help={"gpu": "GPUs of each eval_shard job (profiles/slurm maps gpu to "
                                                            "the A100 partition)"})



class Eval(Section):
    """`eval`"""

    baselines: list[Literal['zero_shot', 'full_history', 'memprompt']] = Field(default_factory=list, description='extra variants run with the same machinery (no memory; full-history concatenation; a memory of its own past errors and their corrections)', json_schema_extra={'uniqueItems': True})
    max_patients: int | None = Field(None, le=1_000_000_000, ge=1, description='cap on evaluated test patients (seeded sample); null = the whole test split')
    patient_seed: int = Field(0, le=2**32 - 1, ge=0, description='seed of the max_patients sample')
    max_visits: int | None = Field(None, le=1_000_000_000, ge=2, description="use only each evaluated patient's first N visits (the sample is drawn first); null = all")
    trained_model: str | None = Field(None, description="HF folder of the trained memory model; null = this run's verified merged model")
    shards: int = Field(8, le=1_000_000_000, ge=1, description='forward-pass jobs per variant')
    seed: int = Field(1234, le=2**32 - 1, ge=0, description='sampling seed of the forward pass, same for every variant')
    threads: int = Field(1, le=1024, ge=1, description='torch CPU threads per eval_shard job')
    grade_visits: Literal['all', 'last'] = Field('all', description="grade every visit (accuracy by visit index) or only each patient's last one")
    final_judge: EvalFinalJudge = Field(default_factory=EvalFinalJudge)
    stats: EvalStats = Field(default_factory=EvalStats)
    resources: EvalResources = Field(default_factory=EvalResources, description='per eval_shard job (profiles/slurm maps gpu to the A100 partition)')



# no gpu: the rubric's engine decides the judge's (plan.judge)
JudgeResources = job_resources("JudgeResources", "judge.resources", "the judge_server job", base=Resources, mem_mb=8000,
                               runtime=1440, cpus_per_task=2)



class Judge(Section):
    """`judge`"""

    rubric: str = Field('config/rubrics/rubric_v2_rubricarm_scalar.yaml', description="rubric YAML (single source of truth for the judge); default = the reference's")
    host: str | None = Field(None, description="address the judge listens on; null = the rubric's (loopback); `node` = its node's address as SLURM reaches it, needed when train.nnodes > 1 (reward workers run on every node)")
    resources: JudgeResources = Field(default_factory=JudgeResources, description="judge_server job (gpu comes from the rubric's engine; vllm -> 1)")



class RewardCustom(Section):
    """`reward.custom`: your own reward function (docs/rewards.md)"""

    path: str | None = Field(None, description="a Python file defining the reward function; null = the package's reward")
    name: str = Field("compute_score", min_length=1, description="the function in `path`, with verl's signature "
                      "compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)")
    timeout_s: float = Field(60, gt=0, le=86400, description="longest wait for one import or one call of your reward "
                             "(it runs in a child process); then it is stopped and the step fails with one line")
    max_abs: float = Field(1e6, gt=0, le=1e30, description="a reward with |r| above this is refused with its row "
                           "(training adds and scales rewards in float32, which overflows at 3.4e38)")
    max_processes: int = Field(64, ge=0, le=4096, description="processes of the reward process's session alive at "
                               "once besides itself (a multiprocessing pool of a 64-core node fits); more stop it "
                               "with one line naming the row")
    max_memory_mb: int = Field(4096, ge=64, le=1_048_576, description="resident memory of the reward process after "
                               "a call (MB); more stop it with one line naming the row, and the next call gets a fresh "
                               "one; its address space is capped at 4 times this (RLIMIT_AS)")
    max_output_bytes: int = Field(1_048_576, ge=0, le=1_073_741_824, description="bytes of what the reward prints "
                                  "(stdout and stderr) passed on to the job's log; then one line says the rest is "
                                  "dropped")


class Reward(Section):
    """`reward`"""

    # each value is an object of llmrnn.reward.modes (whether it asks the judge, how it scores, what it says)
    mode: Literal['scalar', 'pairwise', 'outcome'] = Field('scalar', description='outcome = next-visit recall only, no judge call')
    pairwise_opponent: Literal['group', 'reference'] = Field('group', description='batch scoring (TRL, verl batch manager) compares within the prompt group; per-sample verl uses h_ref')
    outcome_epsilon: float = Field(0.0, le=1000, ge=0, description='weight of the next-visit anticipation term (0 = reference reward)')
    invalid_json_score: float = Field(0.05, ge=0, le=1, description='reward of a policy output that is not exactly `{"evolving_summary": "<text>"}` (optionally in one ```json fence); prose around it counts as invalid, as in the reference (the forward pass is more lenient: it also finds the object inside prose)')
    max_concurrency: int = Field(64, le=4096, ge=1, description='judge calls in flight (thread pool + connection pool)')
    retries: int = Field(4, le=100, ge=0, description='transport retries (refused, timeout, 5xx, 429, a 200 without usable content or logprobs) with exponential backoff; then the call raises JudgeUnavailable')
    backoff_s: float = Field(0.5, le=3600, ge=0, description='first wait between judge retries (seconds), growing exponentially')
    backoff_max_s: float = Field(8.0, le=3600, ge=0, description='longest wait between judge retries (seconds)')
    timeout_s: float = Field(300, le=7 * 24 * 3600, gt=0, description='per judge call')
    health_timeout_s: float = Field(900, le=7 * 24 * 3600, gt=0, description='how long a consumer waits for the endpoint file + /health before failing')
    cache_size: int = Field(4096, le=1_000_000_000, ge=0, description='identical judge requests (duplicate candidates) sent once; 0 = off')
    call_budget_s: float = Field(900, le=7 * 24 * 3600, gt=0, description='one judge call, every try (timeout_s each) and every wait between tries together; then the call fails')
    # no default object: a config without `custom` keeps every job's --cfg (and so its reruns) as it was
    custom: RewardCustom = Field(default_factory=RewardCustom, description="absent by default (the built-in reward); your own reward instead of the judge (docs/rewards.md): a Python file and the function in it with verl's signature, used by both engines", json_schema_extra={"no_default": True})
    dead_after_s: float = Field(30, le=7 * 24 * 3600, gt=0, description="a judge that is certainly gone (the endpoint's processes are not running, or a ready server refuses connections) fails the health wait after this long")
    stall_s: float = Field(120, le=7 * 24 * 3600, gt=0, description="a judge that stops answering: while calls wait on it, some call must get an answer at least this often (or 4x the slowest answer so far, when longer; the first answer may take timeout_s), else every call fails at once with one line instead of waiting call_budget_s; raise it with timeout_s for a judge whose one answer takes longer")

    @property
    def custom_reward(self) -> dict | None:
        """reward.custom as a dict ({"path", "name", "timeout_s", "max_abs", and the reward process's bounds
        "max_processes", "max_memory_mb", "max_output_bytes"}), None when its path is not set."""
        return self.custom.model_dump() if self.custom.path else None



class Preflight(Section):
    """`preflight`"""

    rows: int = Field(8, le=1_000_000_000, ge=1, description='train rows scored (h_ref, h_prev, empty memory each)')
    seed: int = Field(0, le=2**32 - 1, ge=0, description='seed of the row sample')
    max_fallback_rate: float = Field(0.25, ge=0, le=1, description='share of judge answers without a parseable score above which preflight fails, and training stops (over the last fallback_window judged samples)')
    fallback_window: int = Field(64, le=1_000_000_000, ge=1, description='judged samples over which the training-time fallback guard computes its rate')
    min_distinct_rewards: int = Field(3, le=1_000_000_000, ge=1, description='fewer distinct rewards than this = constant reward = failure')
    on_problem: Literal['fail', 'warn'] = Field('fail', description='`fail` stops the DAG with one line saying why; `warn` records judge problems under `warnings`')
    agreement_pairs: int = Field(12, le=1_000_000_000, ge=0, description="judge agreement: pairs (a train row's reference memory vs another patient's, or its own with the diagnoses removed or cut in half) the judge scores; 0 = no check")
    agreement_warn_below: float = Field(0.75, ge=0, le=1, description='a warning when the judge ranks fewer pairs right than this share')
    agreement_fail_below: float = Field(0.5, ge=0, le=1, description='a problem (on_problem) when the judge ranks fewer pairs right than this share')

    @model_validator(mode="after")
    def _thresholds_in_order(self) -> Preflight:
        """The cross-field rule of the section (check, the docs and the preflight share it)."""
        if self.agreement_fail_below > self.agreement_warn_below:
            raise ValueError(f"preflight.agreement_fail_below ({self.agreement_fail_below}) <= agreement_warn_below "
                             f"({self.agreement_warn_below}): a share that fails must also warn")
        return self


def preflight_settings(value: dict | None) -> Preflight:
    """The `preflight` section as its validated model: the preflight's checks, and the fallback guard training
    keeps with the same threshold (max_fallback_rate over fallback_window). Here, beside the model, because
    both the preflight and the train stage read it."""
    return parse(Preflight, value or {}, "preflight")
