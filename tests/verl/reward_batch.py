"""The batch verl's reward loop scores: left-padded prompts, right-padded responses and the rows' columns,
as verl's rollout hands it over. Shared by the reward-loop scripts (run inside a verl venv)."""

from __future__ import annotations


def reward_batch(items: list[dict], prompt_ids: list[list[int]], response_ids: list[list[int]], pad: int):
    import numpy as np
    import torch
    from verl import DataProto

    plen, rlen = max(map(len, prompt_ids)), max(map(len, response_ids))
    prompts = torch.tensor([[pad] * (plen - len(p)) + p for p in prompt_ids])
    resp = torch.tensor([r + [pad] * (rlen - len(r)) for r in response_ids])
    mask = torch.tensor([[0] * (plen - len(p)) + [1] * len(p) + [1] * len(r) + [0] * (rlen - len(r))
                         for p, r in zip(prompt_ids, response_ids)])
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": resp, "attention_mask": mask,
                 "input_ids": torch.cat([prompts, resp], dim=1)},
        non_tensors={k: np.array([it[k] for it in items], dtype=object)
                     for k in ("data_source", "reward_model", "extra_info")},
    )
