"""The judge's scorer: endpoint + rubric + thread pool + request cache + audit + fallback guard, shared
by every entry point (llmrnn.reward.entry), preflight and the qa recipe's judge reward."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from llmrnn import io, jsonparse
from llmrnn.errors import InputError
from llmrnn.judge.client import Endpoint, JudgeClient, JudgeUnavailable, wait_for_endpoint
from llmrnn.matching import anticipated_share
from llmrnn.reward.audit import AuditLog
from llmrnn.reward.config import STOP_REASON_FILE, reward_settings, settings
from llmrnn.reward.guard import FallbackGuard, JudgeDegraded
from llmrnn.reward.modes import reward_mode
from llmrnn.rubric import JudgeRequest, Rubric, load_rubric, response_problem, response_text
from llmrnn.settings import Reward
from llmrnn.settings.trajectory_step import read_step

# The next visit's diagnoses the candidate memory anticipates, matched as the held-out judge matches.
outcome_share = anticipated_share


def _step(sample: dict) -> dict:
    """The sample's trajectory step, checked by its model (llmrnn.settings.trajectory_step): a row missing a
    field, or holding one of another type, is one line naming the row and the field."""
    info = sample.get("extra_info") or {}
    where = f"reward: row {info.get('index', '?')}" + (f" ({info['split']})" if info.get("split") else "")
    return read_step(sample["ground_truth"], where).model_dump()


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

    In a mode that asks no judge (reward.mode outcome) there is no judge: endpoint, rubric, client and pool stay None
    and endpoint_file may be None; scoring and the audit work as in the other modes."""

    def __init__(self, endpoint_file: str | Path | None, rubric_file: str | Path | None,
                 audit_dir: str | Path, cfg: Reward | None = None, guard: Any = None):
        self.cfg = cfg or Reward()
        self.mode = reward_mode(self.cfg)  # how a candidate is scored, and whether the judge is asked
        self.audit = AuditLog(audit_dir)
        self._cache: OrderedDict[str, Future] = OrderedDict()
        self._lock = threading.Lock()
        self.counts = {"judge_requests": 0, "http_calls": 0, "cache_hits": 0}
        self.guard = FallbackGuard.from_spec(guard)
        self.endpoint_file: Path | None = None
        self.endpoint: Endpoint | None = None
        self.rubric: Rubric | None = None
        self.client: JudgeClient | None = None
        self.pool: ThreadPoolExecutor | None = None
        if not self.mode.asks_judge:
            return  # an endpoint given anyway is not waited on: nothing would ever be sent to it
        self.mode.require_endpoint(endpoint_file, "pass endpoint_file")
        self.endpoint_file = Path(endpoint_file)
        self.endpoint = wait_for_endpoint(self.endpoint_file, self.cfg.health_timeout_s,
                                          dead_after_s=self.cfg.dead_after_s)
        self.rubric = load_rubric(rubric_file or self.endpoint.rubric)
        self.client = JudgeClient(
            self.endpoint, timeout_s=self.cfg.timeout_s, retries=self.cfg.retries,
            backoff_s=self.cfg.backoff_s, backoff_max_s=self.cfg.backoff_max_s,
            max_connections=self.cfg.max_concurrency, budget_s=self.cfg.call_budget_s,
            stall_s=self.cfg.stall_s,
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

    # -- public scoring
    def score_samples(self, samples: list[dict], opponent: str = "reference") -> list[dict]:
        """samples: dicts with data_source, solution_str, ground_truth, extra_info (and optional group).
        Returns one result dict per sample, in order; all judge calls of the batch run concurrently."""
        t0 = time.perf_counter()
        prepared = []
        for s in samples:
            step = _step(s)
            # strict, as in the reference: prose around the JSON is invalid policy output (0.05)
            text = s["solution_str"] if isinstance(s["solution_str"], str) else None
            memory = jsonparse.parse_memory(text, strict=True)[0]
            prepared.append({"step": step, "memory": memory, "sample": s})
        plan = self.mode.judge_plan(self.rubric, prepared, opponent)  # none where the mode asks no judge
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
        self.audit.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        io.write_text(self.audit.directory / STOP_REASON_FILE, message + "\n")

    def _finish(self, p: dict, calls: list[tuple[JudgeCall, bool]], batch_s: float) -> dict:
        s = p["sample"]
        memory = p["memory"]
        result: dict[str, Any] = {
            "score": self.cfg.invalid_json_score, "judge_score": None, "outcome": 0.0,
            "parse_method": "invalid_json", "valid_json": memory is not None,
            "judge_latency_s": sum(c.latency_s for c, _ in calls), "retries": sum(c.retries for c, _ in calls),
            "judge_calls": len(calls), "cache_hits": sum(c.cache_hit for c, _ in calls),
        }
        memory = self.mode.score(self.rubric, p, calls, result)
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



# ----------------------------------------------------------------------------- shared scorers (one per settings)
_SCORERS: dict[tuple, Scorer] = {}
_SCORERS_LOCK = threading.Lock()


def get_scorer(endpoint_file: str | None = None, rubric_file: str | None = None, audit_dir: str | None = None,
               reward_cfg: Any = None, guard: Any = None) -> Scorer:
    """The process-wide scorer for these settings, all of them arguments (llmrnn.reward.kwargs: verl's
    reward_kwargs, TRL's reward-function arguments). Outcome mode needs no endpoint; the judged modes stop
    with one line without one."""
    cfg = reward_settings(reward_cfg)
    mode = reward_mode(cfg)
    mode.require_endpoint(endpoint_file, "pass endpoint_file=")
    endpoint_file = endpoint_file if mode.asks_judge else None
    rubric_file = (rubric_file or None) if mode.asks_judge else None
    if not audit_dir:  # every scored sample is audited: the caller says where (train: RUN/train/audit)
        raise InputError("reward: no audit directory: pass audit_dir=")
    spec = settings(guard, "guard")
    key = (str(endpoint_file), str(rubric_file), str(audit_dir), cfg.model_dump_json(),
           json.dumps(spec, sort_keys=True), os.getpid())
    with _SCORERS_LOCK:
        scorer = _SCORERS.get(key)
        if scorer is None:
            scorer = Scorer(endpoint_file, rubric_file, audit_dir, cfg, spec)
            _SCORERS[key] = scorer
    return scorer


