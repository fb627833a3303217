"""Check that verl, vLLM and llmrnn import at the versions the GPU lock pins (the container's %post and %test).

    python scripts/check_gpu_stack.py envs/gpu-lock.txt [PACKAGE ...]   (default: verl vllm torch transformers)

Prints `verl X vllm Y llmrnn Z`; exits 1 with one line naming what is missing or at another version.
Standard library only (it runs before anything else is known to work)."""

from __future__ import annotations

import importlib
import re
import sys
from importlib import metadata

PACKAGES = ("verl", "vllm", "torch", "transformers")


def locked(lock_text: str) -> dict[str, str]:
    out = {}
    for line in lock_text.splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;#]+)", line.strip())
        if m:
            out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


def main(argv: list[str]) -> int:
    with open(argv[1], encoding="utf-8") as fh:
        pins = locked(fh.read())
    problems, found = [], {}
    for name in argv[2:] or PACKAGES:
        try:
            importlib.import_module(name)
            found[name] = metadata.version(name)
        except Exception as exc:  # noqa: BLE001 - any import failure is the one line
            problems.append(f"{name} does not import ({type(exc).__name__}: {exc})")
            continue
        want = pins.get(name)
        if want and found[name].split("+")[0] != want.split("+")[0]:
            problems.append(f"{name} {found[name]} is installed, the GPU lock pins {want}")
    try:
        found["llmrnn"] = importlib.import_module("llmrnn").__file__  # where it imports from
    except Exception as exc:  # noqa: BLE001
        problems.append(f"llmrnn does not import ({type(exc).__name__}: {exc})")
    if problems:
        print(f"{argv[1]}: " + "; ".join(problems), file=sys.stderr)
        return 1
    print(" ".join(f"{k} {v}" for k, v in found.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
