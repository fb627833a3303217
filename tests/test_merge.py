"""Merge stage: a real LoRA adapter on the tiny model, PEFT merge, every check, and the ways a merge goes wrong."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmrnn import merge
from llmrnn import rope as merge_rope
from llmrnn.errors import CheckFailed
from llmrnn.merge import verify as merge_verify
from llmrnn.settings.release import Merge
from llmrnn.settings.train import Train
from tests.conftest import llmrnn_in_process

LORA = {"train": {"lora": {"rank": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj", "up_proj"]}}}
TRAIN = Train.model_validate(LORA["train"])  # the LoRA of the adapters below, as the CLI parses --cfg


def _make_adapter(base: Path, out: Path, random_b: bool = True) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(base)
    peft_model = get_peft_model(
        model,
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], task_type="CAUSAL_LM",
                   init_lora_weights=not random_b),  # False: lora_B random, as after training; True: B = 0
    )
    peft_model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def adapter_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """A real PEFT adapter (r=4, alpha=8) with non-zero lora_B, like one that training has moved."""
    return _make_adapter(tiny_model_dir, tmp_path_factory.mktemp("adapter") / "adapter")


def _set_alpha(adapter: Path, alpha) -> None:
    cfg_path = adapter / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["lora_alpha"] = alpha
    cfg_path.write_text(json.dumps(cfg))


def test_merge_of_a_trl_adapter_passes_every_check(tiny_model_dir, adapter_dir, tmp_path):
    out, check = tmp_path / "merged", tmp_path / "merge_check.json"
    report = merge.run_merge(tiny_model_dir, adapter_dir, out, check, Merge(dtype="float32"), TRAIN)
    on_disk = json.loads(check.read_text())
    assert on_disk["ok"] is True and report["ok"] is True
    checks = on_disk["checks"]
    assert set(checks) == {"files", "adapter_loaded", "weights_differ", "logits_match", "reload_generate",
                           "adapter_config", "rope"}
    assert all(c["ok"] for c in checks.values())
    # 2 layers x (q_proj, v_proj, up_proj) changed, nothing else
    assert checks["weights_differ"]["changed_tensors"] == 6 == checks["weights_differ"]["expected_changed"]
    assert checks["weights_differ"]["n_unexpected_changed"] == 0
    assert checks["logits_match"]["max_abs_diff"] < 1e-4 < checks["logits_match"]["adapter_effect"]
    assert checks["adapter_config"]["rank"] == 4 and checks["adapter_config"]["alpha"] == 8
    assert checks["reload_generate"]["new_tokens"] > 0
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= names
    assert not any(n.startswith("adapter_") for n in names)
    assert not list(tmp_path.glob(".merged.*"))  # no temp folder left behind


def test_bfloat16_merge_is_checked_against_the_rounding_noise_floor(tiny_model_dir, adapter_dir, tmp_path):
    report = merge.run_merge(tiny_model_dir, adapter_dir, tmp_path / "m", tmp_path / "c.json",
                             Merge(dtype="bfloat16"), TRAIN)
    lm = report["checks"]["logits_match"]
    assert report["ok"] and lm["rounding_noise"] > 0 and lm["max_abs_diff"] <= lm["tolerance"]
    assert report["checks"]["weights_differ"]["changed_tensors"] == 6  # bf16 casting alone changes nothing
    assert report["dtype"] == "bfloat16"


def test_verl_checkpoint_with_alpha_zero_is_repaired_from_the_training_config(tiny_model_dir, adapter_dir, tmp_path):
    root = tmp_path / "checkpoints"
    lora = root / "global_step_3" / "actor" / "lora_adapter"
    shutil.copytree(adapter_dir, lora)
    _set_alpha(lora, 0)  # what verl's model_merger writes for a LoRA run
    (root / "latest_checkpointed_iteration.txt").write_text("3\n")
    report = merge.run_merge(tiny_model_dir, root, tmp_path / "m", tmp_path / "c.json", Merge(), TRAIN)
    assert report["source_kind"] == "verl_lora_adapter"
    assert report["adapter_resolved"] == str(lora)
    ac = report["checks"]["adapter_config"]
    assert ac["alpha_repaired"] is True and ac["original_alpha"] == 0 and ac["alpha"] == 8
    # repaired merge equals the true one: logits match base+adapter with alpha 8
    assert report["checks"]["logits_match"]["max_abs_diff"] < 1e-4


def test_a_merge_without_a_train_section_checks_the_adapter_against_trains_defaults(tiny_model_dir, adapter_dir,
                                                                                     tmp_path):
    """`--cfg` without `train` means the run trained with train's defaults (rank 16, alpha 32): an alpha of 0
    is repaired from the default alpha and the r=4 adapter is refused, the line naming train.lora.rank."""
    broken = tmp_path / "adapter"
    shutil.copytree(adapter_dir, broken)
    _set_alpha(broken, 0)
    settings, train = merge.stage_settings({"merge": {}})
    assert (train.lora.rank, train.lora.alpha) == (16, 32)
    with pytest.raises(CheckFailed, match=r"adapter_config: rank 4 != configured 16 \(train\.lora\.rank\)"):
        merge.run_merge(tiny_model_dir, broken, tmp_path / "merged", tmp_path / "c.json", settings, train)
    assert not (tmp_path / "merged").exists() and not (tmp_path / "c.json").exists()
    adapter_config = json.loads((tmp_path / "c.failed.json").read_text())["checks"]["adapter_config"]
    assert adapter_config["alpha_repaired"] is True and adapter_config["alpha"] == 32
    assert adapter_config["repaired_from"] == "train.lora.alpha"


@pytest.mark.parametrize("cfg, line", [
    ({"train": {"lora": {"rank": 0, "alpha": 8}}}, "train.lora.rank: Input should be greater than or equal to 1 (got 0)"),
    ({"train": {"lora_alpha": 8}}, "train.lora_alpha: Extra inputs are not permitted (got 8)"),
    ({"merge": {"probe_prompts": []}}, "merge.probe_prompts: List should have at least 1 item after validation, not 0"),
])
def test_merge_refuses_a_bad_setting_in_one_line_naming_its_key(tmp_path, capsys, cfg, line):
    """--cfg is parsed into settings.Merge and settings.Train before anything is read: a bad key is one line
    naming it by its real dotted path (the old spellings lora_rank/lora_alpha are refused, not read)."""
    from llmrnn import cli

    rc = cli.main(["merge", "run", "--base", str(tmp_path / "absent"), "--adapter", str(tmp_path / "absent"),
                   "--out", str(tmp_path / "m"), "--check", str(tmp_path / "c.json"), "--cfg", json.dumps(cfg)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"llmrnn merge: error: {line}"), err
    assert not (tmp_path / "m").exists() and not (tmp_path / "c.json").exists()


def test_alpha_mismatch_fails_and_leaves_no_merged_folder(tiny_model_dir, adapter_dir, tmp_path):
    (tmp_path / "merged").mkdir()
    (tmp_path / "merged" / "config.json").write_text("{}")  # a stale merge from an earlier run
    train = Train.model_validate({"lora": {"rank": 4, "alpha": 16}})
    with pytest.raises(CheckFailed, match=r"adapter_config: alpha 8 != configured 16 \(train\.lora\.alpha\)"):
        merge.run_merge(tiny_model_dir, adapter_dir, tmp_path / "merged", tmp_path / "c.json", Merge(), train)
    assert not (tmp_path / "merged").exists() and not (tmp_path / "c.json").exists()
    failed = json.loads((tmp_path / "c.failed.json").read_text())
    assert failed["ok"] is False and failed["checks"]["adapter_config"]["ok"] is False
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".merged")]


def test_base_weights_copied_as_merged_are_caught(tiny_model_dir, adapter_dir, tmp_path):
    """What verl's model_merger hands back for a LoRA run: the base weights, byte for byte."""
    fake_merged = tmp_path / "verl_merged"
    shutil.copytree(tiny_model_dir, fake_merged)
    with pytest.raises(CheckFailed, match=r"weights_differ: merged weights are identical to the base"):
        merge.run_check(tiny_model_dir, adapter_dir, fake_merged, tmp_path / "c.json", Merge(), TRAIN)
    assert not (tmp_path / "c.json").exists()


def test_an_adapter_that_never_moved_fails_with_a_hint(tiny_model_dir, tmp_path):
    zero = _make_adapter(tiny_model_dir, tmp_path / "zero", random_b=False)
    with pytest.raises(CheckFailed, match=r"identical to the base.*every lora_B tensor is zero"):
        merge.run_merge(tiny_model_dir, zero, tmp_path / "m", tmp_path / "c.json", Merge(), TRAIN)


def test_adapter_tensors_that_find_no_slot_are_reported(tiny_model_dir, adapter_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "renamed"
    shutil.copytree(adapter_dir, bad)
    weights = load_file(bad / "adapter_model.safetensors")
    save_file({k.replace("q_proj", "qq_proj"): v for k, v in weights.items()}, bad / "adapter_model.safetensors")
    with pytest.raises(CheckFailed, match=r"adapter_loaded: 4 adapter tensors found no slot"):
        merge.run_merge(tiny_model_dir, bad, tmp_path / "m", tmp_path / "c.json", Merge(), TRAIN)


def test_fsdp_full_finetune_needs_verl(tiny_model_dir, tmp_path, monkeypatch):
    """A verl FSDP checkpoint cannot be produced here (no GPU); an empty shard file stands in for one."""
    actor = tmp_path / "global_step_1" / "actor"
    actor.mkdir(parents=True)
    (actor / "model_world_size_1_rank_0.pt").write_bytes(b"")
    src = merge.resolve_adapter(tmp_path / "global_step_1")
    assert src.kind == "verl_fsdp_full"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CheckFailed, match=r"verl is not importable"):
        merge.run_merge(tiny_model_dir, actor, tmp_path / "m", tmp_path / "c.json", Merge(), TRAIN)
    assert not (tmp_path / "m").exists()


def test_the_tied_copy_verls_merger_saves_for_a_full_fine_tune_is_dropped_only_where_it_is_the_tied_tensor(
        tiny_model_dir, tmp_path):
    """verl's merger casts each tensor to bfloat16 apart, so a tied-embedding model (the tiny one, Llama 3.2,
    SmolLM2) comes back with lm_head.weight as a second tensor the base does not hold: dropped when it is
    model.embed_tokens.weight's bytes (the folder is then the base's architecture and loads tied); kept, for
    the merge check to refuse, when it is not."""
    import torch
    from safetensors.torch import load_file, save_file

    from llmrnn.merge.fold import _drop_tied_copies

    folder = tmp_path / "merged"
    shutil.copytree(tiny_model_dir, folder)
    base_names = set(load_file(tiny_model_dir / "model.safetensors"))
    tensors = {k: v.to(torch.bfloat16) for k, v in load_file(folder / "model.safetensors").items()}
    assert "lm_head.weight" not in tensors
    save_file({**tensors, "lm_head.weight": tensors["model.embed_tokens.weight"].clone()},
              folder / "model.safetensors", metadata={"format": "pt"})
    assert _drop_tied_copies(folder) == ["lm_head.weight"]
    assert set(load_file(folder / "model.safetensors")) == base_names
    other = tensors["model.embed_tokens.weight"].clone()
    other[0, 0] += 1
    save_file({**tensors, "lm_head.weight": other}, folder / "model.safetensors", metadata={"format": "pt"})
    assert _drop_tied_copies(folder) == []
    assert "lm_head.weight" in load_file(folder / "model.safetensors")


def test_a_verl_09_lora_checkpoint_is_named_as_one_and_the_gather_step_given(tmp_path):
    """verl 0.9's engine writes a LoRA run's actor/ as FSDP shards + lora_train_meta.json, with no lora_adapter/
    (tests/test_train_verl.py::test_verl_fit_rehearsed_... makes a real one, and merges what train run's
    adapter step gathers from it with verl's merger); read as a full fine-tune it would be merged as one. One line names it and the step to take."""
    actor = tmp_path / "global_step_3" / "actor"
    actor.mkdir(parents=True)
    (actor / "model_world_size_1_rank_0.pt").write_bytes(b"")
    (actor / "lora_train_meta.json").write_text('{"r": 16, "lora_alpha": 32, "task_type": "CAUSAL_LM"}')
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("3")
    with pytest.raises(CheckFailed, match=r"a verl 0.9 LoRA checkpoint .*verl\.model_merger merge --backend fsdp"):
        merge.resolve_adapter(tmp_path)


def test_cli_merge_run_on_the_lora_adapter_verl_071_writes(tiny_model_dir, tmp_path):
    """verl 0.7.1 writes adapter_config.json from asdict(LoraConfig): runtime_config (a dict) and every other
    field. `llmrnn merge run` on that checkpoint reads the config as PEFT's own from_pretrained does; before,
    it built LoraConfig(runtime_config=<dict>) and PeftModel failed: "'dict' object has no attribute
    'ephemeral_gpu_offload'"."""
    import torch
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM

    from tests.verl.verl_lora import save_like_verl_071

    torch.manual_seed(2)
    # the LoraConfig verl 0.7.1 builds (fsdp_workers.py _build_model_optimizer): no dropout, bias none
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(
        task_type=TaskType.CAUSAL_LM, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"],
        exclude_modules=None, bias="none", init_lora_weights=False))
    root = tmp_path / "checkpoints"
    save_like_verl_071(model, str(root / "global_step_2" / "actor" / "lora_adapter"))
    (root / "latest_checkpointed_iteration.txt").write_text("2")
    written = json.loads((root / "global_step_2" / "actor" / "lora_adapter" / "adapter_config.json").read_text())
    assert isinstance(written["runtime_config"], dict)  # what broke our merge
    proc = llmrnn_in_process("merge", "run", "--base", str(tiny_model_dir), "--adapter", str(root),
                             "--out", str(tmp_path / "m"), "--check", str(tmp_path / "c.json"), "--cfg", json.dumps(LORA))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "c.json").read_text())
    assert report["ok"] is True and report["source_kind"] == "verl_lora_adapter"
    assert report["checks"]["weights_differ"]["changed_tensors"] == 6
    assert report["checks"]["logits_match"]["max_abs_diff"] < 1e-4 < report["checks"]["logits_match"]["adapter_effect"]


@pytest.mark.e2e  # a slow tier test (a workflow, CLI or training run of its own): `make test-e2e`
def test_cli_merge_run_exit_codes(tiny_model_dir, adapter_dir, tmp_path):
    exe = Path(sys.executable).parent / "llmrnn"
    base = [str(exe), "merge", "run", "--base", str(tiny_model_dir), "--adapter", str(adapter_dir),
            "--out", str(tmp_path / "m"), "--check", str(tmp_path / "c.json")]
    bad = subprocess.run(base + ["--cfg", json.dumps({"train": {"lora": {"rank": 8, "alpha": 8}}})],
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 3
    assert "merge check failed: adapter_config: rank 4 != configured 8" in bad.stderr
    assert "Traceback" not in bad.stderr
    ok = subprocess.run(base + ["--cfg", json.dumps(LORA)], capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    assert json.loads((tmp_path / "c.json").read_text())["ok"] is True


# the RoPE of Llama-3.x as its Hub config.json spells it (transformers 4.x keys)
LLAMA3_ROPE = {"rope_theta": 500000.0, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                                        "original_max_position_embeddings": 64, "rope_type": "llama3"}}


def test_merged_config_keeps_the_base_rope_for_transformers_457_and_vllm(tiny_model_dir, adapter_dir, tmp_path):
    """merge_model runs in envs/cpu.yaml (transformers 5.x), which writes RoPE only as `rope_parameters`;
    transformers 4.57 (the GPU lock) and vLLM 0.17 read `rope_theta`/`rope_scaling` and would fall back to
    theta 10000 without llama3 scaling. The merged config.json, loaded by the GPU lock's transformers, has
    the base's RoPE; merge_check.json records it."""
    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    cfg = json.loads((base / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    (base / "config.json").write_text(json.dumps({**cfg, **LLAMA3_ROPE}))
    out, check = tmp_path / "merged", tmp_path / "merge_check.json"
    report = merge.run_merge(base, adapter_dir, out, check, Merge(dtype="float32"), TRAIN)
    assert report["ok"] and report["checks"]["rope"]["ok"], report["checks"].get("rope")
    written = json.loads((out / "config.json").read_text())
    assert {k: written.get(k) for k in LLAMA3_ROPE} == LLAMA3_ROPE
    venv = Path(__file__).resolve().parents[1] / ".venv-gpu-cpu"
    if not (venv / ".installed-llmrnn").exists():
        pytest.skip("no .venv-gpu-cpu (the GPU lock's transformers): make .venv-gpu-cpu/.installed-llmrnn")
    python = venv / "bin" / "python"
    probe = ("import json, sys; from transformers import AutoConfig, __version__ as v; c = [AutoConfig.from_pretrained(p) "
             "for p in sys.argv[1:]]; print(json.dumps({'v': v, 'rope': [[x.rope_theta, x.rope_scaling] for x in c]}))")
    proc = subprocess.run([str(python), "-c", probe, str(base), str(out)], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["v"].startswith("4.57")
    (base_theta, base_scaling), (theta, scaling) = got["rope"]
    assert base_theta == theta == 500000.0 and scaling == base_scaling and scaling["rope_type"] == "llama3"


def test_a_merged_config_without_the_base_rope_fails_the_check(tiny_model_dir, tmp_path):
    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    cfg = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**cfg, **LLAMA3_ROPE}))
    check = merge_rope._rope_check(base, tiny_model_dir)  # a folder written by transformers 5.x alone
    assert not check["ok"] and check["base"]["rope_theta"] == 500000.0
    assert "rope:" in merge_verify._failures({"rope": check})[0]


def test_the_temp_folder_of_a_killed_merge_goes_with_the_next_merge_run(tiny_model_dir, adapter_dir, tmp_path):
    """A merge killed after writing the merged weights (SIGKILL: no cleanup runs) leaves its temp folder
    `.merged.XXXXXXXX.tmp` (517 MB for SmolLM2) beside an absent merged/ and merge_check.json; the next
    `llmrnn merge run`, which the workflow then plans again, removes it and writes merged/ in its place."""
    import os
    import signal

    out, check = tmp_path / "merged", tmp_path / "merge_check.json"
    killed = (
        "import os, signal, sys, json; from llmrnn import merge\n"
        "def verify(*a, **k): os.kill(os.getpid(), signal.SIGKILL)  # the weights are saved by now\n"
        "merge.verify_merge = verify\n"
        "merge.run_merge(*sys.argv[1:5], *merge.stage_settings(json.loads(sys.argv[5])))\n"
    )
    args = [str(tiny_model_dir), str(adapter_dir), str(out), str(check), json.dumps(LORA)]
    proc = subprocess.run([sys.executable, "-c", killed, *args], capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(Path(merge.__file__).parents[2])})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    (left,) = tmp_path.glob(".merged.*.tmp")
    assert (left / "model.safetensors").is_file() and not out.exists() and not check.exists()

    rerun = llmrnn_in_process("merge", "run", "--base", args[0], "--adapter", args[1], "--out", args[2],
                              "--check", args[3], "--cfg", args[4])
    assert rerun.returncode == 0, rerun.stderr
    assert not left.exists() and not list(tmp_path.glob(".merged.*"))
    assert json.loads(check.read_text())["ok"] is True and (out / "model.safetensors").is_file()


def test_an_empty_adapter_is_named_as_one_not_blamed_on_the_rewards(tiny_model_dir, adapter_dir, tmp_path):
    """verl 0.7.1 with peft 0.21.x writes lora_adapter/adapter_model.safetensors with no tensor (16 bytes):
    the merge says the adapter is empty, not that equal rewards gave GRPO no gradient."""
    from safetensors.torch import save_file

    empty = tmp_path / "global_step_3" / "actor" / "lora_adapter"
    shutil.copytree(adapter_dir, empty)
    save_file({}, empty / "adapter_model.safetensors")
    assert (empty / "adapter_model.safetensors").stat().st_size == 16
    with pytest.raises(CheckFailed, match=r"an empty adapter \(no LoRA tensor") as exc:
        merge.run_merge(tiny_model_dir, empty, tmp_path / "m", tmp_path / "c.json", Merge(), TRAIN)
    assert "equal rewards" not in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "m").exists()
    with pytest.raises(CheckFailed, match=r"an empty adapter"):  # the checkpoint folder resolves to the same
        merge.run_merge(tiny_model_dir, tmp_path / "global_step_3", tmp_path / "m", tmp_path / "c.json",
                        Merge(), TRAIN)


def test_the_one_alpha_repair_takes_the_first_source_that_has_an_alpha():
    """llmrnn.lora_files.repair_alpha, which the merge (from train.lora.alpha) and verl's adapter step (from
    lora_train_meta.json, else train.lora.alpha) both use: a real alpha is kept, 0/None is set from the first
    source that has one, and with none the line names the sources."""
    from llmrnn.lora_files import repair_alpha

    kept, record = repair_alpha({"r": 4, "lora_alpha": 8}, "a", [("train.lora.alpha", 16)])
    assert kept["lora_alpha"] == 8 and record == {"original_alpha": 8, "alpha_repaired": False, "repaired_from": None}
    sources = [("lora_train_meta.json", None), ("train.lora.alpha", 16)]
    for written in (0, None):
        fixed, record = repair_alpha({"r": 4, "lora_alpha": written}, "a", sources)
        assert fixed["lora_alpha"] == 16 and record["repaired_from"] == "train.lora.alpha" and record["alpha_repaired"]
    with pytest.raises(CheckFailed, match=r"^a: lora_alpha is 0 .*\['lora_train_meta.json'\] gives one"):
        repair_alpha({"lora_alpha": 0}, "a", [("lora_train_meta.json", None)])
