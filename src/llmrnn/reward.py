"""The GRPO reward: a rubric judge over HTTP, the reference's edge table, pairwise mode, outcome term.

Entry points (verl calls compute_score(data_source=, solution_str=, ground_truth=, extra_info=,
**reward_kwargs) and accepts a float or a dict with "score"; TRL passes dataset columns as keywords):
- `compute_score(data_source, solution_str, ground_truth, extra_info, **kw)`: verl's per-sample
  signature; returns a dict with "score" and diagnostics (parse_method, judge_latency_s, retries, ...).
- `compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos, **kw)`: verl's batch
  reward manager signature; scores concurrently, pairwise within groups possible.
- `trl_reward_func(prompts, completions, **columns)`: TRL's batch reward function (same scorer).

Where the judge is: kwargs `endpoint_file=`, `rubric_file=`, `audit_dir=`, `reward_cfg=` (dict or JSON
of config section `reward`), else env LLMRNN_JUDGE_ENDPOINT / LLMRNN_RUBRIC / LLMRNN_AUDIT_DIR /
LLMRNN_REWARD_CFG. The rubric defaults to the one the endpoint file names; the audit dir has no default
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
(LLMRNN_FALLBACK_GUARD set by `llmrnn train run`) a FallbackGuard raises JudgeDegraded when more than
preflight.max_fallback_rate of the last preflight.fallback_window judged samples fell back to 0.5; the
reason is also left in the audit dir (stop_reason.txt) for the train command to report. Identical
judge requests (duplicate candidates are common in a group) are sent once: an LRU of in-flight/finished
calls, counted as `cache_hit`. Every scored sample is appended to RUN/train/audit/calls_<pid>.jsonl
(mode 0600): rollout text, judge prompts, judge answers, reward, timings.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, fields
from functools import partial
from pathlib import Path
from typing import Any

from llmrnn import jsonparse
from llmrnn.constants import DATA_SOURCE
from llmrnn.errors import CheckFailed, InputError, LlmrnnError
from llmrnn.judge.client import Endpoint, JudgeClient, JudgeUnavailable, wait_for_endpoint
from llmrnn.matching import anticipated_share
from llmrnn.rubric import (
    FALLBACK_SCORE,
    JudgeRequest,
    Rubric,
    load_rubric,
    memory_text,
    pairwise_request,
    parse_scalar,
    parse_verdict,
    response_problem,
    response_text,
    scalar_request,
)

log = logging.getLogger(__name__)

ENV_ENDPOINT = "LLMRNN_JUDGE_ENDPOINT"
ENV_RUBRIC = "LLMRNN_RUBRIC"
ENV_AUDIT = "LLMRNN_AUDIT_DIR"
ENV_CFG = "LLMRNN_REWARD_CFG"
ENV_GUARD = "LLMRNN_FALLBACK_GUARD"  # JSON {"max_fallback_rate", "window"}: set for training only
STOP_REASON_FILE = "stop_reason.txt"  # in the audit dir: why the reward stopped training (read by train)
MODES = ("scalar", "pairwise", "outcome")
OPPONENTS = ("group", "reference")


@dataclass(frozen=True)
class RewardConfig:
    """Config section `reward` (documented in docs/configuration.md; schema defaults match these)."""

    mode: str = "scalar"
    pairwise_opponent: str = "group"
    outcome_epsilon: float = 0.0
    invalid_json_score: float = 0.05
    max_concurrency: int = 64
    retries: int = 4
    backoff_s: float = 0.5
    backoff_max_s: float = 8.0
    timeout_s: float = 300.0
    health_timeout_s: float = 900.0
    cache_size: int = 4096
    call_budget_s: float = 900.0  # one judge call, every try and wait together
    dead_after_s: float = 30.0  # a judge that is certainly gone (dead pid, refused port) fails the wait then

    @classmethod
    def from_any(cls, value: Any) -> RewardConfig:
        if value is None or value == "":
            return cls()
        if isinstance(value, RewardConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise InputError(f"reward config is not JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise InputError("reward config must be a mapping")
        value = dict(value.get("reward", value))  # accept {"reward": {...}} (cfg_json) or the section itself
        # TODO(i34-reward): reward.custom {path, name} (llmrnn.settings) is used by the engines there
        custom = value.pop("custom", None)
        if custom and custom.get("path"):
            raise InputError("reward.custom.path: a custom reward is not supported by this build")
        allowed = {f.name for f in fields(cls)}
        unknown = set(value) - allowed
        if unknown:
            raise InputError(f"reward: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
        cfg = cls(**value)
        if cfg.mode not in MODES:
            raise InputError(f"reward.mode: {cfg.mode!r} is not one of {', '.join(MODES)}")
        if cfg.pairwise_opponent not in OPPONENTS:
            raise InputError(f"reward.pairwise_opponent: {cfg.pairwise_opponent!r} is not one of group, reference")
        return cfg

    @property
    def judged(self) -> bool:
        """Scalar and pairwise modes ask the judge; outcome mode scores the memory's recall alone."""
        return self.mode != "outcome"


# The settings that bound every wait on the judge (health, each call, the whole call, a gone judge): what
# any command that asks the judge gets from config section `reward` (`qa judge` too, whatever the mode).
JUDGE_WAIT_KEYS = ("max_concurrency", "retries", "backoff_s", "backoff_max_s", "timeout_s", "health_timeout_s",
                   "call_budget_s", "dead_after_s")


def judge_wait_cfg(reward: dict | None) -> dict:
    """The JUDGE_WAIT_KEYS of config section `reward` (absent keys keep RewardConfig's defaults)."""
    return {k: v for k, v in (reward or {}).items() if k in JUDGE_WAIT_KEYS}


NO_JUDGE = "reward.mode outcome asks no judge"  # why preflight and training run without an endpoint


def asks_judge(config: dict) -> bool:
    """Whether a workflow config's reward needs the judge server (llmrnn.plan plans judge_server,
    and preflight/train take its endpoint, only then): recipe qa when its judge weight is on, the memory
    head unless reward.mode is outcome. The one place that decides it for the rules and `llmrnn check`."""
    if config.get("recipe") == "qa":
        return bool((((config.get("qa") or {}).get("reward") or {}).get("weights") or {}).get("judge"))
    return RewardConfig.from_any(config.get("reward") or {}).judged


def missing_endpoint(mode: str, how: str) -> InputError:
    """The one line for a judged reward mode given no endpoint (`how`: where the caller names it)."""
    return InputError(f"reward.mode {mode} asks the judge but no judge endpoint was given: {how} "
                      "(RUN/judge/endpoint.json; reward.mode outcome needs none)")


# ----------------------------------------------------------------------------- policy output + outcome
# The next visit's diagnoses the candidate memory anticipates, matched as the held-out judge matches.
outcome_share = anticipated_share


def _step(ground_truth: Any) -> dict:
    if isinstance(ground_truth, dict):
        return ground_truth
    try:
        step = json.loads(ground_truth)
    except (TypeError, json.JSONDecodeError) as exc:
        raise InputError(f"reward ground_truth is not a TrajectoryStep JSON: {exc}") from exc
    if not isinstance(step, dict):
        raise InputError("reward ground_truth must be a JSON object (TrajectoryStep)")
    return step


# ----------------------------------------------------------------------------- audit
class AuditLog:
    """Append-only JSONL per process (calls_<pid>.jsonl, mode 0600, directory 0700); fork-safe."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self._lock = threading.Lock()
        self._fh = None
        self._pid = None

    @property
    def path(self) -> Path:
        return self.directory / f"calls_{os.getpid()}.jsonl"

    def write(self, record: dict) -> None:
        """Append one record; a full disk or an unwritable audit dir is one CheckFailed naming the file
        (every scored sample must be audited: scoring stops rather than goes on unaudited)."""
        line = json.dumps(record, ensure_ascii=False, default=str) + "\n"
        with self._lock:
            try:
                if self._fh is None or self._pid != os.getpid():
                    self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
                    fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                    os.fchmod(fd, 0o600)
                    self._fh = os.fdopen(fd, "a", encoding="utf-8")
                    self._pid = os.getpid()
                self._fh.write(line)
                self._fh.flush()
            except OSError as exc:
                fh, self._fh = self._fh, None  # a half-written line is not appended to on the next try
                if fh is not None:
                    with contextlib.suppress(OSError):
                        fh.close()
                raise CheckFailed(f"{self.path}: cannot write the judge audit ({exc.strerror or exc}); "
                                  "free disk space or fix the audit directory, then rerun") from None


# ----------------------------------------------------------------------------- fallback guard
class JudgeDegraded(LlmrnnError):
    """Too many judge answers had no parseable score during training: the reward became a constant."""

    exit_code = 4


def fallback_rate(results: list[dict]) -> float | None:
    """Share of judged samples (valid policy JSON, so the judge was asked) whose answer fell back to 0.5;
    None when no sample was judged. Accepts the scorer's results or their numeric_only form."""
    judged = [r for r in results if r.get("valid_json")]
    if not judged:
        return None
    return sum(r.get("parse_method") == "fallback" or bool(r.get("parse_fallback")) for r in judged) / len(judged)


class FallbackGuard:
    """Stops training when, over the last `window` judged samples, more than `max_rate` fell back to 0.5.

    Preflight checks the same rate once before training; a judge can degrade later (overloaded, a policy
    that drifts into answers the rubric cannot score), and a constant 0.5 trains nothing while looking
    like a healthy run. Once tripped, every later call raises too."""

    def __init__(self, max_rate: float, window: int = 64):
        if window < 1:
            raise InputError(f"preflight.fallback_window: must be >= 1, got {window}")
        self.max_rate = float(max_rate)
        self.window = int(window)
        self.recent: deque[bool] = deque(maxlen=self.window)
        self.tripped: str | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls) -> FallbackGuard | None:
        raw = os.environ.get(ENV_GUARD)
        if not raw:
            return None
        try:
            spec = json.loads(raw)
            return cls(float(spec["max_fallback_rate"]), int(spec.get("window", 64)))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{ENV_GUARD}: expected JSON {{\"max_fallback_rate\": x, \"window\": n}}: {exc}") from exc

    def record(self, results: list[dict]) -> None:
        with self._lock:
            if self.tripped is None:
                for r in results:
                    if r.get("valid_json"):
                        self.recent.append(r.get("parse_method") == "fallback")
                n, bad = len(self.recent), sum(self.recent)
                if n == self.window and bad / n > self.max_rate:
                    self.tripped = (
                        f"judge degraded during training: {bad} of the last {n} judged samples ({bad / n:.0%}) "
                        f"had no parseable score and fell back to 0.5 (preflight.max_fallback_rate "
                        f"{self.max_rate:.0%}); training stopped instead of learning from a constant reward"
                    )
            if self.tripped is not None:
                raise JudgeDegraded(self.tripped)


def guard_env(max_fallback_rate: float, window: int) -> dict[str, str]:
    """The environment that turns the fallback guard on in every process that scores (train only)."""
    return {ENV_GUARD: json.dumps({"max_fallback_rate": float(max_fallback_rate), "window": int(window)})}


# ----------------------------------------------------------------------------- scorer
@dataclass
class JudgeCall:
    request: JudgeRequest
    response: str
    payload: dict
    latency_s: float
    retries: int
    cache_hit: bool


class Scorer:
    """Judge endpoint + rubric + thread pool + request cache + audit, shared by all entry points.

    In outcome mode (cfg.judged False) there is no judge: endpoint, rubric, client and pool stay None
    and endpoint_file may be None; scoring and the audit work as in the other modes."""

    def __init__(self, endpoint_file: str | Path | None, rubric_file: str | Path | None,
                 audit_dir: str | Path, cfg: RewardConfig | None = None):
        self.cfg = cfg or RewardConfig()
        self.audit = AuditLog(audit_dir)
        self._cache: OrderedDict[str, Future] = OrderedDict()
        self._lock = threading.Lock()
        self.counts = {"judge_requests": 0, "http_calls": 0, "cache_hits": 0}
        self.guard = FallbackGuard.from_env()
        self.endpoint_file: Path | None = None
        self.endpoint: Endpoint | None = None
        self.rubric: Rubric | None = None
        self.client: JudgeClient | None = None
        self.pool: ThreadPoolExecutor | None = None
        if not self.cfg.judged:
            return  # an endpoint given anyway is not waited on: nothing would ever be sent to it
        if not endpoint_file:
            raise missing_endpoint(self.cfg.mode, "pass endpoint_file")
        self.endpoint_file = Path(endpoint_file)
        self.endpoint = wait_for_endpoint(self.endpoint_file, self.cfg.health_timeout_s,
                                          dead_after_s=self.cfg.dead_after_s)
        self.rubric = load_rubric(rubric_file or self.endpoint.rubric)
        self.client = JudgeClient(
            self.endpoint, timeout_s=self.cfg.timeout_s, retries=self.cfg.retries,
            backoff_s=self.cfg.backoff_s, backoff_max_s=self.cfg.backoff_max_s,
            max_connections=self.cfg.max_concurrency, budget_s=self.cfg.call_budget_s,
        )
        self.pool = ThreadPoolExecutor(self.cfg.max_concurrency, thread_name_prefix="judge")
        self.failed: BaseException | None = None  # the judge failure that ended this scorer

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        if self.client is not None:
            self.client.close()

    def abort(self, failure: BaseException) -> None:
        """A judge call failed: end the calls still in flight now (their sockets are cut, queued ones are
        cancelled) so the process reports the failure and exits instead of waiting on their deadlines;
        every later call raises the same failure."""
        self.failed = failure
        if self.client is not None:
            self.client.abort()
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)

    # -- one judge call, deduplicated
    def judge(self, req: JudgeRequest) -> JudgeCall:
        if self.failed is not None:
            raise JudgeUnavailable(f"the judge failed earlier: {self.failed}")
        key = req.key()
        with self._lock:
            self.counts["judge_requests"] += 1
            fut = self._cache.get(key)
            owner = fut is None
            if owner:
                fut = Future()
                if self.cfg.cache_size > 0:
                    self._cache[key] = fut
                    while len(self._cache) > self.cfg.cache_size:
                        self._cache.popitem(last=False)
                self.counts["http_calls"] += 1
            else:
                self._cache.move_to_end(key)
                self.counts["cache_hits"] += 1
        if owner:
            try:
                check = partial(response_problem, logprobs=req.wants_logprobs)
                payload, latency, retries = self.client.post(req.path, req.body, check=check)
                text = response_text(payload)
            except BaseException as exc:
                with self._lock:
                    self._cache.pop(key, None)  # a failure is never cached
                fut.set_exception(exc)
                raise
            fut.set_result((payload, text, latency, retries))
            return JudgeCall(req, text, payload, latency, retries, False)
        payload, text, latency, retries = fut.result()
        return JudgeCall(req, text, payload, 0.0, 0, True)

    def judge_many(self, reqs: list[JudgeRequest]) -> list[JudgeCall]:
        """Concurrently (thread pool); identical requests share one HTTP call."""
        if not reqs:  # outcome mode plans none (and has no pool)
            return []
        if self.failed is not None:
            raise JudgeUnavailable(f"the judge failed earlier: {self.failed}")
        futures = [self.pool.submit(self.judge, req) for req in reqs]
        wait(futures, return_when=FIRST_EXCEPTION)
        failures = [f.exception() for f in futures if f.done() and not f.cancelled() and f.exception()]
        if failures:  # the first real failure, not a call abandoned because of it
            first = next((e for e in failures if "call abandoned" not in str(e)), failures[0])
            self.abort(first)
            raise first
        return [f.result() for f in futures]

    # -- scalar
    def _scalar_result(self, call: JudgeCall) -> dict:
        parsed = parse_scalar(call.response, self.rubric.scale_max, call.payload, call.request.prefix,
                              self.rubric.request.score_method == "expected")
        return {"judge_score": parsed.score, "parse_method": parsed.parse_method, "raw_score": parsed.raw_score,
                "digit_probs": parsed.digit_probs}

    # -- pairwise: outcome for the candidate in position A (1 win, 0.5 tie/unparsed, 0 loss)
    def _verdict_points(self, call: JudgeCall, candidate_is_a: bool) -> tuple[float, str]:
        verdict = parse_verdict(call.response, self.rubric)
        if verdict is None:
            return FALLBACK_SCORE, "unparsed"
        if verdict == "tie":
            return 0.5, "tie"
        won = (verdict == "A") == candidate_is_a
        return (1.0 if won else 0.0), ("win" if won else "loss")

    def _pair_requests(self, step: dict, cand: str, other: str) -> list[JudgeRequest]:
        return [pairwise_request(self.rubric, step, cand, other), pairwise_request(self.rubric, step, other, cand)]

    # -- public scoring
    def score_samples(self, samples: list[dict], opponent: str = "reference") -> list[dict]:
        """samples: dicts with data_source, solution_str, ground_truth, extra_info (and optional group).
        Returns one result dict per sample, in order; all judge calls of the batch run concurrently."""
        t0 = time.perf_counter()
        prepared = []
        for s in samples:
            step = _step(s["ground_truth"])
            # strict, as in the reference: prose around the JSON is invalid policy output (0.05)
            text = s["solution_str"] if isinstance(s["solution_str"], str) else None
            memory = jsonparse.parse_memory(text, strict=True)[0]
            prepared.append({"step": step, "memory": memory, "sample": s})
        plan: list[tuple[int, JudgeRequest, bool]] = []  # (sample index, request, candidate is A)
        if self.cfg.mode == "outcome":
            pass  # outcome-only: no judge call (the memory's recall of the next visit's diagnoses is the score)
        elif self.cfg.mode == "scalar":
            for i, p in enumerate(prepared):
                if p["memory"] is not None:
                    plan.append((i, scalar_request(self.rubric, p["step"], p["memory"]), True))
        else:
            plan = self._pairwise_plan(prepared, opponent)
        try:
            calls = self.judge_many([req for _, req, _ in plan])
        except JudgeUnavailable as exc:
            self.stop_reason(str(exc))
            raise
        per_sample: dict[int, list[tuple[JudgeCall, bool]]] = {}
        for (i, _, cand_a), call in zip(plan, calls):
            per_sample.setdefault(i, []).append((call, cand_a))
        elapsed = time.perf_counter() - t0
        results = [self._finish(p, per_sample.get(i, []), elapsed) for i, p in enumerate(prepared)]
        if self.guard is not None:
            try:
                self.guard.record(results)
            except JudgeDegraded as exc:
                self.stop_reason(str(exc))
                raise
        return results

    def stop_reason(self, message: str) -> None:
        """Leave the reason beside the audit: verl's reward workers die inside Ray, and the train
        command reads this file to say why (the file holds no clinical text)."""
        from llmrnn import io

        self.audit.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        io.write_text(self.audit.directory / STOP_REASON_FILE, message + "\n")

    def _pairwise_plan(self, prepared: list[dict], opponent: str) -> list[tuple[int, JudgeRequest, bool]]:
        plan = []
        groups: dict[str, list[int]] = {}
        for i, p in enumerate(prepared):
            if p["memory"] is not None:
                groups.setdefault(str(p["sample"].get("group", i)), []).append(i)
        for members in groups.values():
            distinct = {memory_text(prepared[i]["memory"]) for i in members}
            use_group = opponent == "group" and len(members) > 1 and len(distinct) > 1
            for i in members:
                p = prepared[i]
                cand = p["memory"]
                if use_group:
                    others = [prepared[j]["memory"] for j in members if j != i]
                else:
                    others = [memory_text(p["step"].get("h_ref"))]
                p["opponents"] = len(others)
                for other in others:
                    if memory_text(other) == memory_text(cand):
                        p.setdefault("identical", 0)
                        p["identical"] += 1
                        continue
                    a_first, b_first = self._pair_requests(p["step"], cand, other)
                    plan.append((i, a_first, True))
                    plan.append((i, b_first, False))
        return plan

    def _finish(self, p: dict, calls: list[tuple[JudgeCall, bool]], batch_s: float) -> dict:
        s = p["sample"]
        step = p["step"]
        memory = p["memory"]
        result: dict[str, Any] = {
            "score": self.cfg.invalid_json_score, "judge_score": None, "outcome": 0.0,
            "parse_method": "invalid_json", "valid_json": memory is not None,
            "judge_latency_s": sum(c.latency_s for c, _ in calls), "retries": sum(c.retries for c, _ in calls),
            "judge_calls": len(calls), "cache_hits": sum(c.cache_hit for c, _ in calls),
        }
        if self.cfg.mode == "outcome":
            # Outcome-only (for a judge too weak to rank memories): score = the share of the next visit's
            # diagnoses named by the memory the forward pass would carry (its lenient parser: the eval's
            # memory recall reads the same h_t); output with no memory JSON scores 0, below any memory.
            memory, _ = jsonparse.parse_memory(s["solution_str"])
            result["valid_json"] = memory is not None
            result["outcome"] = outcome_share(memory, step.get("next_ground_truth_diagnoses")) if memory else 0.0
            result["score"] = result["outcome"]
            result["parse_method"] = "outcome" if memory is not None else "invalid_json"
        elif memory is not None:
            if self.cfg.mode == "scalar":
                result.update(self._scalar_result(calls[0][0]))
                unscored = [calls[0][0]] if result["parse_method"] == "fallback" else []
            else:
                points, outcomes, unscored = [], [], []
                for call, cand_a in calls:
                    pts, what = self._verdict_points(call, cand_a)
                    points.append(pts)
                    outcomes.append(what)
                    if what == "unparsed":
                        unscored.append(call)
                ident = p.get("identical", 0)
                points += [0.5, 0.5] * ident
                outcomes += ["identical", "identical"] * ident
                result["judge_score"] = sum(points) / len(points) if points else 0.5
                unparsed = outcomes.count("unparsed")
                result["parse_method"] = (
                    "fallback" if points and unparsed == len(points)
                    else "identical" if outcomes and set(outcomes) == {"identical"} else "pairwise"
                )
                result["pairwise"] = {k: outcomes.count(k) for k in ("win", "loss", "tie", "unparsed", "identical")}
            result["outcome"] = outcome_share(memory, step.get("next_ground_truth_diagnoses"))
            result["score"] = result["judge_score"] + self.cfg.outcome_epsilon * result["outcome"]
            # answers cut off by max_tokens before any score (e.g. a thinking judge): preflight fails on them
            result["truncated_calls"] = sum(1 for c in unscored if finish_reason(c.payload) == "length")
        elif self.cfg.outcome_epsilon:
            # The outcome term reads the raw text when it is not JSON: a small policy that rarely writes
            # valid JSON still gets a within-group signal. With epsilon 0 (the reference) this stays 0.05.
            result["outcome"] = outcome_share(s["solution_str"], step.get("next_ground_truth_diagnoses"))
            result["score"] = self.cfg.invalid_json_score + self.cfg.outcome_epsilon * result["outcome"]
        self.audit.write({
            "time": time.time(), "pid": os.getpid(), "rubric": self.rubric.name if self.rubric else None,
            "mode": self.cfg.mode,
            "data_source": s.get("data_source"), "extra_info": s.get("extra_info"),
            "rollout": s["solution_str"], "candidate_memory": memory,
            "judge": [{"prompt": c.request.prompt, "assistant_prefix": c.request.prefix, "response": c.response,
                       "candidate_is_a": a, "latency_s": round(c.latency_s, 4), "retries": c.retries,
                       "cache_hit": c.cache_hit} for c, a in calls],
            **{k: v for k, v in result.items()}, "batch_s": round(batch_s, 4),
        })
        return result


def finish_reason(payload: dict) -> str | None:
    """The OpenAI finish_reason of a judge answer ("length": it hit max_tokens)."""
    try:
        return (payload.get("choices") or [{}])[0].get("finish_reason")
    except AttributeError:
        return None


# ----------------------------------------------------------------------------- shared scorers
_SCORERS: dict[tuple, Scorer] = {}
_SCORERS_LOCK = threading.Lock()


def get_scorer(endpoint_file: str | None = None, rubric_file: str | None = None, audit_dir: str | None = None,
               reward_cfg: Any = None) -> Scorer:
    """The process-wide scorer for these settings (kwargs win over the LLMRNN_* environment). Outcome
    mode needs no endpoint; the judged modes stop with one line without one."""
    cfg = RewardConfig.from_any(reward_cfg if reward_cfg is not None else os.environ.get(ENV_CFG))
    endpoint_file = (endpoint_file or os.environ.get(ENV_ENDPOINT)) if cfg.judged else None
    if cfg.judged and not endpoint_file:
        raise missing_endpoint(cfg.mode, f"pass endpoint_file= or set {ENV_ENDPOINT}")
    rubric_file = (rubric_file or os.environ.get(ENV_RUBRIC) or None) if cfg.judged else None
    audit_dir = audit_dir or os.environ.get(ENV_AUDIT)
    if not audit_dir:  # every scored sample is audited: the caller says where (train: RUN/train/audit)
        raise InputError(f"reward: no audit directory: pass audit_dir= or set {ENV_AUDIT}")
    key = (str(endpoint_file), str(rubric_file), str(audit_dir), json.dumps(asdict(cfg), sort_keys=True), os.getpid())
    with _SCORERS_LOCK:
        scorer = _SCORERS.get(key)
        if scorer is None:
            scorer = Scorer(endpoint_file, rubric_file, audit_dir, cfg)
            _SCORERS[key] = scorer
    return scorer


def reward_env(endpoint_file: str | os.PathLike | None, audit_dir: str | os.PathLike, reward_cfg: dict | None = None,
               rubric_file: str | None = None) -> dict[str, str]:
    """Environment variables that point compute_score / trl_reward_func at the judge (for train; verl's
    reward workers inherit them). Only what is given is set."""
    env = {ENV_AUDIT: str(audit_dir)}
    if endpoint_file:
        env[ENV_ENDPOINT] = str(endpoint_file)
    if reward_cfg is not None:
        env[ENV_CFG] = json.dumps(reward_cfg, sort_keys=True)
    if rubric_file:
        env[ENV_RUBRIC] = str(rubric_file)
    return env


def _scorer_from(kwargs: dict) -> Scorer:
    return get_scorer(kwargs.pop("endpoint_file", None), kwargs.pop("rubric_file", None),
                      kwargs.pop("audit_dir", None), kwargs.pop("reward_cfg", None))


# The keys compute_score returns, in this order, on EVERY path (judged, invalid JSON, judge fallback, pairwise,
# outcome): verl 0.7.1 builds a worker's reward extras from its first sample's keys (AgentLoopWorker._postprocess)
# and asserts equal `reward_extra_keys` when it concatenates the workers' chunks (DataProto.concat), so a key
# present on one path only crashes a batch that mixes paths. A diagnostic a path has no value for gets NEUTRAL's.
PUBLIC_KEYS = ("score", "judge_score", "outcome", "parse_method", "valid_json", "judge_latency_s", "retries",
               "judge_calls", "cache_hits", "raw_score", "truncated_calls")
NEUTRAL = {"raw_score": None, "truncated_calls": 0}  # no judge answer: no raw number, none cut off
PARSE_FLAGS = ("expected", "score_line", "short_digit", "fallback", "invalid_json", "pairwise", "outcome")


def _public(result: dict, numeric_only: bool) -> dict:
    out = {k: result.get(k, NEUTRAL.get(k)) for k in PUBLIC_KEYS}
    if out.get("judge_score") is None:
        out["judge_score"] = out["score"]
    if numeric_only:  # some trainers average every extra key: keep numbers, encode the method as flags
        method = out.pop("parse_method")
        out.pop("raw_score", None)
        for m in PARSE_FLAGS:
            out[f"parse_{m}"] = float(method == m)
        out["valid_json"] = float(out["valid_json"])
    return out


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None,
                  **kwargs) -> dict:
    """verl's per-sample reward (pairwise mode compares with the row's reference memory h_ref)."""
    numeric_only = bool(kwargs.pop("numeric_only", False))
    scorer = _scorer_from(kwargs)
    sample = {"data_source": data_source, "solution_str": solution_str, "ground_truth": ground_truth,
              "extra_info": extra_info or {}}
    return _public(scorer.score_samples([sample], opponent="reference")[0], numeric_only)


def _group_key(extra_info: Any, ground_truth: Any) -> str:
    if isinstance(extra_info, dict) and extra_info.get("index") is not None:
        return f"{extra_info.get('split')}:{extra_info['index']}"
    return str(hash(ground_truth if isinstance(ground_truth, str) else json.dumps(ground_truth, sort_keys=True)))


def compute_score_batch(data_sources: list, solution_strs: list, ground_truths: list, extra_infos: list,
                        **kwargs) -> list[dict]:
    """verl's batch reward manager signature: all judge calls of the batch run concurrently; in pairwise
    mode with pairwise_opponent: group, candidates of the same row compete with each other."""
    numeric_only = bool(kwargs.pop("numeric_only", False))
    scorer = _scorer_from(kwargs)
    samples = [
        {"data_source": ds, "solution_str": sol, "ground_truth": gt, "extra_info": ei or {},
         "group": _group_key(ei, gt)}
        for ds, sol, gt, ei in zip(data_sources, solution_strs, ground_truths, extra_infos)
    ]
    results = scorer.score_samples(samples, opponent=scorer.cfg.pairwise_opponent)
    return [_public(r, numeric_only) for r in results]


def _completion_text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return completion[-1].get("content") or ""
    if isinstance(completion, dict):
        return completion.get("content") or ""
    return str(completion)


def trl_reward_func(prompts: list, completions: list, **columns) -> list[float]:
    """TRL GRPOTrainer reward function: dataset columns (reward_model, extra_info, data_source) arrive
    as keyword lists; groups are the rows' generations (pairwise_opponent: group compares within them).
    The batch's judge fallback rate goes to TRL's `log_metric` (metrics.jsonl `judge_fallback_rate`)."""
    n = len(completions)
    reward_model = columns.get("reward_model") or [None] * n
    ground_truths = [rm.get("ground_truth") if isinstance(rm, dict) else rm for rm in reward_model]
    if any(gt is None for gt in ground_truths):
        raise InputError("trl_reward_func: column reward_model.ground_truth missing (verl parquet format)")
    extra = columns.get("extra_info") or [{} for _ in range(n)]
    sources = columns.get("data_source") or [DATA_SOURCE] * n
    kw = {k: columns[k] for k in ("endpoint_file", "rubric_file", "audit_dir", "reward_cfg") if k in columns}
    results = compute_score_batch(sources, [_completion_text(c) for c in completions], ground_truths, extra, **kw)
    rate = fallback_rate(results)
    if rate is not None and callable(columns.get("log_metric")):  # TRL >= 1.x hands reward functions a logger
        columns["log_metric"]("judge_fallback_rate", rate)
    return [float(r["score"]) for r in results]
