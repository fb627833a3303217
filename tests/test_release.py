"""Release stage: the generated model card (Hub metadata + sections), MANIFEST.json and the no-upload receipt."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml

from llmrnn import cohort, io, release
from llmrnn.errors import CheckFailed, InputError
from tests.conftest import llmrnn_in_process

KNOBS = {
    "cohort": {"source": "synthetic", "synthetic": {"patients": 12, "seed": 3}},
    "split": {"val_size": 2, "train_size": 4, "seed": 1},
    "train": {"engine": "trl", "lr": 1e-5, "group_size": 4, "kl": {"coef": 0.001, "estimator": "low_var_kl"},
              "lora": {"rank": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}},
    "merge": {"dtype": "float32"},
}


def make_inputs(root: Path, merged_src: Path) -> dict:
    """Release inputs as the upstream rules write them (merged folder, merge check, splits, metrics, rubric)."""
    merged = root / "merged"
    shutil.copytree(merged_src, merged)
    base = root / "base"  # the base model's prepared copy the merge used (the release compares the bundle with it)
    shutil.copytree(merged_src, base)
    check = {
        "ok": True, "base": str(base), "source_kind": "peft_adapter", "dtype": "float32",
        "checked_utc": "2026-01-01T00:00:00Z",
        "checks": {
            "weights_differ": {"ok": True, "changed_tensors": 4, "total_tensors": 20},
            "logits_match": {"ok": True, "max_abs_diff": 1e-6, "tolerance": 1e-3, "adapter_effect": 0.5},
            "adapter_config": {"ok": True, "rank": 4, "alpha": 8, "alpha_repaired": True, "original_alpha": 0,
                               "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
        },
    }
    io.write_json(root / "merge_check.json", check)
    patients = cohort.synthesize_cohort(12, 3)
    parts = cohort.split_cohort(patients, cohort.SplitSizes(val=2, train=4, seed=1))
    split_files = []
    for name, part in parts.items():
        io.write_text(root / f"{name}.json", cohort.dump_cohort(part))
        split_files.append(str(root / f"{name}.json"))
    io.write_json(root / "splits.json", {"seed": 1, "sizes": {n: len(p) for n, p in parts.items()},
                                         "sha256": {n: io.sha256_file(root / f"{n}.json") for n in parts}})
    rows = [{"step": s, "kind": "train", "engine": "trl", "reward_mean": 0.3 + 0.05 * s} for s in range(1, 5)]
    rows.append({"step": 4, "kind": "val", "engine": "trl", "val_reward_mean": 0.41})
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "rubric.yaml").write_text(
        "name: demo_rubric\njudge: {model: smollm2-135m-instruct}\nserving: {engine: llmrnn}\n"
        "rubric: be kind\ntemplate: '{candidate_memory}'\n"
    )
    return {"merged": merged, "merge_check": root / "merge_check.json", "splits": root / "splits.json",
            "split_files": split_files, "metrics": root / "metrics.jsonl", "rubric": root / "rubric.yaml",
            "patients": patients, "base": base}


def run_release(inputs: dict, out: Path, rel: dict | None = None, knobs: dict | None = None) -> dict:
    cfg = {"run_name": "demo", "release": rel or {"base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"},
           "knobs": knobs or KNOBS}
    return release.build_release(
        merged=inputs["merged"], merge_check=inputs["merge_check"], splits=inputs["splits"],
        split_files=inputs["split_files"], metrics=inputs["metrics"], rubric=inputs["rubric"],
        cfg=cfg, card_out=out / "README.md", manifest_out=out / "MANIFEST.json",
        receipt_out=out / "upload_receipt.json",
    )


@pytest.fixture
def inputs(tiny_model_dir, tmp_path) -> dict:
    return make_inputs(tmp_path / "run", tiny_model_dir)


def test_outcome_reward_card_names_no_judge(inputs, tmp_path, monkeypatch):
    """reward.mode outcome asked no judge: the rule passes no rubric, and the card and manifest say what
    the reward was instead of naming a judge model."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    out = tmp_path / "run" / "release"
    knobs = dict(KNOBS, reward={"mode": "outcome"})
    cfg = {"run_name": "demo", "release": {"base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"}, "knobs": knobs}
    release.build_release(
        merged=inputs["merged"], merge_check=inputs["merge_check"], splits=inputs["splits"],
        split_files=inputs["split_files"], metrics=inputs["metrics"], rubric=None, cfg=cfg,
        card_out=out / "README.md", manifest_out=out / "MANIFEST.json", receipt_out=out / "upload_receipt.json")
    card = (out / "README.md").read_text()
    reward = card.split("## Reward\n", 1)[1].split("\n## ", 1)[0]
    assert "outcome (no judge)" in reward and "No judge model was asked" in reward and "judge model |" not in reward
    assert "`preflight`: no judge is started" in card and "`judge_server" not in card
    assert "the share of the next visit's diagnoses its memory names" in card
    assert "opinion of one judge model" not in card
    manifest = json.loads((out / "MANIFEST.json").read_text())
    assert manifest["judge"] == {"rubric_file": None, "model": None, "note": "reward.mode outcome asks no judge"}


def test_card_manifest_and_receipt(inputs, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    out = tmp_path / "run" / "release"
    receipt = run_release(inputs, out)

    card = (out / "README.md").read_text()
    assert card.startswith("---\n")
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert meta["library_name"] == "transformers" and meta["license"] == "apache-2.0"
    assert {"grpo", "lora", "llmrnn"} <= set(meta["tags"])
    for section in ("## Run identity", "## Base model and LoRA", "## GRPO settings", "## Reward", "## Data",
                    "## How the workflow made it", "## Intended use", "## Limitations"):
        assert section in card
    assert "| `group_size` | 4 |" in card and "| `kl.estimator` | low_var_kl |" in card
    assert "restored from train.lora.alpha" in card  # the repaired alpha is disclosed
    assert "smollm2-135m-instruct" in card and "SYNTHETIC" in card
    assert "from 0.35 to 0.5 over 4 logged steps" in card

    manifest = json.loads((out / "MANIFEST.json").read_text())
    assert manifest["knobs"] == KNOBS
    canonical = json.dumps(KNOBS, sort_keys=True, separators=(",", ":")).encode()
    assert manifest["config_sha256"] == hashlib.sha256(canonical).hexdigest()
    assert manifest["splits"]["sha256"]["train"] == io.sha256_file(inputs["split_files"][0])
    assert manifest["judge"]["model"] == "smollm2-135m-instruct"
    assert manifest["judge"]["rubric_sha256"] == io.sha256_file(inputs["rubric"])
    assert manifest["packages"]["torch"].startswith("2.") and manifest["packages"]["peft"]
    assert set(manifest["git"]) >= {"sha", "dirty"}
    assert manifest["model_files"]["model.safetensors"]["sha256"] == io.sha256_file(
        inputs["merged"] / "model.safetensors")
    assert manifest["training"]["reward_mean"]["last"] == pytest.approx(0.5)
    assert manifest["adapter"]["alpha"] == 8 and manifest["adapter"]["alpha_repaired"] is True
    assert manifest["timestamps"]["created_utc"].endswith("Z")

    assert receipt["uploaded"] is False and "release.upload is off" in receipt["reason"]
    assert json.loads((out / "upload_receipt.json").read_text())["phi_guard"]["ok"] is True
    assert not list((tmp_path / "run").glob(".bundle.*"))  # staging removed


def test_upload_on_without_token_says_so(inputs, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    receipt = run_release(inputs, tmp_path / "rel", rel={"upload": True})
    assert receipt["uploaded"] is False and "$HF_TOKEN is not set" in receipt["reason"]


def test_failed_merge_check_is_not_released(inputs, tmp_path):
    check = json.loads(inputs["merge_check"].read_text())
    io.write_json(inputs["merge_check"], dict(check, ok=False))
    with pytest.raises(InputError, match="merge check failed, nothing to release"):
        run_release(inputs, tmp_path / "rel")
    assert not (tmp_path / "rel").exists()


def test_phi_in_the_card_stops_the_release_and_writes_nothing(inputs, tmp_path):
    sid = inputs["patients"][0]["subject_id"]
    rel = {"tags": ["llmrnn", f"patient-{sid}"]}  # a careless knob that would put an id into the card
    with pytest.raises(CheckFailed, match=r"PHI guard refused .*(README.md|MANIFEST.json).*: cohort identifier") as err:
        run_release(inputs, tmp_path / "rel", rel=rel)
    assert str(sid) not in str(err.value)
    assert not (tmp_path / "rel" / "README.md").exists()
    assert not (tmp_path / "rel" / "upload_receipt.json").exists()


def test_clinical_text_copied_from_the_config_into_the_manifest_is_refused(inputs, tmp_path):
    """merge.probe_prompts land in MANIFEST.json's knobs: they are scanned like every other bundle file."""
    dx = next(v["clinical_sections"]["discharge_diagnosis"] for p in inputs["patients"] for v in p["visits"]
              if len(v["clinical_sections"]["discharge_diagnosis"].split()) >= 12)  # short lines joined by \n
    knobs = dict(KNOBS, merge={"dtype": "float32", "probe_prompts": ["Summarise the memory.", dx]})
    with pytest.raises(CheckFailed, match=r"MANIFEST.json \$.knobs.merge.probe_prompts\[1\]: clinical text") as err:
        run_release(inputs, tmp_path / "rel", knobs=knobs)
    assert dx.split("\n")[0] not in str(err.value) and not (tmp_path / "rel").exists()


KEY = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"


@pytest.mark.parametrize("where", ["token_env", "api_key_env", "bad_name"])
def test_a_key_typed_in_place_of_a_variable_name_is_refused(inputs, tmp_path, where, monkeypatch, caplog):
    monkeypatch.setenv("HF_TOKEN", "irrelevant")
    rel, knobs = {"upload": False}, json.loads(json.dumps(KNOBS))
    if where == "token_env":
        rel["token_env"] = KEY
    elif where == "api_key_env":
        knobs["models"] = {"roles": {"judge": {"backend": "openai", "api_key_env": "sk-proj-" + KEY[3:]}}}
    else:
        rel["token_env"] = "MY TOKEN=abc"  # not a variable name at all
    with pytest.raises(InputError, match=r"_env (looks like a key|is not an environment variable NAME)") as err:
        run_release(inputs, tmp_path / "rel", rel=rel, knobs=knobs)
    assert KEY[3:] not in str(err.value) and "abc" not in str(err.value) and KEY[3:] not in caplog.text
    assert not (tmp_path / "rel").exists()  # no manifest, no receipt


def test_logs_of_patient_text_stages_are_private(inputs, tmp_path):
    """`2> {log}` creates the log world-readable (umask 022); the llmrnn stage makes it 0600."""
    import os
    import subprocess
    import sys

    log = tmp_path / "guard.log"
    log.write_text("")
    os.chmod(log, 0o644)
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "README.md").write_text(f"patient {inputs['patients'][0]['subject_id']}\n")
    with open(log, "a") as err:
        proc = subprocess.run([sys.executable, "-m", "llmrnn.cli", "release", "guard", str(bundle), "--split-files",
                               *inputs["split_files"]], stderr=err, stdout=subprocess.DEVNULL, check=False)
    assert proc.returncode == 3
    assert os.stat(log).st_mode & 0o777 == 0o600
    text = log.read_text()
    assert "cohort identifier (subject_id)" in text and str(inputs["patients"][0]["subject_id"]) not in text


QA_KNOBS = {**KNOBS, "recipe": "qa",
            "qa": {"source": "data/ecg_qa.json", "sft": {"enabled": True},
                   "reward": {"weights": {"exact_match": 1.0, "format": 0.2, "judge": 0.0}}}}


@pytest.fixture
def qa_inputs(inputs, tmp_path) -> dict:
    """recipe qa: the release's reference is the QA data stage's output (ECG-report-like records)."""
    from llmrnn.qa import data
    from tests.test_phi_guard import _qa_source

    source = tmp_path / "ecg_qa.json"
    source.write_text(json.dumps(_qa_source()))
    outputs = data.output_paths(tmp_path / "run" / "qa")
    data.prepare({"split": {"val_size": 2, "test_size": 2, "seed": 0}}, outputs, str(source))
    files = [outputs[k] for k in ("train", "val", "test", "ood")]
    return {**inputs, "splits": Path(outputs["summary"]), "split_files": files,
            "records": [r for f in files for r in io.read_jsonl(f)]}


def run_qa_release(inputs: dict, out: Path, rel: dict | None = None, knobs: dict | None = None) -> dict:
    return release.build_release(
        merged=inputs["merged"], merge_check=inputs["merge_check"], splits=inputs["splits"],
        split_files=inputs["split_files"], metrics=inputs["metrics"], rubric=inputs["rubric"],
        cfg={"run_name": "qa", "release": rel or {}, "knobs": knobs or QA_KNOBS}, card_out=out / "README.md",
        manifest_out=out / "MANIFEST.json", receipt_out=out / "upload_receipt.json", split_format="qa",
    )


def test_qa_recipe_card_says_what_the_model_is(qa_inputs, tmp_path, monkeypatch):
    """recipe: qa: the card introduces a QA model (SFT + GRPO, its reward weights), not a memory head, and
    its data section counts the QA splits; the guard compared the bundle with the QA records."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    out = tmp_path / "run" / "release_qa"
    receipt = run_qa_release(qa_inputs, out)
    card = (out / "README.md").read_text()
    assert "medical question-answering model trained by the llmrnn `qa` recipe" in card
    assert "a LoRA SFT warm start, then GRPO" in card and "exact_match 1.0, format 0.2)" in card
    assert "memory-update model" not in card
    assert "| `QA data` | `ecg_qa.json` |" in card and "| `test questions` | 2 (sha256 " in card
    assert "patients" not in card.split("## Data")[1].split("##")[0]
    manifest = json.loads((out / "MANIFEST.json").read_text())
    assert manifest["knobs"]["recipe"] == "qa" and manifest["splits"]["sizes"]["ood"] == 0
    guard = receipt["phi_guard"]
    assert guard["ok"] and guard["reference"] == "qa" and guard["identifiers_checked"] >= 20


def card_section(card: str, title: str) -> str:
    return card.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_qa_card_without_a_judge_tells_the_qa_workflow_use_and_reward(qa_inputs, tmp_path, monkeypatch):
    """recipe qa, judge weight 0 (the rule passes no rubric): the qa rules, the answer format and system
    prompt, the reward's own terms; no memory-head wording, no judge; the manifest says why no judge."""
    from llmrnn.qa.data import SYSTEM_PROMPT

    monkeypatch.delenv("HF_TOKEN", raising=False)
    out = tmp_path / "run" / "release_qa"
    run_qa_release({**qa_inputs, "rubric": None}, out)
    card = (out / "README.md").read_text()
    steps = card_section(card, "How the workflow made it")
    for rule in ("qa_data", "qa_sft / qa_merge_sft", "qa_preflight", "qa_train_grpo", "merge_model", "release"):
        assert f"`{rule}`:" in steps
    assert not any(f"`{rule}`" in steps for rule in ("qa_synth", "judge_server", "dump_trajectories", "train_grpo"))
    assert "`qa_eval_model`" in steps and "after the release" in steps
    use, limits = card_section(card, "Intended use"), card_section(card, "Limitations")
    assert "`<reasoning>...</reasoning><answer>...</answer>`" in use and SYSTEM_PROMPT in use
    assert "memory" not in (use + limits).lower() and "judge" not in limits
    assert "exact match of the extracted answer against the reference" in limits and "a format term" in limits
    assert "judge model |" not in card_section(card, "Reward")
    manifest = json.loads((out / "MANIFEST.json").read_text())
    assert manifest["judge"] == {"rubric_file": None, "model": None,
                                 "note": "the QA reward asks no judge (qa.reward.weights.judge is 0)"}


def test_qa_card_with_a_judge_names_it_and_its_limits(qa_inputs, tmp_path, monkeypatch):
    """judge weight > 0 with the QA rubric: the judge is served, named and its limit stated; the system prompt
    the config trained with is the one shown; no SFT step when SFT is off."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    out = tmp_path / "run" / "release_qa"
    qa = {**QA_KNOBS["qa"], "sft": {"enabled": False}, "prompt": {"system": "Answer briefly in tags."},
          "reward": {"weights": {"exact_match": 0.5, "judge": 0.5, "format": 0.0}}}  # format defaults to 0.2
    run_qa_release(qa_inputs, out, knobs={**QA_KNOBS, "qa": qa})
    card = (out / "README.md").read_text()
    steps = card_section(card, "How the workflow made it")
    assert "`judge_server`:" in steps and "`qa_sft" not in steps
    assert "```text\nAnswer briefly in tags.\n```" in card_section(card, "Intended use")
    limits = card_section(card, "Limitations")
    assert "The judge term is the opinion of one judge model under one rubric" in limits
    assert "a format term" not in limits and "memory" not in limits.lower()
    assert "| `judge model` | smollm2-135m-instruct |" in card_section(card, "Reward")
    assert json.loads((out / "MANIFEST.json").read_text())["judge"]["model"] == "smollm2-135m-instruct"


def test_the_card_templates_read_what_card_py_gives_and_nothing_else(inputs, qa_inputs, tmp_path, monkeypatch):
    """Each recipe's template reads only the variables llmrnn.release.card gives it (Jinja prints an unknown
    name as nothing), card.py gives none that the template leaves unread, and the shared macros read nothing
    but their arguments; the wheel ships every template (pyproject.toml package-data)."""
    import fnmatch

    import jinja2
    from jinja2 import meta
    from setuptools.config.pyprojecttoml import read_configuration

    from llmrnn.release import card
    from tests.conftest import REPO

    monkeypatch.delenv("HF_TOKEN", raising=False)
    env = jinja2.Environment()

    def read(name: str) -> set[str]:
        return meta.find_undeclared_variables(env.parse((card.TEMPLATES / name).read_text()))

    assert read("sections.md") == set()
    for recipe, variables, build, given_inputs in (("memory_head", card._memory_head_variables, run_release, inputs),
                                                   ("qa", card._qa_variables, run_qa_release, qa_inputs)):
        out = tmp_path / "run" / f"release_{recipe}"
        build(given_inputs, out)
        manifest = json.loads((out / "MANIFEST.json").read_text())
        given = {**card._shared_variables(manifest, "x/y"), **variables(manifest)}
        assert read(f"{recipe}.md") == set(given) | {"card_data", "sections"}, recipe  # from_template's, ours

    patterns = read_configuration(REPO / "pyproject.toml")["tool"]["setuptools"]["package-data"]["llmrnn"]
    package = Path(card.__file__).parents[1]
    shipped = [str(p.relative_to(package)) for p in card.TEMPLATES.iterdir()]
    assert len(shipped) == 3 and all(any(fnmatch.fnmatch(f, pat) for pat in patterns) for f in shipped), shipped


def test_qa_data_in_the_card_or_manifest_stops_the_qa_release(qa_inputs, tmp_path):
    from tests.test_phi_guard import QA_ID

    context = next(r for r in qa_inputs["records"] if r["id"] == QA_ID)["context"]
    # the tags go into the card's metadata and the manifest's release section (the first finding is named)
    with pytest.raises(CheckFailed, match=r"(README.md|MANIFEST.json).*: QA data identifier \(record id\)") as err:
        run_qa_release(qa_inputs, tmp_path / "rel", rel={"tags": ["llmrnn", f"tracing-{QA_ID}"]})
    assert QA_ID not in str(err.value)
    knobs = {**QA_KNOBS, "qa": {**QA_KNOBS["qa"], "prompt": {"system": f"Like this one: {context}"}}}
    with pytest.raises(CheckFailed, match=r"MANIFEST.json \$.knobs.qa.prompt.system: QA record text \(context\)") as err:
        run_qa_release(qa_inputs, tmp_path / "rel", knobs=knobs)
    assert not any(line in str(err.value) for line in context.splitlines())
    assert not (tmp_path / "rel").exists()


def test_release_guard_command_takes_the_qa_reference(qa_inputs, tmp_path):
    """`llmrnn release guard --split-format qa` (for people): exit 3 on QA text, the text not repeated."""
    from tests.test_phi_guard import QA_ID

    question = next(r for r in qa_inputs["records"] if r["id"] == QA_ID)["question"]
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "README.md").write_text(f"# card\nAsked: {question}\n")
    cmd = ["release", "guard", str(bundle), "--split-files", *qa_inputs["split_files"]]
    proc = llmrnn_in_process(*cmd, "--split-format", "qa")
    assert proc.returncode == 3 and "README.md: QA record text (question)" in proc.stderr
    assert question not in proc.stderr + proc.stdout
    proc = llmrnn_in_process(*cmd)  # the cohort format: not its files
    assert proc.returncode != 0 and "cannot read split file" in proc.stderr


# ----------------------------------------------------------------------------- links and other non-regular files
@pytest.mark.parametrize("kind", ["file link", "folder link", "fifo", "dangling link"])
def test_links_and_non_regular_files_in_merged_are_refused_never_followed(inputs, tmp_path, kind):
    import os

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text("outside the run: never to be released\n")
    # a name a bundle may hold is named; any other (the folder link's) only by its position
    entry = inputs["merged"] / {"file link": "vocab.json", "folder link": "extra", "fifo": "merges.txt",
                                "dangling link": "special_tokens_map.json"}[kind]
    if kind == "file link":
        entry.symlink_to(outside / "secret.md")
    elif kind == "folder link":
        entry.symlink_to(outside, target_is_directory=True)
    elif kind == "dangling link":
        entry.symlink_to(outside / "missing.md")
    else:
        os.mkfifo(entry)
    what = "not a regular file" if kind == "fifo" else "a symbolic link"
    shown = r"merged: entry \d+ of \d+" if kind == "folder link" else f"merged/{entry.name}"
    with pytest.raises(InputError, match=rf"{shown}: {what}") as err:
        run_release(inputs, tmp_path / "run" / "release")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run" / "release").exists() and not list((tmp_path / "run").glob(".bundle.*"))


def test_the_cli_refuses_a_link_in_one_line_and_writes_nothing(inputs, tmp_path):
    (inputs["merged"] / "vocab.json").symlink_to(inputs["split_files"][0])
    out = tmp_path / "run" / "release"
    cfg = json.dumps({"run_name": "demo", "release": {}, "knobs": KNOBS})
    proc = llmrnn_in_process(
        "release", "build", "--merged", str(inputs["merged"]), "--merge-check", str(inputs["merge_check"]),
        "--splits", str(inputs["splits"]), "--split-files", *inputs["split_files"], "--metrics", str(inputs["metrics"]),
        "--rubric", str(inputs["rubric"]), "--cfg", cfg, "--card", str(out / "README.md"),
        "--manifest", str(out / "MANIFEST.json"), "--receipt", str(out / "upload_receipt.json"))
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "vocab.json: a symbolic link" in lines[0] and "Traceback" not in proc.stderr
    assert not out.exists()


def test_stale_stage_folders_of_a_killed_release_are_removed(inputs, tmp_path):
    """A release killed while staging leaves a full model copy in RUN/.bundle.*.tmp; the next run removes it
    (and nothing else that merely looks alike)."""
    import os
    import signal
    import subprocess
    import sys

    run = tmp_path / "run"
    code = ("import os, signal, sys; from pathlib import Path; from llmrnn.release import staging; "
            "stage, _ = staging.stage_model_files(Path(sys.argv[1]), Path(sys.argv[2])); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    proc = subprocess.run([sys.executable, "-c", code, str(inputs["merged"]), str(run)], check=False,
                          env={**os.environ, "PYTHONPATH": str(Path(release.__file__).parents[2])})
    assert proc.returncode == -signal.SIGKILL
    (stale,) = run.glob(".bundle.*.tmp")
    assert (stale / "model.safetensors").is_file()
    keep = run / ".bundle.notmine"
    keep.mkdir()
    run_release(inputs, run / "release")
    assert not stale.exists() and keep.is_dir() and not list(run.glob(".bundle.*.tmp"))


def test_a_base_model_card_in_merged_is_replaced_and_left_untouched(inputs, tmp_path):
    """merged/README.md (a local base model's card, copied by the merge): the release's card takes its place
    in the bundle; the file in merged/ is not written through (it used to be a hard link of the bundle's)."""
    base_card = "# SmolLM2\nThe base model's own card.\n"
    (inputs["merged"] / "README.md").write_text(base_card)
    out = tmp_path / "run" / "release"
    receipt = run_release(inputs, out)
    assert (inputs["merged"] / "README.md").read_text() == base_card
    assert (out / "README.md").read_text().startswith("---\n") and receipt["files"].count("README.md") == 1
    assert "README.md" not in json.loads((out / "MANIFEST.json").read_text())["model_files"]


def test_card_names_the_checkpoint_merged_and_why(inputs, tmp_path, monkeypatch):
    """train.select: the training summary's chosen step reaches the card and the manifest."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    out = tmp_path / "run" / "release"
    summary = tmp_path / "run" / "summary.json"
    why = "train.select best_val: step 2 had the highest val reward (0.556) of the saved steps [2, 4]"
    io.write_json(summary, {"steps": 4, "checkpoint": {"step": 2, "select": "best_val", "why": why,
                                                       "val_reward": 0.556, "saved_steps": [2, 4]}})
    release.build_release(
        merged=inputs["merged"], merge_check=inputs["merge_check"], splits=inputs["splits"],
        split_files=inputs["split_files"], metrics=inputs["metrics"], rubric=inputs["rubric"],
        cfg={"run_name": "demo", "release": {"base_model": "x/y"}, "knobs": KNOBS}, card_out=out / "README.md",
        manifest_out=out / "MANIFEST.json", receipt_out=out / "upload_receipt.json", train_summary=summary)
    card = (out / "README.md").read_text()
    assert "| `checkpoint merged` | step 2 (train.select best_val) |" in card and f"| `why this step` | {why} |" in card
    manifest = json.loads((out / "MANIFEST.json").read_text())
    assert manifest["training"]["checkpoint"] == {"step": 2, "select": "best_val", "why": why, "val_reward": 0.556}


def test_a_second_release_of_a_run_while_one_runs_stops_and_leaves_the_first_alone(inputs, tmp_path):
    """Two releases of one run at once (two real processes): the first holds the run's lock and its own
    stage; the second stops at once with one line naming the first's pid, neither uploads nor removes the
    first's stage, and writes nothing. When the first is done, a release runs again."""
    import os
    import subprocess
    import sys

    run = tmp_path / "run"
    code = ("import sys, time; from pathlib import Path; from llmrnn.release import staging\n"
            "with staging.run_lock(Path(sys.argv[1])):\n"
            "    stage = Path(sys.argv[1]) / '.bundle.abcd1234.tmp'; stage.mkdir(); (stage / 'w').write_text('x')\n"
            "    print('locked', flush=True); sys.stdin.read()\n")
    env = {**os.environ, "PYTHONPATH": str(Path(release.__file__).parents[2])}
    first = subprocess.Popen([sys.executable, "-c", code, str(run)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=env)
    try:
        assert first.stdout.readline().strip() == "locked"
        out = run / "release"
        cfg = json.dumps({"run_name": "demo", "release": {"upload": True}, "knobs": KNOBS})
        second = subprocess.run(
            [sys.executable, "-m", "llmrnn.cli", "release", "build", "--merged", str(inputs["merged"]),
             "--merge-check", str(inputs["merge_check"]), "--splits", str(inputs["splits"]),
             "--split-files", *inputs["split_files"], "--metrics", str(inputs["metrics"]),
             "--rubric", str(inputs["rubric"]), "--cfg", cfg, "--card", str(out / "README.md"),
             "--manifest", str(out / "MANIFEST.json"), "--receipt", str(out / "upload_receipt.json")],
            capture_output=True, text=True, check=False, env={**env, "HF_TOKEN": "hf_test"}, timeout=120)
        lines = [line for line in second.stderr.splitlines() if line.strip()]
        assert second.returncode == 3 and len(lines) == 1, second.stderr
        assert f"another release of {run} is running (pid {first.pid})" in lines[0]
        assert (run / ".bundle.abcd1234.tmp" / "w").is_file()  # the first's stage is untouched
        assert not out.exists()
    finally:
        first.communicate("", timeout=30)
    assert first.returncode == 0
    run_release(inputs, run / "release")  # the lock went with the first process


def test_card_states_the_attention_that_ran_and_the_data_seed_against_the_reference(inputs, tmp_path, monkeypatch):
    """Item 7 of issue 31: a verl run's card names the attention kernel the actor ran with (the training
    summary's `attention`, resolved on the node from train.verl.attn_implementation auto) and that data.seed
    is set where the reference left it unset."""
    from llmrnn.train import verl_attention

    monkeypatch.delenv("HF_TOKEN", raising=False)
    out = tmp_path / "run" / "release"
    summary = tmp_path / "run" / "summary.json"
    attention = verl_attention.resolve_attention("auto")  # this machine: no flash-attn
    io.write_json(summary, {"steps": 4, "attention": attention})
    knobs = {**KNOBS, "train": {**KNOBS["train"], "engine": "verl", "seed": 42,
                                "verl": {"attn_implementation": "auto"}}}
    release.build_release(
        merged=inputs["merged"], merge_check=inputs["merge_check"], splits=inputs["splits"],
        split_files=inputs["split_files"], metrics=inputs["metrics"], rubric=inputs["rubric"],
        cfg={"run_name": "demo", "release": {"base_model": "x/y"}, "knobs": knobs}, card_out=out / "README.md",
        manifest_out=out / "MANIFEST.json", receipt_out=out / "upload_receipt.json", train_summary=summary)
    card = (out / "README.md").read_text()
    section = card.split("## Differences from the reference run", 1)[1].split("\n## ", 1)[0]
    assert "| `actor attention` | sdpa, remove-padding off (auto: flash-attn does not import" in section
    assert "| `data.seed` | 42 (train.seed): the reference left verl's data.seed unset" in section
    manifest = json.loads((out / "MANIFEST.json").read_text())
    assert manifest["training"]["attention"]["ran"] == "sdpa"


@pytest.mark.parametrize("mode", ["admission_time", "reference"])
def test_card_names_the_note_text_shown_and_its_leakage(inputs, tmp_path, monkeypatch, mode):
    """A cohort built from MIMIC-IV notes: the card says which sections the models saw, and names the
    reference mode's discharge-time text as leakage."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    out = tmp_path / "run" / "release"
    knobs = dict(KNOBS, cohort={"source": "mimic_iv", "mimic_iv": {"hosp": "data/h", "note": "data/n", "mode": mode}})
    cfg = {"run_name": "demo", "release": {"base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"}, "knobs": knobs}
    release.build_release(
        merged=inputs["merged"], merge_check=inputs["merge_check"], splits=inputs["splits"],
        split_files=inputs["split_files"], metrics=inputs["metrics"], rubric=inputs["rubric"], cfg=cfg,
        card_out=out / "README.md", manifest_out=out / "MANIFEST.json", receipt_out=out / "upload_receipt.json")
    data = (out / "README.md").read_text().split("## Data\n", 1)[1].split("\n## ", 1)[0]
    assert f"| `note text shown` | {mode}: " in data
    if mode == "reference":
        assert "LEAKAGE of discharge-time text: procedures, hospital_course" in data
    else:
        assert "none by design" in data and "hospital_course" not in data
