"""Real snakemake runs of prepare_base_model + trajectory scatter/gather (tiny model, CPU)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import yaml

from llmrnn import trajectories
from tests.conftest import snakemake


def write_config(workdir, model_dir, run_name: str, shards: int) -> None:
    cfg = yaml.safe_load((workdir / "config/config.yaml").read_text())
    role = {"model": "tiny", "backend": "transformers", "temperature": 0.7, "top_p": 0.95, "max_tokens": 8}
    cfg.update(
        run_name=run_name,
        cohort={"source": "synthetic", "synthetic": {"patients": 30, "seed": 7}},
        # 3 patients a split over 3 shards, 3 visits each (a patient with too few visits is skipped, so a
        # shard may be empty and gather reads an empty part): few rows, the same scatter and gather
        split={"val_size": 3, "train_size": 3, "seed": 42},
        models={"tiny": {"source": "local", "path": str(model_dir)}},
        roles={r: dict(role) for r in ("prediction", "evaluation", "memory")},
        trajectories={"shards": shards, "max_visits": 3, "seed": 0},
    )
    (workdir / "config/config.yaml").write_text(yaml.safe_dump(cfg))


def targets(run: str) -> list[str]:
    return [f"results/{run}/trajectories/{s}.{ext}" for s in ("train", "val") for ext in ("parquet", "summary.json")]


@pytest.mark.slow
@pytest.mark.e2e  # a whole-workflow run: `make test-e2e` (the fast-feedback tiers)
def test_trajectories_scatter_gather_and_shard_invariance(workflow_dir, tiny_model_dir):
    write_config(workflow_dir, tiny_model_dir, "k3", shards=3)
    dry = snakemake(workflow_dir, "-n", *targets("k3"))
    assert "trajectory_shard" in dry.stdout and "prepare_base_model" in dry.stdout
    snakemake(workflow_dir, *targets("k3"))
    assert (workflow_dir / "resources/models/tiny/.ready").exists()
    for split in ("train", "val"):
        parts = sorted((workflow_dir / f"results/k3/trajectories/shards/{split}").glob("part_*.parquet"))
        assert len(parts) == 3
        summary = json.loads((workflow_dir / f"results/k3/trajectories/{split}.summary.json").read_text())
        assert summary["rows"] > 0 and summary["shards"] == 3 and summary["max_calls_per_role_per_step"] == 1
        table = pq.read_table(workflow_dir / f"results/k3/trajectories/{split}.parquet")
        assert tuple(table.column_names) == trajectories.PARQUET_COLUMNS and table.num_rows == summary["rows"]
        log = (workflow_dir / f"logs/k3/trajectories/{split}/part_0.log").read_text()
        assert "visit step 1/" in log  # progress lines

    write_config(workflow_dir, tiny_model_dir, "k1", shards=1)
    snakemake(workflow_dir, *targets("k1"))
    for split in ("train", "val"):
        a = pq.read_table(workflow_dir / f"results/k3/trajectories/{split}.parquet").to_pylist()
        b = pq.read_table(workflow_dir / f"results/k1/trajectories/{split}.parquet").to_pylist()
        assert a == b  # same rows, same content, same order

    # a prompt edit reruns the shards (the prompt file is their input); nothing to do otherwise
    assert "Nothing to be done" in snakemake(workflow_dir, "-n", *targets("k1")).stdout
    prompts = workflow_dir / yaml.safe_load((workflow_dir / "config/config.yaml").read_text())["prompts"]["file"]
    prompts.write_text(prompts.read_text() + "\n# edited\n")  # any byte counts: the file is the shards' input
    assert "trajectory_shard" in snakemake(workflow_dir, "-n", *targets("k1")).stdout


@pytest.mark.slow
def test_missing_model_entry_is_a_clear_error(workflow_dir, tiny_model_dir):
    write_config(workflow_dir, tiny_model_dir, "bad", shards=1)
    cfg = yaml.safe_load((workflow_dir / "config/config.yaml").read_text())
    cfg["roles"]["memory"]["model"] = "not-configured"
    (workflow_dir / "config/config.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake(workflow_dir, "-n", *targets("bad"), check=False)
    assert proc.returncode != 0
    assert "model 'not-configured' is used but not configured" in proc.stdout + proc.stderr
