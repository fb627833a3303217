"""TRL engine on the tiny model: adapter + metrics from the config's knobs, kill + resume, early end fails."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmrnn.errors import CheckFailed
from llmrnn.reward.function import RewardFunction
from llmrnn.settings.train import Train
from llmrnn.train.spec import RunSpec
from llmrnn.train.trl_engine import checkpoint_complete
from tests.verl.rows import make_rows, write_parquet

STANDIN = f"{Path(__file__).parent / 'verl' / 'rows.py'}:standin_reward"  # test stand-in for the judge reward
LLMRNN = str(Path(sys.executable).parent / "llmrnn")


def tiny_cfg(**over) -> dict:
    cfg = {
        "engine": "trl",
        "seed": 3,
        "lora": {"rank": 8, "alpha": 24},
        "lr": 1e-3,
        "group_size": 4,
        "batch": {"train": 2, "mini": 2, "micro_per_gpu": 4},
        "max_prompt_length": 256,
        "max_response_length": 12,
        "epochs": 2,
        "save_freq": 2,
        "test_freq": 2,
        "keep_last": 2,
    }
    cfg.update(over)
    return cfg


@pytest.fixture
def parquets(tmp_path):
    return (
        write_parquet(tmp_path / "train.parquet", make_rows(8)),
        write_parquet(tmp_path / "val.parquet", make_rows(2, split="val", seed=1)),
    )


def _run_cli(cfg, parquets, model, out, **kw):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [LLMRNN, "train", "run", "--cfg", json.dumps({"train": cfg}), "--train", parquets[0], "--val",
           parquets[1], "--model", str(model), "--work-dir", str(out), "--adapter", str(out / "adapter"),
           "--metrics", str(out / "metrics.jsonl"), "--summary", str(out / "summary.json"),
           "--reward-func", STANDIN]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def run_spec(cfg, parquets, model_dir, out: Path, reward: str) -> RunSpec:
    """One run as `train run` hands it to the engine: the work dir (checkpoints, state) and the two outputs the
    rule passes, named one by one, and the reward function `reward` (file:name)."""
    return RunSpec(cfg, train_parquet=parquets[0], val_parquet=parquets[1], model_dir=model_dir, work_dir=out,
                   adapter_dir=out / "adapter", metrics_path=out / "metrics.jsonl",
                   reward_func=RewardFunction.parse(reward))


def _trace(out: Path) -> dict[int, list[int]]:
    rows = [json.loads(x) for x in (out / "state" / "data_trace.jsonl").read_text().splitlines()]
    return {r["step"]: r["indices"] for r in rows}


@pytest.mark.slow
def test_trl_writes_adapter_metrics_and_summary(tmp_path, tiny_model_dir, parquets):
    out = tmp_path / "train"
    proc = _run_cli(tiny_cfg(), parquets, tiny_model_dir, out)
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log
    conf = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert (conf["r"], conf["lora_alpha"]) == (8, 24)
    assert sorted(conf["target_modules"]) == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    val = [r for r in rows if r["kind"] == "val"]
    assert [r["step"] for r in train] == list(range(1, 9))  # 8 rows / 2 per step x 2 epochs
    for key in ("reward_mean", "reward_std", "kl", "entropy", "response_length_mean", "grad_norm", "lr",
                "step_time_s", "clip_ratio", "truncation_rate"):
        assert all(r[key] is not None for r in train), key
    # max_response_length=12 cuts the tiny model's rambling: the truncation rate sees it
    assert any(r["truncation_rate"] > 0 for r in train) and all(0 <= r["truncation_rate"] <= 1 for r in train)
    # a sample dump per save (save_freq=2 -> steps 2, 4, 6, 8), owner-only, with the rewards of that batch
    dumps = sorted((out / "samples").glob("step_*.jsonl"))
    assert [p.name for p in dumps] == [f"step_{s:06d}.jsonl" for s in (2, 4, 6, 8)]
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in dumps)
    first = [json.loads(x) for x in dumps[0].read_text().splitlines()]
    assert len(first) == 2 * 4 and all(isinstance(r["reward"], float) and r["completion"] for r in first)
    assert {r["step"] for r in val} >= {2, 4, 6, 8} and all(r["val_reward_mean"] > 0 for r in val)
    assert "train step 8/8" in log  # progress visible in the log
    # keep_last=2: only the two newest checkpoints stay
    assert sorted(p.name for p in (out / "checkpoints").glob("checkpoint-*")) == ["checkpoint-6", "checkpoint-8"]
    assert not (out / "plots").exists()  # the training curves are the report stage's (llmrnn report training)
    # the LoRA moved: B matrices start at zero and are non-zero after training
    from safetensors.torch import load_file

    weights = load_file(out / "adapter" / "adapter_model.safetensors")
    lora_b = [t for k, t in weights.items() if "lora_B" in k]
    assert lora_b and max(float(t.abs().max()) for t in lora_b) > 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 8


@pytest.mark.e2e  # a slow tier test (a workflow, CLI or training run of its own): `make test-e2e`
@pytest.mark.slow
def test_killed_run_resumes_at_the_right_step_and_data_position(tmp_path, tiny_model_dir, parquets):
    cfg = tiny_cfg(epochs=4, test_freq=0, save_freq=2, keep_last=None)  # 16 steps
    ref = tmp_path / "reference"
    proc = _run_cli(cfg, parquets, tiny_model_dir, ref)
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log

    out = tmp_path / "killed"
    proc = _run_cli(cfg, parquets, tiny_model_dir, out, start_new_session=True)
    deadline = time.time() + 300
    ckpt = out / "checkpoints" / "checkpoint-6"  # a checkpoint in epoch 2: data order must survive epochs
    while not checkpoint_complete(ckpt):  # trainer_state.json is written last; wait until it parses
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() < deadline
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "adapter").exists()  # a killed run leaves nothing that looks complete
    killed_steps = max(_trace(out))

    proc = _run_cli(cfg, parquets, tiny_model_dir, out)
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] >= 6 and summary["steps"] == 16
    assert f"resuming from {out / 'checkpoints'}" in log
    # the step counter continued: the resumed process trained only the steps after the checkpoint
    assert f"train step {summary['resumed_from_step']}/16" not in log
    assert f"train step {summary['resumed_from_step'] + 1}/16" in log
    # metrics: every step exactly once (rows past the checkpoint were redone, not duplicated)
    train_steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()
                   if json.loads(x)["kind"] == "train"]
    assert train_steps == list(range(1, 17))
    # data position: every step saw exactly the prompts of the uninterrupted run
    assert _trace(out) == _trace(ref)
    assert killed_steps >= 6


def _wait_until_inside_step(proc, out: Path, step: int) -> None:
    """Until the running `train run` has drawn the data of `step` (its data trace), within 300 s."""
    deadline = time.time() + 300
    trace = out / "state" / "data_trace.jsonl"
    while not (trace.exists() and len(trace.read_text().splitlines()) >= step):
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() < deadline
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.e2e  # three tiny runs: about 2.5 min on a loaded 2-core machine
def test_warning_signal_checkpoints_at_the_next_step_and_the_rerun_continues(tmp_path, tiny_model_dir, parquets):
    """SLURM's warning signal (SIGUSR1, profiles/slurm and docs/cluster.md "Long runs") mid-run: a checkpoint at
    the next step boundary (not the next save_freq), exit 75 ("continue"), and the rerun trains the steps
    after it, each once, on the prompts of an uninterrupted run."""
    from llmrnn.errors import Interrupted

    cfg = tiny_cfg(test_freq=0, save_freq=4, keep_last=None)  # 8 steps, saves at 4 and 8 only
    ref = tmp_path / "reference"
    proc = _run_cli(cfg, parquets, tiny_model_dir, ref)
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log

    out = tmp_path / "signalled"
    proc = _run_cli(cfg, parquets, tiny_model_dir, out)
    _wait_until_inside_step(proc, out, 5)
    proc.send_signal(signal.SIGUSR1)
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == Interrupted.exit_code == 75, log
    stopped = max(_trace(out))
    assert 5 <= stopped < 8, log
    assert f"stopped at step {stopped} of 8 on signal SIGUSR1" in log
    assert checkpoint_complete(out / "checkpoints" / f"checkpoint-{stopped}")  # not a save_freq multiple
    assert not (out / "adapter").exists()

    proc = _run_cli(cfg, parquets, tiny_model_dir, out)
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] == stopped and summary["steps"] == 8  # no step lost
    assert f"train step {stopped + 1}/8" in log and f"train step {stopped}/8" not in log
    train_steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()
                   if json.loads(x)["kind"] == "train"]
    assert train_steps == list(range(1, 9))
    assert _trace(out) == _trace(ref)


@pytest.mark.slow
@pytest.mark.e2e  # one tiny run
def test_preemption_sigterm_checkpoints_at_the_next_step_like_the_warning(tmp_path, tiny_model_dir, parquets):
    """SLURM preempts (or cancels) with SIGTERM, GraceTime before SIGKILL: TRL takes it like SIGUSR1, a
    complete checkpoint at the next step boundary (not the next save_freq) and exit 75; the rerun's resume
    from such a checkpoint is the test above."""
    from llmrnn.errors import Interrupted

    out = tmp_path / "preempted"
    proc = _run_cli(tiny_cfg(test_freq=0, save_freq=4, keep_last=None), parquets, tiny_model_dir, out)
    _wait_until_inside_step(proc, out, 5)
    proc.send_signal(signal.SIGTERM)
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == Interrupted.exit_code == 75, log
    stopped = max(_trace(out))
    assert 5 <= stopped < 8 and f"stopped at step {stopped} of 8 on signal SIGTERM" in log, log
    assert checkpoint_complete(out / "checkpoints" / f"checkpoint-{stopped}")
    assert not (out / "adapter").exists()


def test_stop_request_by_clock_and_squeue_end_time():
    from llmrnn.train.stop import StopRequest, parse_end_time

    assert parse_end_time("Unknown") is None and parse_end_time("") is None
    assert parse_end_time("2026-11-27T22:00:00\n") == parse_end_time("2026-11-27T21:00:00") + 3600
    assert not StopRequest(deadline=time.time() + 3600).requested()
    past = StopRequest(deadline=time.time() - 1)
    assert past.requested() and past.reason == "the SLURM time limit is near"


def test_stop_signals_are_put_back_and_a_bad_margin_is_one_line(monkeypatch):
    from llmrnn.errors import InputError
    from llmrnn.train.stop import STOP_SIGNALS, StopRequest, stop_deadline

    before = [signal.getsignal(s) for s in STOP_SIGNALS]
    stop = StopRequest(deadline=time.time() + 3600).watch()
    assert signal.SIGTERM in STOP_SIGNALS and signal.getsignal(signal.SIGTERM) == stop._on_signal
    signal.raise_signal(signal.SIGTERM)
    assert stop.requested() and stop.reason == "signal SIGTERM"
    stop.release()
    assert [signal.getsignal(s) for s in STOP_SIGNALS] == before
    monkeypatch.setenv("LLMRNN_STOP_MARGIN_S", "ten minutes")
    with pytest.raises(InputError, match=r"^LLMRNN_STOP_MARGIN_S='ten minutes': not a number of seconds"):
        stop_deadline()


class _StopAt:
    """A TrainerCallback that ends training early (what a crash-free but short run looks like)."""

    def __init__(self, step):
        from transformers import TrainerCallback

        self.__class__ = type("StopAt", (TrainerCallback,), {"on_step_end": self._stop})
        self.step = step

    def _stop(self, args, state, control, **kw):
        if state.global_step >= self.step:
            control.should_training_stop = True


@pytest.mark.slow
def test_run_that_ends_early_is_not_complete(tmp_path, tiny_model_dir, parquets):
    from llmrnn.train import trl_engine

    out = tmp_path / "train"
    with pytest.raises(CheckFailed, match="stopped at step 3 of 8"):
        trl_engine.train(run_spec(tiny_cfg(test_freq=0), parquets, tiny_model_dir, out, STANDIN), callbacks=[_StopAt(3)])
    assert not (out / "adapter").exists()


@pytest.mark.slow
def test_changed_config_starts_over_instead_of_resuming(tmp_path, tiny_model_dir, parquets):
    """Checkpoints are valid only for the run that wrote them: a rerun with a new knob must not resume."""
    from llmrnn.train import trl_engine

    out = tmp_path / "train"
    with pytest.raises(CheckFailed):
        trl_engine.train(run_spec(tiny_cfg(test_freq=0), parquets, tiny_model_dir, out, STANDIN), callbacks=[_StopAt(3)])
    assert trl_engine.latest_checkpoint(out / "checkpoints") is not None
    same = trl_engine.train(run_spec(tiny_cfg(test_freq=0), parquets, tiny_model_dir, out, STANDIN))
    assert same["resumed_from_step"] == 2  # same config: resumes from its checkpoint
    changed = trl_engine.train(run_spec(tiny_cfg(test_freq=0, lr=5e-4), parquets, tiny_model_dir, out, STANDIN))
    assert changed["resumed_from_step"] == 0 and changed["steps"] == 8


def test_falls_in_a_row():
    from llmrnn.train.trl_engine import falls_in_a_row

    assert not falls_in_a_row([0.5, 0.4], 2)  # one fall
    assert falls_in_a_row([0.5, 0.4, 0.3], 2)
    assert not falls_in_a_row([0.5, 0.4, 0.45, 0.3], 2)  # the rise in between resets it
    assert not falls_in_a_row([0.5, 0.5, 0.5], 2)  # flat is not a fall
    assert falls_in_a_row([0.5, 0.4], 1)


def falling_reward(tmp_path) -> str:
    """A reward function (file:name) that shrinks with every call: each validation is lower than the last."""
    path = tmp_path / "falling.py"
    path.write_text(
        "CALLS = [0]\n"
        "def falling(prompts, completions, **kw):\n"
        "    CALLS[0] += 1\n"
        "    return [1.0 / CALLS[0] + 0.01 * i for i in range(len(completions))]\n"
    )
    return f"{path}:falling"


@pytest.mark.slow
def test_early_stopping_on_a_falling_val_reward(tmp_path, tiny_model_dir, parquets):
    """A reward that shrinks with every call makes each validation lower than the one before: with
    patience 2 the run stops after the third validation (step 6 of 8) and still writes its adapter."""
    from llmrnn.train import trl_engine

    reward = falling_reward(tmp_path)
    out = tmp_path / "train"
    cfg = tiny_cfg(val_before_train=False, early_stopping={"enabled": True, "patience": 2})
    summary = trl_engine.train(run_spec(cfg, parquets, tiny_model_dir, out, reward))
    assert summary["early_stopped_at_step"] == 6 and summary["steps"] == 6
    assert (out / "adapter" / "adapter_config.json").is_file()
    val = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in val if r["kind"] == "val"] == [2, 4, 6]


# --------------------------------------------------------------------------- the judge during training
JSON_POLICY = f"{Path(__file__).parent / 'judge_helpers.py'}:json_policy_reward"


def _judged_command(tmp_path, tiny_model_dir, parquets, port: int, out: Path, preflight: dict,
                    **cfg_over) -> list[str]:
    """`llmrnn train run` into `out` with the real reward against the scripted judge on `port`."""
    from tests.judge_helpers import write_endpoint, write_rubric

    endpoint = write_endpoint(tmp_path / f"{out.name}-endpoint", port, write_rubric(tmp_path))
    cfg = {"train": tiny_cfg(**cfg_over), "preflight": preflight,
           "reward": {"retries": 1, "backoff_s": 0.01, "health_timeout_s": 10}}
    return [LLMRNN, "train", "run", "--cfg", json.dumps(cfg), "--train", parquets[0], "--val", parquets[1],
            "--model", str(tiny_model_dir), "--work-dir", str(out), "--adapter", str(out / "adapter"),
            "--metrics", str(out / "metrics.jsonl"), "--summary", str(out / "summary.json"),
            "--endpoint", str(endpoint), "--reward-func", JSON_POLICY]


def _judged_run(tmp_path, tiny_model_dir, parquets, respond, preflight: dict, **cfg_over):
    """`llmrnn train run` with the real reward against a scripted judge on 127.0.0.1 -> (returncode, log, out)."""
    from tests.judge_helpers import ScriptedJudge

    out = tmp_path / "train"
    with ScriptedJudge(respond) as judge:
        proc = subprocess.run(_judged_command(tmp_path, tiny_model_dir, parquets, judge.port, out, preflight,
                                              **cfg_over),
                              env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                              timeout=900, check=False)
    return proc.returncode, proc.stdout + proc.stderr, out


@pytest.mark.slow
def test_trl_records_the_judge_fallback_rate_per_step(tmp_path, tiny_model_dir, parquets):
    # the judge loses the format on about half the memories (by a hash of the prompt: input-dependent)
    def respond(body):
        prompt = body["messages"][0]["content"]
        return "Score: 6" if sum(map(ord, prompt)) % 2 else "A long answer that never states a score at all."

    code, log, out = _judged_run(tmp_path, tiny_model_dir, parquets, respond,
                                 {"max_fallback_rate": 1.0}, epochs=1, test_freq=0)
    assert code == 0, log
    train = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [r["judge_fallback_rate"] for r in train if r["kind"] == "train"]
    assert len(rates) == 4 and all(r is not None and 0.0 <= r <= 1.0 for r in rates)
    assert 0.0 < sum(rates) / len(rates) < 1.0


def _varied_score(body: dict) -> str:
    """A judge whose score depends on the memory it is shown (rewards differ within a group)."""
    return f"Score: {sum(map(ord, body['messages'][0]['content'])) % 9 + 1}"


# 8 steps, saves at 3 and 6: a stop at step 4 is saved only by the stop itself
PREEMPTED_RUN = {"preflight": {"max_fallback_rate": 1.0}, "test_freq": 0, "save_freq": 3, "keep_last": None}


@pytest.mark.slow
@pytest.mark.e2e  # three tiny judged runs
def test_preemption_that_takes_the_judge_down_loses_only_the_step_in_flight(tmp_path, tiny_model_dir, parquets):
    """A preempted job's every process gets SIGTERM, the judge server of its group too: the step in flight
    cannot be scored. The trainer saves the last step boundary (step 4; save_freq saved 3, all a rerun would
    otherwise find) and exits 75; the rerun, with a judge again, trains steps 5-8 once each on the prompts of
    an uninterrupted run."""
    from llmrnn.errors import Interrupted
    from tests.judge_helpers import ScriptedJudge

    env = dict(os.environ, OMP_NUM_THREADS="1")
    with ScriptedJudge(_varied_score) as judge:
        ref = tmp_path / "reference"
        command = _judged_command(tmp_path, tiny_model_dir, parquets, judge.port, ref, **PREEMPTED_RUN)
        done = subprocess.run(command, env=env,
                              capture_output=True, text=True, timeout=900, check=False)
        assert done.returncode == 0, done.stdout + done.stderr

    out = tmp_path / "preempted"
    trainer: dict = {}

    def preempt_at_step_5(body):
        # steps 1-4 scored (each traced once scored), so this call scores step 5: SLURM's SIGTERM reaches
        # the trainer and this judge together
        trace = out / "state" / "data_trace.jsonl"
        if trace.exists() and len(trace.read_text().splitlines()) >= 4 and not judge_down.dead:
            trainer["proc"].send_signal(signal.SIGTERM)
            judge_down.dead = True
        return _varied_score(body)

    with ScriptedJudge(preempt_at_step_5) as judge_down:
        trainer["proc"] = subprocess.Popen(_judged_command(tmp_path, tiny_model_dir, parquets, judge_down.port, out,
                                                           **PREEMPTED_RUN),
                                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        log, _ = trainer["proc"].communicate(timeout=900)
    assert trainer["proc"].returncode == Interrupted.exit_code, log
    assert "stopped at step 4 of 8 on signal SIGTERM (the judge went down with the job; step 5 was not" in log, log
    assert checkpoint_complete(out / "checkpoints" / "checkpoint-4")
    assert max(_trace(out)) == 4 and not (out / "adapter").exists()

    with ScriptedJudge(_varied_score) as judge:
        command = _judged_command(tmp_path, tiny_model_dir, parquets, judge.port, out, **PREEMPTED_RUN)
        rerun = subprocess.run(command, env=env,
                               capture_output=True, text=True, timeout=900, check=False)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] == 4 and summary["steps"] == 8
    train_steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()
                   if json.loads(x)["kind"] == "train"]
    assert train_steps == list(range(1, 9))
    assert _trace(out) == _trace(ref)


@pytest.mark.slow
def test_trl_stops_with_a_clear_reason_when_the_judge_degrades(tmp_path, tiny_model_dir, parquets):
    code, log, out = _judged_run(tmp_path, tiny_model_dir, parquets, lambda body: "I cannot decide on this one.",
                                 {"max_fallback_rate": 0.25, "fallback_window": 8}, test_freq=0)
    assert code == 4, log
    assert "judge degraded during training: 8 of the last 8 judged samples (100%)" in log
    assert "Traceback" not in log and not (out / "adapter").exists()


def test_json_close_tokens_end_a_memory_rollout(tiny_model_dir):
    from transformers import AutoTokenizer

    from llmrnn.jsonparse import parse_memory
    from llmrnn.train.trl_engine import json_close_token_ids

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    stops = json_close_token_ids(tok)
    assert stops and tok.eos_token_id not in stops
    assert all(tok.decode([i]).rstrip().endswith('"}') and "{" not in tok.decode([i]) for i in stops)
    # a rollout cut right after its first stop token is exactly the memory JSON the reward parses
    ids = tok('{"evolving_summary": "copd; chf"} and then some prose {"x": "y"}', add_special_tokens=False)["input_ids"]
    first = next(k for k, i in enumerate(ids) if i in stops)
    assert parse_memory(tok.decode(ids[: first + 1]), strict=True)[0] == "copd; chf"


@pytest.mark.parametrize("cpu_bf16,checkpointing", [(False, False), (True, True)])
def test_cpu_speed_knobs_reach_grpo_config(tmp_path, cpu_bf16, checkpointing):
    """train.trl.cpu_bf16 / gradient_checkpointing are what TRL runs with (TRL's own defaults: bf16 off on
    CPU, checkpointing on), and val rollouts are generated a whole generation batch (train x G) at a time."""
    from llmrnn.train import config as tcfg
    from llmrnn.train.trl_engine import grpo_arguments

    cfg = tcfg.settings(tiny_cfg(trl={"cpu_bf16": cpu_bf16, "gradient_checkpointing": checkpointing}))
    args = grpo_arguments(cfg, cfg.geometry, tmp_path, max_steps=4, validate=True)
    assert (args.bf16, args.gradient_checkpointing) == (cpu_bf16, checkpointing)
    assert args.per_device_eval_batch_size == 2 * 4 and args.num_generations_eval == 4
    # val_generations: fewer val rollouts per prompt, still whole groups in one generation-sized batch
    cfg = tcfg.settings(tiny_cfg(val_generations=3))
    args = grpo_arguments(cfg, cfg.geometry, tmp_path, max_steps=4, validate=True)
    assert args.num_generations_eval == 3 and args.per_device_eval_batch_size == 6


def _outcome_cli(tmp_path, parquets, model, mode, reward_func=None):
    out = tmp_path / "train"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMRNN_")}
    env["OMP_NUM_THREADS"] = "1"
    # the tiny model's outputs all score 0 here: plumbing, not learning (train.fail_on_zero_gradient off)
    cfg = {"train": tiny_cfg(epochs=1, test_freq=0, save_freq=4, fail_on_zero_gradient=False), "reward": {"mode": mode}}
    cmd = [LLMRNN, "train", "run", "--cfg", json.dumps(cfg), "--train", parquets[0], "--val", parquets[1],
           "--model", str(model), "--work-dir", str(out), "--adapter", str(out / "adapter"),
           "--metrics", str(out / "metrics.jsonl"), "--summary", str(out / "summary.json"),
           *(["--reward-func", reward_func] if reward_func else [])]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False), out


@pytest.mark.parametrize("mode", ["scalar", "pairwise"])
def test_judged_reward_without_an_endpoint_is_one_line(tmp_path, tiny_model_dir, parquets, mode):
    proc, out = _outcome_cli(tmp_path, parquets, tiny_model_dir, mode)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"llmrnn train: error: reward.mode {mode} asks the judge but no judge endpoint was given: pass "
        "--endpoint (RUN/judge/endpoint.json; reward.mode outcome needs none)")
    assert not out.exists()


@pytest.mark.slow
def test_outcome_reward_trains_without_a_judge_endpoint(tmp_path, tiny_model_dir, parquets):
    """reward.mode outcome: `llmrnn train run` with no --endpoint trains with the real reward (the policy's
    text wrapped into memory JSON, as the tiny model writes none) and audits every sample without a judge."""
    proc, out = _outcome_cli(tmp_path, parquets, tiny_model_dir, "outcome", JSON_POLICY)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["steps"] == 4
    audit = [json.loads(x) for f in (out / "audit").glob("calls_*.jsonl") for x in f.read_text().splitlines()]
    assert len(audit) == 4 * 2 * 4  # steps x prompts x group
    assert {(a["mode"], a["rubric"], len(a["judge"]), a["parse_method"]) for a in audit} == {("outcome", None, 0, "outcome")}


# --------------------------------------------------------------------------- clip range and loss aggregation
@pytest.mark.parametrize("mode,loss_type", [("token-mean", "dapo"), ("seq-mean-token-mean", "grpo"),
                                            ("seq-mean-token-sum-norm", "dr_grpo")])
def test_clip_and_loss_reach_both_engines(tmp_path, mode, loss_type):
    """train.clip_ratio and train.loss_agg_mode are what TRL (epsilon, epsilon_high, loss_type) and verl
    (actor.clip_ratio[_low|_high], actor.loss_agg_mode) run with, set explicitly on both."""
    from llmrnn.train import config as tcfg
    from llmrnn.train.trl_engine import grpo_arguments
    from llmrnn.train.verl_overrides import build_overrides

    knobs = {"clip_ratio": {"low": 0.15, "high": 0.28}, "loss_agg_mode": mode}
    cfg = tcfg.settings(tiny_cfg(**knobs))
    args = grpo_arguments(cfg, cfg.geometry, tmp_path, max_steps=4, validate=False)
    assert (args.epsilon, args.epsilon_high, args.loss_type) == (0.15, 0.28, loss_type)
    overrides = build_overrides({**tiny_cfg(**knobs), "engine": "verl"}, train_parquet="t.parquet",
                                val_parquet="v.parquet", model_dir="m", out_dir=str(tmp_path), experiment_name="x",
                                verl_version="0.7.1")
    for item in ("actor_rollout_ref.actor.clip_ratio=0.15", "actor_rollout_ref.actor.clip_ratio_low=0.15",
                 "actor_rollout_ref.actor.clip_ratio_high=0.28", f"actor_rollout_ref.actor.loss_agg_mode={mode}"):
        assert item in overrides
    # the defaults are verl's (the reference run's): TRL's own loss_type default is not relied on
    cfg = tcfg.settings(tiny_cfg())
    args = grpo_arguments(cfg, cfg.geometry, tmp_path, max_steps=4, validate=False)
    assert (args.epsilon, args.epsilon_high, args.loss_type) == (0.2, 0.2, "dapo")


@pytest.mark.parametrize("over,message", [
    ({"loss_agg_mode": "seq-mean-token-sum"}, "train.loss_agg_mode: 'seq-mean-token-sum' is verl-only"),
    ({"loss_agg_mode": "sum"}, "train.loss_agg_mode: Input should be 'token-mean', "),
    ({"clip_ratio": {"low": 0}}, "train.clip_ratio.low: Input should be greater than 0 (got 0)"),
    ({"select": "best"}, "train.select: Input should be 'last' or 'best_val' (got 'best')"),
    ({"select": "best_val", "test_freq": 0}, "train.select: best_val needs validation"),
    ({"select": "best_val", "engine": "verl", "save_freq": 3, "test_freq": 2, "keep_last": None},
     ("best_val with engine verl needs every saved step validated, but train.save_freq=3 is not a multiple of "
     "train.test_freq=2")),
    ({"select": "best_val", "engine": "verl", "keep_last": 1}, "best_val with engine verl needs every checkpoint kept"),
])
def test_bad_clip_loss_or_select_is_one_line(over, message):
    from llmrnn.errors import InputError
    from llmrnn.train import config as tcfg

    with pytest.raises(InputError, match=re.escape(message)):
        tcfg.settings(tiny_cfg(**over))


# --------------------------------------------------------------------------- checkpoint choice
VAL_ROWS = [{"step": s, "kind": "val", "val_reward_mean": v} for s, v in ((0, 0.28), (4, 0.556), (8, 0.444))]


def test_best_val_with_trl_validates_every_save_itself():
    """TRL validates at every save under best_val, so saves and tests need not coincide there (the small
    workflow configs save every 2 steps and validate every 4)."""
    from llmrnn.train import config as tcfg

    assert tcfg.settings(tiny_cfg(select="best_val", save_freq=3, test_freq=2, keep_last=1)).select == "best_val"


def test_choose_checkpoint_last_and_best_val():
    from llmrnn.train.checkpoints import choose_checkpoint

    last = choose_checkpoint("last", [8, 4], VAL_ROWS)
    assert last["step"] == 8 and "final step 8" in last["why"] and last["val_reward"] == 0.444
    best = choose_checkpoint("best_val", [4, 8], VAL_ROWS)
    assert best["step"] == 4 and best["val_reward"] == 0.556
    assert "step 4 had the highest val reward (0.556)" in best["why"] and "last step 8 had 0.444" in best["why"]
    # step 0 (before training) has no checkpoint: never a candidate; ties go to the later step
    tie = choose_checkpoint("best_val", [4, 8], [*VAL_ROWS[:2], {**VAL_ROWS[2], "val_reward_mean": 0.556}])
    assert tie["step"] == 8
    with pytest.raises(CheckFailed, match=r"saved step\(s\) \[6\] have no val reward"):
        choose_checkpoint("best_val", [4, 6, 8], VAL_ROWS)


def test_verl_merges_the_chosen_steps_adapter(tmp_path):
    """verl: the saved global_step_N/actor folders and verl's val rows choose the adapter."""
    from llmrnn.train.verl_cmd import choose_verl_checkpoint

    for step in (4, 8):
        (tmp_path / f"global_step_{step}" / "actor").mkdir(parents=True)
    cfg = Train(select="best_val")
    assert choose_verl_checkpoint(cfg, tmp_path, VAL_ROWS)["step"] == 4
    assert choose_verl_checkpoint(Train(), tmp_path, VAL_ROWS)["step"] == 8


@pytest.mark.slow
def test_best_val_exports_the_best_checkpoints_adapter(tmp_path, tiny_model_dir, parquets):
    """A reward that falls with every call makes the first saved validation (step 2) the best: with
    train.select best_val TRL validates at every save (test_freq 4, save_freq 2), the adapter is
    checkpoint-2's (kept despite keep_last 2), and summary.json says why."""
    from llmrnn.train import trl_engine

    reward = falling_reward(tmp_path)
    out = tmp_path / "train"
    cfg = tiny_cfg(val_before_train=False, select="best_val", keep_last=2, test_freq=4)  # saves every 2
    summary = trl_engine.train(run_spec(cfg, parquets, tiny_model_dir, out, reward))
    chosen = summary["checkpoint"]
    assert chosen["step"] == 2 and chosen["saved_steps"] == [2, 8] and chosen["select"] == "best_val"
    assert "step 2 had the highest val reward" in chosen["why"]
    kept = out / "checkpoints" / "checkpoint-2"
    assert (out / "adapter" / "adapter_model.safetensors").read_bytes() == \
        (kept / "adapter_model.safetensors").read_bytes()
    final = out / "checkpoints" / "checkpoint-8"
    assert (out / "adapter" / "adapter_model.safetensors").read_bytes() != \
        (final / "adapter_model.safetensors").read_bytes()


@pytest.mark.parametrize("name", ["config.yaml", "reproduce.yaml", "qa_reproduce.yaml", "qa_demo.yaml"])
def test_shipped_configs_select_their_checkpoint(name):
    """Every shipped config, read alone as a run reads it, merges its final step: the reproductions keep the
    reference's choice, the demo's val set (3 patients x 2 rollouts) is too small to choose by (config.yaml
    says what best_val measured there)."""
    from llmrnn import runconfig
    from llmrnn.train import config as tcfg

    config, sources = runconfig.resolve([runconfig.read_layer(Path(__file__).parents[1] / "config" / name)])
    assert tcfg.settings(config["train"]).select == "last"
    assert sources["train"]["select"] in (f"config/{name}", runconfig.SCHEMA_DEFAULT)


@pytest.mark.parametrize("native", [True, False], ids=["native-bf16-cpu", "emulated-bf16-cpu"])
def test_cpu_bf16_auto_follows_the_cpu(tmp_path, monkeypatch, native):
    """train.trl.cpu_bf16: auto autocasts to bf16 only on a CPU that computes it natively (AVX512-BF16/AMX);
    emulated, bf16 is slower than float32 (benchmarks/cpu_bf16.py). Anything but true/false/auto is refused."""
    from llmrnn import gpus
    from llmrnn.errors import InputError
    from llmrnn.train import config as tcfg
    from llmrnn.train.trl_engine import grpo_arguments

    monkeypatch.setattr(gpus, "cpu_has_native_bf16", lambda cpuinfo=None: native)
    cfg = tcfg.settings(tiny_cfg(trl={"cpu_bf16": "auto"}))
    assert grpo_arguments(cfg, cfg.geometry, tmp_path, max_steps=4, validate=True).bf16 is native
    with pytest.raises(InputError, match=r"train\.trl\.cpu_bf16: Input should be True, False or 'auto' \(got 'yes'\)"):
        tcfg.settings(tiny_cfg(trl={"cpu_bf16": "yes"}))
