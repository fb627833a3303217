"""The GRPO reward: a rubric judge over HTTP, the reference's edge table, pairwise mode, outcome term.

Entry points (DESIGN §4 / FINDINGS §5):
- `compute_score(data_source, solution_str, ground_truth, extra_info, **kw)`: verl's per-sample
  signature; returns a dict with "score" and diagnostics (parse_method, judge_latency_s, retries, ...).
- `compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos, **kw)`: verl's batch
  reward manager signature; scores concurrently, pairwise within groups possible.
- `trl_reward_func(prompts, completions, **columns)`: TRL's batch reward function (same scorer).

Where the judge is: kwargs `endpoint_file=`, `rubric_file=`, `audit_dir=`, `reward_cfg=` (dict or JSON
of config section `reward`), else env LLMRNN_JUDGE_ENDPOINT / LLMRNN_RUBRIC / LLMRNN_AUDIT_DIR /
LLMRNN_REWARD_CFG. The rubric defaults to the one the endpoint file names; the audit dir defaults to
RUN/train/audit beside RUN/judge/endpoint.json.

Scores:
- policy output that is not a JSON object {"evolving_summary": "<text>"} -> 0.05, no judge call;
- scalar mode: judge answer -> rubric.parse_scalar (edge table: expected digit | Score: N | short
  digit | 0.5 fallback), scaled to (0, 1];
- pairwise mode: candidate vs an opponent in both orders (A/B then B/A, cancelling position bias);
  win 1, tie 0.5, loss 0, unparsed verdict 0.5; the mean over comparisons is the reward in [0, 1].
  Per sample (verl) the opponent is the trajectory's reference memory h_ref; in batch functions with
  `pairwise_opponent: group` every valid candidate meets every other of its prompt group;
- plus `outcome_epsilon` x the share of the next visit's ground-truth diagnoses that the CANDIDATE
  memory mentions (normalised text match), so the term differs within a group (epsilon 0 reproduces
  the reference).

Transport failures are retried with backoff and then raise (JudgeUnavailable): a dead judge stops
training instead of becoming a constant reward. Identical judge requests (duplicate candidates are
common in a group) are sent once: an LRU of in-flight/finished calls, counted as `cache_hit`. Every
scored sample is appended to RUN/train/audit/calls_<pid>.jsonl (mode 0600): rollout text, judge
prompts, judge answers, reward, timings.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from llmrnn.errors import InputError
from llmrnn.judge import Endpoint, JudgeClient, wait_for_endpoint
from llmrnn.rubric import (
    FALLBACK_SCORE,
    JudgeRequest,
    Rubric,
    load_rubric,
    memory_text,
    pairwise_request,
    parse_scalar,
    parse_verdict,
    response_text,
    scalar_request,
)

log = logging.getLogger(__name__)

DATA_SOURCE = "llm_as_rnn_memory_update"
ENV_ENDPOINT = "LLMRNN_JUDGE_ENDPOINT"
ENV_RUBRIC = "LLMRNN_RUBRIC"
ENV_AUDIT = "LLMRNN_AUDIT_DIR"
ENV_CFG = "LLMRNN_REWARD_CFG"
MODES = ("scalar", "pairwise")
OPPONENTS = ("group", "reference")


@dataclass(frozen=True)
class RewardConfig:
    """Config section `reward` (documented in config/README.md; schema defaults match these)."""

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
        value = value.get("reward", value)  # accept {"reward": {...}} (cfg_json) or the section itself
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


# ----------------------------------------------------------------------------- policy output + outcome
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL | re.IGNORECASE)


def parse_memory(solution_str: str) -> str | None:
    """The evolving summary if the policy output is a JSON object {"evolving_summary": str}, else None.

    The whole output (optionally inside one ```json fence) must be that object: prose around it is
    invalid, as in the reference ("policy output is not valid JSON -> 0.05")."""
    if not isinstance(solution_str, str):
        return None
    text = solution_str.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, ValueError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("evolving_summary"), str):
        return None
    return obj["evolving_summary"]


def normalise(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9]+", " ", str(text).lower()).split())


OUTCOME_STOPWORDS = frozenset(["a", "an", "and", "of", "on", "the", "to", "in", "with", "for", "due", "from", "at", "by", "or"])


def outcome_share(memory: str, diagnoses: list[str] | None) -> float:
    """How much of the next visit's ground-truth diagnoses the memory anticipates: per diagnosis, the share
    of its words the memory mentions (normalised, whole words, stop words ignored), averaged. Partial
    credit keeps the signal graded, so candidates of one group rarely tie (GRPO needs differences)."""
    words_of = [[w for w in normalise(d).split() if w not in OUTCOME_STOPWORDS] for d in diagnoses or []]
    words_of = [w for w in words_of if w]
    if not words_of:
        return 0.0
    present = set(normalise(memory).split())
    return sum(sum(w in present for w in words) / len(words) for words in words_of) / len(words_of)


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
        line = json.dumps(record, ensure_ascii=False, default=str) + "\n"
        with self._lock:
            if self._fh is None or self._pid != os.getpid():
                self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                os.fchmod(fd, 0o600)
                self._fh = os.fdopen(fd, "a", encoding="utf-8")
                self._pid = os.getpid()
            self._fh.write(line)
            self._fh.flush()


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
    """Judge endpoint + rubric + thread pool + request cache + audit, shared by all entry points."""

    def __init__(self, endpoint_file: str | Path, rubric_file: str | Path | None = None,
                 audit_dir: str | Path | None = None, cfg: RewardConfig | None = None):
        self.cfg = cfg or RewardConfig()
        self.endpoint_file = Path(endpoint_file)
        self.endpoint: Endpoint = wait_for_endpoint(self.endpoint_file, self.cfg.health_timeout_s)
        self.rubric: Rubric = load_rubric(rubric_file or self.endpoint.rubric)
        if audit_dir is None:
            audit_dir = self.endpoint_file.resolve().parent.parent / "train" / "audit"
        self.audit = AuditLog(audit_dir)
        self.client = JudgeClient(
            self.endpoint, timeout_s=self.cfg.timeout_s, retries=self.cfg.retries,
            backoff_s=self.cfg.backoff_s, backoff_max_s=self.cfg.backoff_max_s,
            max_connections=self.cfg.max_concurrency,
        )
        self.pool = ThreadPoolExecutor(self.cfg.max_concurrency, thread_name_prefix="judge")
        self._cache: OrderedDict[str, Future] = OrderedDict()
        self._lock = threading.Lock()
        self.counts = {"judge_requests": 0, "http_calls": 0, "cache_hits": 0}

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.client.close()

    # -- one judge call, deduplicated
    def judge(self, req: JudgeRequest) -> JudgeCall:
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
                payload, latency, retries = self.client.post(req.path, req.body)
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
        return list(self.pool.map(self.judge, reqs))

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
            memory = parse_memory(s["solution_str"])
            prepared.append({"step": step, "memory": memory, "sample": s})
        plan: list[tuple[int, JudgeRequest, bool]] = []  # (sample index, request, candidate is A)
        if self.cfg.mode == "scalar":
            for i, p in enumerate(prepared):
                if p["memory"] is not None:
                    plan.append((i, scalar_request(self.rubric, p["step"], p["memory"]), True))
        else:
            plan = self._pairwise_plan(prepared, opponent)
        calls = self.judge_many([req for _, req, _ in plan])
        per_sample: dict[int, list[tuple[JudgeCall, bool]]] = {}
        for (i, _, cand_a), call in zip(plan, calls):
            per_sample.setdefault(i, []).append((call, cand_a))
        elapsed = time.perf_counter() - t0
        results = []
        for i, p in enumerate(prepared):
            results.append(self._finish(p, per_sample.get(i, []), elapsed))
        return results

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
        if memory is not None:
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
            "time": time.time(), "pid": os.getpid(), "rubric": self.rubric.name, "mode": self.cfg.mode,
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
    """The process-wide scorer for these settings (kwargs win over the LLMRNN_* environment)."""
    endpoint_file = endpoint_file or os.environ.get(ENV_ENDPOINT)
    if not endpoint_file:
        raise InputError(f"reward: no judge endpoint: pass endpoint_file= or set {ENV_ENDPOINT}")
    rubric_file = rubric_file or os.environ.get(ENV_RUBRIC) or None
    audit_dir = audit_dir or os.environ.get(ENV_AUDIT) or None
    cfg = RewardConfig.from_any(reward_cfg if reward_cfg is not None else os.environ.get(ENV_CFG))
    key = (str(endpoint_file), str(rubric_file), str(audit_dir), json.dumps(asdict(cfg), sort_keys=True), os.getpid())
    with _SCORERS_LOCK:
        scorer = _SCORERS.get(key)
        if scorer is None:
            scorer = Scorer(endpoint_file, rubric_file, audit_dir, cfg)
            _SCORERS[key] = scorer
    return scorer


def reward_env(endpoint_file: str, audit_dir: str, reward_cfg: dict | None = None,
               rubric_file: str | None = None) -> dict[str, str]:
    """Environment variables that point compute_score / trl_reward_func at the judge (for train)."""
    env = {ENV_ENDPOINT: str(endpoint_file), ENV_AUDIT: str(audit_dir)}
    if reward_cfg is not None:
        env[ENV_CFG] = json.dumps(reward_cfg, sort_keys=True)
    if rubric_file:
        env[ENV_RUBRIC] = str(rubric_file)
    return env


def _scorer_from(kwargs: dict) -> Scorer:
    return get_scorer(kwargs.pop("endpoint_file", None), kwargs.pop("rubric_file", None),
                      kwargs.pop("audit_dir", None), kwargs.pop("reward_cfg", None))


def _public(result: dict, numeric_only: bool) -> dict:
    out = {k: v for k, v in result.items() if k not in ("digit_probs", "pairwise")}
    if out.get("judge_score") is None:
        out["judge_score"] = out["score"]
    if numeric_only:  # some trainers average every extra key: keep numbers, encode the method as flags
        method = out.pop("parse_method")
        out.pop("raw_score", None)
        for m in ("expected", "score_line", "short_digit", "fallback", "invalid_json", "pairwise"):
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
    as keyword lists; groups are the rows' generations (pairwise_opponent: group compares within them)."""
    n = len(completions)
    reward_model = columns.get("reward_model") or [None] * n
    ground_truths = [rm.get("ground_truth") if isinstance(rm, dict) else rm for rm in reward_model]
    if any(gt is None for gt in ground_truths):
        raise InputError("trl_reward_func: column reward_model.ground_truth missing (verl parquet format)")
    extra = columns.get("extra_info") or [{} for _ in range(n)]
    sources = columns.get("data_source") or [DATA_SOURCE] * n
    kw = {k: columns[k] for k in ("endpoint_file", "rubric_file", "audit_dir", "reward_cfg") if k in columns}
    results = compute_score_batch(sources, [_completion_text(c) for c in completions], ground_truths, extra, **kw)
    return [float(r["score"]) for r in results]
