"""train.report_to: the trackers of a training run (llmrnn.train.tracking) reach verl's trainer.logger and TRL's
report_to, write into the run folder, and keep secrets in the environment. A CPU TRL run with tensorboard
writes event files holding the reward per step; the verl overrides compose with each tracker in verl itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmrnn.errors import InputError
from llmrnn.runconfig import resolve
from llmrnn.settings.train import Train
from llmrnn.train import config as tcfg
from llmrnn.train import tracking, verl_overrides

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"


@pytest.mark.parametrize("value, expected", [
    ("none", []), (None, []), ([], []), ("tensorboard", ["tensorboard"]),
    (["wandb", "tensorboard", "wandb"], ["wandb", "tensorboard"]), (["mlflow"], ["mlflow"]),
])
def test_report_to_accepts_a_name_or_a_list(value, expected):
    assert tracking.report_to(tcfg.settings({"report_to": value})) == expected
    assert tracking.verl_loggers(tcfg.settings({"report_to": value})) == ["console", "file", *expected]


@pytest.mark.parametrize("value, message", [
    ("tensorbord", "'tensorbord' is not one of"), (["none", "wandb"], "cannot be listed with trackers"),
    (["swanlab"], "'swanlab' is not one of"),
])
def test_report_to_refuses_unknown_names_in_one_line(value, message):
    with pytest.raises(InputError, match=message):
        tcfg.settings({"report_to": value})


@pytest.mark.parametrize("value, ok", [("wandb", True), (["tensorboard", "mlflow"], True), ("none", True),
                                       ("comet", False), (["none"], False), (["wandb", "wandb"], False)])
def test_schema_validates_report_to(value, ok):
    layers = [("x.yaml", {"run_name": "x", "recipe": "memory_head", "train": {"report_to": value}})]
    if ok:
        assert resolve(layers, SCHEMA)[0]["train"]["report_to"] == value
    else:
        with pytest.raises(InputError, match="report_to"):
            resolve(layers, SCHEMA)


def test_schema_and_engine_default_is_no_tracker():
    config, _ = resolve([("x.yaml", {"run_name": "x", "recipe": "memory_head"})], SCHEMA)
    assert config["train"]["report_to"] == Train().report_to == "none"


def test_trackers_write_into_the_run_folder_and_wandb_runs_offline(tmp_path):
    cfg = Train(report_to=["tensorboard", "wandb", "mlflow"], project_name="proj")
    env = tracking.tracking_env(cfg, tmp_path / "train", environ={})
    work = (tmp_path / "train").resolve()
    assert env["TENSORBOARD_DIR"] == env["TENSORBOARD_LOGGING_DIR"] == str(work / "tensorboard")
    assert env["WANDB_MODE"] == "offline" and env["WANDB_DIR"] == str(work) and env["WANDB_PROJECT"] == "proj"
    assert env["WANDB_CONSOLE"] == "off"  # the run's stdout (patient text) never goes into W&B
    assert env["MLFLOW_TRACKING_URI"] == f"sqlite:///{work / 'mlflow.db'}"  # not verl's shared /tmp default
    # what the user exported wins (e.g. WANDB_MODE=online where the nodes reach W&B)
    kept = tracking.tracking_env(cfg, tmp_path, environ={"WANDB_MODE": "online", "TENSORBOARD_DIR": "/tb"})
    assert "WANDB_MODE" not in kept and "TENSORBOARD_DIR" not in kept
    assert tracking.tracking_env(Train(), tmp_path, environ={}) == {}


def test_no_config_key_can_hold_a_tracker_secret():
    """Secrets (WANDB_API_KEY, MLflow credentials) come from the environment only: the schema has no place
    for them, and the trackers' environment that llmrnn sets names no secret."""
    text = SCHEMA.read_text()
    for word in ("api_key:", "wandb_api_key", "WANDB_API_KEY"):
        assert word not in text
    env = tracking.tracking_env(Train(report_to=["wandb", "mlflow", "tensorboard"]), "/tmp/x", environ={})
    assert not [k for k in env if any(s in k for s in ("KEY", "TOKEN", "PASSWORD", "SECRET"))]


def test_tracker_variables_reach_verls_ray_workers_but_no_secret_does(tmp_path):
    """verl's Ray workers (another node of a `ray start` cluster) get the trackers' folders and modes through
    the job's runtime_env, as the metrics path does; WANDB_API_KEY, MLflow credentials and a tracking URI
    with a password stay in the environment: never on main_ppo's command line (which verl prints)."""
    cfg = Train(report_to=["tensorboard", "wandb", "mlflow"], project_name="proj")
    tracked = tracking.tracking_env(cfg, tmp_path / "train", environ={})
    secrets = {"WANDB_API_KEY": "sentinel-key-0123", "MLFLOW_TRACKING_PASSWORD": "sentinel-pw",
               "MLFLOW_TRACKING_TOKEN": "sentinel-token", "HF_TOKEN": "sentinel-hf"}
    items = verl_overrides.runtime_env_overrides({**secrets, **tracked, "VERL_FILE_LOGGER_PATH": "/m.jsonl"})
    prefix = "+ray_kwargs.ray_init.runtime_env.env_vars."
    forwarded = {i[len(prefix):].split("=", 1)[0] for i in items if i.startswith(prefix)}
    assert forwarded == {*tracked, "VERL_FILE_LOGGER_PATH"}
    assert set(tracked) <= set(tracking.FORWARDED_ENV)
    assert not [i for i in items if "sentinel" in i]
    # a user's own tracking server with credentials in the URI is not forwarded (a plain one is)
    user = {"MLFLOW_TRACKING_URI": "https://bob:pw-sentinel@mlflow.example.org"}
    assert not [i for i in verl_overrides.runtime_env_overrides(user) if "sentinel" in i]
    plain = verl_overrides.runtime_env_overrides({"MLFLOW_TRACKING_URI": "https://mlflow.example.org"})
    assert f"{prefix}MLFLOW_TRACKING_URI=https://mlflow.example.org" in plain


def test_verl_overrides_carry_the_loggers_and_never_log_val_generations(tmp_path):
    ov = verl_overrides.build_overrides({"report_to": ["tensorboard", "wandb"]}, train_parquet="t.parquet",
                                        val_parquet="v.parquet", model_dir="m", out_dir=str(tmp_path),
                                        experiment_name="smoke")
    assert "trainer.logger=[console,file,tensorboard,wandb]" in ov
    assert "trainer.experiment_name=smoke" in ov
    assert "trainer.log_val_generations=0" in ov  # verl would send patient text to the trackers


def test_checkpoints_survive_adding_a_tracker(tmp_path):
    from llmrnn.reward.function import BUILTIN_REWARD
    from llmrnn.train.checkpoints import run_fingerprint

    parquet = tmp_path / "t.parquet"
    parquet.write_bytes(b"x")
    fp = lambda cfg: run_fingerprint(tcfg.settings(cfg), parquet, tmp_path, BUILTIN_REWARD)
    assert fp({"lr": 0.1, "report_to": "none"}) == fp({"lr": 0.1, "report_to": ["tensorboard"]})
    assert fp({"lr": 0.1}) != fp({"lr": 0.2})


# ----------------------------------------------------------------------------- a real CPU run
@pytest.mark.e2e  # a slow tier test (a workflow, CLI or training run of its own): `make test-e2e`
@pytest.mark.slow
def test_cpu_trl_run_writes_tensorboard_events_with_the_reward_per_step(tmp_path, tiny_model_dir):
    pytest.importorskip("tensorboard", reason="tensorboard is in the dev extra (pyproject.toml)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.test_train_trl import STANDIN, tiny_cfg
    from tests.verl.rows import make_rows, write_parquet

    train = write_parquet(tmp_path / "train.parquet", make_rows(4))
    out = tmp_path / "myrun" / "train"
    cfg = tiny_cfg(epochs=1, total_steps=2, test_freq=0, save_freq=2, report_to="tensorboard")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TENSORBOARD", "WANDB", "MLFLOW"))}
    cmd = [str(Path(sys.executable).parent / "llmrnn"), "train", "run", "--cfg", json.dumps({"train": cfg}),
           "--train", train, "--model", str(tiny_model_dir), "--work-dir", str(out), "--adapter",
           str(out / "adapter"), "--metrics", str(out / "metrics.jsonl"), "--summary", str(out / "summary.json"),
           "--reward-func", STANDIN]
    proc = subprocess.run(cmd, env=dict(env, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    events = list((out / "tensorboard").rglob("events.out.tfevents.*"))
    assert events, sorted(p.relative_to(out) for p in out.rglob("*"))
    scalars, texts = {}, {}
    for path in events:
        acc = EventAccumulator(str(path), size_guidance={"tensors": 0, "scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend(acc.Scalars(tag))
        for tag in acc.Tags()["tensors"]:
            texts[tag] = b"".join(e.tensor_proto.string_val[0] for e in acc.Tensors(tag)).decode()
    reward = sorted((e.step, e.value) for e in scalars["train/reward"])
    assert [s for s, _ in reward] == [1, 2]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    by_step = {r["step"]: r for r in rows}
    for step, value in reward:  # the same reward the run's metrics.jsonl holds
        assert value == pytest.approx(by_step[step]["reward_mean"], abs=1e-5)
    # the run's name and its effective config travel with the events
    assert '"run_name": "myrun"' in texts["args/text_summary"]
    assert '"report_to": "tensorboard"' in texts["llmrnn/config/text_summary"]


# ----------------------------------------------------------------------------- verl's own config
TRACKERS = ["tensorboard", "wandb", "mlflow", ["tensorboard", "wandb", "mlflow"]]


def _tracker_case(report_to: str | list[str]) -> str:
    return report_to if isinstance(report_to, str) else "+".join(report_to)


@pytest.fixture(scope="module")
def tracker_checks(tmp_path_factory, tiny_model_dir):
    """verl 0.7.1's check of each train.report_to of TRACKERS, all in one verl interpreter (check_cases)."""
    from tests.test_train_verl import REFERENCE, check_cases

    return check_cases("0.7.1", tmp_path_factory.mktemp("trackers"), tiny_model_dir,
                       {_tracker_case(r): {"cfg": dict(REFERENCE, report_to=r)} for r in TRACKERS})


@pytest.mark.e2e  # a slow tier test (a workflow, CLI or training run of its own): `make test-e2e`
@pytest.mark.verl
@pytest.mark.parametrize("report_to", TRACKERS)
def test_verl_overrides_compose_with_each_tracker(report_to, tracker_checks):
    proc = tracker_checks[_tracker_case(report_to)]
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    trackers = [report_to] if isinstance(report_to, str) else report_to
    assert report["logger"] == ["console", "file", *trackers]
    assert report["logger_unsupported"] == []  # every name is one verl's Tracking knows
    assert report["log_val_generations"] == 0


@pytest.mark.e2e  # a slow tier test (a workflow, CLI or training run of its own): `make test-e2e`
@pytest.mark.verl
@pytest.mark.slow
def test_verl_tracking_writes_tensorboard_and_offline_wandb_into_the_run_folder(tmp_path, tiny_model_dir):
    """verl 0.7.1's own Tracking, started with our composed trainer.logger in the environment that
    llmrnn.train.tracking sets: TensorBoard events with the reward per step and an offline W&B run, both
    under RUN/train/, and the API key (a sentinel) in no file."""
    from tests.test_train_verl import verl_python
    from tests.verl.rows import make_rows, write_parquet

    py = verl_python("0.7.1")
    work = tmp_path / "smoke" / "train"
    cfg = Train(report_to=["tensorboard", "wandb"])
    train = write_parquet(tmp_path / "train.parquet", make_rows(4))
    overrides = verl_overrides.build_overrides(cfg, train_parquet=train, val_parquet=train, model_dir=str(tiny_model_dir),
                                               out_dir=str(work), experiment_name="smoke")
    (tmp_path / "o.json").write_text(json.dumps(overrides))
    (work / "state").mkdir(parents=True)  # as verl_cmd.run (MetricsWriter) and tracking.prepare leave it
    secret = "sentinel-wandb-key-0123456789abcdef"
    env_file = tmp_path / "env.json"
    env_file.write_text(json.dumps({**tracking.tracking_env(cfg, work, environ={}), "WANDB_API_KEY": secret,
                                    "VERL_FILE_LOGGER_PATH": str(work / "state" / "verl_metrics.jsonl")}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB", "TENSORBOARD"))}
    env.update(PYTHONPATH=str(REPO / "src"), HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1")
    proc = subprocess.run([str(py), str(REPO / "tests" / "verl" / "track_verl.py"), "--overrides",
                           str(tmp_path / "o.json"), "--env", str(env_file)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["started"] == ["console", "file", "tensorboard", "wandb"]
    assert report["tensorboard_scalars"]["critic/rewards/mean"] == [[1, 0.25], [2, 0.5]]
    assert list((work / "tensorboard").glob("events.out.tfevents.*"))
    runs = list((work / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("run-*.wandb")), sorted(map(str, work.rglob("*")))[:40]
    assert not (tmp_path / "tensorboard_log").exists()  # verl's cwd-relative default stays unused
    leaked = [p for p in tmp_path.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()
              and p.name != "env.json"]
    assert leaked == []
