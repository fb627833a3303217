"""The GRPO reward: a rubric judge over HTTP, the reference's edge table, pairwise mode, outcome term.

One concept a module: `config` (section `reward`, the settings parser, who asks the judge), `kwargs` (the
settings as the scorer's arguments), `scorer` (judge client, cache, pool), `audit`, `guard` (fallback
guard), `entry` (compute_score, compute_score_batch, trl_reward_func: verl's `pkg://llmrnn.reward` path
and TRL's function), `custom` (your own reward: reward.custom), `modes` (one object per reward mode:
whether it asks the judge, how it scores, what preflight, the manifest, the report and the card say of it).

Where the judge is: arguments `endpoint_file=`, `rubric_file=`, `audit_dir=`, `reward_cfg=` (mapping or
JSON of config section `reward`), `guard=` (llmrnn.reward.kwargs; verl's reward_kwargs, TRL's reward
function arguments). No environment variable is read. The rubric defaults to the one the endpoint file names; the audit dir has no default
(the caller names it: RUN/train/audit for training, RUN/train/preflight_audit for preflight). Outcome
mode asks no judge: it needs no endpoint, and ignores one that is given (no health wait, no client, no
rubric); scalar and pairwise modes without an endpoint stop with one line.

Scores:
- policy output that is not exactly a JSON object {"evolving_summary": "<text>"} (optionally in one
  ```json fence; `jsonparse.parse_memory(strict=True)`) -> 0.05, no judge call;
- scalar mode: judge answer -> rubric.parse_scalar (edge table: expected digit | Score: N | short
  digit | 0.5 fallback), scaled to (0, 1];
- pairwise mode: candidate vs an opponent in both orders (A/B then B/A, cancelling position bias);
  win 1, tie 0.5, loss 0, unparsed verdict 0.5; the mean over comparisons is the reward in [0, 1].
  Per sample (verl) the opponent is the trajectory's reference memory h_ref; in batch functions with
  `pairwise_opponent: group` every valid candidate meets every other of its prompt group;
- plus `outcome_epsilon` x the share of the next visit's ground-truth diagnoses that the CANDIDATE
  memory mentions (`matching.anticipated_share`: the held-out matcher's normalisation), so the term
  differs within a group (epsilon 0 reproduces the reference);
- outcome mode (for a judge too weak to rank memories, e.g. the CPU demo's): no judge call; the score
  is that share alone, for the memory the forward pass would keep (jsonparse's lenient parser, so the
  reward and the eval's memory recall read the same h_t); output with no memory JSON scores 0.

Transport failures (refused, timeout, 5xx, and 200 answers with no choices, empty content or
malformed logprobs: rubric.response_problem) are retried with backoff and then raise
(JudgeUnavailable): a dead judge stops training instead of becoming a constant reward. During training
(argument `guard=`, given by `llmrnn train run`) a FallbackGuard raises JudgeDegraded when more than
preflight.max_fallback_rate of the last preflight.fallback_window judged samples fell back to 0.5; the
reason is also left in the audit dir (stop_reason.txt) for the train command to report. Identical
judge requests (duplicate candidates are common in a group) are sent once: an LRU of in-flight/finished
calls, counted as `cache_hit`. Every scored sample is appended to RUN/train/audit/calls_<pid>.jsonl
(mode 0600): rollout text, judge prompts, judge answers, reward, timings.
"""

from __future__ import annotations

from llmrnn.judge.client import JudgeUnavailable
from llmrnn.reward.audit import AuditLog
from llmrnn.reward.config import (
    CUSTOM_NAME,
    JUDGE_WAIT_KEYS,
    STOP_REASON_FILE,
    asks_judge,
    judge_wait_cfg,
    reward_settings,
    settings,
)

# verl's entry for your own reward (reward.custom): verl calls pkg://llmrnn.reward:custom_compute_score, which
# runs the user's function under the same contract as check, preflight and TRL (llmrnn.reward.custom)
from llmrnn.reward.custom import compute_score as custom_compute_score
from llmrnn.reward.entry import (
    NEUTRAL,
    PARSE_FLAGS,
    PUBLIC_KEYS,
    compute_score,
    compute_score_batch,
    trl_reward_func,
)
from llmrnn.reward.guard import FallbackGuard, JudgeDegraded, fallback_rate, guard_spec
from llmrnn.reward.kwargs import ARG_KEYS, LOCATIONS, reward_kwargs, settings_identity
from llmrnn.reward.modes import JUDGED_MODES, MODES, RewardMode, finish_reason, mode_named, reward_mode
from llmrnn.reward.scorer import JudgeCall, Scorer, get_scorer, outcome_share

# `llmrnn reward try`: the CLI finds a stage's commands in llmrnn.<stage>.register
from llmrnn.reward.trial import register

__all__ = [
    "ARG_KEYS",
    "CUSTOM_NAME",
    "JUDGED_MODES",
    "JUDGE_WAIT_KEYS",
    "LOCATIONS",
    "MODES",
    "NEUTRAL",
    "PARSE_FLAGS",
    "PUBLIC_KEYS",
    "STOP_REASON_FILE",
    "AuditLog",
    "FallbackGuard",
    "JudgeCall",
    "JudgeDegraded",
    "JudgeUnavailable",
    "RewardMode",
    "Scorer",
    "asks_judge",
    "compute_score",
    "compute_score_batch",
    "custom_compute_score",
    "fallback_rate",
    "finish_reason",
    "get_scorer",
    "guard_spec",
    "judge_wait_cfg",
    "mode_named",
    "outcome_share",
    "register",
    "reward_kwargs",
    "reward_mode",
    "reward_settings",
    "settings",
    "settings_identity",
    "trl_reward_func",
]
