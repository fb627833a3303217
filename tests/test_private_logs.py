"""Logs that may hold patient data are owner-only (0600) and `llmrnn check` never quotes a patient id."""

from __future__ import annotations

import json
import os
import stat

import yaml

from llmrnn import check, cohort


def _cohort_with_a_bad_record(path) -> tuple[str, str]:
    patients = cohort.synthesize_cohort(12, 3)
    patients[3]["visits"][1]["visit_number"] = "second"
    patients[5]["visits"][0]["visit_id"] = patients[5]["visits"][1]["visit_id"]  # reported only after record 3
    path.write_text(json.dumps(patients))
    return str(patients[3]["subject_id"]), str(patients[3]["visits"][1]["visit_id"])


def test_check_names_the_record_not_the_patient(tmp_path):
    path = tmp_path / "cohort.json"
    pid, vid = _cohort_with_a_bad_record(path)
    (problem,) = check.check_cohort({"cohort": {"source": str(path)}, "split": {"val_size": 1, "train_size": 1}})
    assert f"{path}: record 3 visit 1: visit_number: expected an integer" in problem
    assert pid not in problem and vid not in problem


def test_a_duplicate_visit_id_is_not_repeated_either(tmp_path):
    patients = cohort.synthesize_cohort(6, 3)
    dup = patients[2]["visits"][0]["visit_id"]
    patients[2]["visits"][1]["visit_id"] = dup
    path = tmp_path / "cohort.json"
    path.write_text(json.dumps(patients))
    (problem,) = check.check_cohort({"cohort": {"source": str(path)}, "split": {"val_size": 1, "train_size": 1}})
    assert "record 2 visit 1: visit_id: duplicate <id withheld> within the patient" in problem
    assert str(dup) not in problem and str(patients[2]["subject_id"]) not in problem


def test_the_check_rule_log_is_private_and_quotes_no_patient_id(workflow_dir):
    """`llmrnn check ... | tee {log}`: the log is made by tee, not by llmrnn, so the rule sets umask 077."""
    from tests.conftest import snakemake

    pid, vid = _cohort_with_a_bad_record(workflow_dir / "bad_cohort.json")
    (workflow_dir / "config" / "bad.yaml").write_text(yaml.safe_dump({"cohort": {"source": "bad_cohort.json"}}))
    proc = snakemake(workflow_dir, "check", "--configfile", "config/config.yaml", "config/bad.yaml", check=False)
    assert proc.returncode != 0
    log = workflow_dir / "logs" / "demo" / "check.log"
    text = log.read_text()
    assert "bad_cohort.json: record 3 visit 1: visit_number" in text, text
    assert pid not in text and vid not in text
    assert stat.S_IMODE(os.stat(log).st_mode) == 0o600


# commands whose logs hold no patient data: model preparation (a model, never a patient)
NO_PATIENT_DATA = {"models"}


def test_every_rule_log_that_may_hold_patient_data_is_made_private():
    """A rule's log is created by the shell with the umask: the command must make it 0600 itself (the CLI's
    private_log_files, for the fd it writes to) or the shell must set `umask 077` first (a log made by tee,
    which the command never sees)."""
    from llmrnn.cli import PATIENT_TEXT_COMMANDS
    from tests.test_rules_quoting import shell_commands

    checked = 0
    for rule, command in shell_commands().items():
        if "{log" not in command:
            continue
        words = command.removeprefix("umask 077; ").removeprefix("exec ").split()
        assert words[0] == "llmrnn", f"rule {rule}: runs {words[0]}, not llmrnn"
        verb = words[1]
        piped = "| tee" in command
        private = command.startswith("umask 077;") or (verb in PATIENT_TEXT_COMMANDS and not piped)
        assert private or verb in NO_PATIENT_DATA, f"rule {rule}: its log is not made 0600"
        checked += 1
    assert checked >= 20
