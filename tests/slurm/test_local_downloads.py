"""The literal `snakemake --profile slurm all` plan (no SLURM needed) runs both model downloads on the
login node (local rules: compute nodes usually cannot reach the Hub), submits the GPU work (the trained memory model's eval
shards get its adapter: a LoRA on the base vLLM engine), and grades the test patients locally (no hosted final judge unless the config opts in)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.slurm.dag import copy_extra_parts, load_profile, parse_dry_run, prepare_reproduce_inputs
from tests.slurm.test_profile import _clean_env, _dry_run

pytestmark = pytest.mark.slow

DOWNLOADS = {"prepare_base_model", "prepare_judge_model"}
UPLOAD = "release"  # the Hub upload: the login node has the internet, compute nodes often not

# Snakemake's dry run prints every job as `rule` ("we don't know how the user wants to execute", jobs.py),
# so ask the workflow itself which rules it runs locally under an executor (Workflow.is_local without
# --local-exec: the localrules that are in no group).
LOCAL_RULES = """
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings
with SnakemakeApi(OutputSettings()) as api:
    wf = api.workflow(resource_settings=ResourceSettings(), snakefile=Path("Snakefile"), workdir=Path.cwd(),
                      config_settings=ConfigSettings(configfiles=[Path(p) for p in sys.argv[1:]]))._workflow
    print(json.dumps(sorted(r.name for r in wf.rules if r.name in wf._localrules and r.group is None)))
"""


def test_hub_downloads_run_on_the_login_node(workflow_dir, tmp_path):
    copy_extra_parts(workflow_dir)
    prepare_reproduce_inputs(workflow_dir)
    env = _clean_env(tmp_path)
    text = _dry_run(workflow_dir, env, "--profile", "profiles/slurm", "-n", "all")
    jobs = {j.rule: j for j in parse_dry_run(text)}
    assert DOWNLOADS <= set(jobs), sorted(jobs)  # the reproduction downloads Llama-3.2-3B and RubricARM-8B
    assert "meta-llama/Llama-3.2-3B-Instruct" in text or "llama-3.2-3b-instruct" in jobs["prepare_base_model"].shell
    profile = load_profile(env)
    configfiles = profile["configfile"]
    proc = subprocess.run([sys.executable, "-c", LOCAL_RULES, *configfiles], cwd=workflow_dir, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    local = set(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert DOWNLOADS <= local, local
    assert UPLOAD in jobs and UPLOAD in local, local  # release.upload on a compute node fails at the last step
    assert not (DOWNLOADS | {UPLOAD}) & set(profile.get("groups", {})), profile.get("groups")  # a group would be submitted
    assert not {"train_grpo", "eval_shard", "trajectory_shard", "judge_server"} & local  # GPU work is submitted
    # the same literal plan grades test patients locally: no hosted final judge unless the config opts in
    trained = [j for j in parse_dry_run(text) if j.rule == "eval_shard" and "--variant trained" in j.shell]
    assert trained and all("--memory-adapter" in j.shell and "/train/adapter" in j.shell for j in trained)
    grades = [j for j in parse_dry_run(text) if j.rule == "eval_grade"]
    assert grades and all('"mode": "matcher"' in j.shell and '"allow_external": false' in j.shell for j in grades)
