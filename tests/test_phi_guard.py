"""PHI guard: a release bundle holding cohort identifiers, clinical text, audit logs or cohort files is refused."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from llmrnn import cohort, io, phi_guard
from llmrnn.errors import CheckFailed
from llmrnn.phi_guard import files as guard_files
from llmrnn.phi_guard import scan as guard_scan


def write_splits(folder: Path, patients: list[dict]) -> list[Path]:
    """The split files (val 2, train 4, test the rest; seed 1) of `patients` in folder."""
    files = []
    for name, part in cohort.split_cohort(patients, cohort.SplitSizes(val=2, train=4, seed=1)).items():
        io.write_text(folder / f"{name}.json", cohort.dump_cohort(part))
        files.append(folder / f"{name}.json")
    return files


def make_bundle(model_dir: Path, folder: Path, manifest: dict) -> Path:
    """A release bundle: the model's files, a clean card and `manifest`; beside it (`base`) the base model's
    prepared copy the guard compares the model files with."""
    b = folder / "bundle"
    shutil.copytree(model_dir, b)
    shutil.copytree(model_dir, folder / "base")
    (b / "README.md").write_text("# a model card\nTrained with GRPO on a LoRA adapter, merged.\n")
    (b / "MANIFEST.json").write_text(json.dumps(manifest))
    return b


@pytest.fixture(scope="module")
def splits(tmp_path_factory) -> tuple[list[Path], list[dict]]:
    """Split files of a small synthetic cohort (ids 90000000+, as MIMIC-IV's are 8 digits)."""
    patients = cohort.synthesize_cohort(12, 3)
    return write_splits(tmp_path_factory.mktemp("splits"), patients), patients


@pytest.fixture
def bundle(tiny_model_dir, tmp_path) -> Path:
    return make_bundle(tiny_model_dir, tmp_path, {"run_name": "demo", "seed": 42, "sizes": {"train": 4}})


def guard(bundle: Path, files, *args, **kw) -> dict:
    """The guard as a person runs it on a folder (`llmrnn release guard --base`): the model files compared with
    the base beside the bundle, the card and manifest scanned as free text."""
    return phi_guard.scan_bundle(bundle, files, *args, base=bundle.parent / "base", **kw)


def _scan(bundle, files):
    return guard(bundle, files)


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




def test_clinical_text_is_refused(bundle, splits):
    files, patients = splits
    hpi = patients[3]["visits"][1]["clinical_sections"]["history_present_illness"]
    (bundle / "README.md").write_text(f"# card\n\nExample memory: {hpi}\n")
    report = _scan(bundle, files)
    assert any("README.md: clinical text from the cohort" in f for f in report["findings"]), report["findings"]






def test_short_identifiers_are_counted_not_matched(bundle, tmp_path):
    small = [{"subject_id": 42, "visits": [{"visit_id": 7, "clinical_sections": {"chief_complaint": "cough"}}]}]
    path = tmp_path / "small.json"
    path.write_text(json.dumps(small))
    report = guard(bundle, [path])  # MANIFEST.json holds "seed": 42: not a finding
    assert report["ok"] and report["identifiers_too_short_to_check"] == 2


# ----------------------------------------------------------------------------- hostile and careless bundles
SID = "90000005"  # subject_id of patients[5] of the `splits` fixture (synthetic ids start at 90000000)


def _findings(bundle, files, **kw) -> list[str]:
    return guard(bundle, files, **kw)["findings"]


def _assert_refused_without_quoting(findings: list[str], start: str, *secrets: str) -> None:
    assert any(f.startswith(start) for f in findings), findings
    for secret in secrets:  # what and where, never the identifier or the text itself
        assert all(secret not in f for f in findings), findings


def test_fixture_id_is_what_the_tests_assume(splits):
    assert str(splits[1][5]["subject_id"]) == SID


@pytest.mark.parametrize("written", [
    "90 000 005", "90,000,005", "90-000-005", "90.000.005", "90\u202f000\u202f005", "90'000'005",
    "\u0669\u0660\u0660\u0660\u0660\u0660\u0660\u0665",  # Arabic-Indic digits
    "\uff19\uff10\uff10\uff10\uff10\uff10\uff10\uff15",  # full-width digits
    "\u096f\u0966\u0966\u0966\u0966\u0966\u0966\u096b",  # Devanagari digits
    "id_90000005", "patient90000005",
])
def test_identifier_in_any_written_form_is_refused(bundle, splits, written):
    files, _ = splits
    (bundle / "README.md").write_text(f"# card\nExample patient {written} improved.\n", encoding="utf-8")
    _assert_refused_without_quoting(_findings(bundle, files), "README.md: cohort identifier (subject_id)", written)


def _write_split(path: Path, patients: list[dict]) -> list[Path]:
    path.write_text(json.dumps(patients), encoding="utf-8")
    return [path]


MEDS = "metoprolol succinate 25 mg daily\nlisinopril 10 mg daily\natorvastatin 40 mg at bedtime\naspirin 81 mg"


@pytest.fixture
def string_id_cohort(tmp_path) -> list[Path]:
    """A cohort with string ids (as the validator accepts) and a medication list of short lines."""
    patients = [{"subject_id": "MRN-AB7731X", "visits": [{
        "visit_id": "ENC-2024-55813", "visit_number": 1,
        "clinical_sections": {"admission_medications": MEDS, "chief_complaint": "chest pain"}}]}]
    return _write_split(tmp_path / "split.json", patients)


@pytest.mark.parametrize("written", ["MRN-AB7731X", "mrn ab7731x", "AB7731X", "mrn_ab7731x",
                                     "\uff2d\uff32\uff2e\uff0d\uff21\uff22\uff17\uff17\uff13\uff11\uff38",
                                     "ENC 2024 55813"])
def test_string_identifier_is_refused(bundle, string_id_cohort, written):
    (bundle / "README.md").write_text(f"# card\nSee {written} for an example.\n", encoding="utf-8")
    _assert_refused_without_quoting(_findings(bundle, string_id_cohort), "README.md: cohort identifier", written)


def test_string_cohort_clean_bundle_passes(bundle, string_id_cohort):
    assert _findings(bundle, string_id_cohort) == []




# sentencepiece's ModelProto written with the protobuf wire format (the sentencepiece package is not a
# dependency): 1 = pieces {1 piece, 2 score, 3 type}, 2 = trainer_spec, 3 = normalizer_spec
def _varint(n: int) -> bytes:
    out = b""
    while True:
        out += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
        n >>= 7
        if not n:
            return out


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def sentencepiece_model(pieces: list[str], model_prefix: str = "spm") -> bytes:
    import struct

    out = b""
    for i, piece in enumerate(pieces):
        out += _field(1, _field(1, piece.encode()) + _varint(2 << 3 | 5) + struct.pack("<f", -i) + _varint(3 << 3) + b"\x01")
    out += _field(2, _field(2, model_prefix.encode()) + _varint(3 << 3) + _varint(8000))
    return out + _field(3, _field(1, b"nmt_nfkc") + _field(2, b"\x00\x01\x02binary trie\x00"))






@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-8-sig"])
def test_utf16_and_other_unicode_text_is_decoded(bundle, splits, encoding):
    files, _ = splits
    (bundle / "README.md").write_bytes("# card\nmerged model, nothing else\n".encode(encoding))
    assert _findings(bundle, files) == []
    (bundle / "README.md").write_bytes(f"# card\npatient {SID} improved\n".encode(encoding))
    _assert_refused_without_quoting(_findings(bundle, files), "README.md: cohort identifier", SID)




def test_base64_in_the_card_is_decoded_and_scanned(bundle, splits):
    import base64

    files, patients = splits
    blob = base64.b64encode(f"patient {SID} improved".encode()).decode()
    (bundle / "README.md").write_text(f"# card\nexample payload: {blob}\n")
    _assert_refused_without_quoting(_findings(bundle, files), "README.md: cohort identifier (subject_id) at base64", SID, blob)
    hpi = patients[3]["visits"][1]["clinical_sections"]["history_present_illness"]
    wrapped = base64.encodebytes(hpi.encode()).decode()  # MIME: wrapped at 76 characters
    (bundle / "README.md").write_text(f"# card\n\n```\n{wrapped}```\n")
    _assert_refused_without_quoting(_findings(bundle, files), "README.md (base64 at char", hpi[:30])






@pytest.fixture
def five_digit_cohort(tmp_path) -> list[Path]:
    patients = [{"subject_id": 10000 + p, "visits": [{"visit_id": 10100 + 3 * p + v, "visit_number": v + 1,
                                                      "clinical_sections": {"chief_complaint": "cough"}}
                                                     for v in range(3)]} for p in range(12)]
    return _write_split(tmp_path / "split.json", patients)


def test_stock_tokenizer_token_ids_are_not_identifiers(tmp_path, five_digit_cohort):
    """A 12k-entry vocabulary has token ids 10000..10135 like the cohort's 5-digit ids: not a finding."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    b = tmp_path / "bundle"
    b.mkdir()
    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, 12000)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|im_end|>"])  # id 12000
    tok.save(str(b / "tokenizer.json"))
    (b / "tokenizer_config.json").write_text(json.dumps(
        {"added_tokens_decoder": {"10005": {"content": "<|x|>", "special": True}}, "eos_token": "<|im_end|>"}))
    (b / "config.json").write_text(json.dumps({"vocab_size": 12001, "bos_token_id": 10005,
                                               "eos_token_id": [10006, 10007], "intermediate_size": 10008}))
    (b / "vocab.json").write_text(json.dumps(vocab))  # the slow tokenizer's files of the same vocabulary
    (b / "merges.txt").write_text("#version: 0.2\nw 1\nw1 0005\n")
    (b / "vocab.txt").write_text("[PAD]\n100\n05\nw\n1\n0005\n")  # "100" + "05" glued would be an id
    shutil.copytree(b, tmp_path / "base")  # the base model's prepared copy: the same files
    (b / "MANIFEST.json").write_text(json.dumps({"model_files": {"tokenizer.json": {"bytes": 10009}},
                                                 "knobs": {"split": {"seed": 10010}}}))
    assert _findings(b, five_digit_cohort) == []
    vocab["\u012010005"] = 12001  # a byte-level vocab entry that IS a cohort id (" 10005")
    Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")).save(str(b / "tokenizer.json"))
    _assert_refused_without_quoting(_findings(b, five_digit_cohort),
                                    "tokenizer.json: not byte-identical to the base model's prepared copy", "10005")


def test_clinical_text_in_json_is_matched_after_unescaping(bundle, splits):
    files, patients = splits
    dx = next(v["clinical_sections"]["discharge_diagnosis"] for p in patients for v in p["visits"]
              if len(v["clinical_sections"]["discharge_diagnosis"].split()) >= 12)  # short lines joined by \n
    (bundle / "MANIFEST.json").write_text(json.dumps({"knobs": {"merge": {"probe_prompts": [dx]}}}))
    _assert_refused_without_quoting(
        _findings(bundle, files, min_line_words=20),  # the 8-word window alone, across the decoded \n
        "MANIFEST.json $.knobs.merge.probe_prompts[0]: clinical text from the cohort", dx.split("\n")[0])


def test_short_lines_of_a_medication_list_are_matched(bundle, string_id_cohort):
    for line in MEDS.splitlines():
        (bundle / "README.md").write_text(f"# card\n\nExample:\n- {line.upper()}\n")
        _assert_refused_without_quoting(_findings(bundle, string_id_cohort), "README.md: clinical text from the cohort",
                                        line, line.upper())
    (bundle / "README.md").write_text("# card\n\nlisinopril is a drug.\n")
    assert _findings(bundle, string_id_cohort) == []




def test_json_tricks_are_scanned_or_refused(bundle, splits, tmp_path):
    files, _ = splits
    (bundle / "MANIFEST.json").write_text(f'{{"note": "patient {SID}", "note": "nothing"}}')  # json.loads keeps the last
    _assert_refused_without_quoting(_findings(bundle, files), "MANIFEST.json $.note: cohort identifier", SID)
    (bundle / "MANIFEST.json").write_text("[" * 100_000 + "]" * 100_000)
    assert any(f.startswith("MANIFEST.json: JSON nested too deeply") for f in _findings(bundle, files))
    (bundle / "MANIFEST.json").write_text("{}")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "notes.md").write_text(f"patient {SID}\n")
    (bundle / "docs").symlink_to(outside, target_is_directory=True)
    assert any(re.match(r"bundle entry \d+ of \d+: a linked folder", f) for f in _findings(bundle, files))








def test_strings_inside_a_base64_image_in_the_card_are_found(bundle, splits):
    import base64
    import struct
    import zlib

    files, _ = splits

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
           + chunk(b"tEXt", b"Comment\x00patient " + SID.encode()) + chunk(b"IDAT", zlib.compress(b"\x00\x00"))
           + chunk(b"IEND", b""))
    (bundle / "README.md").write_text(f"# card\n![plot](data:image/png;base64,{base64.b64encode(png).decode()})\n")
    _assert_refused_without_quoting(_findings(bundle, files), "README.md: cohort identifier (subject_id) at strings of base64", SID)


@pytest.mark.parametrize("written", ["90**000**005", "90`000`005", "\u0669\u0660\u066c\u0660\u0660\u0660\u066c\u0660\u0660\u0665"])
def test_identifier_split_by_markup_or_arabic_grouping_is_refused(bundle, splits, written):
    files, _ = splits
    (bundle / "README.md").write_text(f"# card\nExample {written}.\n", encoding="utf-8")
    _assert_refused_without_quoting(_findings(bundle, files), "README.md: cohort identifier (subject_id)", written)


def test_a_credential_pasted_into_the_bundle_is_refused(bundle, splits):
    files, _ = splits
    key = "hf_AbCdEfGhIjKlMnOpQrStUvWx0123456789"
    (bundle / "MANIFEST.json").write_text(json.dumps({"release": {"commit_message": f"token {key}"}}))
    _assert_refused_without_quoting(_findings(bundle, files), "MANIFEST.json $.release.commit_message: a credential", key)


# ----------------------------------------------------------------------------- look-alikes, numbers as ids
@pytest.mark.parametrize("written", [
    "\u041cRN-\u0410\u04127731\u0425",  # Cyrillic М, А, В, Х
    "\u0410\u04127731\u0425",  # the id-like part alone, Cyrillic letters
    "MRN-AB7731\u03a7",  # Greek capital chi for X
    "\u13aa\u13f47731X",  # Cherokee letters that look like A and B
])
def test_string_identifier_with_look_alike_letters_is_refused(bundle, string_id_cohort, written):
    (bundle / "README.md").write_text(f"# card\nSee {written} for an example.\n", encoding="utf-8")
    _assert_refused_without_quoting(_findings(bundle, string_id_cohort), "README.md: cohort identifier", written)


@pytest.mark.parametrize("written", [
    "9OOOOOO5", "9oooooo5",  # Latin letter O for the digit zero
    "9\u041e\u041e\u041e\u041e\u041e\u041e5",  # Cyrillic О
    "9\u039f\u039f\u039f\u039f\u039f\u039f5",  # Greek omicron
])
def test_numeric_identifier_with_look_alike_letters_is_refused(bundle, splits, written):
    files, _ = splits
    (bundle / "README.md").write_text(f"# card\nExample patient {written} improved.\n", encoding="utf-8")
    _assert_refused_without_quoting(_findings(bundle, files), "README.md: cohort identifier (subject_id)", written)


@pytest.mark.parametrize(("name", "content"), [
    ("config.json", {"record_id": int(SID)}),
    ("generation_config.json", {"example_id": int(SID)}),
    ("MANIFEST.json", {"example": {"case": -int(SID)}}),
])
def test_identifier_as_a_json_number_under_an_id_key_is_refused(bundle, splits, name, content):
    """config.json and generation_config.json are compared with the base's (a key it lacks is refused, not
    named); the manifest of a person's folder is scanned as free text."""
    files, _ = splits
    data = json.loads((bundle / name).read_text()) if (bundle / name).exists() else {}
    (bundle / name).write_text(json.dumps({**data, **content}))
    if name == "MANIFEST.json":
        _assert_refused_without_quoting(_findings(bundle, files), f"{name} $.", SID)
        assert any("as a JSON number" in f for f in _findings(bundle, files))
    else:
        _assert_refused_without_quoting(_findings(bundle, files), f"{name}: a key the base model's", SID,
                                        next(iter(content)))


def test_token_ids_in_model_metadata_are_not_cohort_ids(bundle, tmp_path):
    # a 5-digit cohort id equal to a token id of the model's own config is no finding
    cohort_file = _write_split(tmp_path / "five.json", [
        {"subject_id": 12801, "visits": [{"visit_id": 40960, "visit_number": 1, "clinical_sections": {}}]}])
    cfg = json.loads((bundle / "config.json").read_text())
    for folder in (bundle, bundle.parent / "base"):  # the base model's own token ids
        (folder / "config.json").write_text(json.dumps({**cfg, "eos_token_id": [12801, 2], "image_token_id": 40960}))
    assert _findings(bundle, cohort_file) == []


@pytest.mark.parametrize("written", ["00" + SID, hex(int(SID)), "0" + SID + ".000", hex(int(SID)).upper().replace("X", "x")])
def test_number_in_card_text_is_matched_by_its_value(bundle, splits, written):
    files, _ = splits
    (bundle / "README.md").write_text(f"# card\nlearning rate 3e-6, version 0.17.1, value {written}.\n")
    _assert_refused_without_quoting(_findings(bundle, files), "README.md: cohort identifier (subject_id)", SID)


def test_numbers_in_card_text_that_are_not_ids_pass(bundle, splits):
    files, _ = splits
    (bundle / "README.md").write_text(
        "# card\nlearning rate 3e-6, 1e5 steps, version 0.17.1, 0x1F, 00042 and l10n/i18n.\n")
    assert _findings(bundle, files) == []


@pytest.mark.parametrize("written", ["MRN-L04567", "mrn l04567", "1o4567", "MRN-L\u041e4567"])
def test_string_identifier_with_digits_for_its_letters_is_refused(bundle, tmp_path, written):
    # the cohort id holds the letters L and O; the card types the digits 1 and 0 for them (or the reverse)
    ids = _write_split(tmp_path / "split.json", [{"subject_id": "MRN-LO4567", "visits": [
        {"visit_id": "ENC-9", "visit_number": 1, "clinical_sections": {"chief_complaint": "cough"}}]}])
    (bundle / "README.md").write_text(f"# card\nSee {written} for an example.\n", encoding="utf-8")
    _assert_refused_without_quoting(_findings(bundle, ids), "README.md: cohort identifier (subject_id)", written)


# ----------------------------------------------------------------------------- recipe qa: the QA records
# For recipe qa the reference is the QA data stage's split files: questions, contexts, free-text answers and
# ids came from the user's data (ECG QA: from patients). Records here are ECG-report-like and made by the
# real data stage (llmrnn.qa.data.prepare).
RHYTHMS = ["sinus rhythm", "atrial fibrillation", "sinus bradycardia", "sinus tachycardia", "atrial flutter"]
QA_ID = "ECG-4471920"  # the record id of QA record 3 (string ids, as ECG sets carry them)
QA_GROUP = "77031943"  # its patient


def _qa_source() -> list[dict]:
    records = []
    for i in range(10):
        rate, pr, qtc = 58 + 7 * i, 150 + 9 * i, 402 + 5 * i
        context = (f"{RHYTHMS[i % 5].capitalize()} at {rate} bpm recorded on a resting 12-lead tracing.\n"
                   f"PR interval {pr} ms, QRS duration {84 + i} ms, corrected QT {qtc} ms.\n"
                   f"- poor R wave progression in V{1 + i % 3}\n"
                   f"Compared with the prior tracing of visit {i + 2}, new T wave inversion in lead {['III', 'aVF', 'V5'][i % 3]}.")
        record = {"id": f"ECG-{4471917 + i}", "group": str(77031940 + i), "context": context,
                  "question": f"Looking at tracing {i} of this patient, what is the underlying rhythm and is the PR interval normal?"}
        if i % 2:
            record |= {"options": RHYTHMS, "answer": "ABCDE"[i % 5]}
        else:
            record["answer"] = f"{RHYTHMS[i % 5]} with a PR interval of {pr} ms"
        records.append(record)
    return records


@pytest.fixture(scope="module")
def qa_splits(tmp_path_factory) -> tuple[list[str], list[dict]]:
    from llmrnn.qa import data

    d = tmp_path_factory.mktemp("qa")
    source = d / "ecg_qa.json"
    source.write_text(json.dumps(_qa_source()), encoding="utf-8")
    outputs = data.output_paths(d / "out")
    data.prepare({"split": {"val_size": 2, "test_size": 2, "seed": 0}}, outputs, str(source))
    files = [outputs[k] for k in ("train", "val", "test", "ood")]
    return files, [r for f in files for r in io.read_jsonl(f)]


def _qa_findings(bundle, files, **kw) -> list[str]:
    return guard(bundle, files, split_format="qa", **kw)["findings"]


def _qa_record(records: list[dict]) -> dict:
    return next(r for r in records if r["id"] == QA_ID)


def test_qa_fixture_is_what_the_tests_assume(qa_splits):
    _, records = qa_splits
    assert len(records) == 10 and _qa_record(records)["group"] == QA_GROUP
    assert _qa_record(records)["options"] and not next(r for r in records if r["id"].endswith("4471917"))["options"]


def test_clean_qa_bundle_passes(bundle, qa_splits):
    files, _ = qa_splits
    (bundle / "README.md").write_text(
        "# card\nA medical QA model: SFT then GRPO on ECG questions; answers as <reasoning>/<answer>.\n"
        "- Options: sinus rhythm; atrial fibrillation; atrial flutter\n")  # the shared answer vocabulary
    report = guard(bundle, files, split_format="qa")
    assert report["ok"] and report["reference"] == "qa", report["findings"]
    assert report["identifiers_checked"] >= 20 and report["clinical_texts_checked"] >= 25


def _as_json(text: str) -> str:
    return json.dumps({"note": text})  # newlines and quotes escaped, unicode as \uXXXX


def _gzip(text: str) -> bytes:
    import gzip

    return gzip.compress(text.encode())


def _b64(text: str) -> str:
    import base64

    return "# card\nexample payload:\n" + base64.encodebytes(text.encode()).decode()


# (file, content from the record's context, finding): the leak shapes the cohort guard handles
QA_LEAKS = {
    "card": ("README.md", lambda c: f"# card\n\nAn example:\n{c}\n", "README.md: QA record text (context)"),
    "manifest knob": ("MANIFEST.json", lambda c: json.dumps({"knobs": {"merge": {"probe_prompts": ["Hi.", c]}}}),
                      "MANIFEST.json $.knobs.merge.probe_prompts[1]: QA record text (context)"),
    "base64 in the card": ("README.md", _b64, "README.md (base64 at char"),
    "one line as a list item": ("README.md", lambda c: f"# card\n\n- {c.splitlines()[2][2:].upper()}\n",
                                "README.md: QA record text (context)"),
}


@pytest.mark.parametrize("shape", list(QA_LEAKS))
def test_a_qa_context_leaked_into_the_bundle_is_refused_without_quoting_it(bundle, qa_splits, shape):
    files, records = qa_splits
    context = _qa_record(records)["context"]
    name, content, finding = QA_LEAKS[shape]
    data = content(context)
    (bundle / name).write_bytes(data if isinstance(data, bytes) else data.encode())
    findings = _qa_findings(bundle, files)
    _assert_refused_without_quoting(findings, finding, *context.splitlines(), context.splitlines()[2][2:].upper())
    assert all(re.search(r"(char|word) \d+", f) for f in findings), findings  # where: an offset


def test_a_qa_question_and_free_text_answer_are_refused(bundle, qa_splits):
    files, records = qa_splits
    free = next(r for r in records if not r["options"])
    (bundle / "README.md").write_text(f"# card\nExample question: {free['question']}\n")
    _assert_refused_without_quoting(_qa_findings(bundle, files), "README.md: QA record text (question)",
                                    free["question"])
    (bundle / "README.md").write_text(f"# card\nExample answer:\n- {free['answer']}\n")
    _assert_refused_without_quoting(_qa_findings(bundle, files), "README.md: QA record text (answer)", free["answer"])


@pytest.mark.parametrize(("written", "kind"), [(QA_ID, "record id"), ("ecg 4471920", "record id"),
                                               (QA_GROUP, "group id"), ("77 031 943", "group id")])
def test_a_qa_record_or_group_id_is_refused(bundle, qa_splits, written, kind):
    files, _ = qa_splits
    (bundle / "README.md").write_text(f"# card\nSee tracing {written}.\n")
    _assert_refused_without_quoting(_qa_findings(bundle, files), f"README.md: QA data identifier ({kind}) at char",
                                    written, QA_ID, QA_GROUP)




def test_ids_the_data_stage_made_up_are_not_identifiers(bundle, tmp_path):
    """Records without ids get q000000, q000001, ...: positions, not data; their texts are still checked."""
    from llmrnn.qa import data

    source = tmp_path / "noid.jsonl"
    io.write_jsonl(source, [{k: v for k, v in r.items() if k not in ("id", "group")} for r in _qa_source()])
    outputs = data.output_paths(tmp_path / "out")
    data.prepare({"split": {"val_size": 2, "test_size": 2, "seed": 0}}, outputs, str(source))
    files = [outputs[k] for k in ("train", "val", "test", "ood")]
    (bundle / "README.md").write_text("# card\nsee q000003 and q000007\n")
    # the guard knows no recipe: the data stage marks the ids it made up (id_generated), nothing is exempt by shape
    report = guard(bundle, files, split_format="qa")
    assert report["ok"] and report["identifiers_checked"] == 0 and report["clinical_texts_checked"] >= 25


def test_the_cohort_reference_does_not_know_qa_text(bundle, qa_splits, splits):
    """The reference is the recipe's data: a QA context is not in the cohort splits."""
    qa_files, records = qa_splits
    (bundle / "README.md").write_text(f"# card\n{_qa_record(records)['context']}\n")
    assert _qa_findings(bundle, qa_files) and _findings(bundle, splits[0]) == []


# ----------------------------------------------------------------------------- guard gaps (issue 25)
def _qa_files(tmp_path: Path, records: list[dict]) -> list[str]:
    """QA split files as the data stage writes them (normalised records), from `records` (raw)."""
    from llmrnn.qa import data

    source = tmp_path / "qa_source.jsonl"
    io.write_jsonl(source, records)
    outputs = data.output_paths(tmp_path / "qa_out")
    data.prepare({"split": {"val_size": 2, "test_size": 2, "seed": 0}}, outputs, str(source))
    return [outputs[k] for k in ("train", "val", "test", "ood")]


@pytest.mark.parametrize("written", ["Patient MRN 12345678", "mrn: 12 345 678", "record A7731204X", "#12345678"])
def test_an_identifier_inside_qa_text_is_checked(bundle, tmp_path, written):
    """Only record and group ids used to be identifiers; an MRN written inside a question or context is one too."""
    records = _qa_source()
    records[3]["context"] += "\nPatient MRN 12345678, record A7731204X."
    files = _qa_files(tmp_path, records)
    (bundle / "README.md").write_text(f"# card\nAn example: {written}\n")
    _assert_refused_without_quoting(_qa_findings(bundle, files), "README.md: QA data identifier (identifier in the "
                                    "context)", "12345678", "A7731204X")


def test_measurements_in_qa_text_are_not_identifiers(bundle, qa_splits):
    files, _ = qa_splits
    (bundle / "README.md").write_text("# card\nIntervals: 150 ms; 84 ms; 402 ms; V1; 12-lead; 2024-01-05.\n")
    assert _qa_findings(bundle, files) == []


def test_a_real_id_shaped_like_a_generated_one_is_not_exempt(bundle, tmp_path):
    """Exemption comes from provenance (the ids the data stage made up), not from the shape q\\d{6,}."""
    records = _qa_source()
    records[0]["id"] = "q1234567"  # the source's own record id
    records[1].pop("id")  # this one gets a made-up id (its position)
    files = _qa_files(tmp_path, records)
    made_up = next(r for f in files for r in io.read_jsonl(f) if r.get("id_generated"))
    (bundle / "README.md").write_text(f"# card\nsee record {made_up['id']}\n")
    assert _qa_findings(bundle, files) == []
    (bundle / "README.md").write_text("# card\nsee record q1234567\n")
    _assert_refused_without_quoting(_qa_findings(bundle, files), "README.md: QA data identifier (record id)",
                                    "q1234567")


def test_a_hand_written_split_file_cannot_exempt_by_shape(bundle, tmp_path):
    path = tmp_path / "test.jsonl"
    io.write_jsonl(path, [{"id": "q7654321", "group": "q7654321", "question": "which rhythm is shown?",
                           "answer": "A", "options": {"A": "sinus", "B": "flutter"}}])
    (bundle / "README.md").write_text("# card\nq7654321\n")
    _assert_refused_without_quoting(_qa_findings(bundle, [path]), "README.md: QA data identifier", "q7654321")


def _double_url(text: str) -> str:
    import urllib.parse

    return urllib.parse.quote(urllib.parse.quote(text, safe=""), safe="")


def _double_url_every_byte(text: str) -> str:
    """Every byte as %XX, then the % signs escaped again: `9` -> `%39` -> `%2539`."""
    import urllib.parse

    return urllib.parse.quote("".join(f"%{b:02X}" for b in text.encode()), safe="")


def _b32(text: str) -> str:
    import base64

    return base64.b32encode(text.encode()).decode()


@pytest.mark.parametrize(("encode", "how"), [
    (_double_url, "URL escapes x2"),
    (_double_url_every_byte, "URL escapes x2"),
    (lambda t: _double_url(_double_url(t)), "URL escapes x4"),
    (_b32, "base32 at char"),
    (lambda t: _b32(t).lower().rstrip("="), "base32 at char"),
    (lambda t: "&amp;#" + ";&amp;#".join(str(ord(c)) for c in t) + ";", "HTML entities x2"),
])
def test_ids_encoded_twice_or_in_base32_are_refused(bundle, splits, encode, how):
    files, _ = splits
    (bundle / "README.md").write_text(f"# card\npayload: {encode(f'patient {SID} seen')}\n")
    findings = _findings(bundle, files)
    _assert_refused_without_quoting(findings, "README.md: cohort identifier (subject_id)", SID)
    assert any(how in f for f in findings), findings


def test_base32_clinical_text_is_refused(bundle, splits):
    files, patients = splits
    course = patients[5]["visits"][0]["clinical_sections"]["hospital_course"]
    (bundle / "README.md").write_text(f"# card\n{_b32(course)}\n")
    assert any(f.startswith("README.md (base32 at char") and "clinical text" in f for f in _findings(bundle, files))


def test_ordinary_uppercase_words_are_not_base32(bundle, splits):
    files, _ = splits
    (bundle / "README.md").write_text("# card\nSEE THE LIMITATIONS SECTION; CLINICALSUMMARIZATION MEMORYUPDATE\n")
    assert _findings(bundle, files) == []


def test_a_password_in_a_url_is_refused(bundle, splits):
    files, _ = splits
    (bundle / "README.md").write_text("# card\nserved from https://alice:s3cret@judge.example.org/v1\n")
    _assert_refused_without_quoting(_findings(bundle, files), "README.md: a credential-like string", "s3cret")
    (bundle / "README.md").write_text("# card\nsee https://huggingface.co/org/model and git@github.com:a/b\n")
    assert _findings(bundle, files) == []


@pytest.mark.parametrize("kind", ["file link", "fifo"])
def test_the_guard_refuses_links_and_non_regular_files(bundle, splits, tmp_path, kind):
    import os

    files, _ = splits
    outside = tmp_path / "outside.md"
    outside.write_text("nothing to see\n")
    (bundle / "vocab.json").unlink(missing_ok=True)
    if kind == "file link":
        (bundle / "vocab.json").symlink_to(outside)
        start = "vocab.json: a linked file: a symbolic link; refused, never followed"
    else:
        os.mkfifo(bundle / "vocab.json")
        start = "vocab.json: not a regular file"
    assert any(f.startswith(start) for f in _findings(bundle, files)), _findings(bundle, files)


# a large text file is read window by window: these make the windows small so that tests stay fast
SMALL_WINDOWS = {"WINDOW_CHARS": 1 << 14, "OVERLAP_CHARS": 1 << 11, "STREAM_ABOVE": 1 << 15,
                 "DOC_BUDGET_CHARS": 1 << 14}


def _filler(n_chars: int) -> str:
    import random

    rng = random.Random(0)
    words = ["model", "card", "reward", "memory", "update", "visit", "summary", "learning", "rate", "value",
             "note", "result"]
    out, size = [], 0
    while size < n_chars:
        line = " ".join(rng.choice(words) for _ in range(11)) + f" {rng.randint(0, 999)}\n"
        out.append(line)
        size += len(line)
    return "".join(out)


@pytest.mark.parametrize("at", ["start", "window edge", "end"])
def test_a_large_text_file_is_scanned_window_by_window_without_gaps(bundle, splits, monkeypatch, at):
    files, patients = splits
    for name, value in SMALL_WINDOWS.items():
        for module in (guard_scan, guard_files):  # the window constants: the scan's, read by files too
            if hasattr(module, name):
                monkeypatch.setattr(module, name, value)
    filler = _filler(200_000)
    cut = {"start": 0, "window edge": (1 << 14) - 4, "end": len(filler)}[at]
    course = " ".join(patients[5]["visits"][0]["clinical_sections"]["hospital_course"].split()[:10])
    (bundle / "README.md").write_text(filler[:cut] + f"patient {SID}" + filler[cut:])
    findings = _findings(bundle, files)
    _assert_refused_without_quoting(findings, "README.md: cohort identifier (subject_id) at char", SID)
    assert any(f"at char {cut + len('patient ')}" in f for f in findings), findings
    (bundle / "README.md").write_text(filler[:cut] + course + filler[cut:])
    assert any(f.startswith("README.md: clinical text from the cohort") for f in _findings(bundle, files))


def test_a_large_text_file_is_scanned_in_bounded_memory(tmp_path, splits, monkeypatch):
    """Peak memory of the scan does not grow with the file (it grew ~150x the file size: 6 MB -> 0.9 GB)."""
    import tracemalloc

    files, _ = splits
    for name, value in SMALL_WINDOWS.items():
        for module in (guard_scan, guard_files):  # the window constants: the scan's, read by files too
            if hasattr(module, name):
                monkeypatch.setattr(module, name, value)
    bundle = tmp_path / "only_notes"
    bundle.mkdir()
    peaks = {}
    for size in (48_000, 192_000):  # both streamed (STREAM_ABOVE 32k), 3 and 12 windows
        (bundle / "README.md").write_text(_filler(size))
        tracemalloc.start()
        assert phi_guard.scan_bundle(bundle, files)["findings"] == []  # a card alone: no model to compare
        peaks[size] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peaks[192_000] < 1.5 * peaks[48_000], peaks

