"""verl engine: our main_ppo overrides against verl's own config for 0.7.1 and 0.9.1 (separate venvs made by
scripts/make_verl_env.sh; `make test` builds them), plus the run wrapper with a stand-in for main_ppo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llmrnn.errors import CheckFailed, InputError
from llmrnn.reward import guard_spec, reward_kwargs
from llmrnn.settings.train import Train
from llmrnn.train import verl_adapter, verl_attention, verl_cmd, verl_overrides
from llmrnn.train.spec import RunSpec
from tests.verl.rows import make_rows, write_parquet

REPO = Path(__file__).resolve().parents[1]
VERSIONS = ["0.7.1", "0.9.1"]
REFERENCE = {"n_gpus_per_node": 2, "rollout": {"tensor_parallel": 2}}  # reproduce.yaml's layout


def verl_python(version: str) -> Path:
    py = REPO / f".venv-verl-{version}" / "bin" / "python"
    if not py.exists():
        pytest.skip(f"no verl {version} venv: run scripts/make_verl_env.sh {version} (make test builds it)")
    return py


# a reward section with what Hydra could misread: a nested mapping, quotes, a comma and spaces in a path
REWARD_SECTION = {"mode": "pairwise", "outcome_epsilon": 0.1,
                  "custom": {"path": "/data/it's, here/{r}.py", "name": "compute_score"}}


def check_inputs(version, tmp_path, model, cfg, extra=(), drop=()) -> Path:
    """The overrides file of one check: our overrides (+ `extra`, less those starting with `drop`) over a train
    and a val parquet in tmp_path."""
    train = write_parquet(tmp_path / "train.parquet", make_rows(6))
    val = write_parquet(tmp_path / "val.parquet", make_rows(2, split="val"))
    overrides = verl_overrides.build_overrides(
        cfg, train_parquet=train, val_parquet=val, model_dir=str(model), out_dir=str(tmp_path / "train"),
        experiment_name="t", endpoint_file=str(tmp_path / "endpoint.json"), verl_version=version,
        reward_kwargs=reward_kwargs(REWARD_SECTION, audit_dir=tmp_path / "train" / "audit",
                                    endpoint_file=tmp_path / "endpoint.json", guard=guard_spec(0.2, 64)),
    ) + list(extra)
    overrides = [o for o in overrides if not (drop and o.startswith(tuple(drop)))]
    path = tmp_path / "overrides.json"
    path.write_text(json.dumps(overrides))
    return path


def _check_verl(version, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), HF_HUB_OFFLINE="1")
    return subprocess.run([str(verl_python(version)), str(REPO / "tests" / "verl" / "check_verl.py"), *args],
                          capture_output=True, text=True, env=env, timeout=600, check=False)


def check(version, tmp_path, model, cfg, extra=(), drop=()):
    """check_verl.py in the verl venv with our overrides (+ `extra`, less those starting with `drop`)."""
    path = check_inputs(version, tmp_path, model, cfg, extra, drop)
    return _check_verl(version, "--overrides", str(path), "--model", str(model),
                       "--parquet", str(tmp_path / "train.parquet"))


# The override sets checked against the tiny model, all of a version's in one check_verl.py run (`verl_checks`)
CHECK_CASES = {
    "compose": {"cfg": dict(REFERENCE, lora={"rank": 16, "alpha": 32}, val_generations=3)},
    "misspelled": {"cfg": REFERENCE, "extra": ["actor_rollout_ref.actor.kl_los_coef=0.1"]},
    "micro_batch": {"cfg": dict(REFERENCE, batch={"train": 16, "mini": 16, "micro_per_gpu": 3})},
}


def check_cases(version, base: Path, model, cases: dict) -> dict[str, subprocess.CompletedProcess]:
    """check() of each case (name -> check()'s keyword arguments) in ONE check_verl.py run: name -> the outcome
    a run of its own would give (exit status, the report line, the traceback as stderr). Each interpreter
    start imports verl, torch and transformers (20-45 s apiece on 2 loaded cores)."""
    inputs = {}
    for name, spec in cases.items():
        (base / name).mkdir()
        inputs[name] = {"overrides": str(check_inputs(version, base / name, model, **spec)),
                        "model": str(model), "parquet": str(base / name / "train.parquet")}
    (base / "cases.json").write_text(json.dumps(inputs))
    proc = _check_verl(version, "--cases", str(base / "cases.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcomes = json.loads(proc.stdout.strip().splitlines()[-1])
    return {name: subprocess.CompletedProcess(["check_verl.py", name], got["returncode"],
                                              stdout=json.dumps(got["report"]) + "\n", stderr=got["error"])
            for name, got in outcomes.items()}


@pytest.fixture(scope="module")
def verl_checks(tmp_path_factory, tiny_model_dir):
    """(version, case) -> check_verl.py's outcome for CHECK_CASES[case]; one verl interpreter per version
    checks every case."""
    outcomes: dict[str, dict] = {}

    def outcome(version: str, case: str) -> subprocess.CompletedProcess:
        if version not in outcomes:
            outcomes[version] = check_cases(version, tmp_path_factory.mktemp(f"verl-{version}-checks"),
                                            tiny_model_dir, CHECK_CASES)
        return outcomes[version][case]

    return outcome


@pytest.mark.verl
@pytest.mark.parametrize("version", VERSIONS)
def test_overrides_compose_and_validate_in_real_verl(version, verl_checks):
    proc = verl_checks(version, "compose")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["verl"] == version
    assert (report["val_n"], report["val_do_sample"]) == (3, True)  # train.val_generations
    assert (report["lora_rank"], report["lora_alpha"]) == (16, 32)
    assert report["adv_estimator"] == "grpo" and report["rollout_n"] == 8 and report["rollout_name"] == "vllm"
    assert report["use_kl_loss"] is True and report["kl_loss_type"] == "low_var_kl"
    assert report["load_format"] == "safetensors"
    # the rollout's context is a prompt plus a response (null: the model's max_position_embeddings)
    assert report["max_model_len"] == sum(report["prompt_response"]) > 0
    # verl's own loader resolved OUR reward function (not verl's default scorer) with our kwargs
    assert report["reward_fn"] == "llmrnn.reward.entry.compute_score"  # pkg://llmrnn.reward re-exports it
    assert report["reward_kwargs"]["endpoint_file"].endswith("endpoint.json")
    assert report["reward_kwargs"]["numeric_only"] is True
    # the reward's settings reach compute_score as arguments, through Hydra and verl's loader unchanged
    assert json.loads(report["reward_kwargs"]["reward_cfg"]) == REWARD_SECTION
    assert json.loads(report["reward_kwargs"]["guard"]) == {"max_fallback_rate": 0.2, "window": 64}
    assert report["default_local_dir"].endswith("train/checkpoints") and report["resume_mode"] == "auto"
    assert report["validation_data_dir"].endswith("train/validation")  # verl's validation dump, beside rollouts/
    # verl 0.9's default v1 trainer imports TransferQueue (not in our verl env); v0 is the loop rehearse_fit runs
    assert report["use_v1"] is (False if version.startswith("0.9") else None)
    assert report["logger"] == ["console", "file"]
    # our parquet loads through verl's RLHFDataset with a chat-template tokenizer
    assert report["dataset_rows"] == 6 and report["item_data_source"] == "llm_as_rnn_memory_update"
    assert report["item_ground_truth_is_json"] is True


@pytest.mark.verl
@pytest.mark.parametrize("version", VERSIONS)
def test_misspelled_key_fails(version, verl_checks):
    proc = verl_checks(version, "misspelled")
    assert proc.returncode != 0
    assert "kl_los_coef" in proc.stderr and "Could not override" in proc.stderr


@pytest.mark.verl
@pytest.mark.parametrize("version", VERSIONS)
def test_micro_batch_verl_only_checks_on_the_gpu_node_is_caught_by_preflight(version, verl_checks):
    """verl checks mini x n / GPUs % micro only inside the FSDP worker (fsdp_workers.py), i.e. after the job
    got its GPUs; its config-level validation lets it through. Our preflight rejects it before the queue."""
    from llmrnn.train import config as tcfg

    cfg = CHECK_CASES["micro_batch"]["cfg"]
    proc = verl_checks(version, "micro_batch")
    assert proc.returncode == 0, proc.stderr[-2000:]
    problems = tcfg.settings(cfg).geometry.problems
    assert any("micro_per_gpu=3 does not divide the 64 responses" in p for p in problems)


# ----------------------------------------------------------------------------- rehearsal of the reward half
@pytest.mark.verl
@pytest.mark.slow
def test_rehearsal_verl_scores_our_trajectory_parquet_through_compute_score(tmp_path, tiny_model_dir):
    """verl 0.7.1's own classes on CPU: RLHFDataset loads the train parquet that the real trajectories code
    made (forward pass with the tiny model + gather), and verl's RewardLoopWorker with the naive reward
    manager scores a batch through llmrnn.reward.compute_score against a judge on 127.0.0.1 (scripted
    answers: the judge MODEL is the fake part). Invalid policy JSON scores 0.05 without a judge call."""
    from llmrnn import io, trajectories
    from llmrnn.cohort import dump_cohort, synthesize_cohort
    from tests.judge_helpers import ScriptedJudge, memory, prompt_of, write_endpoint, write_rubric

    python = verl_python("0.7.1")
    if subprocess.run([str(python), "-c", "import tenacity"], capture_output=True, check=False).returncode:
        pytest.skip("the verl 0.7.1 venv predates tenacity in scripts/make_verl_env.sh: `make verl-envs` rebuilds it")
    split = tmp_path / "train.json"
    io.write_text(split, dump_cohort(synthesize_cohort(3, seed=4)))
    role = {"model": str(tiny_model_dir), "backend": "transformers", "temperature": 0.7, "top_p": 0.95,
            "max_tokens": 8}
    cfg = {"roles": {r: dict(role) for r in ("prediction", "evaluation", "memory")},
           "trajectories": {"shards": 1, "max_visits": 4, "seed": 3}}
    rows, stats = trajectories.run_shard("train", split, 0, cfg, REPO / "config" / "prompts" / "llmrnn.yaml")
    trajectories.write_parquet(tmp_path / "part_0.parquet", rows)
    io.write_json(tmp_path / "part_0.json", stats)
    rows, _ = trajectories.gather("train", [tmp_path / "part_0.parquet"], [tmp_path / "part_0.json"])
    parquet = tmp_path / "train.parquet"
    trajectories.write_parquet(parquet, rows)
    responses = [memory("CKD stage 3 and heart failure: watch edema at the next visit."),
                 memory("Patient likes gardening."), "not JSON at all"]

    def judge_answer(body):  # the scripted judge prefers the memory that names the next visit's risks
        return "Score: 8" if "watch edema at the next visit" in prompt_of(body) else "Score: 3"

    with ScriptedJudge(judge_answer) as judge:
        endpoint = write_endpoint(tmp_path, judge.port, write_rubric(tmp_path))
        overrides = verl_overrides.build_overrides(
            dict(REFERENCE), train_parquet=str(parquet), val_parquet=None, model_dir=str(tiny_model_dir),
            out_dir=str(tmp_path / "train"), experiment_name="rehearsal", endpoint_file=str(endpoint),
            verl_version="0.7.1")
        (tmp_path / "overrides.json").write_text(json.dumps(overrides))
        (tmp_path / "responses.json").write_text(json.dumps(responses))
        env = dict(os.environ, PYTHONPATH=str(REPO / "src"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
        proc = subprocess.run(
            [str(python), str(REPO / "tests" / "verl" / "rehearse_reward.py"), "--overrides",
             str(tmp_path / "overrides.json"), "--responses", str(tmp_path / "responses.json")],
            capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    n = len(rows)
    assert report["verl"] == "0.7.1" and report["dataset_rows"] == n >= 3
    assert report["reward_manager"].endswith("reward_manager.naive.NaiveRewardManager")
    expected = [(8 / 9, "score_line"), (3 / 9, "score_line"), (0.05, "invalid_json")]
    got = list(zip(report["scores"], report["parse_methods"]))
    for i, (score, method) in enumerate(got):
        want_score, want_method = expected[i % 3]
        assert method == want_method and score == pytest.approx(want_score), (i, got)
    assert judge.hits == sum(1 for i in range(n) if i % 3 != 2)  # invalid JSON never reached the judge
    assert "judge_latency_s" in report["extra_keys"] and "valid_json" in report["extra_keys"]
    assert sorted(set(report["patients"])) == sorted({r["extra_info"]["patient_id"] for r in rows})
    assert list((tmp_path / "train" / "audit").glob("*.jsonl"))  # every judge call audited


# ----------------------------------------------------------------------------- verl's batch assembly
@pytest.mark.verl
@pytest.mark.parametrize("version", VERSIONS)
def test_verl_assembles_batches_mixing_every_reward_path_in_every_order(version, tmp_path, tiny_model_dir):
    """verl 0.7.1's own NaiveRewardManager scores real compute_score outputs (memory head: judged, invalid
    JSON, judge fallback; qa: tag answer, no answer, judge fallback) through a judge on 127.0.0.1; then its
    AgentLoopWorker._postprocess and DataProto.concat assemble them in every order, as one worker and as
    one worker per sample (tests/verl/assemble_batch.py). A key on one path only failed here with KeyError
    'truncated_calls' (judged first) or an AssertionError in concat (the other orders). Then the trainer's
    own rollout dump (extract_reward, RayPPOTrainer._log_rollout_data/_dump_generations) writes the batch:
    integer diagnostics (retries, judge_calls, ...) failed verl 0.7.1's json.dumps there with "Object of type
    int64 is not JSON serializable", at the end of every step; every diagnostic is a float now."""
    from tests.judge_helpers import ScriptedJudge, make_step, memory, write_endpoint, write_rubric

    python = verl_python(version)
    needs = "cachetools" + (", fastapi, uvicorn" if version.startswith("0.9") else "")  # 0.9's agent loop imports them
    if subprocess.run([str(python), "-c", f"import {needs}"], capture_output=True, check=False).returncode:
        pytest.skip(f"the verl {version} venv predates cachetools/fastapi/uvicorn in scripts/make_verl_env.sh: "
                    "`make verl-envs` rebuilds it")

    def judge_answer(body):
        if "unscorable" in json.dumps(body):
            return "I cannot decide this one, the text is neither good nor bad in my view, sorry. " * 3
        return "Score: 8"

    with ScriptedJudge(judge_answer) as judge:
        endpoint = str(write_endpoint(tmp_path, judge.port, write_rubric(tmp_path)))
        step = json.dumps(make_step())
        # the reward_kwargs `train run` builds (llmrnn.reward.kwargs), as verl's config carries them
        guard = guard_spec(0.9, 64)
        head = {"path": "pkg://llmrnn.reward", "data_source": "llm_as_rnn_memory_update", "ground_truth": step,
                "reward_kwargs": {**reward_kwargs({"mode": "scalar"}, audit_dir=tmp_path / "audit",
                                                  endpoint_file=endpoint, guard=guard), "numeric_only": True}}
        qa_cfg = {"weights": {"exact_match": 1.0, "judge": 0.5}}
        qa = {"path": "pkg://llmrnn.qa.rewards", "data_source": "llmrnn_qa",
              "ground_truth": json.dumps({"answer": "B", "question": "Which?", "options": {"A": "x", "B": "y"}}),
              "reward_kwargs": {**reward_kwargs(qa_cfg, audit_dir=tmp_path / "qa_audit", endpoint_file=endpoint,
                                                guard=guard), "numeric_only": True}}
        samples = [
            dict(head, name="judged", solution_str=memory("CKD stage 3: watch edema at the next visit.")),
            dict(head, name="invalid_json", solution_str="not JSON at all"),
            dict(head, name="fallback", solution_str=memory("unscorable memory")),
        ]
        qa_samples = [
            dict(qa, name="qa_tag", solution_str="<reasoning>r</reasoning><answer>B</answer>"),
            dict(qa, name="qa_none", solution_str=""),
            dict(qa, name="qa_fallback", solution_str="<answer>unscorable</answer>"),
        ]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
                   HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
        sets = []  # both sample sets in one verl interpreter (its start imports verl and torch)
        for i, batch in enumerate((samples, qa_samples)):
            (tmp_path / f"samples{i}.json").write_text(json.dumps(batch))
            sets += ["--samples", str(tmp_path / f"samples{i}.json"), "--dump", str(tmp_path / f"dump{i}")]
        proc = subprocess.run(
            [str(python), str(REPO / "tests" / "verl" / "assemble_batch.py"), *sets, "--model", str(tiny_model_dir)],
            capture_output=True, text=True, env=env, timeout=600, check=False)
        assert proc.returncode == 0, proc.stderr[-4000:]
        # one report line per set; verl prints its own lines between them (the dump's path)
        reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"verl": ')]
        assert len(reports) == 2, proc.stdout[-4000:]
    head_report, qa_report = reports
    assert head_report["verl"] == version and head_report["orders"] == 6 == qa_report["orders"]
    assert head_report["scores"] == pytest.approx({"judged": 8 / 9, "invalid_json": 0.05, "fallback": 0.5})
    # exact match 1, format 1 at qa.reward.weights.format's one default 0.2 (the tags are there), judge 8/9 at 0.5
    assert qa_report["scores"]["qa_tag"] == pytest.approx(1.0 + 0.2 + 0.5 * 8 / 9)
    assert qa_report["scores"]["qa_fallback"] == pytest.approx(0.25)
    for report in reports:
        assert report["failures"] == [], report["failures"]
        assert len({tuple(k) for k in report["keys"].values()}) == 1, report["keys"]
    assert "truncated_calls" in head_report["keys"]["invalid_json"]
    for report in reports:  # the trainer's dump: one row per sample, every diagnostic a float as we read it back
        assert isinstance(report["dump"], list), report["dump"]
        assert len(report["dump"]) == 3
        for row in report["dump"]:
            for key in report["keys"]["judged" if report is head_report else "qa_tag"]:
                assert type(row[key]) is float, (key, row[key])
    rates = [verl_cmd.rollout_stats(tmp_path / "dump0", 1)]  # what train run reads back from the dump
    assert rates[0]["llmrnn/judge_fallback_rate"] == pytest.approx(0.5)  # fallback of judged + fallback


# ----------------------------------------------------------------------------- the workers' environment
@pytest.mark.verl
@pytest.mark.slow
def test_verl_ray_workers_get_the_metrics_path_reward_env_and_umask_without_the_driver_env(tmp_path, tiny_model_dir):
    """On a `ray start` cluster a worker on another node has its raylet's environment, not main_ppo's: the
    metrics path (VERL_FILE_LOGGER_PATH) and umask 077 were lost. verl 0.7.1's own run_ppo builds ray.init's
    runtime_env from our overrides; a Ray worker started in a process that lacks those variables (umask 022)
    sees them all and writes files 0600 (tests/verl/ray_env.py). The reward's settings are no variable: they
    are compute_score's reward_kwargs, which travel in the config to every worker."""
    from llmrnn.reward import guard_spec, reward_kwargs
    from llmrnn.train import tracking
    from llmrnn.train.ray_cluster import single_node_overrides

    python = verl_python("0.7.1")
    work = tmp_path / "train"
    train = write_parquet(tmp_path / "train.parquet", make_rows(6))
    env = {"VERL_FILE_LOGGER_PATH": str(work / "state" / "verl metrics.jsonl"),
           "LLMRNN_REWARD_CFG": "the old variable: never forwarded",
           # train.report_to's folders reach the workers too; the W&B key (a secret) never travels
           **tracking.tracking_env(Train(report_to=["tensorboard", "wandb", "mlflow"]), work, environ={}),
           "WANDB_API_KEY": "sentinel-wandb-key"}
    overrides = verl_overrides.build_overrides(
        dict(REFERENCE), train_parquet=train, val_parquet=None, model_dir=str(tiny_model_dir), out_dir=str(work),
        experiment_name="t", endpoint_file=str(tmp_path / "endpoint.json"), verl_version="0.7.1",
        reward_kwargs=reward_kwargs({"mode": "scalar", "outcome_epsilon": 0.1}, audit_dir=work / "audit",
                                    endpoint_file=tmp_path / "endpoint.json", guard=guard_spec(0.2, 64)),
    ) + single_node_overrides({"SLURM_CPUS_PER_TASK": "1"}) + verl_overrides.runtime_env_overrides(env)
    assert not [o for o in overrides if "LLMRNN_" in o]
    (tmp_path / "overrides.json").write_text(json.dumps(overrides))
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    names = [*verl_overrides.FORWARDED_ENV, *tracking.FORWARDED_ENV, "WANDB_API_KEY"]
    clean = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", str(tmp_path)), "HF_HUB_OFFLINE": "1",
             "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [str(python), str(REPO / "tests" / "verl" / "ray_env.py"), "--overrides", str(tmp_path / "overrides.json"),
         "--probe-dir", str(probe_dir), "--names", ",".join(names)],
        # a local Ray starts six Python processes: 20 s on a quiet machine, 374 s measured at load 9 on 2 cores
        capture_output=True, text=True, env=clean, timeout=1500, check=False)
    # Ray's own warnings come first in its stderr: the message leads with the harness's last line (what failed)
    assert proc.returncode == 0, (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1] + "\n" + proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["env"] == {k: env.get(k) for k in names if k != "WANDB_API_KEY"} | {"WANDB_API_KEY": None}, report
    assert report["env"]["TENSORBOARD_DIR"] == str(work.resolve() / "tensorboard")
    assert "sentinel" not in (tmp_path / "overrides.json").read_text() + proc.stdout + proc.stderr
    assert report["mode"] == "0o600", report  # rollout dumps with patient text: the user's alone
    assert report["runtime_env"]["env_vars"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "true"  # verl's own stay


# ----------------------------------------------------------------------------- the actor's model load
ATTN_OVERRIDES = ("+actor_rollout_ref.model.override_config.attn_implementation=",
                  "actor_rollout_ref.model.use_remove_padding=")


def gpu_lock_python() -> Path:
    """The locked GPU stack minus torch/CUDA (transformers 4.57; `make .venv-gpu-cpu/.installed-llmrnn`)."""
    venv = REPO / ".venv-gpu-cpu"
    if not (venv / ".installed-llmrnn").exists():
        pytest.skip("no .venv-gpu-cpu: run `make .venv-gpu-cpu/.installed-llmrnn` (make test-gpu-stack builds it)")
    return venv / "bin" / "python"


def gpu_lock_env() -> dict:
    return dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TRANSFORMERS_VERBOSITY="error",
                PYTHONPATH=str(REPO))


@pytest.fixture(scope="module")
def gpu_lock_tiny_model(tmp_path_factory) -> Path:
    """The tiny model saved by the lock's transformers 4.57 (a 5.x tokenizer file names a class 4.57 lacks);
    built once for the module (one interpreter start with torch and transformers 4.57)."""
    python = gpu_lock_python()
    model = tmp_path_factory.mktemp("gpu-lock") / "tiny-llama"
    subprocess.run([str(python), "-c", f"from tests.tiny_model import build_tiny_model; build_tiny_model({str(model)!r})"],
                   env=gpu_lock_env(), check=True, capture_output=True, timeout=300)
    return model


@pytest.fixture(scope="module")
def actor_checks(tmp_path_factory, gpu_lock_tiny_model) -> dict[str, subprocess.CompletedProcess]:
    """verl 0.7.1's check of REFERENCE on the lock's tiny model, with our attention overrides ("rendered") and
    without them ("verl-defaults"): both in one verl interpreter."""
    return check_cases("0.7.1", tmp_path_factory.mktemp("verl-actor-checks"), gpu_lock_tiny_model,
                       {"rendered": {"cfg": REFERENCE}, "verl-defaults": {"cfg": REFERENCE, "drop": ATTN_OVERRIDES}})


@pytest.mark.verl
@pytest.mark.parametrize("rendered", [True, False], ids=["rendered", "verl-defaults"])
def test_actor_loads_the_way_verl_071_loads_it_in_the_locked_gpu_venv(rendered, tmp_path, gpu_lock_tiny_model,
                                                                       actor_checks):
    """verl 0.7.1 composes the model settings (ours, or its own defaults when our two attention overrides
    are left out); the locked GPU venv (transformers 4.57, no flash-attn) then loads the actor exactly as
    verl's FSDP worker does (tests/verl/load_actor.py). verl's defaults (flash_attention_2 + remove padding)
    fail there with ImportError; the rendered ones load and run a forward pass."""
    python = gpu_lock_python()
    env = gpu_lock_env()
    model = gpu_lock_tiny_model
    proc = actor_checks["rendered" if rendered else "verl-defaults"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    settings = {k: report[k] for k in ("model_override_config", "use_remove_padding")}
    if rendered:
        assert settings == {"model_override_config": {"attn_implementation": "sdpa"}, "use_remove_padding": False}
    else:
        assert settings == {"model_override_config": {}, "use_remove_padding": True}
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(settings))
    load = subprocess.run([str(python), str(REPO / "tests" / "verl" / "load_actor.py"), "--model", str(model),
                           "--settings", str(path)], capture_output=True, text=True, env=env, timeout=600, check=False)
    if rendered:
        assert load.returncode == 0, load.stderr[-3000:]
        out = json.loads(load.stdout.strip().splitlines()[-1])
        assert out["transformers"].startswith("4.57") and out["attn_implementation"] == "sdpa"
        assert out["finite"] and out["logits_shape"][0] == 1
    else:
        assert load.returncode == 1, (load.stdout, load.stderr[-3000:])
        assert "ImportError" in load.stderr and "flash" in load.stderr.lower()


def test_attention_knob_renders_both_verl_settings():
    def rendered(**verl):
        ov = verl_overrides.build_overrides({"verl": verl}, train_parquet="t", val_parquet=None, model_dir="m",
                                            out_dir="o", experiment_name="e", verl_version="0.7.1")
        return [o for o in ov if o.startswith(ATTN_OVERRIDES)]

    assert sorted(rendered()) == ["+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
                                  "actor_rollout_ref.model.use_remove_padding=false"]
    assert sorted(rendered(attn_implementation="flash_attention_2")) == [
        "+actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2",
        "actor_rollout_ref.model.use_remove_padding=true"]
    with pytest.raises(Exception, match="train.verl.attn_implementation"):
        rendered(attn_implementation="flash_attn")


def test_check_allows_flash_attention_only_where_flash_attn_imports(monkeypatch):
    import importlib.util

    from llmrnn import check
    from llmrnn.train import config as tcfg

    flash = tcfg.settings({"verl": {"attn_implementation": "flash_attention_2"}})
    assert check.check_attention(tcfg.settings({})) == []
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flash_attn" else object())
    (problem,) = check.check_attention(flash)
    assert problem.startswith("train.verl.attn_implementation: flash_attention_2 needs the flash-attn package")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())  # a node with flash-attn
    assert check.check_attention(flash) == []


def test_overrides_use_the_reward_keys_that_work_in_both_releases():
    ov = verl_overrides.build_overrides({}, train_parquet="t.parquet", val_parquet="v.parquet", model_dir="m",
                                        out_dir="o", experiment_name="e", verl_version="0.9.1")
    keys = [o.split("=", 1)[0] for o in ov]
    assert not any(k.startswith(("custom_reward_function", "+custom_reward_function")) for k in keys)
    assert "reward.custom_reward_function.path=pkg://llmrnn.reward" in ov
    assert "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4" in ov
    assert "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4" in ov
    with pytest.raises(Exception, match="unsupported"):
        verl_overrides.build_overrides({}, train_parquet="t", val_parquet=None, model_dir="m", out_dir="o",
                                       experiment_name="e", verl_version="0.3.0")



def test_the_train_section_is_normalised_once(monkeypatch):
    """`llmrnn train run` normalises the section at the CLI boundary; verl_cmd.run and build_overrides
    take it as it is (they normalised it again, twice, before) and still normalise a raw one."""
    from llmrnn.train import config as tcfg

    cfg = tcfg.settings({"group_size": 4})
    assert tcfg.settings(cfg) is cfg and isinstance(cfg, Train)
    merges = []
    real = tcfg.parse
    monkeypatch.setattr(tcfg, "parse", lambda *a: merges.append(a) or real(*a))
    kw = {"train_parquet": "t.parquet", "val_parquet": None, "model_dir": "m", "out_dir": "o", "experiment_name": "e"}
    normalised = verl_overrides.build_overrides(cfg, **kw)
    assert merges == [] and "actor_rollout_ref.rollout.n=4" in normalised
    assert verl_overrides.build_overrides({"group_size": 4}, **kw) == normalised and len(merges) == 1
    with pytest.raises(InputError, match="train.group_size"):
        verl_overrides.build_overrides({"group_size": 0}, **kw)

# ----------------------------------------------------------------------------- the run wrapper
FAKE_MAIN_PPO = textwrap.dedent(
    '''
    """STAND-IN for `python -m verl.trainer.main_ppo` (verl cannot train without a GPU): writes what verl
    writes - file-logger lines, rollout dumps, global_step_N/actor/lora_adapter, latest_checkpointed_iteration."""
    import json, os, sys
    args = dict(a.split("=", 1) for a in sys.argv[3:] if "=" in a)
    out = args["trainer.default_local_dir"]
    stop = int(os.environ.get("FAKE_STOP_AT", "0"))
    total = int(os.environ["FAKE_TOTAL"])
    start = int(open(os.path.join(out, "latest_checkpointed_iteration.txt")).read()) if os.path.exists(
        os.path.join(out, "latest_checkpointed_iteration.txt")) else 0
    log = open(os.environ["VERL_FILE_LOGGER_PATH"], "w")
    os.makedirs(args["trainer.rollout_data_dir"], exist_ok=True)
    for step in range(start + 1, total + 1):
        with open(os.path.join(args["trainer.rollout_data_dir"], f"{step}.jsonl"), "w") as fh:
            for s, fb in ((0.2, 0.0), (0.6, 1.0)):
                fh.write(json.dumps({"score": s, "parse_fallback": fb, "valid_json": 1.0, "step": step}) + "\\n")
        data = {"critic/score/mean": 0.4, "actor/kl_loss": 0.01 * step, "actor/entropy": 1.0,
                "response_length/mean": 50, "actor/pg_clipfrac": 0.0,
                "actor/grad_norm": float(os.environ.get("FAKE_GRAD_NORM", "0.5")),
                "actor/lr": float(args["actor_rollout_ref.actor.optim.lr"]), "timing_s/step": 2.0}
        if step % int(args["trainer.test_freq"]) == 0:
            data["val-core/llm_as_rnn_memory_update/reward/mean@1"] = 0.5
        log.write(json.dumps({"step": step, "data": data}) + "\\n")
        log.flush()
        if step == stop:
            sys.exit(0)  # ends early but exits 0: the failure mode the wrapper must catch
        d = os.path.join(out, f"global_step_{step}", "actor", "lora_adapter")
        os.makedirs(d, exist_ok=True)
        json.dump({"r": int(args["actor_rollout_ref.model.lora_rank"]),
                   "lora_alpha": int(args["actor_rollout_ref.model.lora_alpha"])},
                  open(os.path.join(d, "adapter_config.json"), "w"))
        import torch  # the adapter's tensors, as verl writes them (train run refuses an empty adapter)
        from safetensors.torch import save_file
        stem = "base_model.model.model.layers.0.self_attn.q_proj"
        save_file({f"{stem}.lora_A.weight": torch.ones(2, 8), f"{stem}.lora_B.weight": torch.ones(8, 2)},
                  os.path.join(d, "adapter_model.safetensors"))
        open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w").write(str(step))
    '''
)


def install_fake_main_ppo(tmp_path: Path, monkeypatch, source: str) -> Path:
    """A stand-in `verl.trainer.main_ppo` (no verl in this venv) first on PYTHONPATH, and a fast poll."""
    fake = tmp_path / "fake"
    (fake / "verl" / "trainer").mkdir(parents=True)
    (fake / "verl" / "__init__.py").write_text("")
    (fake / "verl" / "trainer" / "__init__.py").write_text("")
    (fake / "verl" / "trainer" / "main_ppo.py").write_text(source)
    monkeypatch.setenv("PYTHONPATH", str(fake))
    monkeypatch.setattr(verl_cmd, "POLL_S", 0.05)
    return fake


def test_verl_run_streams_metrics_checks_completion_and_copies_adapter(tmp_path, monkeypatch):
    install_fake_main_ppo(tmp_path, monkeypatch, FAKE_MAIN_PPO)
    train = write_parquet(tmp_path / "train.parquet", make_rows(8))
    val = write_parquet(tmp_path / "val.parquet", make_rows(2, split="val"))
    cfg = {"batch": {"train": 2, "mini": 2, "micro_per_gpu": 4}, "group_size": 4, "epochs": 2, "test_freq": 2,
           "lora": {"rank": 8, "alpha": 16}}
    out = tmp_path / "train"
    spec = RunSpec(cfg, train_parquet=train, val_parquet=val, model_dir="m", work_dir=str(out),
                   adapter_dir=out / "adapter", metrics_path=out / "metrics.jsonl", run_name="e")

    monkeypatch.setenv("FAKE_TOTAL", "8")
    monkeypatch.setenv("FAKE_STOP_AT", "5")
    with pytest.raises(CheckFailed, match="stopped at step 4 of 8"):
        verl_cmd.run(spec, verl_version="0.7.1")
    assert not (out / "adapter").exists()

    monkeypatch.setenv("FAKE_STOP_AT", "0")
    summary = verl_cmd.run(spec, verl_version="0.7.1")
    assert summary["resumed_from_step"] == 4 and summary["steps"] == 8
    conf = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert (conf["r"], conf["lora_alpha"]) == (8, 16)
    # rollout dumps hold patient text: verl runs under umask 077, so they are the owner's alone
    assert (out / "rollouts" / "1.jsonl").stat().st_mode & 0o777 == 0o600
    assert (out / "rollouts").stat().st_mode & 0o777 == 0o700
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == list(range(1, 9))
    assert [r["step"] for r in rows if r["kind"] == "val"] == [2, 4, 6, 8]
    first = rows[0]
    assert first["reward_mean"] == 0.4 and first["reward_std"] == pytest.approx(0.2)
    assert first["judge_fallback_rate"] == 0.5 and first["kl"] == pytest.approx(0.01)
    assert "python" in (out / "state" / "verl_command.sh").read_text() and sys.executable


class _Stopped(Exception):
    """Raised where a test stops an engine before it trains."""


def test_train_run_hands_one_run_spec_to_either_engine(tmp_path, monkeypatch):
    """`llmrnn train run` builds one RunSpec from its arguments and hands it to the engine train.engine (or
    --engine) names: the same spec, but for train.engine, reaches TRL's engine (stopped before it loads
    torch) and verl's runner, whose main_ppo command (stopped before it runs) is built from it."""
    import dataclasses

    from llmrnn import cli, gpu_stack
    from llmrnn.train import trl_engine

    specs, commands = {}, []

    def entered(name, real):
        def entry(spec, **kw):
            specs[name] = spec
            return real(spec, **kw)
        return entry

    def threads_not_set(threads):
        raise _Stopped("trl")

    def main_ppo_not_run(cmd, env, out, follow, stop=None):
        commands.append(cmd)
        raise _Stopped("verl")

    monkeypatch.setattr(trl_engine, "train", entered("trl", trl_engine.train))
    monkeypatch.setattr(trl_engine, "_setup_threads", threads_not_set)
    monkeypatch.setattr(verl_cmd, "run", entered("verl", verl_cmd.run))
    monkeypatch.setattr(verl_cmd, "_main_ppo", main_ppo_not_run)
    monkeypatch.setattr(gpu_stack, "require_verl", lambda: None)  # no verl nor GPU here
    monkeypatch.setattr(gpu_stack, "require_gpus", lambda need, have: None)
    for var in ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID"):
        monkeypatch.delenv(var, raising=False)
    train = write_parquet(tmp_path / "train.parquet", make_rows(8))
    cfg = {"train": {"batch": {"train": 2, "mini": 2, "micro_per_gpu": 4}, "group_size": 4, "epochs": 1,
                     "test_freq": 0}, "reward": {"mode": "outcome"}}
    work = tmp_path / "run" / "train"
    for engine in ("trl", "verl"):
        args = cli.build_parser(("train",)).parse_args([
            "train", "run", "--cfg", json.dumps(cfg), "--train", str(train), "--model", "m", "--work-dir", str(work),
            "--adapter", str(work / "adapter"), "--metrics", str(work / "metrics.jsonl"),
            "--summary", str(work / "summary.json"), "--engine", engine])
        with pytest.raises(_Stopped, match=engine):
            args.func(args)
    trl, verl = specs["trl"], specs["verl"]
    assert (type(trl), trl.cfg.engine, verl.cfg.engine) == (RunSpec, "trl", "verl")
    assert dataclasses.replace(trl, cfg=verl.cfg) == verl
    assert (trl.train_parquet, trl.work_dir, trl.run_name, trl.tracked_config) == (str(train), str(work), "run", cfg)
    (cmd,) = commands
    assert {f"data.train_files={train}", "trainer.experiment_name=run",
            f"trainer.default_local_dir={work / 'checkpoints'}"} <= set(cmd)
    assert f"+reward.custom_reward_function.reward_kwargs.audit_dir={work / 'audit'}" in cmd


def test_a_verl_run_whose_gradient_was_always_zero_is_not_complete(tmp_path, monkeypatch):
    """As under TRL: verl exits 0 after every planned step, but the gradient norm was 0 at each (a constant
    reward): one line, and no adapter is written."""
    install_fake_main_ppo(tmp_path, monkeypatch, FAKE_MAIN_PPO)
    monkeypatch.setenv("FAKE_TOTAL", "4")
    monkeypatch.setenv("FAKE_GRAD_NORM", "0")
    train = write_parquet(tmp_path / "train.parquet", make_rows(8))
    cfg = {"batch": {"train": 2, "mini": 2, "micro_per_gpu": 4}, "group_size": 4, "epochs": 1, "test_freq": 2,
           "lora": {"rank": 8, "alpha": 16}}
    out = tmp_path / "train"
    with pytest.raises(CheckFailed, match=r"the gradient norm was 0 at every one of 4 logged steps"):
        verl_cmd.run(RunSpec(cfg, train_parquet=train, val_parquet=None, model_dir="m", work_dir=str(out),
                             adapter_dir=out / "adapter", metrics_path=out / "metrics.jsonl", run_name="e"),
                     verl_version="0.7.1")
    assert not (out / "adapter").exists()


def verl09_actor(root: Path, meta: dict | None) -> Path:
    """A folder shaped as verl 0.9's engine writes a LoRA checkpoint's actor/ (shard names, fsdp_config.json,
    lora_train_meta.json); its shard is not a real one."""
    actor = root / "global_step_1" / "actor"
    actor.mkdir(parents=True)
    (actor / "model_world_size_1_rank_0.pt").write_bytes(b"not a torch file")
    (actor / "fsdp_config.json").write_text(json.dumps({"world_size": 1}))
    if meta is not None:
        (actor / "lora_train_meta.json").write_text(json.dumps(meta))
    return actor


def test_a_verl_09_checkpoint_whose_gather_fails_stops_in_one_line_naming_the_merger_log(tmp_path):
    """train run on a verl 0.9 LoRA checkpoint runs verl's model merger with the training Python; here that
    Python has no verl (this venv's), so the merger fails: one line, the merger's last line, its log."""
    actor = verl09_actor(tmp_path, {"r": 8, "lora_alpha": 16, "task_type": "CAUSAL_LM"})
    scratch = tmp_path / "state" / "gathered"
    with pytest.raises(CheckFailed) as err:
        verl_adapter.adapter_from_checkpoint(actor, tmp_path / "adapter", Train(lora={"rank": 8, "alpha": 16}),
                                         python=sys.executable, scratch=scratch)
    msg = str(err.value)
    assert "\n" not in msg and "verl's model_merger exited with 1" in msg and "No module named" in msg, msg
    assert str(tmp_path / "state" / "model_merger.log") in msg
    assert not (tmp_path / "adapter").exists() and not scratch.exists()
    # without lora_train_meta.json it is no 0.9 LoRA checkpoint: the 0.7 rule (lora_adapter/ is required) stands
    plain = verl09_actor(tmp_path / "full", None)
    with pytest.raises(CheckFailed, match="no lora_adapter in the final verl checkpoint"):
        verl_adapter.adapter_from_checkpoint(plain, tmp_path / "adapter", Train(lora={"rank": 8, "alpha": 16}),
                                         python=sys.executable)


@pytest.mark.parametrize("meta, want, source", [
    ({"r": 8, "lora_alpha": 32}, 32, "lora_train_meta.json"),  # the trained model's alpha first
    (None, 16, "train.lora.alpha"),  # no metadata: the configured alpha
])
def test_an_alpha_of_0_from_verls_merger_is_set_from_the_checkpoint_metadata_or_the_config(tmp_path, meta, want,
                                                                                           source):
    actor = verl09_actor(tmp_path, meta)
    adapter = tmp_path / "lora_adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 0, "peft_type": "LORA"}))
    got = verl_adapter.fix_gathered_alpha(adapter, actor, Train(lora={"rank": 8, "alpha": 16}))
    assert got == {"merger_alpha": 0, "alpha_fixed_from": source}
    assert json.loads((adapter / "adapter_config.json").read_text())["lora_alpha"] == want
    # an alpha the merger wrote is kept (check_adapter then compares it with train.lora)
    assert verl_adapter.fix_gathered_alpha(adapter, actor, Train(lora={"rank": 8, "alpha": 99}))["merger_alpha"] == want


FAKE_SCORING_MAIN_PPO = textwrap.dedent(
    '''
    """STAND-IN for `python -m verl.trainer.main_ppo` that scores like verl's reward workers: it calls
    the configured compute_score once per sample with the reward_kwargs, dumps the results per step, and
    dies with the exception when scoring raises (as a Ray worker takes main_ppo down)."""
    import json, os, sys
    from llmrnn.reward import compute_score
    args = dict(a.split("=", 1) for a in sys.argv[3:] if "=" in a)
    prefix = "+reward.custom_reward_function.reward_kwargs."
    unquote = lambda v: v[1:-1].replace("\\\\'", "'").replace("\\\\\\\\", "\\\\") if v[:1] == "'" else v
    kwargs = {k[len(prefix):]: unquote(v) for k, v in args.items() if k.startswith(prefix)}
    kwargs["numeric_only"] = kwargs["numeric_only"] == "true"
    log = open(os.environ["VERL_FILE_LOGGER_PATH"], "w")
    os.makedirs(args["trainer.rollout_data_dir"], exist_ok=True)
    gt = os.environ["FAKE_GROUND_TRUTH"]
    for step in range(1, 4):
        results = [compute_score("llm_as_rnn_memory_update", json.dumps({"evolving_summary": f"s{step} m{i}"}),
                                 gt, {"index": i}, **kwargs) for i in range(4)]
        with open(os.path.join(args["trainer.rollout_data_dir"], f"{step}.jsonl"), "w") as fh:
            for r in results:
                fh.write(json.dumps(dict(r, step=step)) + "\\n")
        log.write(json.dumps({"step": step, "data": {"critic/score/mean": 0.5}}) + "\\n")
        log.flush()
    '''
)


def install_scoring_verl(tmp_path, monkeypatch) -> None:
    """A stand-in `verl.trainer.main_ppo` (FAKE_SCORING_MAIN_PPO, named as a fake: no GPU here) first on
    PYTHONPATH, scoring one real TrajectoryStep through llmrnn.reward."""
    from tests.judge_helpers import make_step

    fake_dir = tmp_path / "fake"
    (fake_dir / "verl" / "trainer").mkdir(parents=True)
    (fake_dir / "verl" / "__init__.py").write_text("")
    (fake_dir / "verl" / "trainer" / "__init__.py").write_text("")
    (fake_dir / "verl" / "trainer" / "main_ppo.py").write_text(FAKE_SCORING_MAIN_PPO)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake_dir), str(REPO / "src")]))
    monkeypatch.setenv("FAKE_GROUND_TRUTH", json.dumps(make_step()))


def test_verl_run_stops_with_the_reason_the_reward_left(tmp_path, monkeypatch):
    """The reward's fallback guard trips inside a (stand-in) verl worker: the run fails naming the reason,
    and the steps before it carry their judge_fallback_rate from compute_score's numeric flags."""
    from llmrnn.reward import guard_spec, reward_kwargs
    from tests.judge_helpers import ScriptedJudge, write_endpoint, write_rubric

    install_scoring_verl(tmp_path, monkeypatch)
    monkeypatch.setattr(verl_cmd, "POLL_S", 0.05)
    train = write_parquet(tmp_path / "train.parquet", make_rows(8))
    cfg = {"batch": {"train": 2, "mini": 2, "micro_per_gpu": 4}, "group_size": 4, "epochs": 1, "test_freq": 0,
           "lora": {"rank": 8, "alpha": 16}}
    out = tmp_path / "train"
    answers = iter(["Score: 7"] * 4 + ["no score in this answer, sorry"] * 100)
    with ScriptedJudge(lambda body: next(answers)) as judge:
        endpoint = write_endpoint(tmp_path, judge.port, write_rubric(tmp_path))
        with pytest.raises(CheckFailed, match=r"exited with 1: judge degraded during training: 5 of the last 8"):
            kwargs = reward_kwargs(None, audit_dir=out / "audit", endpoint_file=endpoint, guard=guard_spec(0.5, 8))
            verl_cmd.run(RunSpec(cfg, train_parquet=train, val_parquet=None, model_dir="m", work_dir=str(out),
                                 adapter_dir=out / "adapter", metrics_path=out / "metrics.jsonl", run_name="e",
                                 endpoint_file=str(endpoint), reward_kwargs=kwargs), verl_version="0.7.1")
    rows = [json.loads(x) for x in (out / "state" / "metrics.jsonl").read_text().splitlines()]
    assert [r["judge_fallback_rate"] for r in rows if r["kind"] == "train"] == [0.0, 1.0]


def test_verl_reward_workers_score_outcome_mode_without_an_endpoint(tmp_path, monkeypatch):
    """reward.mode outcome: the verl command carries no endpoint and its (stand-in) reward workers score
    through compute_score with only the audit dir and the reward section as reward_kwargs, asking no judge."""
    from llmrnn.reward import reward_kwargs

    install_scoring_verl(tmp_path, monkeypatch)
    monkeypatch.setattr(verl_cmd, "POLL_S", 0.05)
    train = write_parquet(tmp_path / "train.parquet", make_rows(8))
    cfg = {"batch": {"train": 2, "mini": 2, "micro_per_gpu": 4}, "group_size": 4, "epochs": 1, "test_freq": 0,
           "lora": {"rank": 8, "alpha": 16}}
    out = tmp_path / "train"
    kwargs = reward_kwargs({"mode": "outcome"}, audit_dir=out / "audit")  # as `train run` builds it from --cfg
    overrides = verl_overrides.build_overrides(cfg, train_parquet=train, val_parquet=None, model_dir="m", out_dir=str(out),
                                               experiment_name="e", endpoint_file=None, verl_version="0.7.1",
                                               reward_kwargs=kwargs)
    assert not [o for o in overrides if "endpoint" in o]
    assert "+reward.custom_reward_function.reward_kwargs.reward_cfg='{\"mode\": \"outcome\"}'" in overrides
    # the stand-in scores three steps and writes no checkpoint: the run is (rightly) incomplete
    with pytest.raises(CheckFailed) as failed:
        verl_cmd.run(RunSpec(cfg, train_parquet=train, val_parquet=None, model_dir="m", work_dir=str(out),
                             adapter_dir=out / "adapter", metrics_path=out / "metrics.jsonl", run_name="e",
                             reward_kwargs=kwargs), verl_version="0.7.1")
    assert "endpoint" not in str(failed.value) and "exited with" not in str(failed.value)
    scored = [json.loads(x) for step in (1, 2, 3) for x in (out / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
    assert len(scored) == 12 and all(r["parse_outcome"] == 1.0 and r["judge_calls"] == 0 for r in scored)


def test_auto_attention_resolves_by_whether_flash_attn_imports_in_the_training_python(tmp_path, monkeypatch):
    """train.verl.attn_implementation auto: flash_attention_2 + remove-padding where flash-attn imports in the
    Python that runs main_ppo (the reference's image), sdpa where it does not; the result (and why) goes to
    the training summary. The 'imports' case is a real package folder on that Python's path (flash_attn with
    the bert_padding module verl's remove-padding imports), the other this machine's venv."""
    def rendered(attention):
        ov = verl_overrides.build_overrides({}, train_parquet="t", val_parquet=None, model_dir="m", out_dir="o",
                                            experiment_name="e", verl_version="0.7.1", attention=attention)
        return sorted(o for o in ov if o.startswith(ATTN_OVERRIDES))

    without = verl_attention.resolve_attention("auto", sys.executable)
    assert without["ran"] == "sdpa" and not without["use_remove_padding"] and without["flash_attn"] is None
    assert without["why"].startswith("auto: flash-attn does not import (") and "flash_attn" in without["why"]
    assert rendered(without["ran"]) == ["+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
                                        "actor_rollout_ref.model.use_remove_padding=false"]
    pkg = tmp_path / "site" / "flash_attn"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '2.7.4.post1'\n")
    (pkg / "bert_padding.py").write_text("def unpad_input(*a):\n    raise NotImplementedError\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    with_flash = verl_attention.resolve_attention("auto", sys.executable)
    assert with_flash == {"configured": "auto", "ran": "flash_attention_2", "use_remove_padding": True,
                          "flash_attn": "2.7.4.post1", "why": "auto: flash-attn 2.7.4.post1 imports"}
    assert rendered(with_flash["ran"]) == [
        "+actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2",
        "actor_rollout_ref.model.use_remove_padding=true"]
    # a configured kernel is taken as is (check_attention refuses flash_attention_2 without flash-attn)
    assert verl_attention.resolve_attention("sdpa")["ran"] == "sdpa"


# ----------------------------------------------------------------------------- verl's trainer loop, rehearsed
@pytest.fixture(scope="module")
def json_policy_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model, fine-tuned for seconds to answer our prompts with short memory JSON (tests/verl/
    prime_policy.py): its samples differ, so the judged rewards of a group differ and GRPO moves the LoRA."""
    from tests.verl.prime_policy import prime_json_policy

    prompts = [r["prompt"][0]["content"] for r in make_rows(12)]
    return prime_json_policy(tiny_model_dir, tmp_path_factory.mktemp("policy") / "json-llama", prompts, steps=50)


@pytest.mark.verl
@pytest.mark.e2e
@pytest.mark.parametrize("version", VERSIONS)
def test_verl_fit_rehearsed_on_cpu_from_rollout_to_merged_model(version, tmp_path, json_policy_dir):
    """verl's own RayPPOTrainer.fit() (tests/verl/rehearse_fit.py) with the smoke config's train section, our
    parquet and our reward judged through a judge server on 127.0.0.1 (scripted answers: the judge MODEL is the
    fake part). Stand-ins only for the GPU parts: the worker group's dispatch, the vLLM rollout servers, the
    weight sync, and for verl 0.9 the CPU platform (tests/verl/cpu_platform.py). The actor is verl's own:
    0.7.1's DataParallelPPOActor, 0.9's engine ActorRolloutRefWorker with its FSDP2 engine (FSDP1 refuses a
    CPU module with sync_module_states) and checkpoint manager. Validation before training, steps 1-2 and a
    checkpoint, then a second trainer resumes at step 2 and runs step 3; the rollout and validation dumps hold
    float diagnostics; then `llmrnn merge run` on the checkpoint folder. Lengths are cut (prompt 256, response
    24 tokens) to keep it minutes on 2 CPU cores; every other knob is the smoke config's."""
    from llmrnn.runconfig import read_layer, resolve
    from tests.judge_helpers import ScriptedJudge, prompt_of, write_endpoint, write_rubric

    python = verl_python(version)
    config, _ = resolve([read_layer(REPO / "config" / "smoke.yaml")], REPO / "workflow/schemas/config.schema.yaml")
    train = dict(config["train"], n_gpus_per_node=1)  # one CPU process stands in for the GPUs
    work = tmp_path / "train"
    engine = version != "0.7.1"

    def judge_answer(body):  # a judge whose score follows the memory it reads: the group's scores differ
        return f"Score: {len(prompt_of(body)) % 9 + 1}"

    with ScriptedJudge(judge_answer) as judge:
        endpoint = write_endpoint(tmp_path, judge.port, write_rubric(tmp_path))
        overrides = verl_overrides.build_overrides(
            train, train_parquet=write_parquet(tmp_path / "train.parquet", make_rows(12)),
            val_parquet=write_parquet(tmp_path / "val.parquet", make_rows(2, split="val")),
            model_dir=str(json_policy_dir), out_dir=str(work), experiment_name="rehearsal", verl_version=version,
            attention="sdpa", endpoint_file=str(endpoint),
            reward_kwargs=reward_kwargs({"mode": "scalar"}, audit_dir=work / "audit", endpoint_file=endpoint),
        ) + ["trainer.device=cpu", "data.max_prompt_length=256", "data.max_response_length=24",
             "actor_rollout_ref.rollout.max_model_len=280"]
        if engine:
            overrides += ["actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.ref.strategy=fsdp2"]
        (tmp_path / "o.json").write_text(json.dumps(overrides))
        (work / "state").mkdir(parents=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
                   HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
                   VERL_FILE_LOGGER_PATH=str(work / "state" / "verl_metrics.jsonl"),
                   TENSORBOARD_DIR=str(work / "tensorboard"))
        proc = subprocess.run([str(python), str(REPO / "tests" / "verl" / "rehearse_fit.py"), "--overrides",
                               str(tmp_path / "o.json"), "--out", str(tmp_path / "report.json"), "--stop-after", "2"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=3000, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["verl"] == version and report["worker"] == ("engine" if engine else "dp_actor")
    first, second = report["runs"]
    assert first["saved_steps"] == [2] and second["saved_steps"] == [3], report
    assert second["global_steps"] >= 3 and second["total_training_steps"] == 3
    if engine:  # the replica got the engine's adapter tensors before every rollout (start, after each step)
        assert first["weight_syncs"] == 3 and second["weight_syncs"] == 2, report
    # every weight sync went through the LoRA guard (one tensor per slot), and one after an update had moved
    assert first["guard"]["syncs"] >= 3 and first["guard"]["updates"] == 2, report
    assert first["guard"]["changed_checked"], report
    ckpt = work / "checkpoints"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    assert (ckpt / "global_step_2" / "data.pt").is_file()  # the dataloader position the resume read
    dumped = {}
    for step in (1, 2, 3):
        rows = [json.loads(x) for x in (work / "rollouts" / f"{step}.jsonl").read_text().splitlines() if x]
        assert len(rows) == 4 * train["group_size"]
        assert all(type(r["retries"]) is float and type(r["judge_calls"]) is float for r in rows)
        dumped[step] = rows
    # trainer.validation_data_dir: before training (0), at test_freq (3) and the first run's last step (2)
    for step in (0, 2, 3):
        val = [json.loads(x) for x in (work / "validation" / f"{step}.jsonl").read_text().splitlines() if x]
        assert len(val) == 2 and all(type(r["retries"]) is float for r in val)
    logged = [json.loads(x)["step"] for f in ("verl_metrics.previous.jsonl", "verl_metrics.jsonl")
              for x in (work / "state" / f).read_text().splitlines() if x]
    assert {0, 1, 2, 3} <= set(logged)  # validation before training (0), the steps, across the resume
    assert list((work / "tensorboard").rglob("events.out.tfevents.*"))  # train.report_to: tensorboard
    # our reward, judged over HTTP on 127.0.0.1 inside fit(): the policy's JSON reached the judge, the scores of
    # a group differ (else GRPO's advantages are 0 and the adapter never moves), every call audited
    assert judge.hits > 0 and list((work / "audit").glob("*.jsonl"))
    judged = [r for rows in dumped.values() for r in rows if r["parse_score_line"] == 1.0]
    assert judged and all(r["judge_calls"] >= 1.0 for r in judged)
    assert len({r["score"] for r in dumped[1]}) > 1
    exe = Path(sys.executable).parent / "llmrnn"
    lora = {"train": {"lora": {k: train["lora"][k] for k in ("rank", "alpha", "target_modules")}}}

    def merge(adapter: Path, out: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(exe), "merge", "run", "--base", str(json_policy_dir), "--adapter", str(adapter),
                               "--out", str(tmp_path / out), "--check", str(tmp_path / f"{out}.json"),
                               "--cfg", json.dumps(lora)], capture_output=True, text=True, check=False)

    merged = merge(ckpt, "from-checkpoint")
    assert "Traceback" not in merged.stderr, merged.stderr[-3000:]
    actor = ckpt / "global_step_3" / "actor"
    if engine:
        # verl 0.9's engine checkpoint of a LoRA run: FSDP shards + lora_train_meta.json, no lora_adapter/. Our
        # merge (CPU environment, no verl) says so in one line and names the gather step
        assert not (actor / "lora_adapter").exists() and (actor / "lora_train_meta.json").is_file()
        assert merged.returncode == 3, merged.stderr[-3000:]  # CheckFailed
        assert "a verl 0.9 LoRA checkpoint" in merged.stderr.strip().splitlines()[-1]
    else:  # verl 0.7.1's lora_adapter/ merges straight from the checkpoint folder (before the runtime_config fix:
        # exit 1)
        assert merged.returncode == 0, merged.stderr[-3000:]
        done = json.loads((tmp_path / "from-checkpoint.json").read_text())
        assert done["ok"] and done["source_kind"] == "verl_lora_adapter"
        assert done["adapter_resolved"].endswith("lora_adapter")
    # what `llmrnn train run` does with its chosen checkpoint (verl_cmd.run calls it with the training Python):
    # 0.7.1's lora_adapter/ copied as it is; 0.9.1's gathered by verl's own model merger in the verl venv
    scratch = tmp_path / "state" / "gathered"
    got = verl_adapter.adapter_from_checkpoint(actor, tmp_path / "adapter", Train(**train), python=str(python), scratch=scratch)
    assert got["adapter_from"] == ("model_merger" if engine else "lora_adapter"), got
    assert not scratch.exists()  # the merger's whole-model copy is gone
    conf = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (conf["r"], conf["lora_alpha"]) == (train["lora"]["rank"], train["lora"]["alpha"])
    if engine:  # 0.9.1's merger takes the real alpha from lora_train_meta.json (0.7.1's wrote 0)
        assert got["merger_alpha"] == train["lora"]["alpha"] and got["alpha_fixed_from"] is None, got
        assert set(conf["target_modules"]) == set(train["lora"]["target_modules"]), conf
    else:
        assert sorted(f.name for f in (tmp_path / "adapter").iterdir()) == \
            sorted(f.name for f in (actor / "lora_adapter").iterdir())
        assert (tmp_path / "adapter" / "adapter_model.safetensors").read_bytes() == \
            (actor / "lora_adapter" / "adapter_model.safetensors").read_bytes()
    merged = merge(tmp_path / "adapter", "merged")  # the merge_model rule's input: train run's adapter folder
    assert merged.returncode == 0, merged.stderr[-3000:]
    done = json.loads((tmp_path / "merged.json").read_text())
    assert done["ok"] and done["source_kind"] == "peft_adapter"
    assert done["checks"]["adapter_config"]["alpha_repaired"] is False  # the adapter carried the real alpha
    import torch
    from transformers import AutoModelForCausalLM

    out = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(json_policy_dir, dtype=torch.float32)
    moved = [n for n, p in out.state_dict().items() if not torch.equal(p, base.state_dict()[n])]
    assert moved and all(any(m in n for m in train["lora"]["target_modules"]) for n in moved), moved[:5]


def _fsdp_lora(tmp_path, model, peft_dir: Path | None = None) -> dict:
    """tests/verl/fsdp_lora.py: verl 0.7.1's own FSDP ActorRolloutRefWorker over 2 CPU ranks (gloo)."""
    python = verl_python("0.7.1")
    path = [str(peft_dir)] if peft_dir else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*path, str(REPO / "src")]), HF_HUB_OFFLINE="1",
               OMP_NUM_THREADS="1")
    out = tmp_path / "fsdp.json"
    proc = subprocess.run([str(python), str(REPO / "tests" / "verl" / "fsdp_lora.py"), "--model", str(model),
                           "--out", str(out), "--ckpt", str(tmp_path / "ckpt")],
                          env=env, capture_output=True, text=True, timeout=1500, check=False)
    assert proc.returncode == 0 and out.is_file(), proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert "error" not in report, report.get("traceback", report)
    return report


@pytest.mark.verl
@pytest.mark.e2e
def test_verl_071s_fsdp_worker_hands_vllm_and_its_checkpoint_every_lora_tensor(tmp_path, tiny_model_dir):
    """With the GPU lock's PEFT (scripts/make_verl_env.sh installs it), verl 0.7.1's own FSDP worker on 2 gloo
    ranks, wrapped by get_fsdp_wrap_policy(is_lora=True): the weight sync's collector (layered_summon, our
    setting) hands over one tensor per LoRA slot before and after an update, save_checkpoint writes them all
    into lora_adapter/, load_checkpoint reads the checkpoint back, and the LoRA guard stays quiet. With peft
    0.21.x the collector returns none and the adapter is 16 bytes (the next test)."""
    lock = [x for x in (REPO / "envs" / "gpu-lock.txt").read_text().splitlines() if x.startswith("peft==")]
    report = _fsdp_lora(tmp_path, tiny_model_dir)
    assert lock == [f"peft=={report['peft']}"], (lock, report["peft"])  # the rehearsal runs the cluster's peft
    assert report["fsdp"].endswith("FullyShardedDataParallel") and report["slots"] == 28  # 2 layers x 7 x (A, B)
    assert report["collected"] == report["collected_after_update"] == report["slots"], report
    assert report["saved_tensors"] == report["slots"] and report["adapter_bytes"] > 16, report
    assert report["reloaded"] and not [k for k in report if k.startswith("guard_")], report


@pytest.mark.verl
@pytest.mark.e2e
def test_the_lora_guard_stops_verl_071_with_peft_021_at_the_first_sync(tmp_path, tiny_model_dir):
    """peft 0.21.x (the CPU stack's, constraints.txt) under verl 0.7.1's own worker: its collector hands vLLM
    no LoRA tensor and save_checkpoint writes a 16-byte adapter; the guard says so in one line at the first
    sync and again at the save."""
    import peft

    if not peft.__version__.startswith("0.21."):
        pytest.skip(f"this environment's peft is {peft.__version__}, not a 0.21 release")
    overlay = tmp_path / "peft021"
    overlay.mkdir()
    (overlay / "peft").symlink_to(Path(peft.__file__).parent)
    report = _fsdp_lora(tmp_path, tiny_model_dir, overlay)
    assert report["peft"] == peft.__version__
    assert report["collected"] == 0 and report["slots"] == 28, report
    assert report["saved_tensors"] == 0 and report["adapter_bytes"] == 16, report
    assert "hold 0 LoRA tensors of the actor's 28 (sync 1)" in report["guard_sync"]
    assert "holds 0 LoRA tensors of the 28 LoRA slots" in report["guard_save"]
    assert all("\n" not in v for k, v in report.items() if k.startswith("guard_"))
