"""Trajectory parquet rows in the verl RLHFDataset layout, for the train tests.

Written with pyarrow only, so the verl venvs (tests/verl/check_verl.py) can use it too. When TRAJ's
writer `llmrnn.trajectories` offers one, tests/test_train_*.py prefer it (see `write_parquet`).
"""

from __future__ import annotations

import json
import random

WORDS = ["patient", "visit", "history", "diabetes", "hypertension", "chest", "pain", "memory", "summary", "focus", "areas", "future"]


def step(pid: int, t: int, words: int, rng: random.Random) -> dict:
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    return {
        "patient_id": str(pid),
        "visit_index": t,
        "visit_id": f"{pid}-{t}",
        "update_prompt": f"Update the memory of patient {pid} after visit {t}. Visit: {text}. "
        'Answer with JSON {"evolving_summary": "..."}.',
        "h_prev": json.dumps({"evolving_summary": "none yet"}),
        "h_ref": json.dumps({"evolving_summary": f"patient {pid}: {text[:40]}"}),
        "visit": {"visit_id": f"{pid}-{t}", "clinical_sections": {"chief_complaint": text[:30]}},
        "next_visit": {"visit_id": f"{pid}-{t + 1}"},
        "prediction": {"top_5_diagnoses": ["diabetes"], "primary_diagnosis": "diabetes"},
        "evaluation": {"primary_correct": True, "any_top5_correct": True, "missed_diagnoses": [],
                       "why_missed": "", "improvement_suggestions": ""},
        "next_prediction": {"top_5_diagnoses": ["hypertension"], "primary_diagnosis": "hypertension"},
        "next_evaluation": {"primary_correct": False, "any_top5_correct": True, "missed_diagnoses": [],
                            "why_missed": "", "improvement_suggestions": ""},
        "ground_truth_diagnoses": ["diabetes"],
        "next_ground_truth_diagnoses": ["hypertension"],
        "parse_ok": {"prediction": True, "evaluation": True, "memory": True, "next_prediction": True,
                     "next_evaluation": True},
    }


def make_rows(n: int, split: str = "train", words: int = 12, seed: int = 0, long_every: int = 0,
              long_words: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        w = long_words if long_every and i % long_every == long_every - 1 else words
        s = step(100 + i, 0, w, rng)
        rows.append(
            {
                "prompt": [{"role": "user", "content": s["update_prompt"]}],
                "data_source": "llm_as_rnn_memory_update",
                "ability": "clinical_summary",
                "reward_model": {"style": "rubric", "ground_truth": json.dumps(s)},
                "extra_info": {"split": split, "patient_id": s["patient_id"], "visit_index": 0,
                               "visit_id": s["visit_id"], "index": i},
            }
        )
    return rows


def write_parquet(path, rows: list[dict]) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return str(path)


def standin_reward(prompts, completions, **columns) -> list[float]:
    """TEST STAND-IN for llmrnn.reward.trl_reward_func (no judge server here): a real, input-dependent
    score (share of distinct characters in the completion), so rewards differ within a group."""
    out = []
    for c in completions:
        text = c[-1]["content"] if isinstance(c, list) else str(c)
        out.append(len(set(text)) / (len(text) + 1))
    return out
