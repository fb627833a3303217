"""The fallback guard: training stops when the judge's answers keep falling back to 0.5."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from llmrnn.errors import InputError, LlmrnnError
from llmrnn.reward.config import settings


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
    def from_spec(cls, value: Any) -> FallbackGuard | None:
        """The guard a scorer's `guard=` argument asks for ({"max_fallback_rate", "window"}, a mapping or
        its JSON; guard_spec), None where none is given (preflight, evaluation: only training is guarded)."""
        spec = settings(value, "guard")
        if not spec:
            return None
        try:
            return cls(float(spec["max_fallback_rate"]), int(spec.get("window", 64)))
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"guard: expected {{\"max_fallback_rate\": x, \"window\": n}}: {exc!r}") from exc

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


def guard_spec(max_fallback_rate: float, window: int) -> dict:
    """The `guard=` argument that turns the fallback guard on in the scorer (train only)."""
    return {"max_fallback_rate": float(max_fallback_rate), "window": int(window)}
