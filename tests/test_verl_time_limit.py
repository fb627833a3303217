"""verl at the SLURM time limit: verl installs no signal handler, but its own fit() saves early when
should_save_ckpt_esi sees an expiration near. Our stop deadline reaches that function in both verl releases
(run inside their venvs), and the wrapper stops main_ppo at the deadline with exit 75 (continue)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import threading
import time

import pytest

from llmrnn.errors import InputError, Interrupted
from llmrnn.train import verl_cmd, verl_overrides
from llmrnn.train.ray_cluster import single_node_overrides
from llmrnn.train.spec import RunSpec
from tests.test_train_verl import REFERENCE, REPO, VERSIONS, install_fake_main_ppo, verl_python
from tests.verl.rows import make_rows, write_parquet


@pytest.mark.verl
@pytest.mark.parametrize("version", VERSIONS)
def test_verls_own_time_limit_save_sees_our_deadline(version, tmp_path, tiny_model_dir):
    """An hour to the deadline and a save allowed 300 s (esi_redundant_time 240 beyond verl's 60): verl's
    should_save_ckpt_esi, with the environment verl's TaskRunner gets from our overrides, saves after a step
    once the longest step + 300 s reach the deadline (3400 s), not before (600 s), never at step 1 (0 s)."""
    train = write_parquet(tmp_path / "train.parquet", make_rows(6))
    deadline = time.time() + 3600
    env = {"VERL_FILE_LOGGER_PATH": str(tmp_path / "m.jsonl"), verl_overrides.SAVE_ENV: "300"}
    overrides = verl_overrides.build_overrides(
        dict(REFERENCE), train_parquet=train, val_parquet=None, model_dir=str(tiny_model_dir),
        out_dir=str(tmp_path / "train"), experiment_name="t", verl_version=version,
    ) + verl_overrides.deadline_overrides(deadline, env) + single_node_overrides({"SLURM_CPUS_PER_TASK": "1"}) \
        + verl_overrides.runtime_env_overrides(env)
    (tmp_path / "overrides.json").write_text(json.dumps(overrides))
    clean = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", str(tmp_path)), "HF_HUB_OFFLINE": "1",
             "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}  # no expiration of its own
    proc = subprocess.run(
        [str(verl_python(version)), str(REPO / "tests" / "verl" / "esi_save.py"), "--overrides",
         str(tmp_path / "overrides.json"), "--longest-step", "0", "600", "3400"],
        capture_output=True, text=True, env=clean, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["verl"] == version
    assert report["esi_redundant_time"] == 240 and report["expiration"] == f"{deadline:.0f}"
    assert report["env_types"] == ["str"]  # Ray refuses anything else
    assert report["saves"] == [False, False, True]


def test_no_deadline_no_override_and_a_bad_allowance_is_one_line():
    assert verl_overrides.deadline_overrides(None) == []
    with pytest.raises(InputError, match=r"^LLMRNN_VERL_SAVE_S='five': not a number of seconds"):
        verl_overrides.deadline_overrides(time.time(), {verl_overrides.SAVE_ENV: "five"})


# STAND-IN for main_ppo (verl cannot train without a GPU): saves step 1 the way verl does, then runs a step that
# outlasts the deadline; it records its command line and its pid
SLOW_MAIN_PPO = textwrap.dedent(
    '''
    import json, os, sys, time
    args = dict(a.split("=", 1) for a in sys.argv[3:] if "=" in a)
    out = args["trainer.default_local_dir"]
    json.dump({"argv": sys.argv, "pid": os.getpid()}, open(os.environ["FAKE_RECORD"], "w"))
    os.makedirs(os.path.join(out, "global_step_1", "actor", "lora_adapter"), exist_ok=True)
    open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w").write("1")
    time.sleep(3600)
    '''
)

# STAND-IN for SLURM's squeue inside a job: the job's end time (%e) FAKE_END_IN seconds from now
FAKE_SQUEUE = textwrap.dedent(
    '''\
    #!/usr/bin/env python3
    import os, time
    from datetime import datetime
    print(datetime.fromtimestamp(time.time() + float(os.environ["FAKE_END_IN"])).strftime("%Y-%m-%dT%H:%M:%S"))
    '''
)


def _slow_verl(tmp_path, monkeypatch):
    install_fake_main_ppo(tmp_path, monkeypatch, SLOW_MAIN_PPO)
    monkeypatch.setenv("FAKE_RECORD", str(tmp_path / "record.json"))
    cfg = {"batch": {"train": 2, "mini": 2, "micro_per_gpu": 4}, "group_size": 4, "epochs": 1, "test_freq": 0,
           "lora": {"rank": 8, "alpha": 16}}
    out = tmp_path / "train"
    return RunSpec(cfg, train_parquet=write_parquet(tmp_path / "train.parquet", make_rows(8)), val_parquet=None,
                   model_dir="m", work_dir=str(out), adapter_dir=out / "adapter", metrics_path=out / "m.jsonl",
                   run_name="e")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_verl_run_stops_main_ppo_at_the_slurm_deadline_with_exit_75(tmp_path, monkeypatch):
    """Inside a SLURM job (squeue answers its end time): main_ppo gets verl's expiration and redundant time
    on its command line, and at the deadline (end less LLMRNN_STOP_MARGIN_S) it is stopped and the run
    ends Interrupted (75) naming the checkpoint a rerun continues from; the handlers are put back."""
    spec = _slow_verl(tmp_path, monkeypatch)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(FAKE_SQUEUE)
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("FAKE_END_IN", "62")
    monkeypatch.setenv("LLMRNN_STOP_MARGIN_S", "60")  # the deadline: two seconds from now
    monkeypatch.setenv(verl_overrides.SAVE_ENV, "100")
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted, match=r"stopped on the SLURM time limit is near; its last checkpoint is step 1"):
        verl_cmd.run(spec, verl_version="0.7.1")
    record = json.loads((tmp_path / "record.json").read_text())
    assert _gone(record["pid"])
    argv = record["argv"]
    assert "trainer.esi_redundant_time=40" in argv
    (expiry,) = [a.split("=", 1)[1] for a in argv if verl_overrides.ESI_ENV in a]
    assert abs(float(expiry.strip("'")) - (time.time() + 2)) < 120  # about the end less the margin
    assert signal.getsignal(signal.SIGTERM) is before and not (tmp_path / "train" / "adapter").exists()


def test_verl_run_stops_main_ppo_on_sigterm_with_exit_75(tmp_path, monkeypatch):
    """Preemption (SIGTERM) outside any time limit: verl cannot save on request, so main_ppo is stopped and
    the run ends Interrupted (75) from its last checkpoint; no expiration goes to verl without a limit."""
    spec = _slow_verl(tmp_path, monkeypatch)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    record = tmp_path / "record.json"

    def preempt():
        while not record.exists():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=preempt, daemon=True).start()
    with pytest.raises(Interrupted, match=r"stopped on signal SIGTERM; its last checkpoint is step 1"):
        verl_cmd.run(spec, verl_version="0.7.1")
    argv = json.loads(record.read_text())["argv"]
    assert _gone(json.loads(record.read_text())["pid"])
    assert not [a for a in argv if "esi" in a or verl_overrides.ESI_ENV in a]

