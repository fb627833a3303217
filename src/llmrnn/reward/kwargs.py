"""The reward's settings as ARGUMENTS of the scorer: one object, built once by `llmrnn train run`.

verl 0.7.1 calls `compute_score(data_source=, solution_str=, ground_truth=, extra_info=, **reward_kwargs)`
with `reward.custom_reward_function.reward_kwargs` (verl.trainer.ppo.reward.get_custom_reward_fn); TRL calls
its reward function with the keyword arguments bound here (functools.partial). Both get this object:

    {"audit_dir": DIR, "endpoint_file": RUN/judge/endpoint.json (judged modes),
     "reward_cfg": JSON of config section `reward`, "guard": JSON {"max_fallback_rate", "window"} (training)}

The nested settings travel as JSON text: a Hydra override renders them as one quoted string, verl hands
a nested mapping over as an OmegaConf DictConfig where a string stays a string, and the scorers read
both the same way (llmrnn.reward.config.settings). The checkpoint fingerprint (llmrnn.train.checkpoints)
hashes this object less its LOCATIONS. No secret is in it: the judge's API key stays in the file the
endpoint file names (the object is on main_ppo's command line).
"""

from __future__ import annotations

import json
import os
from typing import Any

ARG_KEYS = ("endpoint_file", "rubric_file", "audit_dir", "reward_cfg", "guard", "numeric_only")
LOCATIONS = ("audit_dir", "endpoint_file", "rubric_file")  # where things are, not what the reward computes


def reward_kwargs(reward: dict | None, *, audit_dir: str | os.PathLike, endpoint_file: str | os.PathLike | None = None,
                  guard: dict | None = None) -> dict[str, Any]:
    """The scorer's arguments for config section `reward` (None: the scorer's defaults); only what is given."""
    kw: dict[str, Any] = {"audit_dir": str(audit_dir)}
    if endpoint_file:
        kw["endpoint_file"] = str(endpoint_file)
    if reward is not None:
        kw["reward_cfg"] = json.dumps(reward, sort_keys=True)
    if guard is not None:
        kw["guard"] = json.dumps(guard, sort_keys=True)
    return kw


def settings_identity(kwargs: dict | None) -> str:
    """What of the reward's arguments decides the rewards (the checkpoint fingerprint hashes it)."""
    return json.dumps({k: v for k, v in (kwargs or {}).items() if k not in LOCATIONS}, sort_keys=True, default=str)
