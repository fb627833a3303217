"""Training preflight: impossible batch geometry, overlong prompts, LR schedule, GPUs, disk."""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmrnn.preflight import training_checks
from llmrnn.train import config as tcfg
from tests.verl.rows import make_rows, write_parquet

GOOD = {"engine": "trl", "group_size": 4, "batch": {"train": 2, "mini": 2, "micro_per_gpu": 4},
        "max_prompt_length": 256, "max_response_length": 16, "epochs": 2}


@pytest.fixture
def parquets(tmp_path):
    return (write_parquet(tmp_path / "train.parquet", make_rows(8)),
            write_parquet(tmp_path / "val.parquet", make_rows(2, split="val", seed=1)))


def _cfg(**over):
    cfg = json.loads(json.dumps(GOOD))
    for key, value in over.items():
        if isinstance(value, dict):
            cfg.setdefault(key, {}).update(value)
        else:
            cfg[key] = value
    return cfg


def test_good_config_passes_with_numbers(parquets, tiny_model_dir, tmp_path):
    res = training_checks(_cfg(), *parquets, tiny_model_dir, out_dir=tmp_path / "train")
    assert res["ok"], res["problems"]
    assert res["data"]["train"]["rows"] == 8 and res["data"]["train"]["overlong_rows"] == 0
    assert res["data"]["steps_per_epoch"] == 4 and res["data"]["planned_steps"] == 8
    assert res["geometry"]["grad_accum"] == 2  # 2 prompts x 4 rollouts / micro 4
    assert res["lr_schedule"]["lr_first_step"] == res["lr_schedule"]["lr_last_step"] == 3e-6
    assert res["disk"]["free_gb"] > 0


def test_reference_geometry_is_possible():
    # 16 prompts x G=8 on 2 GPUs: 64 responses per GPU per update, micro 4 -> 16 micro steps
    geo = tcfg.settings({"n_gpus_per_node": 2, "rollout": {"tensor_parallel": 2}}).geometry
    assert geo.problems == () and geo.grad_accum == 16 and geo.responses_per_step == 128


@pytest.mark.parametrize(
    "over, message",
    [
        ({"batch": {"micro_per_gpu": 3}}, "micro_per_gpu=3 does not divide the 8 responses"),
        ({"batch": {"train": 2, "mini": 4}}, "batch.mini=4 is larger than train.batch.train=2"),
        ({"batch": {"train": 6, "mini": 4, "micro_per_gpu": 4}}, "not a multiple of train.batch.mini=4"),
        ({"engine": "verl", "n_gpus_per_node": 3, "group_size": 4, "rollout": {"tensor_parallel": 1}},
         "cannot be split evenly over 3 GPUs"),
        ({"engine": "verl", "n_gpus_per_node": 2, "rollout": {"tensor_parallel": 4}},
         "tensor_parallel=4 does not divide"),
    ],
)
def test_impossible_geometry_is_rejected(parquets, tiny_model_dir, over, message):
    res = training_checks(_cfg(**over), *parquets, tiny_model_dir, gpus_available=8)
    assert not res["ok"]
    assert any(message in p for p in res["problems"]), res["problems"]


def test_check_preflight_and_trl_read_the_one_geometry_of_the_settings(parquets, tiny_model_dir):
    """The batch geometry is one derived value of the Train settings (Train.geometry): `llmrnn check`,
    preflight and the TRL engine report the same numbers and the same problems, each in its own way (check:
    a line per problem; preflight: its problems and geometry; TRL: a refusal before loading anything)."""
    from llmrnn.check.training import check_training
    from llmrnn.errors import CheckFailed, InputError
    from llmrnn.train.trl_engine import check_knobs

    bad = _cfg(batch={"train": 6, "mini": 4, "micro_per_gpu": 3})
    geo = tcfg.settings(bad).geometry
    assert len(geo.problems) == 2 and geo.as_dict()["responses_per_step"] == 24
    pre = training_checks(bad, *parquets, tiny_model_dir, check_gpus=False)
    assert pre["geometry"] == geo.as_dict() and pre["problems"][:2] == list(geo.problems)
    assert check_training({"train": bad})[:2] == [f"train: {p}" for p in geo.problems]
    with pytest.raises(CheckFailed) as refused:
        check_knobs(tcfg.settings(bad))
    assert str(refused.value) == "train: " + "; ".join(geo.problems)
    # TRL runs only a section whose engine is trl: its geometry (one device) is not verl's (n_gpus_per_node)
    with pytest.raises(InputError, match=r"^train\.engine: 'verl', but the TRL engine was asked to run it"):
        check_knobs(tcfg.settings({**bad, "engine": "verl"}))


def test_overlong_prompts_are_counted_and_rejected(tmp_path, tiny_model_dir):
    train = write_parquet(tmp_path / "train.parquet", make_rows(9, long_every=3, long_words=120))
    val = write_parquet(tmp_path / "val.parquet", make_rows(2, split="val"))
    res = training_checks(_cfg(max_prompt_length=100), train, val, tiny_model_dir)
    assert not res["ok"]
    assert res["data"]["train"]["overlong_rows"] == 3 and res["data"]["val"]["overlong_rows"] == 0
    assert [e["row"] for e in res["data"]["train"]["overlong_examples"]] == [2, 5, 8]
    (problem,) = [p for p in res["problems"] if "max_prompt_length" in p]
    assert "3 of 9 prompts exceed train.max_prompt_length=100" in problem and "silently drop" in problem
    # the same data passes when the limit fits the longest prompt
    longest = res["data"]["train"]["prompt_tokens_max"]
    assert training_checks(_cfg(max_prompt_length=longest), train, val, tiny_model_dir)["ok"]


def test_too_few_rows_lr_warmup_gpus_and_disk(parquets, tiny_model_dir):
    res = training_checks(_cfg(batch={"train": 16, "mini": 16, "micro_per_gpu": 4}), *parquets, tiny_model_dir)
    assert any("fewer than one batch" in p for p in res["problems"])
    res = training_checks(_cfg(warmup_steps=8), *parquets, tiny_model_dir)
    assert any("warmup_steps=8 >= the run's 8 optimizer steps" in p for p in res["problems"])
    # the LR-schedule preflight: still below 30% of train.lr at optimizer step min(20, run) -> refused
    res = training_checks(_cfg(warmup_steps=7), *parquets, tiny_model_dir)
    assert res["lr_schedule"]["check_step"] == 8
    assert not any("LR schedule" in p for p in res["problems"])  # 8/7 of warmup: the full LR at step 8
    res = training_checks(_cfg(warmup_steps=40, epochs=20), *parquets, tiny_model_dir)
    assert res["lr_schedule"]["lr_at_check_step"] == pytest.approx(3e-6 * 20 / 40)
    assert not any("LR schedule" in p for p in res["problems"])  # 50% at step 20
    res = training_checks(_cfg(warmup_steps=70, epochs=20), *parquets, tiny_model_dir)
    assert any("LR schedule: at optimizer step 20 of 80 the LR is 8.57e-07, below 30%" in p
               for p in res["problems"]), res["problems"]
    res = training_checks(_cfg(engine="verl", n_gpus_per_node=2), *parquets, tiny_model_dir, gpus_available=0)
    assert any("n_gpus_per_node=2 but 0 GPU(s)" in p for p in res["problems"])
    res = training_checks(_cfg(min_free_disk_gb=1e6), *parquets, tiny_model_dir)
    assert any("min_free_disk_gb" in p for p in res["problems"])


def test_cli_exits_nonzero_with_clear_message(parquets, tiny_model_dir, tmp_path):
    out = tmp_path / "pre.json"
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "llmrnn"), "preflight", "training", "--cfg",
         json.dumps({"train": _cfg(batch={"micro_per_gpu": 3})}), "--train", parquets[0], "--val", parquets[1],
         "--model", str(tiny_model_dir), "--out", str(out)],
        capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 3
    assert "preflight: train.batch.micro_per_gpu=3 does not divide" in proc.stderr
    assert json.loads(out.read_text())["ok"] is False


def test_unknown_knob_is_an_input_error():
    from llmrnn.errors import InputError

    with pytest.raises(InputError, match="train.group_sise: Extra inputs are not permitted"):
        tcfg.settings({"group_sise": 4})
    with pytest.raises(InputError, match="train.group_size: Input should be greater than or equal to 2"):
        tcfg.settings({"group_size": 1})  # GRPO needs 2 rollouts per prompt (TRL refuses 1): the settings' bound


def test_early_stopping_with_verl_is_refused_not_ignored():
    from llmrnn.errors import InputError
    from llmrnn.train import config as tcfg

    assert tcfg.settings({"engine": "trl", "early_stopping": {"enabled": True}}).early_stopping.enabled
    with pytest.raises(InputError, match="train.early_stopping.enabled: true needs train.engine trl"):
        tcfg.settings({"engine": "verl", "early_stopping": {"enabled": True}})


def _stand_in(bin_dir: Path, name: str, script: str) -> None:
    """A stand-in quota tool on PATH (the real ones answer on a cluster's login and compute nodes)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / name).write_text("#!/bin/sh\n" + script)
    (bin_dir / name).chmod(0o755)


def test_disk_check_sees_the_lustre_quota_that_statvfs_does_not(parquets, tiny_model_dir, tmp_path, monkeypatch):
    """Issue 31 item 7: statvfs counted the filesystem's free space (terabytes on a scratch) while the user's
    quota allowed far less. A stand-in `lfs` answers as Lustre's does for `lfs quota -q -u USER DIR`: 9.9 of
    10 GB used, so ~0.1 GB left; the check refuses with the quota's numbers and names the knob."""
    bin_dir = tmp_path / "stand-in-bin"
    _stand_in(bin_dir, "lfs", '[ "$1 $2 $3" = "quota -q -u" ] || exit 2\n'
              'echo "     /lustre/scratch  9900000*  9765625 10000000       -   12345       0       0       -"\n')
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    res = training_checks(_cfg(min_free_disk_gb=1), *parquets, tiny_model_dir, out_dir=tmp_path / "train")
    assert res["disk"]["quota"] == "lfs quota -u {}: 10.14 GB used of a 10.0 GB quota".format(
        os.environ.get("USER") or getpass.getuser()), res["disk"]
    (line,) = [p for p in res["problems"] if "quota" in p]
    assert line.startswith("only 0.0 GB left under your quota at ") and "1.0 GB needed for train.min_free_disk_gb=1" \
        in line and "set train.keep_last (verl trainer.max_actor_ckpt_to_keep" in line, line


def test_disk_check_reads_quota_w_or_says_quotas_were_not_checked(parquets, tiny_model_dir, tmp_path, monkeypatch):
    from llmrnn.quota import _mount_of

    device, _ = _mount_of(tmp_path)
    bin_dir = tmp_path / "stand-in-bin"
    # `quota -w` as quota-tools prints it: 2 GB used of a 3 GB soft / 4 GB hard limit on this filesystem
    _stand_in(bin_dir, "quota", '[ "$1" = "-w" ] || exit 2\necho "Disk quotas for user u (uid 1):"\n'
              'echo "     Filesystem  blocks   quota   limit   grace   files   quota   limit   grace"\n'
              f'echo "{device}  2000000  3000000  4000000  0  10  0  0  0"\n')
    monkeypatch.setenv("PATH", str(bin_dir) + ":" + str(Path(sys.executable).parent))
    res = training_checks(_cfg(min_free_disk_gb=2), *parquets, tiny_model_dir, out_dir=tmp_path / "train")
    assert res["disk"]["quota"] == "quota -w: 2.05 GB used of a 3.07 GB quota", res["disk"]
    assert any(p.startswith("only 1.0 GB left under your quota") for p in res["problems"]), res["problems"]
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))  # neither tool here
    res = training_checks(_cfg(), *parquets, tiny_model_dir, out_dir=tmp_path / "train")
    assert res["disk"]["quota"].startswith("quotas not checked: neither `lfs quota` nor `quota` answered"), res["disk"]
