"""One HTTP retry policy for every client of an OpenAI-compatible server (the judge client, the openai
backend): which failures are worth another try, how long to wait between tries, and when to give up.

Transient (retried with exponential backoff, tenacity): refused / reset connections, timeouts, HTTP 408,
409, 429 and 5xx, a body that is not JSON, and a 200 whose payload the caller's `check` calls unusable
(e.g. a judge answer with no choices or empty content). Any other 4xx is the request's fault: it is
raised at once as RequestRejected. After the last try, RetriesExhausted names the last error; callers
turn both into their own user-facing error, so a dead server stops the run instead of becoming empty
outputs or constant rewards.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

RETRY_STATUS = frozenset({408, 409, 429})


class Transient(Exception):
    """One failed try that another try may fix."""


class RetriesExhausted(Exception):
    def __init__(self, attempts: int, last: str):
        super().__init__(f"failed {attempts} times; last error: {last}")
        self.attempts = attempts
        self.last = last


class RequestRejected(Exception):
    def __init__(self, status: int, text: str):
        super().__init__(f"HTTP {status}: {text[:300]}")
        self.status = status


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 4  # tries after the first
    backoff_s: float = 0.5  # first wait; doubles per try
    backoff_max_s: float = 8.0
    budget_s: float | None = None  # the whole call, every try and wait together; None = tries x timeout

    def post_json(self, client, url: str, body: dict, *, headers: dict | None = None,
                  check: Callable[[object], str | None] | None = None,
                  sleep: Callable[[float], object] | None = None) -> tuple[dict, float, int]:
        """POST `body` as JSON through an httpx.Client; return (payload, latency of the good try in s,
        retries used). `check(payload)` returns a problem (retried like a transport failure) or None.
        No try starts after `budget_s`; `sleep` waits between tries (an Event's wait can cut it short)."""
        from tenacity import (
            Retrying,
            retry_if_exception_type,
            stop_after_attempt,
            stop_after_delay,
            wait_exponential,
        )

        stop = stop_after_attempt(self.retries + 1)
        if self.budget_s is not None:
            stop = stop | stop_after_delay(self.budget_s)
        retrying = Retrying(
            stop=stop,
            wait=wait_exponential(multiplier=self.backoff_s, max=self.backoff_max_s),
            retry=retry_if_exception_type(Transient),
            reraise=True,
            sleep=sleep or time.sleep,
        )
        tries = 0
        try:
            for attempt in retrying:
                with attempt:
                    tries = attempt.retry_state.attempt_number
                    payload, latency = _one_try(client, url, body, headers, check)
                    return payload, latency, attempt.retry_state.attempt_number - 1
        except Transient as exc:
            raise RetriesExhausted(tries, str(exc)) from None
        raise AssertionError("unreachable: tenacity either returns or re-raises")  # pragma: no cover


def _one_try(client, url: str, body: dict, headers: dict | None, check) -> tuple[dict, float]:
    import httpx

    t0 = time.perf_counter()
    try:
        resp = client.post(url, json=body, headers=headers)
    except httpx.TimeoutException as exc:
        raise Transient(f"timeout ({type(exc).__name__}{': ' if str(exc) else ''}{exc})") from None
    except httpx.TransportError as exc:  # refused, reset, protocol error
        raise Transient(f"{type(exc).__name__}: {exc}") from None
    latency = time.perf_counter() - t0
    if resp.status_code >= 500 or resp.status_code in RETRY_STATUS:
        raise Transient(f"HTTP {resp.status_code}: {resp.text[:200]}")
    if resp.status_code >= 400:
        raise RequestRejected(resp.status_code, resp.text)
    try:
        payload = resp.json()
    except ValueError:
        raise Transient(f"HTTP {resp.status_code} with a body that is not JSON: {resp.text[:200]}") from None
    problem = check(payload) if check is not None else None
    if problem:
        raise Transient(f"HTTP {resp.status_code} but {problem}")
    return payload, latency
