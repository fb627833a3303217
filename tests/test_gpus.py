"""llmrnn.gpus: the judge and the trainer on one node get disjoint GPUs (judge last, trainer before)."""

from __future__ import annotations

import pytest

from llmrnn.errors import InputError
from llmrnn.gpus import assign, split, visible_devices


def test_reference_layout_from_a_shared_allocation():
    devices = ["0", "1", "2"]
    assert split(devices, "judge", judge_gpus=1) == ["2"]
    assert split(devices, "train", judge_gpus=1, train_gpus=2) == ["0", "1"]


def test_steps_already_narrowed_by_slurm_are_kept():
    assert split(["5"], "judge", judge_gpus=1) == ["5"]
    assert split(["3", "4"], "train", judge_gpus=1, train_gpus=2) == ["3", "4"]


def test_no_judge_on_the_node_trainer_takes_all():
    assert split(["0", "1", "2", "3"], "train", judge_gpus=0) == ["0", "1", "2", "3"]
    assert split(["0", "1"], "judge", judge_gpus=0) == []


def test_too_few_gpus_is_one_clear_error():
    with pytest.raises(InputError, match="cannot hold the judge"):
        split(["0"], "train", judge_gpus=1, train_gpus=2)
    with pytest.raises(InputError, match="needs 3 GPU"):
        split(["0", "1"], "train", judge_gpus=1, train_gpus=3)
    with pytest.raises(InputError, match="role"):
        split(["0"], "actor")


def test_assign_narrows_the_environment_and_cpu_runs_are_untouched():
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2"}
    assert assign("judge", judge_gpus=1, env=env) == ["2"]
    assert env["CUDA_VISIBLE_DEVICES"] == "2"
    env = {"SLURM_JOB_GPUS": "4,5,6"}
    assert assign("train", judge_gpus=1, train_gpus=2, env=env) == ["4", "5"]
    assert env["CUDA_VISIBLE_DEVICES"] == "4,5"
    cpu = {}
    assert assign("train", env=cpu) == [] and "CUDA_VISIBLE_DEVICES" not in cpu
    assert visible_devices({"CUDA_VISIBLE_DEVICES": ""}) == []


def test_cpu_native_bf16_is_read_from_the_cpu_flags():
    """dtype auto on the CPU: bfloat16 only with AVX512-BF16 or AMX-BF16 among the flags (a CPU without them,
    like an AVX2-only EPYC, emulates bf16 and runs it slower than float32)."""
    from llmrnn.gpus import cpu_bf16, cpu_dtype, cpu_has_native_bf16

    avx2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
    native = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
    amx = "flags\t\t: avx2 amx_tile amx_bf16\n"
    assert not cpu_has_native_bf16(avx2) and cpu_has_native_bf16(native) and cpu_has_native_bf16(amx)
    assert not cpu_has_native_bf16("") and not cpu_has_native_bf16("flags\t: avx512f\n")  # avx512 alone is not bf16
    assert (cpu_dtype("auto", avx2), cpu_dtype("auto", native)) == ("float32", "bfloat16")
    assert cpu_dtype("bfloat16", avx2) == "bfloat16"  # asked for: kept (only auto decides)
    assert (cpu_bf16("auto", avx2), cpu_bf16("auto", native), cpu_bf16(True, avx2), cpu_bf16(False, native)) \
        == (False, True, True, False)
