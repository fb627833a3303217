"""The child process your own reward (reward.custom) runs in: `python -m llmrnn.custom_reward_child REQ RESP PARENT
MAX_MB` (llmrnn.reward.custom starts it). It imports nothing of llmrnn but this file (outside the llmrnn.reward
package, whose import pulls in the judge client), so it starts fast and the user's code cannot reach the caller's
state.

Protocol: frames on two pipes of their own (REQ and RESP, file descriptors the parent passes; never the
standard streams, which the user's code may read, print to or replace), each frame MAGIC + request id + length
+ CRC-32 of its body (`frame`/`read_frame`). The parent sends ("load", path, name, max_abs), then ("call",
kwargs) per sample, pickled; the child answers each with the request's id and a body that needs no serialiser:
b"o" + a float64, or b"e" + one line (+ NUL + the traceback, for `-v`), or b"x" as b"e" for an error after
which the child ends. Everything the child's protocol uses
(the unpickler, CRC, os.read/os.write) is bound here, before the user's file is imported: a reward that replaces
`pickle.dumps`, `os.write` or `zlib.crc32` in its process changes nothing here. A reward that closes or replaces
the protocol's file descriptors makes the child exit with CHANNEL_LOST, which the parent names in one line.

Bounds (the parent's side is llmrnn.reward.custom.RewardProcess): the child leads a session of its own, so a
signal to the job's process group (SLURM's SIGTERM) does not reach it and the trainer can save; it also shields
itself from SIGTERM/SIGINT sent to it alone (its parent ends it with SIGKILL); a watchdog thread kills its whole
process group when its parent is gone; its address space is capped (RLIMIT_AS, AS_FACTOR x MAX_MB) and after
every call its resident memory is checked against MAX_MB (over it: one line, and the child ends).
"""

from __future__ import annotations

import _pickle
import importlib.util
import inspect
import math
import numbers
import os
import resource
import signal
import struct
import sys
import threading
import time
import traceback
import zlib

from llmrnn.safe_path import safe_path_env

PARAMETERS = ("data_source", "solution_str", "ground_truth", "extra_info")
SIGNATURE = "(data_source, solution_str, ground_truth, extra_info, **kwargs)"
MAGIC = b"LRC1"
HEADER = struct.Struct("<4sQQI")  # magic, request id, body length, CRC-32 of the body
SCORE = struct.Struct("<d")
CHANNEL_LOST = 86  # exit code: the reward's code closed or replaced the protocol's file descriptors
AS_FACTOR = 4  # the address-space cap over the resident-memory limit: mappings (threads' stacks, libraries) exceed RSS

# bound before the user's file is imported, so nothing it patches reaches the protocol
_loads, _crc32, _read, _write, _fstat, _getppid, _killpg = (_pickle.loads, zlib.crc32, os.read, os.write, os.fstat,
                                                             os.getppid, os.killpg)


def frame(request_id: int, body: bytes) -> bytes:
    return HEADER.pack(MAGIC, request_id, len(body), _crc32(body)) + body


def check_header(head: bytes) -> tuple[int, int, int]:
    """(request id, body length, crc) of a frame header; ValueError when it is not one of ours."""
    magic, request_id, length, crc = HEADER.unpack(head)
    if magic != MAGIC:
        raise ValueError("not a frame of the reward protocol (bad magic)")
    return request_id, length, crc


def signature_problem(fn) -> str | None:
    """Why `fn` cannot be called as verl calls a reward, or None."""
    if not callable(fn):
        return "is not callable"
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return "has no inspectable signature"
    by_keyword = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    missing = [n for n in PARAMETERS if n not in by_keyword]
    if missing or not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return f"has signature {inspect.signature(fn)}; verl calls {SIGNATURE}" + (
            f" (missing {', '.join(missing)})" if missing else " (no **kwargs)")
    return None


def as_score(result, max_abs: float) -> float:
    """The reward a call returned (a number, a numpy number or 0-d array, or {"score": that}) as a float
    within [-max_abs, max_abs]; ValueError (one line, naming what was returned) otherwise. The one conversion of
    a user's result."""
    if isinstance(result, dict) and "score" not in result:
        raise ValueError(f"returned {_short(result)}, a dict without a 'score' key; expected a finite number or "
                         "a dict with a finite 'score'")
    value = result.get("score") if isinstance(result, dict) else result
    what = f"{_short(result)} (its 'score' is {_short(value)})" if isinstance(result, dict) else _short(value)
    if getattr(value, "shape", None) == () and hasattr(value, "item"):  # numpy scalar or 0-d array
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"returned {what}; expected a finite number or a dict with a finite 'score'")  # noqa: TRY004 - one error type for a bad result
    try:
        score = float(value)
    except (OverflowError, ValueError) as exc:
        raise ValueError(f"returned {what}; expected a finite number ({exc})") from exc
    if not math.isfinite(score):
        raise ValueError(f"returned {score!r}; expected a finite number or a dict with a finite 'score'")
    if abs(score) > max_abs:
        raise ValueError(f"returned {score:.6g}, outside [-{max_abs:g}, {max_abs:g}] (reward.custom.max_abs): "
                         "training's float32 arithmetic would overflow")
    return score


def _short(value) -> str:
    try:
        text = repr(value)
    except BaseException as exc:  # noqa: BLE001 - a user's __repr__
        text = f"<{type(value).__name__} whose repr raised {type(exc).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def _line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r}) (sys.exit)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _where(exc: BaseException) -> str:
    """' (file:line)' of the innermost frame the exception passed (the traceback's last line), or ''."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _traceback(exc: BaseException) -> str:
    """The user's traceback, without this module's frame that called into it."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None))


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(f"llmrnn_custom_reward_{os.path.basename(path)[:-3]}", path)
    if spec is None or spec.loader is None:
        raise _Refused("not a Python file")
    module = importlib.util.module_from_spec(spec)
    # the file's own folder, last on the path: helper modules beside your reward import (the working directory
    # is off the path, llmrnn.safe_path), and nothing there can shadow an installed package
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.append(folder)
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - the user's code: whatever it raises is one line
        raise _Refused(f"importing it failed: {_line(exc)}{_where(exc)}", _traceback(exc)) from None
    if not hasattr(module, name):
        raise _Refused(f"defines no {name!r}")
    fn = getattr(module, name)
    problem = signature_problem(fn)
    if problem:
        raise _Refused(f"{name} {problem}")
    return fn


class _Refused(Exception):
    def __init__(self, line: str, trace: str = ""):
        super().__init__(line)
        self.trace = trace


def _error(line: str, trace: str = "") -> bytes:
    return b"e" + (line + ("\0" + trace if trace else "")).encode("utf-8", "replace")


def rss_mb(pid: int | str = "self") -> float:
    """The resident memory of a process in MB (0 where /proc cannot tell)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


class _Channel:
    """The two protocol pipes, with what they were when the child started (a closed or replaced one is CHANNEL_LOST)."""

    def __init__(self, req: int, resp: int):
        self.req, self.resp = req, resp
        self.ids = {fd: self._id(fd) for fd in (req, resp)}

    @staticmethod
    def _id(fd: int) -> tuple[int, int] | None:
        try:
            st = _fstat(fd)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def intact(self) -> bool:
        return all(self._id(fd) == ident for fd, ident in self.ids.items())

    def read(self, n: int) -> bytes | None:
        out = bytearray()  # not bytes +=: a 50 MB row arrives in 64 KiB pipe reads
        while len(out) < n:
            try:
                chunk = _read(self.req, min(n - len(out), 1 << 20))
            except OSError:
                os._exit(CHANNEL_LOST)
            if not chunk:
                return None
            out += chunk
        return bytes(out)

    def send(self, data: bytes) -> None:
        if not self.intact():
            os._exit(CHANNEL_LOST)
        view = memoryview(data)
        while view:
            try:
                view = view[_write(self.resp, view):]
            except OSError:
                os._exit(CHANNEL_LOST)


def _watch_parent(parent: int) -> None:
    """Ends the child's whole process group (what the reward started or forked too) once its parent is gone."""
    while _getppid() == parent:
        time.sleep(0.5)
    _killpg(0, signal.SIGKILL)


def _shield() -> None:
    # the trainer's process group gets SLURM's SIGTERM; the reward must keep scoring until the trainer has saved
    # at the step boundary (its parent ends it with SIGKILL). A handler, not SIG_IGN: a process the reward
    # starts gets the default disposition back at exec
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)


def _limit_memory(max_mb: float) -> None:
    cap = int(max_mb * AS_FACTOR * 2**20)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def main(argv: list[str]) -> None:
    try:
        _serve(argv)
    finally:  # the request pipe closed (the parent is done or gone), or the child must end: all it started ends too
        _killpg(0, signal.SIGKILL)


def _serve(argv: list[str]) -> None:
    req, resp, parent, max_mb = int(argv[0]), int(argv[1]), int(argv[2]), float(argv[3])
    channel = _Channel(req, resp)
    sys.stdin = open(os.devnull)  # noqa: SIM115 - the process's stdin for its whole life (fd 0 is /dev/null too)
    _shield()
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="llmrnn-reward-watchdog").start()
    _limit_memory(max_mb)
    while True:
        head = channel.read(HEADER.size)
        if head is None:
            return
        try:
            request_id, length, crc = check_header(head)
        except ValueError as exc:
            channel.send(frame(0, _error(str(exc))))
            return
        body = channel.read(length)
        if body is None:
            return
        if _crc32(body) != crc:
            channel.send(frame(request_id, _error("a request frame arrived damaged (CRC mismatch)")))
            return
        answer = _answer(_loads(body))
        used = rss_mb()
        if answer[:1] == b"o" and used > max_mb:
            # b"x": an error after which this child ends (the parent starts a new one for the next call)
            channel.send(frame(request_id, b"x" + _error(
                f"holds {used:.0f} MB after the call, more than the reward process's limit of {max_mb:g} MB; "
                "the reward process was stopped")[1:]))
            return
        channel.send(frame(request_id, answer))


def _answer(msg: tuple) -> bytes:
    global _fn, _max_abs
    if msg[0] == "load":
        _, path, name, _max_abs = msg
        try:
            _fn = _load(path, name)
        except _Refused as exc:
            return _error(str(exc), exc.trace)
        return b"o" + SCORE.pack(0.0)
    try:
        result = _fn(**msg[1])
    except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt too: one line, the child lives on
        return _error(f"raised {_line(exc)}{_where(exc)}", _traceback(exc))
    try:
        return b"o" + SCORE.pack(as_score(result, _max_abs))
    except ValueError as exc:
        return _error(str(exc))
    except BaseException as exc:  # noqa: BLE001 - a result whose conversion itself fails
        return _error(f"returned a value that is not a number ({_line(exc)})")


_fn = None
_max_abs = math.inf


def child_env() -> dict[str, str]:
    """The environment of a reward child: this process's, with this copy of llmrnn first on PYTHONPATH (the
    child runs `python -m llmrnn.custom_reward_child` wherever the parent's package lies), its working directory
    off sys.path (llmrnn.safe_path)."""
    src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return safe_path_env(dict(os.environ, PYTHONPATH=os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])])))


if __name__ == "__main__":
    main(sys.argv[1:])
