"""PHI guard: a release bundle holding cohort identifiers, clinical text, audit logs or cohort files is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from llmrnn import cohort, io, phi_guard
from llmrnn.errors import CheckFailed


@pytest.fixture(scope="module")
def splits(tmp_path_factory) -> tuple[list[Path], list[dict]]:
    """Split files of a small synthetic cohort (ids 90000000+, as MIMIC-IV's are 8 digits)."""
    d = tmp_path_factory.mktemp("splits")
    patients = cohort.synthesize_cohort(12, 3)
    parts = cohort.split_cohort(patients, cohort.SplitSizes(val=2, train=4, seed=1))
    files = []
    for name, part in parts.items():
        io.write_text(d / f"{name}.json", cohort.dump_cohort(part))
        files.append(d / f"{name}.json")
    return files, patients


@pytest.fixture
def bundle(tiny_model_dir, tmp_path) -> Path:
    b = tmp_path / "bundle"
    shutil.copytree(tiny_model_dir, b)
    (b / "README.md").write_text("# a model card\nTrained with GRPO on a LoRA adapter, merged.\n")
    (b / "MANIFEST.json").write_text(json.dumps({"run_name": "demo", "seed": 42, "sizes": {"train": 4}}))
    return b


def _scan(bundle, files):
    return phi_guard.scan_bundle(bundle, files)


def test_clean_bundle_passes(bundle, splits):
    files, _ = splits
    report = _scan(bundle, files)
    assert report["ok"] and report["findings"] == []
    assert report["identifiers_checked"] > 12 and report["clinical_texts_checked"] > 0
    phi_guard.enforce(report, bundle)  # does not raise


def test_subject_id_in_the_card_is_refused(bundle, splits):
    files, patients = splits
    sid = patients[5]["subject_id"]
    (bundle / "README.md").write_text(f"# card\nExample patient {sid} improved.\n")
    report = _scan(bundle, files)
    assert not report["ok"]
    with pytest.raises(CheckFailed, match=r"README.md: cohort identifier \(subject_id\) at char \d+") as err:
        phi_guard.enforce(report, bundle)
    assert str(sid) not in str(err.value)  # says what and where, never the identifier itself


def test_visit_id_inside_safetensors_metadata_is_refused(bundle, splits):
    import torch
    from safetensors.torch import save_file

    files, patients = splits
    vid = patients[0]["visits"][0]["visit_id"]
    save_file({"w": torch.zeros(2)}, bundle / "extra.safetensors", metadata={"note": f"visit {vid}"})
    report = _scan(bundle, files)
    assert any(f.startswith("extra.safetensors metadata key .note: cohort identifier (visit_id)")
               for f in report["findings"]), report["findings"]


def test_clinical_text_is_refused(bundle, splits):
    files, patients = splits
    hpi = patients[3]["visits"][1]["clinical_sections"]["history_present_illness"]
    (bundle / "README.md").write_text(f"# card\n\nExample memory: {hpi}\n")
    report = _scan(bundle, files)
    assert any("README.md: clinical text from the cohort" in f for f in report["findings"]), report["findings"]


def test_audit_log_and_cohort_files_are_refused(bundle, splits):
    files, _ = splits
    (bundle / "calls_1234.jsonl").write_text('{"prompt": "..."}\n')
    shutil.copy(files[0], bundle / "extra_data.json")  # a split file under another name
    (bundle / "audit").mkdir()
    (bundle / "audit" / "notes.txt").write_text("judge said 7\n")
    findings = _scan(bundle, files)["findings"]
    assert any(f.startswith("calls_1234.jsonl: file type not allowed") for f in findings)
    assert any(f.startswith("extra_data.json: identical to a cohort split file") for f in findings)
    assert any(f.startswith("audit/notes.txt: name looks like an audit log") for f in findings)


def test_cohort_shaped_json_is_refused_even_when_edited(bundle, splits):
    files, patients = splits
    edited = [dict(patients[0], subject_id=1)]
    (bundle / "examples.json").write_text(json.dumps(edited))
    assert any("examples.json: JSON records with subject_id and visits" in f
               for f in _scan(bundle, files)["findings"])


def test_short_identifiers_are_counted_not_matched(bundle, tmp_path):
    small = [{"subject_id": 42, "visits": [{"visit_id": 7, "clinical_sections": {"chief_complaint": "cough"}}]}]
    path = tmp_path / "small.json"
    path.write_text(json.dumps(small))
    report = phi_guard.scan_bundle(bundle, [path])  # MANIFEST.json holds "seed": 42: not a finding
    assert report["ok"] and report["identifiers_too_short_to_check"] == 2
