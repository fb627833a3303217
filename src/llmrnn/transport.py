"""HTTP to an OpenAI-compatible server: calls bounded in size and time, and a watchdog of its progress.

LiveCalls holds the sockets of every call in flight on one client (so one failure cuts them all) and notices
a server that stopped answering; BoundedHTTP sends one request under a whole-call deadline and a size cap on
the answer. Used by the judge client (llmrnn.judge.client) and the OpenAI-compatible role backend
(llmrnn.backends).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import zlib
from typing import Any

# What a judge answer may be. A judge writes a few hundred tokens with at most 20 alternatives each: 8 MiB
# is far above that and far below what would hurt the trainer's memory.
MAX_RESPONSE_BYTES = 8 * 1024 * 1024
def _timeout_error(seconds: float):
    import httpx

    return httpx.ReadTimeout(f"no complete answer within the whole-call deadline of {seconds:g} s")


def _too_large(what: str):
    import httpx

    return httpx.RemoteProtocolError(f"the judge's answer is larger than {MAX_RESPONSE_BYTES} bytes {what}")


class JudgeAborted(Exception):
    """The client was aborted (another call of the batch failed): this try ends now and is not retried."""


STALL_FACTOR = 4.0  # a judge that answered is stalled after max(stall_s, this x its slowest answer) without one


class LiveCalls:
    """The sockets of every call in flight on one client, so `abort()` can cut them all at once; and, with
    `stall_s`, a watchdog of the server's progress. It counts the time during which tries wait on the
    server (idle time and the waits between tries do not count) since its last complete answer (any HTTP
    status): past window = max(stall_s, STALL_FACTOR x the slowest answer so far; before the first answer
    max(stall_s, first_s)) the server has stalled, `reason` says so in one line and every call is aborted at
    once. A slow server that keeps answering never trips it."""

    def __init__(self, stall_s: float | None = None, first_s: float = 0.0, what: str = "the judge",
                 setting: str = "reward.stall_s"):
        self.aborted = threading.Event()
        self.lock = threading.Lock()
        self.sockets: set[socket.socket] = set()
        self.reason: str | None = None
        self.stall_s, self.first_s, self.what, self.setting = stall_s, first_s, what, setting
        self._cond = threading.Condition(threading.Lock())
        self._waiting = 0  # tries in flight
        self._busy_since: float | None = None  # since when tries are in flight (None: none is)
        self._waited = 0.0  # seconds tries waited, before _busy_since, since the last answer
        self._answers = 0
        self._slowest = 0.0
        self._watcher: threading.Thread | None = None
        self._closed = False

    def add(self, sock: socket.socket) -> None:
        with self.lock:
            self.sockets.add(sock)
        if self.aborted.is_set():
            self.cut(sock)

    def discard(self, sock: socket.socket) -> None:
        with self.lock:
            self.sockets.discard(sock)

    @staticmethod
    def cut(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)  # wakes a recv() blocked on a silent server

    def abort(self) -> None:
        self.aborted.set()
        with self.lock:
            live = list(self.sockets)
        for sock in live:
            self.cut(sock)
        self.close()

    # -- the progress watchdog
    def begin(self) -> None:
        """A try starts waiting on the server."""
        if not self.stall_s:
            return
        with self._cond:
            if self._waiting == 0:
                self._busy_since = time.monotonic()
            self._waiting += 1
            if self._watcher is None and not self._closed:
                self._watcher = threading.Thread(target=self._watch, name="judge-watchdog", daemon=True)
                self._watcher.start()
            self._cond.notify_all()

    def end(self) -> None:
        if not self.stall_s:
            return
        with self._cond:
            self._waiting -= 1
            if self._waiting == 0 and self._busy_since is not None:
                self._waited += time.monotonic() - self._busy_since
                self._busy_since = None
            self._cond.notify_all()

    def answered(self, latency_s: float) -> None:
        """One try got a complete answer: the server is making progress."""
        if not self.stall_s:
            return
        with self._cond:
            self._answers += 1
            self._slowest = max(self._slowest, latency_s)
            self._waited = 0.0
            if self._busy_since is not None:
                self._busy_since = time.monotonic()
            self._cond.notify_all()

    def carry(self, earlier: LiveCalls | None) -> LiveCalls:
        """Take over what an earlier watchdog of the same server learnt (its answers, the slowest one)."""
        if earlier is not None:
            self._answers, self._slowest = earlier._answers, earlier._slowest
        return self

    def window(self) -> float:
        if self._answers:
            return max(self.stall_s, STALL_FACTOR * self._slowest)
        return max(self.stall_s, self.first_s)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                if self._busy_since is None:
                    self._cond.wait()
                    continue
                window = self.window()
                left = window - self._waited - (time.monotonic() - self._busy_since)
                if left > 0:
                    self._cond.wait(left)
                    continue
                before = (f"after {self._answers} answer(s), the slowest {self._slowest:.1f} s" if self._answers
                          else "before any answer")
                self.reason = (f"{self.what} has stalled: calls waited on it {window:g} s without any answer "
                               f"({before}; {self.setting} {self.stall_s:g})")
                break
            else:
                return
        self.abort()  # the calls raise; their caller reports `reason` once


class BoundedHTTP:
    """What RetryPolicy posts through: a whole-call deadline (not per read: a server trickling a byte at a
    time or sending an endless chunked body is cut off when the deadline passes, by shutting its socket)
    and a cap on the answer's size, decompressed (a gzip bomb stops at the cap). Failures are httpx
    transport errors, so the policy retries them and then raises. `until` (monotonic) ends every try of
    the call (reward.call_budget_s); `live` lets the client abort every call in flight at once."""

    def __init__(self, client, deadline_s: float, max_bytes: int = MAX_RESPONSE_BYTES,
                 until: float | None = None, live: LiveCalls | None = None):
        self.client = client
        self.deadline_s = deadline_s
        self.max_bytes = max_bytes
        self.until = until
        self.live = live

    def post(self, url: str, json: Any = None, headers: dict | None = None):
        import httpx

        if self.live is not None and self.live.aborted.is_set():
            raise JudgeAborted("aborted")
        deadline = time.monotonic() + self.deadline_s
        if self.until is not None:
            deadline = min(deadline, self.until)
        seconds = deadline - time.monotonic()
        if seconds <= 0:  # the call's budget is spent: no try starts
            raise _timeout_error(self.deadline_s)
        sockets: list[socket.socket] = []
        expired = threading.Event()

        def trace(name: str, info: dict) -> None:  # each request has its own connection (no keep-alive)
            if name in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
                stream = info.get("return_value")
                sock = stream.get_extra_info("socket") if stream is not None else None
                if sock is not None:
                    sockets.append(sock)
                    if self.live is not None:
                        self.live.add(sock)
                    if expired.is_set():  # the deadline passed while it connected
                        LiveCalls.cut(sock)

        def cut() -> None:
            expired.set()
            for sock in sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # wakes a recv() blocked on a silent server

        timer = threading.Timer(seconds, cut)
        timer.daemon = True
        timer.start()
        if self.live is not None:
            self.live.begin()
        try:
            t0 = time.monotonic()
            with self.client.stream("POST", url, json=json, headers=headers, extensions={"trace": trace},
                                    timeout=httpx.Timeout(seconds, connect=min(10.0, seconds))) as resp:
                data = self._read(resp, deadline)
                if self.live is not None:
                    self.live.answered(time.monotonic() - t0)
                status, kept = resp.status_code, [(k, v) for k, v in resp.headers.items()
                                                  if k.lower() not in ("content-encoding", "content-length",
                                                                       "transfer-encoding")]
                request = resp.request
        except httpx.HTTPError:
            if self.live is not None and self.live.aborted.is_set():
                raise JudgeAborted("aborted") from None
            if expired.is_set() or time.monotonic() >= deadline:
                raise _timeout_error(round(seconds, 3)) from None
            raise
        finally:
            timer.cancel()
            if self.live is not None:
                self.live.end()
                for sock in sockets:
                    self.live.discard(sock)
        return httpx.Response(status, headers=kept, content=data, request=request)

    def _read(self, resp, deadline: float) -> bytes:
        import httpx

        encoding = resp.headers.get("content-encoding", "identity").strip().lower()
        wbits = {"identity": None, "": None, "gzip": 31, "x-gzip": 31, "deflate": 47}
        if encoding not in wbits:
            raise httpx.RemoteProtocolError(f"the judge's answer uses content-encoding {encoding[:40]!r}, "
                                            "which was not asked for")
        declared = resp.headers.get("content-length", "")
        if declared.isdigit() and wbits[encoding] is None and int(declared) > self.max_bytes:
            raise _too_large(f"(content-length {declared})")
        inflate = zlib.decompressobj(wbits[encoding]) if wbits[encoding] else None
        body = bytearray()
        for chunk in resp.iter_raw():
            if time.monotonic() >= deadline:
                raise _timeout_error(self.deadline_s)
            while chunk:
                if inflate is None:
                    body += chunk
                    chunk = b""
                else:
                    try:  # at most one byte past the cap per call, whatever the compression ratio
                        body += inflate.decompress(chunk, self.max_bytes - len(body) + 1)
                    except zlib.error as exc:
                        raise httpx.DecodingError(f"the judge's {encoding} answer does not decompress: {exc}") \
                            from None
                    chunk = inflate.unconsumed_tail
                if len(body) > self.max_bytes:
                    raise _too_large("(decompressed)" if inflate is not None else "")
        return bytes(body)


