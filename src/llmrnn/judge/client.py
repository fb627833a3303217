"""The judge's endpoint file and the client every consumer (reward, preflight) uses.

The launcher (llmrnn.judge.launcher) writes RUN/judge/endpoint.json {"url", "model", "api_key_file",
"rubric", "pid", "status", ...} at once with status "starting" and flips it to "ready" once its server
proved it is ours. Consumers call `wait_for_endpoint()` (the file may appear late or be stale: they
poll health, with a timeout and a clear error; they also prove again, as the launcher did, that the server
refuses requests without the key) and talk to the server through `JudgeClient` (the shared retry policy of
llmrnn.retry, then `JudgeUnavailable`; never a silent fallback).

The client trusts no answer: each call has a whole-call deadline and a size cap (decompressed), and an
answer naming another model, or logprobs that are not log-probabilities of the text it returned, is a
failed try like a dropped connection (retried, then JudgeUnavailable), never a score.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmrnn import io
from llmrnn.errors import CheckFailed, InputError, LlmrnnError
from llmrnn.retry import RequestRejected, RetriesExhausted, RetryPolicy
from llmrnn.rubric import Serving
from llmrnn.transport import BoundedHTTP, JudgeAborted, LiveCalls

log = logging.getLogger(__name__)
logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise

ERROR_FILE = "server_error.txt"
KEY_FILE = "api_key"


class JudgeUnavailable(LlmrnnError):
    """The judge did not answer after the retry budget (refused, timeout, 5xx, empty answers): training
    must stop."""

    exit_code = 4


class JudgeRequestError(LlmrnnError):
    """The judge rejected a request (4xx): a bug or a misconfigured rubric, not a transient failure."""


class UntrustedEndpoint(JudgeUnavailable, CheckFailed):
    """The endpoint file names a server that does not prove it is ours (it takes requests without our
    key): it never gets the key nor a prompt."""


# ----------------------------------------------------------------------------- endpoint file
@dataclass(frozen=True)
class Endpoint:
    url: str  # http://127.0.0.1:PORT/v1
    model: str
    api_key_file: str | None
    rubric: str
    pid: int | None = None
    host: str | None = None
    engine: str = "llmrnn"
    status: str = "ready"  # starting | ready | failed (a file without status is taken as ready)
    error: str | None = None
    launcher_pid: int | None = None

    @property
    def base_url(self) -> str:
        return self.url.removesuffix("/v1")

    def api_key(self) -> str | None:
        if not self.api_key_file:
            return None
        try:
            return Path(self.api_key_file).read_text().strip()
        except OSError as exc:
            raise CheckFailed(f"judge API key file {self.api_key_file}: {exc.strerror}") from exc

    @classmethod
    def read(cls, path: str | Path) -> Endpoint:
        try:
            data = io.read_json(path)
        except (OSError, json.JSONDecodeError) as exc:
            raise InputError(f"{path}: not a readable judge endpoint file: {exc}") from exc
        try:
            return cls(
                url=data["url"], model=data["model"], api_key_file=data.get("api_key_file"),
                rubric=data["rubric"], pid=data.get("pid"), host=data.get("host"),
                engine=data.get("engine", Serving.engine), status=data.get("status", "ready"),
                error=data.get("error"), launcher_pid=data.get("launcher_pid"),
            )
        except KeyError as exc:
            raise InputError(f"{path}: judge endpoint file lacks {exc.args[0]!r}") from exc


def _pid_alive(pid: int | None, host: str | None) -> bool:
    if not pid or (host and host != socket.gethostname()):
        return True  # cannot tell from here; health decides
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def health_ok(base_url: str, timeout_s: float = 5.0) -> bool:
    return health_state(base_url, timeout_s) == "ok"


def health_state(base_url: str, timeout_s: float = 5.0) -> str:
    """"ok" (/health answers 200), "refused" (nothing listens on the port: the connection is refused)
    or "no answer" (anything else: it listens but is not healthy yet, or is slow)."""
    import httpx

    try:
        return "ok" if httpx.get(f"{base_url}/health", timeout=timeout_s).status_code == 200 else "no answer"
    except httpx.ConnectError as exc:
        return "refused" if isinstance(exc.__cause__ or exc.__context__, ConnectionRefusedError) \
            or "refused" in str(exc).lower() else "no answer"
    except httpx.HTTPError:
        return "no answer"


DEAD_AFTER_S = 30.0  # reward.dead_after_s: a judge that is gone fails the wait after this long


def _gone(ep: Endpoint, path: Path) -> str | None:
    """Why the judge the endpoint file names is certainly not coming (None while it may still come): the
    processes it names on this host are not running, or (ready) its port refuses connections."""
    local = not ep.host or ep.host == socket.gethostname()
    named = [p for p in (ep.pid, ep.launcher_pid) if p]
    if local and named and not any(_pid_alive(p, ep.host) for p in named):
        pids = " and ".join(f"pid {p}" for p in named)
        return f"{path} says {ep.status}, but {pids} on {socket.gethostname()} is not running"
    if ep.status == "ready" and health_state(ep.base_url) == "refused":
        return f"{path} says ready, but {ep.base_url} refuses connections (the judge server is gone)"
    return None


def wait_for_endpoint(endpoint_file: str | Path, timeout_s: float = 900.0, poll_s: float = 1.0,
                      dead_after_s: float = DEAD_AFTER_S) -> Endpoint:
    """Wait until the endpoint file says "ready" and names a live server whose /health answers; else a
    clear CheckFailed: after timeout_s, or after dead_after_s when the judge is certainly gone (every
    process the file names on this host is dead, or a ready server's port refuses connections, and the
    file did not change meanwhile: a stale file being replaced by a starting launcher changes).

    The judge_server service starts together with its consumers, so the file may not exist yet or may
    still say "starting" (Snakemake wants a service's output within --latency-wait, so the launcher
    writes it at once and flips it to "ready" after the health + auth check); a file left by an earlier
    run names a dead pid or a port nobody answers on, and is waited past."""
    path = Path(endpoint_file)
    error_file = path.parent / ERROR_FILE
    start = time.time()
    deadline = start + timeout_s
    state = "endpoint file not written yet"
    gone_since: tuple[tuple, float] | None = None  # (the file's stat when it was seen gone, since when)
    while True:
        if error_file.exists() and error_file.stat().st_mtime >= start - 2:
            raise CheckFailed(f"judge server failed to start: {error_file.read_text().strip()}")
        if path.exists():
            try:
                ep = Endpoint.read(path)
            except InputError as exc:
                state = str(exc)  # being replaced right now, or broken: retry until the deadline
            else:
                if ep.status == "failed":
                    raise CheckFailed(f"judge server failed to start: {ep.error}")
                gone = _gone(ep, path)
                if gone is None:
                    gone_since = None
                else:
                    with contextlib.suppress(OSError):
                        st = path.stat()
                        seen = (st.st_mtime_ns, st.st_size, st.st_ino)
                        if gone_since is None or gone_since[0] != seen:
                            gone_since = (seen, time.time())
                        elif time.time() - gone_since[1] >= dead_after_s:
                            raise CheckFailed(f"judge is gone: {gone} for {dead_after_s:g} s (reward.dead_after_s); "
                                              "see the judge_server log (logs/RUN/judge_server.log)")
                if ep.status != "ready":
                    state = f"server still {ep.status} (pid {ep.pid})"
                    if not _pid_alive(ep.pid, ep.host):
                        state = f"{path} says {ep.status} but pid {ep.pid} is not running (stale file?)"
                elif not _pid_alive(ep.pid, ep.host):
                    state = f"{path} names pid {ep.pid}, which is not running (stale file?)"
                elif verified(ep, path):
                    log.info("judge at %s is healthy (waited %.1f s)", ep.url, time.time() - start)
                    return ep
                else:
                    state = f"{ep.base_url}/health does not answer"
        if time.time() >= deadline:
            raise CheckFailed(
                f"judge endpoint {path} not healthy after {timeout_s:.0f} s ({state}); "
                "see the judge_server log (logs/RUN/judge_server.log)"
            )
        time.sleep(poll_s)


class NotOurServer(CheckFailed):
    """The port answers, but not as the server we started (it ignores the key or serves another model)."""


def readiness(base_url: str, key: str, served_name: str, timeout_s: float = 5.0) -> bool:
    """True once the server at base_url is the one we started; False while it is not up yet.

    Raises NotOurServer when something else answers there. Requests without the key and with a made-up
    key go first, so a server that ignores auth never receives the real key."""
    import httpx

    if not health_ok(base_url, timeout_s):
        return False
    try:
        anonymous = httpx.get(f"{base_url}/v1/models", timeout=timeout_s)
    except httpx.HTTPError:
        return False
    if anonymous.status_code == 200:
        raise NotOurServer(f"{base_url} answers /v1/models without the API key: the port is held by a server "
                           "we did not start; refusing to send it the key or any prompt")
    if anonymous.status_code not in (401, 403):
        return False
    try:  # a server that takes ANY key is not checking ours: a decoy key must be refused too
        decoy = httpx.get(f"{base_url}/v1/models", timeout=timeout_s,
                          headers={"Authorization": f"Bearer {secrets.token_urlsafe(32)}"})
    except httpx.HTTPError:
        return False
    if decoy.status_code not in (401, 403):
        raise NotOurServer(f"{base_url} accepts a made-up API key: the port is held by a server we did not start; "
                           "refusing to send it the key or any prompt")
    try:
        resp = httpx.get(f"{base_url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=timeout_s)
        served = [m.get("id") for m in resp.json().get("data", [])] if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return False
    if served is None:
        return False
    if served_name not in served:
        raise NotOurServer(f"{base_url}/v1/models lists {served} with our key, not {served_name!r}: "
                           "the port is held by a server we did not start")
    return True


def verified(ep: Endpoint, path: str | Path) -> bool:
    """True when the server the endpoint file names is up and proves it is the one the launcher started
    (the launcher's own check, again: the file may be stale, copied or written by someone else): it
    refuses requests without our key and with a made-up key, and lists the model with ours. False while
    it does not answer yet; UntrustedEndpoint when something else answers."""
    key = ep.api_key()
    if not key:
        raise UntrustedEndpoint(f"{path} names no API key file: the judge we start always has a per-run key; "
                                "refusing to send prompts to a server that takes requests from anyone")
    try:
        return readiness(ep.base_url, key, ep.model)
    except NotOurServer as exc:
        raise UntrustedEndpoint(f"{path}: {exc}") from None


# ----------------------------------------------------------------------------- client
MAX_TOP_LOGPROBS = 20  # the OpenAI API's limit (our server's too); servers may add the chosen token
LOGPROB_TOL = 1e-3
DIGITS = re.compile(r"\d")


def _finite_logprob(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and value <= LOGPROB_TOL)


def _pairs(items: Any) -> list[tuple[Any, Any]]:
    """[(token, logprob)] of a top_logprobs value: chat's list of {token, logprob}, completions' dict."""
    if isinstance(items, dict):
        return list(items.items())
    if not isinstance(items, list):
        return [(None, None)]  # malformed: _position_problem names it
    return [(t.get("token"), t.get("logprob")) if isinstance(t, dict) else (None, None) for t in items]


def _positions(choice: dict) -> list[tuple[Any, Any, list[tuple[Any, Any]]]] | None:
    """(chosen token, its logprob, [(alternative, logprob)]) per generated token; None without logprobs."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return None
    if isinstance(lp.get("content"), list):  # chat
        return [(e.get("token"), e.get("logprob"), _pairs(e.get("top_logprobs") or []))
                if isinstance(e, dict) else (None, None, []) for e in lp["content"]]
    tokens, values, tops = lp.get("tokens") or [], lp.get("token_logprobs") or [], lp.get("top_logprobs") or []
    if not all(isinstance(x, list) for x in (tokens, values, tops)):
        return [(None, None, [])]
    return [(tok, values[i] if i < len(values) else None, _pairs(tops[i] or {}) if i < len(tops) else [])
            for i, tok in enumerate(tokens)]


def _position_problem(i: int, chosen: Any, value: Any, alts: list, greedy: bool, top_cap: int) -> str | None:
    where = f"logprobs position {i}"
    if not isinstance(chosen, str):
        return f"{where}: no token"
    if value is not None and not _finite_logprob(value):
        return f"{where}: logprob {str(value)[:30]} is not a log-probability (finite and <= 0)"
    if len(alts) > top_cap:
        return f"{where}: {len(alts)} top_logprobs, more than the {top_cap - 1} asked for"
    if any(not isinstance(t, str) or not _finite_logprob(v) for t, v in alts):
        return f"{where}: a top_logprobs entry is not a token with a log-probability (finite and <= 0)"
    given = dict(alts)
    if value is not None and chosen in given and abs(given[chosen] - value) > LOGPROB_TOL * (1 + abs(value)):
        return f"{where}: the chosen token's logprob {value:.4g} differs from its top_logprobs entry {given[chosen]:.4g}"
    mass = sum(math.exp(v) for _, v in alts) + (math.exp(value) if value is not None and chosen not in given else 0)
    if mass > 1 + 1e-2:
        return f"{where}: the probabilities add up to {mass:.3f} > 1"
    if greedy and value is not None and alts and max(v for _, v in alts) > value + 1e-2 * (1 + abs(value)):
        return (f"{where}: the chosen token is not the most likely one although the request was greedy "
                "(temperature 0): the text and its logprobs disagree")
    return None


def answer_problem(payload: Any, body: dict) -> str | None:
    """Why a judge answer that is well formed (rubric.response_problem) cannot be trusted; None when it can.
    The server must answer as the model asked for, and its logprobs must be log-probabilities of the text
    it returned: a reward computed from anything else would be a silent, wrong score."""
    if not isinstance(payload, dict):
        return None  # the caller's check names it
    want = body.get("model")
    if want is not None and payload.get("model") != want:
        return f"the answer names model {str(payload.get('model'))[:80]!r}, not the requested {str(want)[:80]!r}"
    choices = payload.get("choices")
    if not isinstance(choices, list):
        return None
    if len(choices) > max(int(body.get("n") or 1), 1):
        return f"{len(choices)} choices, more than the {body.get('n') or 1} asked for"
    asked = body.get("top_logprobs") if "messages" in body else body.get("logprobs")
    asked = asked if isinstance(asked, int) and not isinstance(asked, bool) else MAX_TOP_LOGPROBS
    top_cap = min(asked, MAX_TOP_LOGPROBS) + 1
    greedy = body.get("temperature") == 0
    max_tokens = body.get("max_tokens")
    for k, choice in enumerate(choices):
        if not isinstance(choice, dict):
            continue
        positions = _positions(choice)
        if positions is None:
            continue
        if isinstance(max_tokens, int) and len(positions) > max_tokens:
            return f"choices[{k}]: logprobs for {len(positions)} tokens, more than max_tokens {max_tokens}"
        for i, (chosen, value, alts) in enumerate(positions):
            if problem := _position_problem(i, chosen, value, alts, greedy, top_cap):
                return f"choices[{k}]: {problem}"
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else choice.get("text")
        if isinstance(text, str):
            said = "".join(DIGITS.findall(text))
            scored = "".join(DIGITS.findall("".join(c for c, _, _ in positions if isinstance(c, str))))
            if not scored.startswith(said):
                return (f"choices[{k}]: the text's digits {said[:20]!r} are not the digits of its logprobs tokens "
                        f"{scored[:20]!r}: text and logprobs disagree")
    return None


class JudgeClient:
    """Thread-safe OpenAI-compatible client: one connection pool and the shared retry policy
    (llmrnn.retry: refused, timeouts, 5xx/429 and answers `check` calls empty are retried with backoff),
    then JudgeUnavailable. Any other 4xx -> JudgeRequestError at once."""

    def __init__(self, endpoint: Endpoint, timeout_s: float = 300.0, retries: int = 4,
                 backoff_s: float = 0.5, backoff_max_s: float = 8.0, max_connections: int = 64,
                 budget_s: float | None = None, stall_s: float | None = None):
        import httpx

        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.budget_s = budget_s
        self.policy = RetryPolicy(retries=retries, backoff_s=backoff_s, backoff_max_s=backoff_max_s,
                                  budget_s=budget_s)
        # a judge that stops answering fails every call after reward.stall_s, not after call_budget_s each
        self._live = LiveCalls(stall_s, first_s=timeout_s, what=f"judge {endpoint.url}")
        key = endpoint.api_key()
        # identity: a compressed answer is inflated by us, within the size cap (BoundedHTTP)
        headers = {"Accept-Encoding": "identity", **({"Authorization": f"Bearer {key}"} if key else {})}
        self._client = httpx.Client(
            base_url=endpoint.url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)),
            # no keep-alive: each call owns its connection, so its deadline can cut exactly that socket
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=0),
        )

    def close(self) -> None:
        self._live.close()
        self._client.close()

    def abort(self) -> None:
        """End every call in flight now (their sockets are shut, waits between tries cut short) and refuse
        new ones: a batch whose one call failed stops at once instead of waiting on the others' deadlines."""
        self._live.abort()

    def limits(self) -> str:
        """The settings that bound one call, for the error a user reads."""
        tries = self.policy.retries + 1
        budget = f", at most {self.budget_s:g} s in all (reward.call_budget_s)" if self.budget_s else ""
        return (f"{tries} tries (reward.retries {self.policy.retries} + 1) of at most {self.timeout_s:g} s each "
                f"(reward.timeout_s){budget}")

    def post(self, path: str, body: dict, check: Callable[[object], str | None] | None = None
             ) -> tuple[dict, float, int]:
        """POST and return (json payload, latency of the successful try in s, number of retries).
        `check(payload)` names why a 200 is no answer (rubric.response_problem); such answers, and answers
        `answer_problem` cannot trust (another model, logprobs that are not the text's), are retried."""
        def trusted(payload: object) -> str | None:
            return (check(payload) if check is not None else None) or answer_problem(payload, body)

        until = time.monotonic() + self.budget_s if self.budget_s else None
        http = BoundedHTTP(self._client, self.timeout_s, until=until, live=self._live)
        try:
            return self.policy.post_json(http, path, body, check=trusted, sleep=self._live.aborted.wait)
        except RequestRejected as exc:
            raise JudgeRequestError(f"judge {self.endpoint.url}{path} rejected the request: {exc}") from None
        except JudgeAborted:
            if self._live.reason:  # the watchdog: the judge stopped answering
                raise JudgeUnavailable(f"{self._live.reason}. Refusing to wait reward.call_budget_s on a judge "
                                       "that has stopped answering.") from None
            raise JudgeUnavailable(f"judge {self.endpoint.url}{path}: call abandoned, another call of the batch "
                                   "failed") from None
        except RetriesExhausted as exc:
            raise JudgeUnavailable(
                f"judge {self.endpoint.url}{path} {exc} ({self.limits()}). Refusing to turn a dead judge into "
                "constant rewards."
            ) from None
