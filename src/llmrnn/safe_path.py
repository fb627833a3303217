"""The environment of every Python child we start (`python -m verl.trainer.main_ppo`, `python -m llmrnn.cli ...`,
`python -m pip`, `python -c ...`): PYTHONSAFEPATH=1, so the child does not put its working directory first on
sys.path. Without it a stray folder there shadows an installed package: W&B writes `./wandb/` wherever a run
starts, and `import wandb` from that folder finds it (a namespace package, no `wandb.init`) where wandb is not
installed, or a local `wandb.py` where it is. The variable (Python 3.11's `-P`) is used rather than the flag:
an older interpreter given as `--python` ignores it instead of refusing to start, and it reaches the child's own
Python children (vLLM's workers, a `ray start` raylet's)."""

from __future__ import annotations

import os
from collections.abc import Mapping

SAFE_PATH = {"PYTHONSAFEPATH": "1"}


def safe_path_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's environment) with PYTHONSAFEPATH=1."""
    return {**(os.environ if env is None else env), **SAFE_PATH}
