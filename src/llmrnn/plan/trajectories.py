"""The trajectories stage's plan: its params JSON and the shard files of each split."""

from __future__ import annotations

from llmrnn.plan.common import PlanBase, knobs, stage_resources, to_json

TRAJECTORY_SPLITS = ("train", "val")


class TrajectoriesPlan(PlanBase):
    """The trajectories stage's decisions over the config (it depends on no other stage)."""

    def shard_cfg(self) -> str:
        """params of trajectory_shard: roles, the models they use, the trajectories knobs (not resources)."""
        c = self.config
        used = {r["model"] for r in c["roles"].values()}
        return to_json({
            "roles": c["roles"],
            "models": {n: m for n, m in c["models"].items() if n in used},
            "trajectories": knobs(c["trajectories"]),
        })

    def threads(self) -> int:
        """threads of trajectory_shard: trajectories.threads (torch's CPU threads per shard)."""
        return self.config["trajectories"]["threads"]

    def resources(self) -> dict:
        """resources of trajectory_shard: trajectories.resources (a killed shard starts over: its runtime grows)."""
        return stage_resources(self.config["trajectories"]["resources"])

    def shard_files(self, split: str, ext: str) -> list[str]:
        return [
            f"{self.paths.trajectories}/trajectories/shards/{split}/part_{k}.{ext}"
            for k in range(self.config["trajectories"]["shards"])
        ]

    def targets(self) -> list[str]:
        return [
            f"{self.paths.trajectories}/trajectories/{s}.{ext}"
            for s in TRAJECTORY_SPLITS
            for ext in ("parquet", "summary.json")
        ]
