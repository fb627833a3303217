"""Your own reward: config `reward.custom: {path: my_reward.py, name: compute_score, timeout_s, max_abs}`.

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

import json
import os
import pickle
import select
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmrnn.constants import DATA_SOURCE
from llmrnn.custom_reward_child import PARAMETERS, SIGNATURE, child_env, signature_problem
from llmrnn.errors import InputError
from llmrnn.reward.config import CUSTOM_NAME, reward_settings, settings
from llmrnn.reward.entry import _completion_text
from llmrnn.settings import section_defaults

__all__ = ["PARAMETERS", "SIGNATURE", "RewardProcess", "compute_score", "load", "problem", "signature_problem",
           "trl_reward"]
# reward.custom.timeout_s (one import or one call of your reward) and max_abs (|reward| beyond it is refused
# with its row): the settings' defaults
DEFAULT_TIMEOUT_S = float(section_defaults("reward.custom")["timeout_s"])
DEFAULT_MAX_ABS = float(section_defaults("reward.custom")["max_abs"])


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
    too) or a child that dies or hangs is one InputError line naming the file, the function and the row."""

    def __init__(self, path: str, name: str = CUSTOM_NAME, timeout_s: float = DEFAULT_TIMEOUT_S,
                 max_abs: float = DEFAULT_MAX_ABS):
        self.path, self.name, self.timeout_s, self.max_abs = str(path), name, float(timeout_s), float(max_abs)
        self.where = f"{self.path}:{self.name}"
        self.proc: subprocess.Popen | None = None
        if not Path(self.path).is_file():
            what = "a fifo, device or folder, not a file" if Path(self.path).exists() else "no such file"
            raise InputError(f"reward.custom.path: {self.path}: {what}")
        self._start()

    def _start(self) -> None:
        env = child_env()
        self.proc = subprocess.Popen([sys.executable, "-m", "llmrnn.custom_reward_child"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, cwd=os.getcwd())
        answer = self._ask(("load", str(Path(self.path).resolve()), self.name, self.max_abs), "importing it ")
        if answer[0] != "ok":
            self.close()
            line = answer[1]
            if line.startswith("defines no"):
                raise InputError(f"reward.custom.name: {self.path} {line}")
            if line.startswith(f"{self.name} "):  # another signature
                raise InputError(f"reward.custom: {self.path}:{line}")
            raise InputError(f"reward.custom.path: {self.path}: {line}")

    def _ask(self, msg: tuple, what: str) -> tuple:
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        try:
            data = pickle.dumps(msg)
        except (pickle.PicklingError, TypeError, AttributeError):
            # a keyword argument that cannot cross into the child (TRL's log_metric/log_extra callables bound
            # to its trainer) is left out; the row's own arguments always pickle
            kwargs = {k: v for k, v in msg[1].items() if _sendable(v)}
            data = pickle.dumps((msg[0], kwargs))
        try:
            self.proc.stdin.write(struct.pack("<Q", len(data)) + data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return "error", self._gone(what)
        fd = self.proc.stdout.fileno()
        head = self._read(fd, 8, what)
        if isinstance(head, str):
            return "error", head
        body = self._read(fd, struct.unpack("<Q", head)[0], what)
        return ("error", body) if isinstance(body, str) else pickle.loads(body)

    def _read(self, fd: int, n: int, what: str) -> bytes | str:
        """n bytes from the child, or the line saying why not (no answer within the time limit, or it died)."""
        out = b""
        deadline = time.monotonic() + self.timeout_s
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.close()
                return (f"{what}gave no answer within {self.timeout_s:g} s (reward.custom.timeout_s); "
                        "the reward process was stopped")
            chunk = os.read(fd, n - len(out))
            if not chunk:
                return self._gone(what)
            out += chunk
        return out

    def _gone(self, what: str) -> str:
        code = self.proc.wait() if self.proc else None
        self.proc = None
        return f"{what}ended the reward process (exit code {code}: os._exit or a crash in its code)"

    def __call__(self, where: str = "", **kwargs) -> float:
        """The score of one call, or InputError naming the file:function and `where` (the row)."""
        if self.proc is None:
            self._start()
        status, value = self._ask(("call", kwargs), "")
        if status != "ok":
            raise InputError(f"reward.custom: {self.where}{' on ' + where if where else ''} {value}")
        return value

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            for fh in (self.proc.stdin, self.proc.stdout):
                if fh is not None:
                    fh.close()
            self.proc = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown
            pass


def _sendable(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except (pickle.PicklingError, TypeError, AttributeError):
        return False
    return True


def open_custom(custom: dict) -> RewardProcess:
    """The RewardProcess of a `custom_of` mapping (its timeout and bound from reward.custom)."""
    return RewardProcess(custom["path"], custom.get("name") or CUSTOM_NAME,
                         timeout_s=custom.get("timeout_s") or DEFAULT_TIMEOUT_S,
                         max_abs=custom.get("max_abs") or DEFAULT_MAX_ABS)


def load(path: str, name: str = CUSTOM_NAME, timeout_s: float = DEFAULT_TIMEOUT_S,
         max_abs: float = DEFAULT_MAX_ABS) -> RewardProcess:
    """Your own reward, loaded in its child: InputError in one line (no file, no such name, another
    signature, an import that fails, exits or hangs)."""
    return RewardProcess(path, name, timeout_s, max_abs)


def problem(config: dict) -> str | None:
    """`llmrnn check`'s line for the config's own reward (None: none set, or it loads with verl's signature)."""
    try:
        custom = custom_of((config or {}).get("reward"))
        if custom:
            open_custom(custom).close()
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
    proc = _PROCESSES.get(key)
    if proc is None:
        proc = _PROCESSES[key] = open_custom(custom)
    info = dict(extra_info or {})
    return proc(f"row {info.get('index', '?')}", data_source=data_source, solution_str=solution_str,
                ground_truth=ground_truth, extra_info=info, **kwargs)


_PROCESSES: dict[str, RewardProcess] = {}


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
            info = dict(info or {})
            out.append(fn(f"row {info.get('index', '?')}", data_source=source,
                          solution_str=_completion_text(completion), ground_truth=gt, extra_info=info, **columns))
        return out

    reward.__name__ = name
    return reward
