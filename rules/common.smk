# Helpers only: config validation, path builders, the config subsets rules pass as params.
import hashlib
import importlib.util
import json
import os
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

validate(config, schema="../workflow/schemas/config.schema.yaml")

RUN = f"results/{config['run_name']}"
LOGS = f"logs/{config['run_name']}"


def cfg_json(*sections):
    """The exact config subset a rule depends on, as JSON; in params it makes Snakemake rerun the
    rule when (and only when) that subset changes."""
    return json.dumps({s: config[s] for s in sections}, sort_keys=True)


def code_hash(*modules):
    """sha256 of the package modules a job runs (Snakemake's code trigger sees only the shell line)."""
    digest = hashlib.sha256()
    for name in sorted(modules):
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise WorkflowError(
                f"code_hash: module {name} not found; is llmrnn installed (pip install -e .)?"
            )
        digest.update(name.encode())
        digest.update(Path(spec.origin).read_bytes())
    return digest.hexdigest()[:16]


def raw_cohort_path(wildcards):
    """The cohort file clean_cohort reads: made by synth_cohort, or the user's own file."""
    source = config["cohort"]["source"]
    if source == "synthetic":
        return "resources/cohort/synthetic.json"
    if not Path(source).exists():
        raise WorkflowError(
            f"cohort.source: {source} does not exist. Expected a JSON list of patients in the LLM-as-RNN "
            "format (see config/README.md). MIMIC-IV is credentialed and never shipped with llmrnn: "
            "build the file from your own PhysioNet copy, or set cohort.source: synthetic."
        )
    return source


def all_targets():
    return [f"{RUN}/splits/splits.json"]
