"""One code identity per training job: the checkpoints' fingerprint holds the same import-closure hash as
the rule's `code` param, so a rerun Snakemake starts for a code change never resumes the old code's
checkpoints (nor hands back a finished old run's adapter)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from llmrnn.reward.function import BUILTIN_REWARD, RewardFunction
from llmrnn.train import checkpoints
from tests.conftest import REPO

# in a copy of the package: per reward spec, the fingerprint of a fixed run and whether
# discard_stale_checkpoints kept its checkpoints
SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from llmrnn.settings.train import Train
    from llmrnn.reward.function import RewardFunction
    from llmrnn.train.checkpoints import discard_stale_checkpoints, run_fingerprint
    data = sys.argv[1]
    for i, spec in enumerate(sys.argv[2:]):
        out = Path(data).parent / f"run{i}"
        fp = run_fingerprint(Train(lr=1e-5), data, out, RewardFunction.parse(spec))
        discard_stale_checkpoints(out, fp)
        print(fp, (out / "checkpoints" / "global_step_2").is_dir())
""")
SPECS = ("llmrnn.reward:trl_reward_func", "llmrnn.qa.rewards:trl_reward_func")


def _run(src: Path, data: Path) -> list[tuple[str, bool]]:
    env = {"PYTHONPATH": str(src), "PATH": str(Path(sys.executable).parent), "HOME": str(data.parent)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(data), *SPECS], check=False, env=env,
                          text=True, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [(fp, kept == "True") for fp, kept in (line.split() for line in proc.stdout.splitlines())]


def test_an_edit_of_a_module_the_reward_runs_discards_the_checkpoints(tmp_path):
    """matching.py (the outcome reward's matcher) is neither reward.py nor an engine module: an edit of it
    reruns training (the rule's code hash) and now also starts it over (the fingerprint)."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "src" / "llmrnn", src / "llmrnn", ignore=shutil.ignore_patterns("__pycache__"))
    data = tmp_path / "train.parquet"
    data.write_bytes(b"rows")
    first = _run(src, data)  # stamps each run's checkpoints folder
    for i in range(len(SPECS)):
        (tmp_path / f"run{i}" / "checkpoints" / "global_step_2").mkdir(parents=True)
    matching = src / "llmrnn" / "matching.py"
    original = matching.read_text()
    matching.write_text(original + "\n# a comment: changes no code that runs\n")
    assert _run(src, data) == [(fp, True) for fp, _ in first]  # the same code resumes
    matching.write_text(original + "\nTHRESHOLD_NUDGE = 1\n")
    edited = _run(src, data)
    for (fp, _), (new, kept), spec in zip(first, edited, SPECS):
        assert new != fp and not kept, spec  # another code's checkpoints are never resumed


def test_the_fingerprint_holds_the_code_hash_of_the_rule_that_runs_it():
    """For each recipe's training rule (the rule running `llmrnn train run`, as Snakemake builds it for each
    recipe: tests.rules_api): its `code` param is the job_code of the --reward-func its flags pass (none:
    llmrnn.reward), i.e. the checkpoints' code identity is the rule's."""
    from tests.rules_api import RECIPE_CONFIGS, workflow_rules

    trainers = [rule for config in RECIPE_CONFIGS for rule in workflow_rules(configs=(config,)).values()
                if rule.command == f"llmrnn {checkpoints.TRAIN_VERB}"]
    assert len(trainers) == 2, [rule.name for rule in trainers]  # one per recipe
    rewards = set()
    for rule in trainers:
        flags = rule.called_param("flags", preflight="p.json")
        reward = RewardFunction.parse(flags[flags.index("--reward-func") + 1]) if "--reward-func" in flags \
            else BUILTIN_REWARD
        assert checkpoints.job_code(reward) == rule.params["code"], rule.name
        rewards.add(reward)
    assert len(rewards) == 2  # the QA recipe's rewards and the memory head's own
    # a reward outside the package: its file is part of the identity
    assert checkpoints.job_code(RewardFunction.parse("json:loads")) != checkpoints.job_code(BUILTIN_REWARD)


def _model_folder(folder: Path, scale: float) -> Path:
    """A small HF-shaped folder: config, tokenizer files, safetensors weights (the values scaled by `scale`)."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "llama", "hidden_size": 8}')
    (folder / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    save_file({"w": torch.arange(3_000_000, dtype=torch.float32) * scale}, str(folder / "model.safetensors"))
    (folder / ".ready").write_text('{"prepared_at": "now"}')
    return folder


def test_a_base_model_replaced_at_the_same_path_does_not_resume(tmp_path):
    """The fingerprint held the model's PATH: a retrained base of the same shapes put at the same path
    resumed the old run's checkpoints. It holds the contents now; the same contents elsewhere still resume."""
    from llmrnn.settings.train import Train

    data = tmp_path / "train.parquet"
    data.write_bytes(b"rows")
    model = _model_folder(tmp_path / "base", 1.0)
    first = checkpoints.run_fingerprint(Train(), data, model, BUILTIN_REWARD)
    assert checkpoints.run_fingerprint(Train(), data, model, BUILTIN_REWARD) == first
    _model_folder(model, 2.0)  # same path, names, sizes and header; other weights
    assert checkpoints.run_fingerprint(Train(), data, model, BUILTIN_REWARD) != first
    _model_folder(model, 1.0)
    (model / ".ready").write_text('{"prepared_at": "later"}')  # the marker and a card change nothing
    (model / "README.md").write_text("card")
    assert checkpoints.run_fingerprint(Train(), data, model, BUILTIN_REWARD) == first
    moved = shutil.copytree(model, tmp_path / "elsewhere" / "base")
    assert checkpoints.run_fingerprint(Train(), data, moved, BUILTIN_REWARD) == first
    (model / "tokenizer.json").write_text('{"model": {"vocab": {"b": 0}}}')
    assert checkpoints.run_fingerprint(Train(), data, model, BUILTIN_REWARD) != first
