"""The cohort stage's plan: the raw cohort file (synthetic, MIMIC-IV or the user's), its hash, the
MIMIC-IV inputs, and the split params."""

from __future__ import annotations

from pathlib import Path

from llmrnn.cohort import source_sha256
from llmrnn.configcheck import SYNTHETIC_MIMIC_IV
from llmrnn.errors import InputError
from llmrnn.mimic.tables import header_problem, table_paths
from llmrnn.plan.common import PlanBase, to_json

SYNTHETIC_COHORT = "resources/cohort/synthetic.json"


class CohortPlan(PlanBase):
    """The cohort stage's decisions over the config (it depends on no other stage)."""

    def raw_path(self, wildcards=None) -> str:
        """The cohort file clean_cohort reads: made by synth_cohort, or the user's own file."""
        source = self.config["cohort"]["source"]
        if source == "synthetic":
            return SYNTHETIC_COHORT
        if source == "mimic_iv":
            return f"{self.paths.cohort}/cohort/built.json"
        if "{" in source or "}" in source:
            raise InputError(
                f"cohort.source: {source!r} contains a brace, which Snakemake reads as a wildcard; "
                "rename the file or its folder"
            )
        if not Path(source).exists():
            raise InputError(
                f"cohort.source: {source} does not exist. Expected a JSON list of patients in the LLM-as-RNN "
                "format (see docs/configuration.md). MIMIC-IV is credentialed and never shipped with llmrnn: "
                "build the file from your own PhysioNet copy, or set cohort.source: synthetic."
            )
        return source

    def raw_sha256(self, wildcards=None) -> str | None:
        """params of clean_cohort: the user's cohort by content, so a replaced file reruns cleaning (and
        splits) even when its mtime is older; None for the synthetic cohort (synth_cohort's params rerun it).
        """
        return source_sha256(self.config["cohort"]["source"])

    def mimic_iv_inputs(self, wildcards=None) -> dict[str, str]:
        """build_cohort's inputs: the PhysioNet files themselves (a new release reruns everything after)."""
        mimic = self.config["cohort"]["mimic_iv"]
        paths = table_paths(mimic["hosp"], mimic["note"], mimic["diagnoses"], mimic.get("icd_version"))
        for table, path in paths.items():
            if "{" in str(path) or "}" in str(path):
                raise InputError(f"cohort.mimic_iv: {path} contains a brace, which Snakemake reads as a wildcard")
            if not str(path).startswith(SYNTHETIC_MIMIC_IV + "/") and (problem := header_problem(path, table)):
                raise InputError(f"cohort.mimic_iv: {problem}")
        return {table: str(path) for table, path in paths.items()}

    def mimic_iv_cfg(self) -> str:
        """params of build_cohort: the selection and diagnosis knobs (the folders are its inputs; `workers`
        is the rule's threads: it changes how fast, not what, so it reruns nothing)."""
        return to_json({k: v for k, v in self.config["cohort"]["mimic_iv"].items()
                        if k not in ("hosp", "note", "workers")})

    def build_workers(self) -> int:
        """threads of build_cohort: the processes splitting notes (cohort.mimic_iv.workers)."""
        return int(self.config["cohort"]["mimic_iv"]["workers"])

    def split_cfg(self) -> str:
        """params of split_cohort: the split section itself."""
        return to_json(self.config["split"])
