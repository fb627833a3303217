"""Your own reward: config `reward.custom: {path: my_reward.py, name: compute_score, timeout_s, max_abs,
max_processes, max_memory_mb, max_output_bytes}`.

The function has verl's signature, `compute_score(data_source, solution_str, ground_truth, extra_info,
**kwargs)`, and returns a number (numpy numbers too) or a dict with "score". It runs under one contract
wherever it runs (`RewardProcess`): `llmrnn check` imports it, preflight scores a few real rows with it, TRL
calls it through `trl_reward`, and verl through `compute_score` here (reward.custom_reward_function names
pkg://llmrnn.reward:custom_compute_score, never the user's file), each time in a child process with a time
limit per import and per call; its result is converted once (custom_reward_child.as_score: finite, within
+-reward.custom.max_abs); whatever it raises, exits or hangs on is one line naming the file, the function and
the row. It replaces the judge's scorer (no judge server is planned). Its file's content is hashed into the
rules' `code` param and the checkpoint fingerprint (llmrnn.provenance.code_identity).
"""

from __future__ import annotations

import atexit
import itertools
import json
import logging
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmrnn.constants import DATA_SOURCE
from llmrnn.custom_reward_child import (
    CHANNEL_LOST,
    HEADER,
    PARAMETERS,
    SCORE,
    SIGNATURE,
    check_header,
    child_env,
    frame,
    signature_problem,
)
from llmrnn.errors import InputError
from llmrnn.reward.config import CUSTOM_NAME, reward_settings, settings
from llmrnn.reward.entry import _completion_text
from llmrnn.settings import section_defaults

__all__ = ["PARAMETERS", "SIGNATURE", "RewardProcess", "compute_score", "load", "problem", "signature_problem",
           "trl_reward"]
log = logging.getLogger(__name__)
# reward.custom.timeout_s (one import or one call of your reward) and max_abs (|reward| beyond it is refused
# with its row): the settings' defaults
_CUSTOM_DEFAULTS = section_defaults("reward.custom")
DEFAULT_TIMEOUT_S = float(_CUSTOM_DEFAULTS["timeout_s"])
DEFAULT_MAX_ABS = float(_CUSTOM_DEFAULTS["max_abs"])
# The reward process's own bounds (docs/rewards.md "What the reward process may do"), settings of reward.custom;
# their defaults:
MAX_MEMORY_MB = int(_CUSTOM_DEFAULTS["max_memory_mb"])  # resident after any call (address space: AS_FACTOR times)
MAX_PROCESSES = int(_CUSTOM_DEFAULTS["max_processes"])  # of its session alive at once besides itself
OUTPUT_CAP = int(_CUSTOM_DEFAULTS["max_output_bytes"])  # of its stdout+stderr into the log, then one line
MAX_DEPTH = 200  # nesting of one argument (pickle itself fails near 1000 levels, json near 1000 too)
MAX_REQUEST_MB = 256  # one call's arguments, pickled
TICK_S = 0.25  # how often a call in flight has its process count checked


def custom_of(reward: Any) -> dict | None:
    """{"path", "name"} of config section `reward` (or the whole config), None when no own reward is set."""
    reward = settings(reward, "reward")
    custom = reward.get("custom") if isinstance(reward.get("custom"), dict) else None
    if not custom:  # also a section of another recipe (qa.reward): only its `custom` key is read here
        return None
    return reward_settings({"custom": custom}).custom_reward


def code_files(config: dict) -> list[str]:
    """The own reward's file, for a rule's code_hash(...) (empty without one)."""
    custom = custom_of((config or {}).get("reward"))
    return [str(custom["path"])] if custom else []


class RewardProcess:
    """Your own reward behind one contract, wherever it runs (check, preflight, TRL, verl): imported and
    called in a child process (llmrnn.custom_reward_child) with a time limit per import and per call
    (reward.custom.timeout_s), its result converted once (numbers, numpy numbers, {"score": ...}; finite and
    within +-reward.custom.max_abs), and whatever the user's code raises (SystemExit and KeyboardInterrupt
    too) or a child that dies, hangs, or breaks a bound is one InputError line naming the file, the function
    and the row (its traceback at debug level: `llmrnn -v`).

    Calls from many threads at once (verl's reward loop runs each sample's compute_score in a thread pool) take
    turns: one lock per child holds a whole exchange, and every answer carries its request's id, checked here,
    so no row can get another row's score. The child's bounds: its own session (a signal to the job's process
    group does not reach it; its whole group is killed when it is stopped, when this process exits, or by its
    watchdog when this process is gone), at most `max_processes` processes besides itself, `max_memory_mb`
    resident after each call, `output_cap` bytes of its output in the log (reward.custom.max_processes,
    max_memory_mb, max_output_bytes)."""

    def __init__(self, path: str, name: str = CUSTOM_NAME, timeout_s: float = DEFAULT_TIMEOUT_S,
                 max_abs: float = DEFAULT_MAX_ABS, *, import_timeout_s: float | None = None,
                 import_limit: str = "reward.custom.timeout_s",
                 max_memory_mb: float = MAX_MEMORY_MB, max_processes: int = MAX_PROCESSES,
                 output_cap: int = OUTPUT_CAP):
        self.path, self.name, self.timeout_s, self.max_abs = str(path), name, float(timeout_s), float(max_abs)
        self.import_timeout_s = float(import_timeout_s or timeout_s)
        self.import_limit = import_limit if self.import_timeout_s < self.timeout_s else "reward.custom.timeout_s"
        self.max_memory_mb, self.max_processes, self.output_cap = float(max_memory_mb), int(max_processes), int(output_cap)
        self.where = f"{self.path}:{self.name}"
        self.proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._req = self._resp = -1
        if not Path(self.path).is_file():
            what = "a fifo, device or folder, not a file" if Path(self.path).exists() else "no such file"
            raise InputError(f"reward.custom.path: {self.path}: {what}")
        _LIVE.add(self)
        with self._lock:
            self._start()

    def _start(self) -> None:
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "llmrnn.custom_reward_child", str(req_r), str(resp_w), str(os.getpid()),
                 str(self.max_memory_mb)],
                stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w, pass_fds=(req_r, resp_w),
                start_new_session=True, env=child_env(), cwd=os.getcwd())
        except OSError:
            for fd in (req_w, resp_r, out_r):
                os.close(fd)
            raise
        finally:
            for fd in (req_r, resp_w, out_w):
                os.close(fd)
        self._req, self._resp = req_w, resp_r
        os.set_blocking(req_w, False)
        self._output = threading.Thread(target=_pass_output, args=(out_r, self.output_cap, self.where),
                                        daemon=True, name="llmrnn-reward-output")
        self._output.start()
        status, line, trace = self._ask(_pickled(("load", str(Path(self.path).resolve()), self.name, self.max_abs)),
                                        "importing it ", self.import_timeout_s, self.import_limit)
        if status != "ok":
            self._stop()
            if trace:
                log.debug("reward.custom: %s: importing it raised:\n%s", self.path, trace)
            if line.startswith("defines no"):
                raise InputError(f"reward.custom.name: {self.path} {line}")
            if line.startswith(f"{self.name} "):  # another signature
                raise InputError(f"reward.custom: {self.path}:{line}")
            raise InputError(f"reward.custom.path: {self.path}: {line}")

    def _ask(self, body: bytes, what: str, timeout_s: float,
             limit: str = "reward.custom.timeout_s") -> tuple[str, str, str]:
        """(status, line, traceback) of one exchange with the child (`body`: the pickled request); the caller
        holds the lock."""
        request_id = next(self._ids)
        deadline = time.monotonic() + timeout_s
        data = memoryview(frame(request_id, body))
        while data:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [self._req], [], min(left, TICK_S))[1]:
                if (line := self._over_limits(what, deadline, timeout_s, limit)) is not None:
                    return "error", line, ""
                continue
            try:
                data = data[os.write(self._req, data):]
            except BlockingIOError:
                continue
            except (BrokenPipeError, OSError):
                return "error", self._gone(what), ""
        head = self._read(HEADER.size, what, deadline, timeout_s, limit)
        if isinstance(head, str):
            return "error", head, ""
        try:
            answer_id, length, crc = check_header(head)
        except ValueError as exc:
            self._stop()
            return "error", f"{what}broke the reward protocol ({exc}); the reward process was stopped", ""
        body = self._read(length, what, deadline, timeout_s, limit)
        if isinstance(body, str):
            return "error", body, ""
        if answer_id != request_id or zlib.crc32(body) != crc:
            self._stop()
            why = f"the answer to request {answer_id} came for request {request_id}" if answer_id != request_id \
                else "an answer frame arrived damaged (CRC mismatch)"
            return "error", f"{what}broke the reward protocol ({why}); the reward process was stopped", ""
        kind, rest = body[:1], body[1:]
        if kind == b"o":
            if (line := self._after_call(what)) is not None:
                return "error", line, ""
            return "ok", repr(SCORE.unpack(rest)[0]), ""
        line, _, trace = rest.decode("utf-8", "replace").partition("\0")
        if kind == b"x":  # an error after which the child ends
            self._stop()
        return "error", line, trace

    def _read(self, n: int, what: str, deadline: float, timeout_s: float, limit: str) -> bytes | str:
        """n bytes from the child, or the line saying why not (no answer within the time limit, a bound broken,
        or it died)."""
        out = bytearray()
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._resp], [], [], min(left, TICK_S))[0]:
                if (line := self._over_limits(what, deadline, timeout_s, limit)) is not None:
                    return line
                continue
            chunk = os.read(self._resp, min(n - len(out), 1 << 20))
            if not chunk:
                return self._gone(what)
            out += chunk
        return bytes(out)

    def _over_limits(self, what: str, deadline: float, timeout_s: float, limit: str) -> str | None:
        """While a call is in flight: the line that stops it (its time is up, or it runs too many processes)."""
        if time.monotonic() >= deadline:
            self._stop()
            return (f"{what}gave no answer within {timeout_s:g} s ({limit}); "
                    "the reward process was stopped")
        return self._process_problem(what)

    def _process_problem(self, what: str) -> str | None:
        pid = self.proc.pid if self.proc else None
        if pid is None:
            return None
        n = len(_session(pid)) - 1
        if n <= self.max_processes:
            return None
        self._stop()
        return (f"{what}started {n} processes, more than the reward process's limit of {self.max_processes} "
                "alive at once; the reward process and all it started were stopped")

    def _after_call(self, what: str) -> str | None:
        """After an answer: a child that left more processes than its limit running is stopped (its next call
        starts a fresh one), the line saying so; only looked for when it has children at all (cheap)."""
        pid = self.proc.pid if self.proc else None
        try:
            with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as fh:
                if not fh.read().strip():
                    return None
        except OSError:
            pass
        return self._process_problem(what)

    def _gone(self, what: str) -> str:
        proc = self.proc
        code = None
        if proc is not None:
            try:
                code = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._stop()
        if code == CHANNEL_LOST:
            return (f"{what}closed or replaced the reward protocol's file descriptors (a reward must not close "
                    "descriptors it did not open); the reward process was stopped")
        if code is None:
            return f"{what}closed the reward protocol's pipes and did not end; the reward process was stopped"
        if code < 0:
            return f"{what}ended the reward process (killed by {_signal_name(-code)})"
        return f"{what}ended the reward process (exit code {code}: os._exit or a crash in its code)"

    def __call__(self, where: str = "", **kwargs) -> float:
        """The score of one call, or InputError naming the file:function and `where` (the row)."""
        on = f" on {where}" if where else ""
        for field in PARAMETERS:
            if (problem := field_problem(kwargs.get(field))) is not None:
                raise InputError(f"reward.custom: {self.where}{on}: {field} {problem}")
        try:
            body = _pickled(("call", kwargs))
        except InputError as exc:
            raise InputError(f"reward.custom: {self.where}{on}: {exc}") from None
        with self._lock:
            if self.proc is None:
                self._start()
            status, line, trace = self._ask(body, "", self.timeout_s)
        if status != "ok":
            if trace:
                log.debug("reward.custom: %s%s raised:\n%s", self.where, on, trace)
            raise InputError(f"reward.custom: {self.where}{on} {line}")
        return float(line)

    def _stop(self) -> None:
        """End the child and everything in its session (SIGKILL: it shields itself from SIGTERM)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            _kill(lambda: os.killpg(proc.pid, signal.SIGKILL))  # its group, then any that left the group
            for pid in _session(proc.pid):
                _kill(lambda pid=pid: os.kill(pid, signal.SIGKILL))
            proc.wait()
            # SIGKILL is delivered asynchronously: close() returns once its session is gone (at most ~2 s)
            for _ in range(100):
                if not _session(proc.pid):
                    break
                time.sleep(0.02)
            # the child's session is gone, so is every writer of its output pipe: what it printed last reaches
            # the log before close() returns (a loaded host ended the process first and lost it); bounded, as
            # a grandchild that escaped the session may still hold the pipe
            output = getattr(self, "_output", None)
            if output is not None and output is not threading.current_thread():
                output.join(timeout=5)
        for name in ("_req", "_resp"):
            fd, _ = getattr(self, name), setattr(self, name, -1)
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop()

    def __del__(self) -> None:
        try:
            self._stop()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown
            pass


_LIVE: weakref.WeakSet[RewardProcess] = weakref.WeakSet()


def _kill(send: Callable[[], None]) -> None:
    try:
        send()
    except (ProcessLookupError, PermissionError):
        pass


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@atexit.register
def _close_all() -> None:
    """When the trainer ends, its reward processes end, with all they started."""
    for proc in list(_LIVE):
        proc.close()


def _session(sid: int) -> list[int]:
    """The live (not zombie) processes of session `sid` (the reward child leads one of its own)."""
    out = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 3 and fields[3] == str(sid).encode() and fields[0] != b"Z":
            out.append(int(name))
    return out


def _pass_output(fd: int, cap: int, where: str) -> None:
    """The child's stdout and stderr into this process's stderr (the job's log), the first `cap` bytes only."""
    passed, noted = 0, False
    with os.fdopen(fd, "rb", buffering=0) as fh:
        while chunk := fh.read(1 << 16):
            part = chunk[: max(cap - passed, 0)]
            passed += len(part)
            text = part.decode("utf-8", "replace") if part else ""
            if len(part) < len(chunk) and not noted:
                noted = True
                text += (f"\nllmrnn: reward.custom: {where} printed more than {cap} bytes; the rest of its output "
                         "is dropped\n")
            if text:
                try:
                    sys.stderr.write(text)
                    sys.stderr.flush()
                except (OSError, ValueError):
                    pass


def field_problem(value: Any) -> str | None:
    """Why one argument of a call cannot be handed to the reward (nested too deep), or None. Iterative: a
    20,000-level row must not crash the walk that refuses it."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"is nested more than {MAX_DEPTH} levels deep"
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend((v, depth + 1) for v in item)
        elif getattr(getattr(item, "dtype", None), "hasobject", False):  # a numpy object array (verl's columns)
            stack.extend((v, depth + 1) for v in item.ravel())
    return None


def _pickled(msg: tuple) -> bytes:
    """The request's bytes. A keyword argument that cannot cross into the child (TRL's log_metric/log_extra
    callables bound to its trainer) is left out; a row's own argument that cannot, or a request over
    MAX_REQUEST_MB, is InputError naming the argument."""
    try:
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError, ValueError):
        kwargs = msg[1]
        for field in PARAMETERS:
            if field in kwargs and not _sendable(kwargs[field]):
                raise InputError(f"{field} cannot be handed to the reward process "
                                 f"({type(kwargs[field]).__name__} does not pickle)") from None
        data = pickle.dumps((msg[0], {k: v for k, v in kwargs.items() if _sendable(v)}),
                            protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) > MAX_REQUEST_MB << 20:
        sizes = {k: len(pickle.dumps(v)) for k, v in msg[1].items()} if msg[0] == "call" else {}
        big = max(sizes, key=sizes.get) if sizes else "the request"
        raise InputError(f"{big} is {len(data) / 2**20:.0f} MB pickled, more than the {MAX_REQUEST_MB} MB one call "
                         "may carry")
    return data


def _sendable(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError, ValueError):
        return False
    return True


def open_custom(custom: dict, import_timeout_s: float | None = None, import_limit: str = "") -> RewardProcess:
    """The RewardProcess of a `custom_of` mapping (its timeout, bound and the process's limits from
    reward.custom); the import waits at most `import_timeout_s` where that is shorter than
    reward.custom.timeout_s."""
    timeout_s = float(custom.get("timeout_s") or DEFAULT_TIMEOUT_S)

    def limit(key: str, default: int) -> int:
        return default if custom.get(key) is None else int(custom[key])  # 0 is a limit too

    return RewardProcess(custom["path"], custom.get("name") or CUSTOM_NAME, timeout_s=timeout_s,
                         max_abs=custom.get("max_abs") or DEFAULT_MAX_ABS,
                         import_timeout_s=min(timeout_s, import_timeout_s or timeout_s),
                         import_limit=import_limit or "reward.custom.timeout_s",
                         max_memory_mb=limit("max_memory_mb", MAX_MEMORY_MB),
                         max_processes=limit("max_processes", MAX_PROCESSES),
                         output_cap=limit("max_output_bytes", OUTPUT_CAP))


def load(path: str, name: str = CUSTOM_NAME, timeout_s: float = DEFAULT_TIMEOUT_S,
         max_abs: float = DEFAULT_MAX_ABS) -> RewardProcess:
    """Your own reward, loaded in its child: InputError in one line (no file, no such name, another
    signature, an import that fails, exits or hangs)."""
    return RewardProcess(path, name, timeout_s, max_abs)


def problem(config: dict, import_timeout_s: float | None = None, import_limit: str = "") -> str | None:
    """`llmrnn check`'s line for the config's own reward (None: none set, or it loads with verl's signature);
    `import_timeout_s`: the check's own limit on the import (never longer than reward.custom.timeout_s)."""
    try:
        custom = custom_of((config or {}).get("reward"))
        if custom:
            open_custom(custom, import_timeout_s, import_limit).close()
    except InputError as exc:
        return str(exc)
    return None


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """What verl calls under reward.custom (reward.custom_reward_function: pkg://llmrnn.reward, this name):
    your own reward, read from the reward settings verl passes on (reward_cfg's `custom`), under the same
    contract as everywhere else (its child, time limit, one conversion, one line)."""
    custom = custom_of(kwargs.get("reward_cfg"))
    if not custom:
        raise InputError("reward.custom: verl called the own-reward entry but reward_cfg names no reward.custom.path")
    key = json.dumps(custom, sort_keys=True)
    with _PROCESSES_LOCK:  # verl's threads: one child per reward, however many threads ask at once
        proc = _PROCESSES.get(key)
        if proc is None:
            proc = _PROCESSES[key] = open_custom(custom)
    info = _info(extra_info, "row ?")
    return proc(f"row {info.get('index', '?')}", data_source=data_source, solution_str=solution_str,
                ground_truth=ground_truth, extra_info=info, **kwargs)


_PROCESSES: dict[str, RewardProcess] = {}
_PROCESSES_LOCK = threading.Lock()


def _info(extra_info: Any, where: str) -> dict:
    """A row's extra_info as the reward's mapping (null: an empty one, as verl's own default); anything else
    that is not a mapping is one line naming the row."""
    if extra_info is None:
        return {}
    try:
        return dict(extra_info)
    except (TypeError, ValueError):
        raise InputError(f"reward.custom: {where}: extra_info is a {type(extra_info).__name__}, not a mapping") from None


def trl_reward(fn: RewardProcess, name: str = CUSTOM_NAME) -> Callable:
    """TRL's batch reward function over your own reward's RewardProcess (one score per call, already
    converted and bounded): the parquet's reward_model.ground_truth,
    extra_info and data_source columns become its arguments; every other keyword TRL or `train run` passes
    (the reward settings among them) goes on as **kwargs."""

    def reward(prompts: list, completions: list, **columns) -> list[float]:
        n = len(completions)
        reward_model = columns.pop("reward_model", None) or [None] * n
        extra = columns.pop("extra_info", None) or [{}] * n
        sources = columns.pop("data_source", None) or [DATA_SOURCE] * n
        out = []
        for completion, rm, source, info in zip(completions, reward_model, sources, extra):
            gt = rm.get("ground_truth") if isinstance(rm, dict) else rm
            info = _info(info, "a TRL row")
            out.append(fn(f"row {info.get('index', '?')}", data_source=source,
                          solution_str=_completion_text(completion), ground_truth=gt, extra_info=info, **columns))
        return out

    reward.__name__ = name
    return reward
