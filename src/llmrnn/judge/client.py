"""The judge's endpoint file and the client every consumer (reward, preflight) uses.

The launcher (llmrnn.judge.launcher) writes RUN/judge/endpoint.json {"url", "model", "api_key_file",
"rubric", "pid", "status", ...} at once with status "starting" and flips it to "ready" once its server
proved it is ours. Consumers call `wait_for_endpoint()` (the file may appear late or be stale: they
poll health, with a timeout and a clear error) and talk to the server through `JudgeClient` (the shared
retry policy of llmrnn.retry, then `JudgeUnavailable`; never a silent fallback).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmrnn import io
from llmrnn.errors import CheckFailed, InputError, LlmrnnError
from llmrnn.retry import RequestRejected, RetriesExhausted, RetryPolicy

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
                engine=data.get("engine", "llmrnn"), status=data.get("status", "ready"),
                error=data.get("error"),
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
    import httpx

    try:
        return httpx.get(f"{base_url}/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for_endpoint(endpoint_file: str | Path, timeout_s: float = 900.0, poll_s: float = 1.0) -> Endpoint:
    """Wait until the endpoint file says "ready" and names a live server whose /health answers; else a
    clear CheckFailed.

    The judge_server service starts together with its consumers, so the file may not exist yet or may
    still say "starting" (Snakemake wants a service's output within --latency-wait, so the launcher
    writes it at once and flips it to "ready" after the health + auth check); a file left by an earlier
    run names a dead pid or a port nobody answers on, and is waited past."""
    path = Path(endpoint_file)
    error_file = path.parent / ERROR_FILE
    start = time.time()
    deadline = start + timeout_s
    state = "endpoint file not written yet"
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
                if ep.status != "ready":
                    state = f"server still {ep.status} (pid {ep.pid})"
                    if not _pid_alive(ep.pid, ep.host):
                        state = f"{path} says {ep.status} but pid {ep.pid} is not running (stale file?)"
                elif not _pid_alive(ep.pid, ep.host):
                    state = f"{path} names pid {ep.pid}, which is not running (stale file?)"
                elif health_ok(ep.base_url):
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


# ----------------------------------------------------------------------------- client
class JudgeClient:
    """Thread-safe OpenAI-compatible client: one connection pool and the shared retry policy
    (llmrnn.retry: refused, timeouts, 5xx/429 and answers `check` calls empty are retried with backoff),
    then JudgeUnavailable. Any other 4xx -> JudgeRequestError at once."""

    def __init__(self, endpoint: Endpoint, timeout_s: float = 300.0, retries: int = 4,
                 backoff_s: float = 0.5, backoff_max_s: float = 8.0, max_connections: int = 64):
        import httpx

        self.endpoint = endpoint
        self.policy = RetryPolicy(retries=retries, backoff_s=backoff_s, backoff_max_s=backoff_max_s)
        key = endpoint.api_key()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(
            base_url=endpoint.url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    def close(self) -> None:
        self._client.close()

    def post(self, path: str, body: dict, check: Callable[[object], str | None] | None = None
             ) -> tuple[dict, float, int]:
        """POST and return (json payload, latency of the successful try in s, number of retries).
        `check(payload)` names why a 200 is no answer (rubric.response_problem); such answers are retried."""
        try:
            return self.policy.post_json(self._client, path, body, check=check)
        except RequestRejected as exc:
            raise JudgeRequestError(f"judge {self.endpoint.url}{path} rejected the request: {exc}") from None
        except RetriesExhausted as exc:
            raise JudgeUnavailable(
                f"judge {self.endpoint.url}{path} {exc}. Refusing to turn a dead judge into constant rewards."
            ) from None
