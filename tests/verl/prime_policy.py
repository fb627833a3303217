"""A tiny policy that writes memory JSON some of the time, for the trainer rehearsal (tests/verl/rehearse_fit.py).

The random tiny model (tests/tiny_model.py) never writes a memory JSON, so every reward of a group is equal,
GRPO's advantages are 0 and training never moves the LoRA. A few seconds of plain supervised fine-tuning (full
weights, CPU) on our own prompts -> `{"evolving_summary": "<a few words>"}` give a base model whose samples at
the rollout temperature differ: some name the next visit's diagnosis, some do not, some are cut off or not JSON.
The judged reward then varies within a group, GRPO moves the adapter, and the merge has something to merge.
Importable from the main venv and the verl venvs (transformers + torch only).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

WORDS = ["hypertension", "diabetes", "patient", "visit", "history", "memory", "chest", "pain"]


def prime_json_policy(model_dir: str | Path, out_dir: str | Path, prompts: list[str], steps: int = 60,
                      seed: int = 0) -> Path:
    """Copy model_dir to out_dir and fine-tune it to answer each prompt (chat template) with a short memory
    JSON of random WORDS; returns out_dir."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out_dir)
    shutil.copytree(model_dir, out, dirs_exist_ok=True)
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        ids, labels = [], []
        for _ in range(4):
            prompt = rng.choice(prompts)
            head = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                           tokenize=True)
            head = list(head["input_ids"]) if hasattr(head, "keys") else list(head)
            answer = json.dumps({"evolving_summary": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))})
            tail = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            ids.append(head + tail)
            labels.append([-100] * len(head) + tail)
        width = max(map(len, ids))
        x = torch.tensor([s + [tok.pad_token_id] * (width - len(s)) for s in ids])
        y = torch.tensor([s + [-100] * (width - len(s)) for s in labels])
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in ids])
        loss = model(input_ids=x, attention_mask=mask, labels=y).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(out)
    return out
