"""One eval shard: the forward pass of a variant over its patients."""

from __future__ import annotations

from pathlib import Path

from llmrnn import rnn
from llmrnn.errors import InputError
from llmrnn.evaluate.recall import MEMORY_VARIANTS, REFERENCE, variant_mode
from llmrnn.prompts import load_prompts


# ----------------------------------------------------------------------------- forward pass
def run_shard(
    patients: list[dict], variant: str, roles_cfg: dict, prompts_file: str, seed: int,
    memory_model: str | None = None, label: str = "eval", memory_adapter: str | None = None,
    replay: list[dict] | None = None,
) -> tuple[list[dict], dict]:
    """The LLM-as-RNN forward pass (llmrnn.rnn.run_forward, batched per visit step) of one variant.

    base/trained: memory = "rnn" and only the memory role's weights differ (`memory_model`); baselines
    use the same prediction/evaluation roles with memory "none", "full_history" or "memprompt". Every variant gets
    the same roles config, prompts and seed, so sampling is paired per (patient, visit, role).
    `replay`: the base variant's records of the same patients (the same shard of the same eval config): the
    trained variant's calls whose prompts are all the base's (its first visit step's prediction and
    evaluation) take the base's outputs instead of being made again (llmrnn.rnn.run_forward).
    """
    mode = variant_mode(variant)
    if variant in MEMORY_VARIANTS and variant != REFERENCE and not memory_model:
        raise InputError(f"eval {variant}: needs --memory-model (the merged trained model directory)")
    if memory_model and not (Path(memory_model) / "config.json").is_file():
        raise InputError(f"{memory_model}: not a HF model directory (no config.json); memory model of {variant}")
    prompts = load_prompts(prompts_file)
    if replay is not None and (variant == REFERENCE or mode != "rnn"):
        raise InputError(f"eval {variant}: --replay is for a memory model variant other than {REFERENCE}")
    if replay is not None:  # in this chunk's order; a patient it lacks is run_forward's refusal (the CLI checks first)
        by_id = {str(r.get("patient_id")): r for r in replay}
        replay = [by_id.get(str(p["subject_id"]), {}) for p in patients]
    if memory_adapter and not (Path(memory_adapter) / "adapter_config.json").is_file():
        raise InputError(f"{memory_adapter}: not a PEFT adapter folder (no adapter_config.json); memory adapter of {variant}")
    # with a vLLM memory role the trained model runs as its adapter on the base engine (one engine per GPU)
    roles = rnn.make_roles(roles_cfg, {"memory": memory_model} if memory_model else None,
                           memory_adapter=memory_adapter if variant == "trained" else None)
    stats: dict = {}
    results = rnn.run_forward(patients, roles, prompts, memory=mode, seed=seed, stats=stats, label=label,
                              replay=replay)
    for rec in results:
        rec["variant"] = variant
    return results, stats
