"""Stage `merge`: fold the trained LoRA into the base model and prove the result is right.

Inputs it accepts (`--adapter`):
- a PEFT adapter folder (adapter_config.json + adapter_model.safetensors): what TRL writes, or what the
  verl engine copies from verl 0.7's `global_step_N/actor/lora_adapter` (or, for verl 0.9, gathers from
  the checkpoint's FSDP shards with verl's model merger: llmrnn.train.verl_adapter.adapter_from_checkpoint);
- a verl checkpoint: the checkpoints root (latest_checkpointed_iteration.txt), `global_step_N/` or
  `global_step_N/actor/`; its `actor/lora_adapter/` is used (a verl 0.9 LoRA checkpoint has none: one line
  names the gather step);
- a verl FULL fine-tune (actor/ with FSDP shards, no lora_adapter): gathered by `python -m verl.model_merger
  merge --backend fsdp` (only when verl is importable: the gpu extra / envs/verl.yaml);
- a full HF model folder (full fine-tune written by TRL): copied as is, then checked.

verl's own merger never merges a LoRA here (for verl 0.9 it only gathers the adapter, in the training job):
`python -m verl.model_merger merge` on a LoRA run leaves the base weights untouched and (0.7.1) writes
lora_alpha=0 (verl issues #3050, #4553, #5325, #7285). We merge with PEFT `merge_and_unload()`; an adapter
whose alpha is 0 (or missing) is repaired from the training config (`train.lora.alpha`) and the repair is
logged and recorded.

Settings: `--cfg` is parsed once, here at the CLI boundary (`stage_settings`), into `settings.Merge` and
`settings.Train`; the stage functions take those models (a key the config leaves out has its default).

Checks (merge_check.json, all must pass, else CheckFailed and no merged folder is left behind):
- adapter_loaded: every tensor of the adapter file found its LoRA slot in the base model;
- adapter_config: rank and alpha (after any repair) equal train.lora.rank and train.lora.alpha;
- weights_differ: merged tensors that differ from the base (at the saved dtype): > 0, and none outside
  the adapter's target modules;
- logits_match: merged logits == base+adapter (unmerged PEFT, float32) logits on probe prompts within
  max(atol + rtol * max|ref|, rounding_margin * noise), where noise is what rounding the BASE weights to
  the saved dtype alone does to its logits (0 for float32); also reports how much the adapter moves the
  logits at all (adapter_effect);
- reload_generate: the merged folder (config, safetensors, tokenizer, generation config, no adapter files)
  reloads with AutoModelForCausalLM/AutoTokenizer and generates.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import time
from pathlib import Path

from llmrnn import io
from llmrnn.errors import CheckFailed, InputError
from llmrnn.lora_files import repair_alpha, saved_lora_tensors
from llmrnn.merge.adapter import base_dir_of, read_adapter_config, resolve_adapter
from llmrnn.merge.fold import merge_lora, merge_verl_fsdp
from llmrnn.merge.verify import _fail, _report, check_adapter_config, verify_merge
from llmrnn.rope import keep_base_rope
from llmrnn.settings.base import parse
from llmrnn.settings.release import Merge
from llmrnn.settings.train import Train

log = logging.getLogger(__name__)

__all__ = [
    "resolve_adapter",
    "run_check",
    "run_merge",
    "stage_settings",
]


def stage_settings(cfg: dict) -> tuple[Merge, Train]:
    """`--cfg` as the settings models, parsed once: the merge section, and the train section whose LoRA
    (train.lora.rank, train.lora.alpha) the adapter is checked against and an alpha of 0 repaired from."""
    return parse(Merge, cfg.get("merge") or {}, "merge"), parse(Train, cfg.get("train") or {}, "train")


def _repaired_config(adapter_dir: Path, train: Train) -> tuple[dict, dict]:
    """The adapter's config, an alpha of 0 repaired from train.lora.alpha (llmrnn.lora_files.repair_alpha)."""
    return repair_alpha(read_adapter_config(adapter_dir), str(adapter_dir), [("train.lora.alpha", train.lora.alpha)])


def run_merge(base: str | Path, adapter: str | Path, out: str | Path, check: str | Path, settings: Merge,
              train: Train) -> dict:
    """Merge and verify; the merged folder appears at `out` only when every check passed."""
    base_dir, out_dir, check_path = base_dir_of(base), Path(out), Path(check)
    source = resolve_adapter(adapter)
    log.info("adapter source: %s at %s", source.kind, source.path)
    t0 = time.monotonic()
    check_path.unlink(missing_ok=True)
    if out_dir.exists():  # a stale merge must not survive a failing one
        shutil.rmtree(out_dir)
    with io.atomic_dir(out_dir) as tmp:
        adapter_cfg, repair = None, {}
        if source.kind in ("peft_adapter", "verl_lora_adapter"):
            if saved_lora_tensors(source.path) == 0:  # e.g. verl's 16-byte adapter_model.safetensors
                raise CheckFailed(f"{source.path}: an empty adapter (no LoRA tensor in adapter_model.*): the "
                                  "trainer's LoRA collection saved nothing, so there is nothing to merge; "
                                  "not a reward problem (docs/troubleshooting.md: reward flat)")
            adapter_cfg, repair = _repaired_config(source.path, train)
            info = merge_lora(base_dir, source, adapter_cfg, tmp, settings)
        elif source.kind == "verl_fsdp_full":
            info = merge_verl_fsdp(source.path, tmp, base_dir)
        else:
            shutil.copytree(source.path, tmp, dirs_exist_ok=True)
            info = {"dtype": "as trained", "device": "cpu"}
        info["rope"] = keep_base_rope(base_dir, tmp)
        checks = verify_merge(base_dir, source, adapter_cfg, tmp, settings)
        if adapter_cfg is not None:
            checks["adapter_config"] = check_adapter_config(adapter_cfg, train.lora, repair)
        report = _report(base_dir, source, out_dir, checks, {**info, "seconds": 0.0})
        report["seconds"] = round(time.monotonic() - t0, 2)
        if not report["ok"]:
            _fail(report, check_path)
    io.write_json(check_path, report)
    check_path.with_name(check_path.name.replace(".json", "") + ".failed.json").unlink(missing_ok=True)
    log.info("merge check passed: %s", ", ".join(f"{k}=ok" for k in checks))
    return report


def run_check(base: str | Path, adapter: str | Path | None, merged: str | Path, check: str | Path,
              settings: Merge, train: Train) -> dict:
    """Verify a merged folder made elsewhere (e.g. by verl's model_merger) against base + adapter."""
    base_dir, merged_dir, check_path = base_dir_of(base), Path(merged), Path(check)
    if not (merged_dir / "config.json").is_file():
        raise InputError(f"{merged_dir}: merged folder has no config.json")
    source = resolve_adapter(adapter) if adapter else None
    adapter_cfg, repair = None, {}
    if source is not None and source.kind in ("peft_adapter", "verl_lora_adapter"):
        adapter_cfg, repair = _repaired_config(source.path, train)
    checks = verify_merge(base_dir, source, adapter_cfg, merged_dir, settings)
    if adapter_cfg is not None:
        checks["adapter_config"] = check_adapter_config(adapter_cfg, train.lora, repair)
    report = _report(base_dir, source, merged_dir, checks, {})
    if not report["ok"]:
        _fail(report, check_path)
    io.write_json(check_path, report)
    return report


# ----------------------------------------------------------------------------- CLI
def _cmd_run(args: argparse.Namespace) -> None:
    run_merge(args.base, args.adapter, args.out, args.check, *stage_settings(args.cfg))


def _cmd_check(args: argparse.Namespace) -> None:
    run_check(args.base, args.adapter, args.merged, args.check, *stage_settings(args.cfg))


def register(sub: argparse._SubParsersAction) -> None:
    from llmrnn.cli import json_arg

    merge = sub.add_parser("merge", help="merge the LoRA into the base model and verify it")
    msub = merge.add_subparsers(dest="merge_command", required=True)
    cfg_help = ('JSON: {"merge": {...}, "train": {"lora": {"rank": R, "alpha": A}}}: the merge section and the LoRA '
                "the adapter must match (train.lora.rank, train.lora.alpha); a key left out has its config default")

    p = msub.add_parser("run", help="PEFT merge_and_unload + checks -> merged folder and merge_check.json")
    p.add_argument("--base", required=True, help="base model folder or its .ready marker")
    p.add_argument("--adapter", required=True, help="adapter folder or verl checkpoint path")
    p.add_argument("--out", required=True, help="output: merged HF model folder")
    p.add_argument("--check", required=True, help="output: merge_check.json")
    p.add_argument("--cfg", type=json_arg, default={}, help=cfg_help)
    p.set_defaults(func=_cmd_run)

    p = msub.add_parser("check", help="verify a merged folder made elsewhere (e.g. by verl's merger)")
    p.add_argument("--base", required=True)
    p.add_argument("--adapter", help="the adapter it should contain (omit for a full fine-tune)")
    p.add_argument("--merged", required=True)
    p.add_argument("--check", required=True, help="output: the check report JSON")
    p.add_argument("--cfg", type=json_arg, default={}, help=cfg_help)
    p.set_defaults(func=_cmd_check)
