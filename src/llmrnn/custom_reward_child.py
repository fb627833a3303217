"""The child process your own reward (reward.custom) runs in: `python -m llmrnn.custom_reward_child`
(llmrnn.reward.custom starts it). It imports nothing of llmrnn but this file (outside the llmrnn.reward
package, whose import pulls in the judge client), so it starts fast and the user's code cannot reach the caller's
state. Protocol (pickled tuples, length-prefixed, on private copies of stdin and stdout; the user's prints go to
stderr, its reads of stdin find nothing):
the parent sends ("load", path, name), then ("call", kwargs) per sample; every answer is ("ok", value) or
("error", one line). Whatever the user's code raises, SystemExit and KeyboardInterrupt included, is one line.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import numbers
import os
import pickle
import struct
import sys

from llmrnn.safe_path import safe_path_env

PARAMETERS = ("data_source", "solution_str", "ground_truth", "extra_info")
SIGNATURE = "(data_source, solution_str, ground_truth, extra_info, **kwargs)"


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
    within [-max_abs, max_abs]; ValueError (one line) otherwise. The one conversion of a user's result."""
    value = result.get("score") if isinstance(result, dict) else result
    if getattr(value, "shape", None) == () and hasattr(value, "item"):  # numpy scalar or 0-d array
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"returned {_short(value)}; expected a finite number or a dict with a finite 'score'")  # noqa: TRY004 - one error type for a bad result
    try:
        score = float(value)
    except (OverflowError, ValueError) as exc:
        raise ValueError(f"returned {_short(value)}; expected a finite number ({exc})") from exc
    if not math.isfinite(score):
        raise ValueError(f"returned {score!r}; expected a finite number or a dict with a finite 'score'")
    if abs(score) > max_abs:
        raise ValueError(f"returned {score:.6g}, outside [-{max_abs:g}, {max_abs:g}] (reward.custom.max_abs): "
                         "training's float32 arithmetic would overflow")
    return score


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r}) (sys.exit)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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
        raise _Refused(f"importing it failed: {_line(exc)}") from None
    if not hasattr(module, name):
        raise _Refused(f"defines no {name!r}")
    fn = getattr(module, name)
    problem = signature_problem(fn)
    if problem:
        raise _Refused(f"{name} {problem}")
    return fn


class _Refused(Exception):
    pass


def main() -> None:
    channel = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # the user's prints go to stderr, never into the protocol
    sys.stdout = sys.stderr
    inbox = os.fdopen(os.dup(0), "rb")  # the requests, on a private copy: the user's reads of stdin get nothing
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(os.devnull)  # noqa: SIM115 - the process's stdin for its whole life

    def send(msg) -> None:
        data = pickle.dumps(msg)
        channel.write(struct.pack("<Q", len(data)) + data)
        channel.flush()

    while True:
        head = inbox.read(8)
        if len(head) < 8:
            return
        msg = pickle.loads(inbox.read(struct.unpack("<Q", head)[0]))
        send(_answer(msg))


def _answer(msg: tuple) -> tuple:
    global _fn, _max_abs
    if msg[0] == "load":
        _, path, name, _max_abs = msg
        try:
            _fn = _load(path, name)
        except _Refused as exc:
            return "error", str(exc)
        return "ok", None
    try:
        result = _fn(**msg[1])
    except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt too: one line, the child lives on
        return "error", f"raised {_line(exc)}"
    try:
        return "ok", as_score(result, _max_abs)
    except ValueError as exc:
        return "error", str(exc)
    except BaseException as exc:  # noqa: BLE001 - a result whose conversion itself fails
        return "error", f"returned a value that is not a number ({_line(exc)})"


_fn = None
_max_abs = math.inf


def child_env() -> dict[str, str]:
    """The environment of a reward child: this process's, with this copy of llmrnn first on PYTHONPATH (the
    child runs `python -m llmrnn.custom_reward_child` wherever the parent's package lies), its working directory
    off sys.path (llmrnn.safe_path)."""
    src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return safe_path_env(dict(os.environ, PYTHONPATH=os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])])))


if __name__ == "__main__":
    main()
