"""PHI guard, round 5: the guard sees what a reader of the rendered page sees (markup between words is
stripped before matching), and identifiers written inside the cohort's notes (record numbers, names next to a
name-like header, dates of birth) are refused with file and line, never the value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmrnn import cohort
from tests.test_phi_guard import guard, make_bundle, write_splits

NOTE_HEADER = "Name: Johanna Quist  MRN: 44519023  DOB: 1956-03-14\n"


@pytest.fixture(scope="module")
def cohort_splits(tmp_path_factory) -> tuple[list[Path], list[dict]]:
    patients = cohort.synthesize_cohort(12, 3)
    course = patients[2]["visits"][0]["clinical_sections"]
    course["hospital_course"] = NOTE_HEADER + course["hospital_course"]
    return write_splits(tmp_path_factory.mktemp("splits"), patients), patients


@pytest.fixture
def bundle(tiny_model_dir, tmp_path) -> Path:
    return make_bundle(tiny_model_dir, tmp_path, {"run_name": "demo", "seed": 42})


def _hpi_words(patients) -> list[str]:
    words = patients[3]["visits"][1]["clinical_sections"]["history_present_illness"].split()
    assert len(words) >= 10, "the synthetic note is long enough for an 8-word run"
    return words[:10]


def _dressed(words: list[str], how: str) -> str:
    if how == "br":
        return "<br>".join(words)
    if how == "tags":
        return " ".join(f"<span>{w[:1]}</span>{w[1:]}" for w in words)
    if how == "links":
        return " ".join(f"[{w}](https://example.org/{i})" for i, w in enumerate(words))
    if how == "emphasis":
        return " ".join(f"{w[:1]}**{w[1:]}**" if len(w) > 1 else w for w in words)
    if how == "table":
        return "| a | b |\n|---|---|\n" + "".join(f"| {w} |\n" for w in words)
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["br", "tags", "links", "emphasis", "table"])
@pytest.mark.parametrize("name", ["README.md"])  # any other text file is refused by its name (fail closed)
def test_clinical_text_dressed_in_markup_is_refused(bundle, cohort_splits, how, name):
    files, patients = cohort_splits
    (bundle / name).write_text(f"# card\n\nExample memory: {_dressed(_hpi_words(patients), how)}\n")
    report = guard(bundle, files)
    # a table's cells are lines of their own already; every other dressing is seen in the rendered view only
    seen = f"{name}: " if how == "table" else f"{name} (rendered): "
    assert any(f.startswith(f"{seen}clinical text from the cohort") for f in report["findings"]), report["findings"]


def test_markup_in_a_json_string_is_rendered_too(bundle, cohort_splits):
    files, patients = cohort_splits
    (bundle / "MANIFEST.json").write_text(json.dumps({"knobs": {"note": _dressed(_hpi_words(patients), "br")}}))
    report = guard(bundle, files)
    assert any(f.startswith("MANIFEST.json $.knobs.note (rendered): clinical text") for f in report["findings"]), \
        report["findings"]


@pytest.mark.parametrize(("written", "kind"), [
    ("Reviewed by Johanna Quist.", "name in the clinical text"),
    ("Reviewed by <b>Johanna</b> Quist.", "name in the clinical text"),
    ("See record 44519023 for details.", "identifier in the clinical text"),
    ("Born 03/14/1956 in the example.", "date of birth in the clinical text"),
])
def test_identifier_inside_a_note_is_refused_with_its_line(bundle, cohort_splits, written, kind):
    files, _ = cohort_splits
    (bundle / "README.md").write_text(f"# card\n\nTrained with GRPO.\n\n{written}\n")
    report = guard(bundle, files)
    assert not report["ok"]
    finding = next(f for f in report["findings"] if f.startswith("README.md"))
    assert f"cohort identifier ({kind})" in finding and finding.endswith("line 5"), report["findings"]
    for value in ("Johanna", "Quist", "44519023", "1956"):
        assert value not in " ".join(report["findings"])


@pytest.mark.parametrize("glue", ["<wbr>", "\u200b", "\u202e", "<sup>1</sup> ", "\\*"])
@pytest.mark.parametrize("name", ["README.md"])
def test_clinical_text_whose_word_breaks_are_hidden_is_refused(bundle, cohort_splits, glue, name):
    """Words glued (a reader still reads them: `<wbr>`, zero-width or bidi characters between them) or with a
    footnote mark or escaped markup between or inside them: matched on the letters alone."""
    files, patients = cohort_splits
    words = _hpi_words(patients)
    text = glue.join(words) if glue != "\\*" else " ".join(f"{w[:1]}{glue}{w[1:]}" for w in words)
    (bundle / name).write_text(f"# card\n\nExample memory: {text}\n")
    report = guard(bundle, files)
    assert any(f.startswith(name) and "clinical text from the cohort" in f for f in report["findings"]), \
        report["findings"]


@pytest.mark.parametrize("written", ["born March 14, 1956", "14th of Mar 1956", "on 3/14/56", "14-mar-56"])
def test_a_date_of_birth_from_a_note_is_refused_however_it_is_spelled(bundle, cohort_splits, written):
    files, _ = cohort_splits
    (bundle / "README.md").write_text(f"# card\n\nAn example patient, {written}.\n")
    report = guard(bundle, files)
    assert any(f.startswith("README.md: cohort identifier (") and ") written as a date at " in f
               for f in report["findings"]), report["findings"]
    assert "1956" not in " ".join(report["findings"])


@pytest.mark.parametrize("written", ["Quist, Johanna", "QUIST JOHANNA", "Johanna M. Quist", "Dr. Quist (Johanna)"])
def test_a_name_from_a_note_is_refused_reordered_or_with_a_middle_initial(bundle, cohort_splits, written):
    files, _ = cohort_splits
    (bundle / "README.md").write_text(f"# card\n\nReviewed by {written}.\n")
    report = guard(bundle, files)
    assert any(f.startswith("README.md: cohort identifier (name in the clinical text)") for f in report["findings"]), \
        report["findings"]
    assert not any(w in " ".join(report["findings"]) for w in ("Quist", "Johanna", "quist", "johanna"))


def test_a_clean_card_with_markup_still_passes(bundle, cohort_splits):
    files, _ = cohort_splits
    (bundle / "README.md").write_text("# card\n\n| metric | value |\n|---|---|\n| reward | **0.61** |\n\n"
                                      "Trained with [GRPO](https://arxiv.org/abs/2402.03300)<br>on a LoRA adapter.\n"
                                      "Name: the memory head.\nReleased 2024-03-14; born<wbr>again as v2 on 3/14/24.\n"
                                      "Antidisestablishmentarianism<sup>1</sup> pneumonoultramicroscopicsilicovolcano"
                                      "coniosis floccinaucinihilipilification.\nJohanna wrote the card; Quist is not named.\n")
    report = guard(bundle, files)
    assert report["ok"], report["findings"]


DIGITLESS_TOKEN = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh"  # made up: hf_ and 34 letters, no digit


def test_a_hub_token_without_a_digit_is_refused_by_the_guard(bundle, cohort_splits):
    files, _ = cohort_splits
    assert len(DIGITLESS_TOKEN) == 37
    (bundle / "README.md").write_text(f"# card\nUse token {DIGITLESS_TOKEN} to download.\n")
    report = guard(bundle, files)
    assert any(f.startswith("README.md: a credential-like string") for f in report["findings"]), report["findings"]
    assert DIGITLESS_TOKEN not in " ".join(report["findings"])


def test_a_hub_token_without_a_digit_is_refused_by_the_config_check():
    from llmrnn.configcheck import value_findings

    found = value_findings({"release": {"commit_message": f"token {DIGITLESS_TOKEN}"}})
    assert [(where, secret) for where, _, secret in found] == [("release.commit_message", True)], found
    assert "hf_..." in found[0][1] and DIGITLESS_TOKEN not in found[0][1]
    # a name that merely starts like one is not a token
    assert value_findings({"release": {"commit_message": "see hf_hub_download and hf_transfer_enabled"}}) == []
