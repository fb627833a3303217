"""PHI guard, round 6: fail closed. A release bundle holds a fixed set of file kinds, each accounted for against
the base model's prepared copy and the release's own card and manifest; the only text scanned is what a user
supplied (settings copied into the card and manifest, the commit message), read as a person reads it and across
JSON and table structure. Refusals are one line, exit 3, and never repeat the value, file names included.

The cohort carries a note header with a fake name, MRN and date of birth, as PhysioNet-shaped notes do."""

from __future__ import annotations

import base64
import io as stdio
import json
import struct
import subprocess
import zipfile
import zlib
from pathlib import Path

import pytest

from llmrnn import cohort, io, phi_guard, release
from llmrnn.errors import CheckFailed
from llmrnn.phi_guard import scan as guard_scan
from llmrnn.phi_guard.secrets import load_cohort_secrets
from tests.conftest import llmrnn_in_process
from tests.test_release import KNOBS, make_inputs

NAME, SURNAME, GIVEN, MRN, DOB = "Zephyrine Quoxley", "Quoxley", "Zephyrine", "44519023", "1956-03-14"
NOTE_HEADER = (f"Name: {NAME} Unit No: 5521\nMRN: {MRN}  DOB: {DOB}\nContact: Daughter at bedside\n"
               "Patient - Denies chest pain\n")
SECRETS = (NAME, SURNAME, GIVEN, MRN, "Quoxley", "Zephyrine", "19560314", "4451", "9023")


def _with_note_header(inputs: dict) -> dict:
    """The release inputs with the note header in one train patient's note (split files rewritten)."""
    train = Path(inputs["split_files"][0])
    patients = json.loads(train.read_text())
    course = patients[0]["visits"][0]["clinical_sections"]
    course["hospital_course"] = NOTE_HEADER + course["hospital_course"]
    train.write_text(json.dumps(patients))
    return inputs


@pytest.fixture
def inputs(tiny_model_dir, tmp_path) -> dict:
    return _with_note_header(make_inputs(tmp_path / "run", tiny_model_dir))


def _release(inputs: dict, out: Path, rel: dict | None = None, knobs: dict | None = None) -> dict:
    cfg = {"run_name": "demo", "release": {"base_model": "HuggingFaceTB/SmolLM2-135M-Instruct", **(rel or {})},
           "knobs": knobs or KNOBS}
    return release.build_release(
        merged=inputs["merged"], merge_check=inputs["merge_check"], splits=inputs["splits"],
        split_files=inputs["split_files"], metrics=inputs["metrics"], rubric=inputs["rubric"], cfg=cfg,
        card_out=out / "README.md", manifest_out=out / "MANIFEST.json", receipt_out=out / "upload_receipt.json")


def _refused(inputs: dict, tmp_path: Path, match: str, **kw) -> str:
    with pytest.raises(CheckFailed, match=match) as err:
        _release(inputs, tmp_path / "rel", **kw)
    message = str(err.value)
    assert "\n" not in message
    for secret in SECRETS:
        assert secret.lower() not in message.lower(), message
    assert not (tmp_path / "rel").exists()  # nothing written, nothing uploaded
    return message


def test_the_fixture_holds_what_the_tests_assume(inputs):
    secrets = load_cohort_secrets(inputs["split_files"], 5)
    assert ("zephyrine", "quoxley") in secrets.names and MRN in secrets.ids and "19560314" in secrets.ids
    assert "quoxley" in secrets.surnames


def test_an_honest_release_still_releases(inputs, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    receipt = _release(inputs, tmp_path / "run" / "release")
    guard = receipt["phi_guard"]
    assert guard["ok"] and guard["findings"] == [] and guard["base"] == str(inputs["base"])
    assert receipt["withheld_base_files"] == 0


# ----------------------------------------------------------------------------- the bundle accounts for every byte
def _rewrite_weights(path: Path, extra: dict | None = None, metadata: dict | None = None, rename: dict | None = None):
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    for old, new in (rename or {}).items():
        tensors[new] = tensors.pop(old)
    tensors.update(extra or {})
    save_file(tensors, path, metadata={"format": "pt", **(metadata or {})})


def _png_with_text(text: str) -> bytes:
    """A 1x1 PNG whose zTXt chunk holds `text` (compressed: no text in the bytes)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
            + chunk(b"zTXt", b"Comment\x00\x00" + zlib.compress(text.encode()))
            + chunk(b"IDAT", zlib.compress(b"\x00\x00")) + chunk(b"IEND", b""))


def _zip_of(text: str) -> bytes:
    buf = stdio.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("a.txt", text)
    return buf.getvalue()


HOSTILE_MERGED = {
    # a file name holding the name in another order: refused by its position, the name never repeated
    "file name": lambda m: (m / f"{SURNAME}_{GIVEN}.md").write_text("nothing here\n"),
    "figure with a zTXt chunk": lambda m: (m / "figure.png").write_bytes(_png_with_text(f"{NAME} MRN {MRN}")),
    "zip in a text file": lambda m: (m / "notes.txt").write_bytes(_zip_of(f"{NAME}, MRN {MRN}")),
    "an audit log": lambda m: (m / "calls_0001.jsonl").write_text(json.dumps({"prompt": NAME}) + "\n"),
}


@pytest.mark.parametrize("case", list(HOSTILE_MERGED))
def test_a_file_the_bundle_may_not_hold_stops_the_release_named_by_position(inputs, tmp_path, case):
    HOSTILE_MERGED[case](inputs["merged"])
    message = _refused(inputs, tmp_path, r"merged: entry \d+ of \d+ \(sorted by name\) is a file whose name is not "
                                         "one the bundle may hold")
    assert ".md" not in message and ".png" not in message and ".txt" not in message


def test_a_folder_in_merged_stops_the_release(inputs, tmp_path):
    from llmrnn.errors import InputError

    (inputs["merged"] / SURNAME).mkdir()
    (inputs["merged"] / SURNAME / "a.md").write_text("x\n")
    with pytest.raises(InputError, match=r"merged: entry \d+ of \d+: a folder") as err:
        _release(inputs, tmp_path / "rel")
    assert SURNAME not in str(err.value)


def _split_mrn_tokenizer_config(m: Path) -> None:
    cfg = json.loads((m / "tokenizer_config.json").read_text())
    (m / "tokenizer_config.json").write_text(json.dumps({**cfg, "note_a": MRN[:4], "note_b": MRN[4:]}))


HOSTILE_MODEL_FILES = {
    # tokenizer files: byte-identical to the base's or refused with the file named
    "tokenizer config with an MRN over two strings": (_split_mrn_tokenizer_config, "tokenizer_config.json: not byte-identical"),
    "chat template with the name reversed by a bidi override": (
        lambda m: (m / "chat_template.jinja").write_text((m / "chat_template.jinja").read_text()
                                                       + "{# \u202eyelxouQ eniryhpeZ\u202c #}"),
        "chat_template.jinja: not byte-identical"),
    "a tokenizer file the base does not have": (
        lambda m: (m / "vocab.txt").write_text(f"[PAD]\n{MRN}\n"),
        "vocab.txt: a tokenizer file the base model's prepared copy does not have"),
    # configs: keys and values the base's or made by a setting
    "an MRN as the seed of generation_config.json": (
        lambda m: (m / "generation_config.json").write_text(json.dumps(
            {**json.loads((m / "generation_config.json").read_text()), "seed": int(MRN)})),
        "generation_config.json: a key the base model's generation_config.json does not have"),
    "an MRN as a size in config.json": (
        lambda m: (m / "config.json").write_text(json.dumps(
            {**json.loads((m / "config.json").read_text()), "intermediate_size": int(MRN)})),
        "config.json: the value of `intermediate_size` is not the base model's and no setting made it"),
    # weights: header metadata and tensor names the base's architecture
    "an MRN over two tensor names": (
        lambda m: _rewrite_weights(m / "model.safetensors", extra={
            f"model.extra.{MRN[:4]}": _zeros(), f"model.extra.{MRN[4:]}": _zeros()}),
        "model.safetensors: a tensor whose name is not one of the base model's"),
    "the name in the header metadata, reversed": (
        lambda m: _rewrite_weights(m / "model.safetensors", metadata={"note": "\u202eyelxouQ eniryhpeZ"}),
        "model.safetensors: its header metadata is not the base model's"),
}


def _zeros():
    import torch

    return torch.zeros(2)


@pytest.mark.parametrize("case", list(HOSTILE_MODEL_FILES))
def test_a_model_file_that_is_not_the_base_models_stops_the_release(inputs, tmp_path, case):
    change, finding = HOSTILE_MODEL_FILES[case]
    change(inputs["merged"])
    _refused(inputs, tmp_path, "PHI guard refused .*" + finding.replace("(", r"\(").replace(")", r"\)"))


def test_a_dtype_the_merge_saved_at_is_accounted_for(inputs, tmp_path, monkeypatch):
    """merge.dtype bfloat16 of a float32 base: config.json's dtype and the tensors' dtype are what the setting
    made; the same dtype without the merge having saved at it is refused."""
    import torch
    from safetensors.torch import load_file, save_file

    monkeypatch.delenv("HF_TOKEN", raising=False)
    merged = inputs["merged"]
    save_file({k: v.to(torch.bfloat16) for k, v in load_file(merged / "model.safetensors").items()},
              merged / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((merged / "config.json").read_text())
    key = "dtype" if "dtype" in cfg else "torch_dtype"
    (merged / "config.json").write_text(json.dumps({**cfg, key: "bfloat16"}))
    check = json.loads(inputs["merge_check"].read_text())
    io.write_json(inputs["merge_check"], {**check, "dtype": "bfloat16"})
    assert _release(inputs, tmp_path / "run" / "release")["phi_guard"]["ok"]
    io.write_json(inputs["merge_check"], {**check, "dtype": "float32"})
    _refused(inputs, tmp_path, "(config.json: the value of `(torch_)?dtype`|model.safetensors: a tensor whose dtype)")


def test_files_the_merge_copied_from_the_base_are_withheld_not_released(inputs, tmp_path, monkeypatch):
    """A base file of no bundle kind (a license, the base's training logs), copied into merged/ by the merge:
    withheld and counted, never uploaded; the same name with other bytes stops the release."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    for folder in (inputs["base"], inputs["merged"]):
        (folder / "LICENSE.txt").write_text("Apache-2.0\n")
    receipt = _release(inputs, tmp_path / "run" / "release")
    assert receipt["withheld_base_files"] == 1 and "LICENSE.txt" not in receipt["files"]
    (inputs["merged"] / "LICENSE.txt").write_text(f"Apache-2.0 {NAME}\n")
    _refused(inputs, tmp_path, r"merged: entry \d+ of \d+ \(sorted by name\) is a file whose name is not one")


def test_a_card_or_manifest_the_release_did_not_write_is_refused(inputs, tmp_path):
    """The card and manifest are compared with what the release writes from the run's records."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "README.md").write_text("# card\nnothing here\n")
    (bundle / "MANIFEST.json").write_text("{}\n")
    expected = {"README.md": b"# card\nnothing here\n", "MANIFEST.json": b"{ }\n"}
    report = phi_guard.scan_bundle(bundle, inputs["split_files"], base=inputs["base"], expected=expected)
    assert report["findings"] == [("MANIFEST.json: differs from the manifest the release writes from the run's "
                                   "records; refused")]


def test_the_guard_command_refuses_in_one_line_exit_3(inputs, tmp_path):
    """`llmrnn release guard --base` on a person's folder: the model files compared with the base, the card
    scanned as free text; without --base the model files cannot be accounted for."""
    import shutil

    bundle = tmp_path / "folder"
    shutil.copytree(inputs["merged"], bundle)
    (bundle / "README.md").write_text("# card\nnothing here\n")
    cmd = ["release", "guard", str(bundle), "--split-files", *inputs["split_files"]]
    ok = llmrnn_in_process(*cmd, "--base", str(inputs["base"]))
    assert ok.returncode == 0, ok.stderr
    no_base = llmrnn_in_process(*cmd)
    assert no_base.returncode == 3 and "no base model to compare it with (--base)" in no_base.stderr
    (bundle / f"{SURNAME}-{GIVEN}.txt").write_text("x\n")
    proc = llmrnn_in_process(*cmd, "--base", str(inputs["base"]))
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 3 and len(lines) == 1 and "bundle entry" in lines[0], proc.stderr
    assert SURNAME not in proc.stderr and GIVEN not in proc.stderr and "Traceback" not in proc.stderr


# ----------------------------------------------------------------------------- user-supplied free text
def _data_uri_png() -> str:
    return "data:image/png;base64," + base64.b64encode(_png_with_text(f"{NAME} {MRN}")).decode()


HOSTILE_TEXT = {
    # text the guard reads differently from a person
    "digits in mixed widths": ({"tags": ["llmrnn", "mrn-\uff14\uff145190\uff123"]}, None, "cohort identifier"),
    "Cyrillic confusables": ({"tags": ["Z\u0435phyr\u0456n\u0435 Qu\u043exl\u0435y"]}, None, "cohort identifier"),
    "a bidi override": ({"commit_message": "release \u202eyelxouQ eniryhpeZ\u202c"}, None, "cohort identifier"),
    "a Hangul filler": ({"tags": ["Zephy\u3164rine Quo\u3164xley"]}, None, "cohort identifier"),
    "tag characters": ({"tags": ["Zeph\U000e0061yrine Quox\U000e0062ley"]}, None, "cohort identifier"),
    "a filler between the words": ({"tags": ["Zephyrine\u3164Quoxley"]}, None, "cohort identifier"),
    # identifiers split across structure
    "a name in two fields of one record": (None, {**KNOBS, "cohort": {**KNOBS["cohort"], "about": {"first": GIVEN, "last": SURNAME}}},
                                           "cohort identifier"),
    "an MRN over two strings": ({"tags": ["llmrnn", MRN[:4], MRN[4:]]}, None, "cohort identifier"),
    "an MRN over table cells": ({"commit_message": f"| run | {MRN[:4]} | {MRN[4:]} |"}, None, "cohort identifier"),
    "a date of birth over table cells": ({"commit_message": "| born | 1956 | 03 | 14 |"}, None, "cohort identifier"),
    # in places nobody looks
    "a PNG data URI": ({"commit_message": f"see ![x]({_data_uri_png()})"}, None, "a data URI in user-supplied free text"),
    "a zip, base64-encoded": ({"commit_message": "payload " + base64.b64encode(_zip_of(f"{NAME} {MRN}")).decode()},
                              None, "base64 data in user-supplied free text"),
    "a surname after a title": ({"commit_message": f"thanks to Mrs. {SURNAME}"}, None, "cohort identifier"),
}


@pytest.mark.parametrize("case", list(HOSTILE_TEXT))
def test_user_supplied_text_is_read_as_a_person_reads_it(inputs, tmp_path, case):
    rel, knobs, finding = HOSTILE_TEXT[case]
    _refused(inputs, tmp_path, rf"PHI guard refused .*MANIFEST.json \$\.(release|knobs)\S*.*: {finding}",
             rel=rel, knobs=knobs)


# ----------------------------------------------------------------------------- an honest release refused
def test_header_words_of_the_notes_are_no_identifiers(inputs, tmp_path, monkeypatch):
    """`Contact: Daughter at bedside`, `Patient - Denies chest pain`: one capitalised word after a header is no
    name; `Name: Zephyrine Quoxley Unit No: 5521`: the name ends before the next header."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    secrets = load_cohort_secrets(inputs["split_files"], 5)
    assert not {"daughter", "denies", "unit", "zephyrinequoxleyunit"} & set(secrets.ids)
    assert ("zephyrine", "quoxley", "unit") not in secrets.names
    assert not {"unit", "denies", "daughter"} & set(secrets.surnames)
    rel = {"tags": ["llmrnn", "daughter", "denies", "unit"],
           "commit_message": "Unit tests pass; the patient denies nothing, Patient Denies nothing"}
    assert _release(inputs, tmp_path / "run" / "release", rel=rel)["phi_guard"]["ok"]


def test_a_card_scans_in_linear_time(monkeypatch):
    """The letters-only pass counted each word's start by summing every word before it (a 1 MiB card: 374 s).
    Counted, not timed: the calls to len() the pass makes grow with the text, not with its square."""
    import builtins

    calls = {"n": 0}

    def counting_len(obj):
        calls["n"] += 1
        return builtins.len(obj)

    monkeypatch.setattr(guard_scan, "len", counting_len, raising=False)
    counts = {}
    for words in (2_000, 8_000):
        calls["n"] = 0
        guard_scan._letters(" ".join(f"word{i % 97}x" for i in range(words)))
        counts[words] = calls["n"]
    assert counts[8_000] <= 4.5 * counts[2_000], counts


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_real_merge_releases(tiny_model_dir, tmp_path, monkeypatch, dtype):
    """The honest path end to end: a real PEFT merge (merge.run_merge, at the dtype of merge.dtype) of the base
    model's prepared copy is accounted for file by file and released."""
    import shutil

    from llmrnn import merge
    from tests.test_merge import LORA, _make_adapter

    monkeypatch.delenv("HF_TOKEN", raising=False)
    inputs = _with_note_header(make_inputs(tmp_path / "run", tiny_model_dir))
    adapter = _make_adapter(inputs["base"], tmp_path / "adapter")
    shutil.rmtree(inputs["merged"])
    merge.run_merge(inputs["base"], adapter, inputs["merged"], inputs["merge_check"],
                    *merge.stage_settings({"merge": {"dtype": dtype}, **LORA}))
    receipt = _release(inputs, tmp_path / "run" / "release")
    assert receipt["phi_guard"]["ok"] and "model.safetensors" in receipt["files"], receipt["phi_guard"]["findings"]


def test_sharded_weights_and_their_index_are_accounted_for(tmp_path, tiny_model_dir, splits_with_header):
    """A sharded save (transformers' own, max_shard_size) is the base's architecture over two files and an
    index of exactly those tensors; an MRN as the index's total_size, or a tensor mapped to another file, is
    refused."""
    import shutil

    from transformers import AutoModelForCausalLM

    base, bundle = tmp_path / "base", tmp_path / "bundle"
    shutil.copytree(tiny_model_dir, base)
    AutoModelForCausalLM.from_pretrained(base).save_pretrained(bundle, max_shard_size="100KB")
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(base / f, bundle / f)
    assert len(list(bundle.glob("model-*-of-*.safetensors"))) >= 2
    assert phi_guard.scan_bundle(bundle, splits_with_header, base=base)["findings"] == []
    index = json.loads((bundle / "model.safetensors.index.json").read_text())
    (bundle / "model.safetensors.index.json").write_text(json.dumps(
        {**index, "metadata": {**index["metadata"], "total_size": int(MRN)}}))
    findings = phi_guard.scan_bundle(bundle, splits_with_header, base=base)["findings"]
    assert findings == ["model.safetensors.index.json: its metadata totals are not the bundle's tensors'; refused"]


@pytest.fixture
def splits_with_header(tmp_path) -> list[Path]:
    patients = cohort.synthesize_cohort(12, 3)
    course = patients[0]["visits"][0]["clinical_sections"]
    course["hospital_course"] = NOTE_HEADER + course["hospital_course"]
    path = tmp_path / "train.json"
    io.write_text(path, cohort.dump_cohort(patients))
    return [path]


def test_strings_hidden_in_the_bytes_of_a_base_shaped_tensor_are_found(inputs, tmp_path):
    """Weights of the base's architecture are still searched: an MRN written into a tensor's bytes (its name,
    shape and dtype the base's) stops the release, the tensor named, the MRN not repeated."""
    path = inputs["merged"] / "model.safetensors"
    data = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    name = next(k for k in sorted(header) if k != "__metadata__")
    start = 8 + n + header[name]["data_offsets"][0]
    payload = f"MRN {MRN};".encode()
    data[start:start + len(payload)] = payload
    path.write_bytes(bytes(data))
    _refused(inputs, tmp_path, rf"model.safetensors tensor '{name}'.*: cohort identifier")


# ----------------------------------------------------------------------------- a full fine-tune (verl's merger)
def _base_like_llama32(tiny_model_dir: Path, root: Path, generation_config: bool = True) -> Path:
    """The tiny base with a config as Llama-3.2's is: a list of eos ids and no pad id, so the ids verl's actor
    sets from the tokenizer (one eos, the tokenizer's pad) differ from the base's config."""
    import shutil

    base = root / "base"
    shutil.copytree(tiny_model_dir, base)
    cfg = json.loads((base / "config.json").read_text())
    cfg.pop("pad_token_id")
    cfg["eos_token_id"] = [cfg["eos_token_id"], 0]
    (base / "config.json").write_text(json.dumps(cfg, indent=2))
    if not generation_config:
        (base / "generation_config.json").unlink()
    return base


def _as_verl_merger_writes(base: Path, bundle: Path, eos_token_id: int | None = None) -> None:
    """A full fine-tune's merged folder as `llmrnn merge run` leaves what verl's model merger wrote (the e2e
    test below runs the real merger): config.json with the token ids verl's actor set from the tokenizer
    (`eos_token_id`: the eos verl's hf_tokenizer made, when not the tokenizer's own) and dtype bfloat16, the
    base's generation config, every tensor in bfloat16 (the merger's copy of the tied output embedding
    dropped: tests/test_merge.py)."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    bundle.mkdir()
    tok = AutoTokenizer.from_pretrained(base)
    cfg = json.loads((base / "config.json").read_text())
    cfg.update(eos_token_id=tok.eos_token_id if eos_token_id is None else eos_token_id,
               pad_token_id=tok.pad_token_id, dtype="bfloat16")
    (bundle / "config.json").write_text(json.dumps(cfg, indent=2))
    tensors = {k: v.to(torch.bfloat16) for k, v in load_file(base / "model.safetensors").items()}
    save_file(tensors, bundle / "model.safetensors", metadata={"format": "pt"})
    for f in base.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            shutil.copy(f, bundle / f.name)


def test_what_verls_merger_writes_for_a_full_fine_tune_is_accounted_for_and_nothing_else(
        tiny_model_dir, tmp_path, splits_with_header):
    """The merge check names verl's model merger as the writer (a verl checkpoint without lora_adapter/): the
    token ids its actor set from the base's tokenizer are accounted for; without that writer they are refused,
    and so is any value it did not set (an MRN as the pad id, an extra key)."""
    from llmrnn.constants import VERL_MERGER

    base = _base_like_llama32(tiny_model_dir, tmp_path)
    bundle = tmp_path / "bundle"
    _as_verl_merger_writes(base, bundle)

    def findings(written_by=VERL_MERGER) -> list[str]:
        return phi_guard.scan_bundle(bundle, splits_with_header, base=base, saved_dtype="bfloat16",
                                     written_by=written_by)["findings"]

    assert findings() == []
    assert findings(None) == [
        "config.json: the value of `eos_token_id` is not the base model's and no setting made it; refused"]
    cfg = json.loads((bundle / "config.json").read_text())
    for changed, finding in (({"pad_token_id": int(MRN)}, "the value of `pad_token_id` is not the base model's"),
                             ({"seed": int(MRN)}, "a key the base model's config.json does not have")):
        (bundle / "config.json").write_text(json.dumps({**cfg, **changed}))
        assert findings() == [f"config.json: {finding}; refused" if "does not have" in finding
                              else f"config.json: {finding} and no setting made it; refused"]


@pytest.mark.verl
@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("generation_config", [True, False], ids=["base-has-generation-config", "base-has-none"])
def test_a_verl_full_fine_tune_merged_by_verls_own_merger_releases(tiny_model_dir, tmp_path, monkeypatch,
                                                                   generation_config):
    """The honest full fine-tune end to end: an actor checkpoint as verl 0.7.1's FSDP actor leaves it
    (tests/verl/full_finetune_checkpoint.py), `llmrnn merge run` on it in the verl venv (verl's own
    `python -m verl.model_merger`), then the release: the merge check names the writer and the dtype it saved
    at, and the bundle is accounted for file by file and released."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    base = _base_like_llama32(tiny_model_dir, tmp_path, generation_config)
    merged = _verl_full_fine_tune_merged(base, tmp_path)
    written = json.loads((merged / "config.json").read_text())
    assert written["eos_token_id"] != json.loads((base / "config.json").read_text())["eos_token_id"]
    receipt = _release_merged_by_verl(merged, tmp_path)
    assert receipt["phi_guard"]["ok"] and "model.safetensors" in receipt["files"], receipt["phi_guard"]["findings"]


def _verl_full_fine_tune_merged(base: Path, tmp_path: Path, attn: str = "sdpa") -> Path:
    """tmp_path/merged: an actor checkpoint as verl 0.7.1's FSDP actor leaves it for `base`
    (tests/verl/full_finetune_checkpoint.py, its actor attention `attn`), merged by `llmrnn merge run` in the
    verl venv (verl's own `python -m verl.model_merger`); its merge check is tmp_path/merge_check.json."""
    import os

    from llmrnn.constants import VERL_MERGER
    from tests.conftest import REPO
    from tests.test_train_verl import verl_python

    py = verl_python("0.7.1")
    actor = tmp_path / "checkpoints" / "global_step_1" / "actor"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    for cmd in ([str(py), str(REPO / "tests" / "verl" / "full_finetune_checkpoint.py"), "--base", str(base),
                 "--out", str(actor), "--attn", attn],
                [str(py), "-c", "from llmrnn.cli import main; raise SystemExit(main())", "merge", "run",
                 "--base", str(base), "--adapter", str(actor.parent), "--out", str(tmp_path / "merged"),
                 "--check", str(tmp_path / "merge_check.json"), "--cfg", "{}"]):
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
    check = json.loads((tmp_path / "merge_check.json").read_text())
    assert check["source_kind"] == "verl_fsdp_full" and check["written_by"] == VERL_MERGER, check
    assert check["dtype"] == "bfloat16"
    return tmp_path / "merged"


def _release_merged_by_verl(merged: Path, tmp_path: Path) -> dict:
    """The release of a folder _verl_full_fine_tune_merged left, with its real merge check (its `base` the base
    the merge used)."""
    inputs = _with_note_header(make_inputs(tmp_path / "run", merged))
    io.write_json(inputs["merge_check"], json.loads((tmp_path / "merge_check.json").read_text()))
    return _release(inputs, tmp_path / "run" / "release")


# ----------------------------------------------------------------------------- a Gemma-2 base: a list of eos ids
# google/gemma-2-2b-it stops on [1, 107] (<eos>, <end_of_turn>) in config.json and generation_config.json; its
# tokenizer's eos is 1. verl's hf_tokenizer, for a model path naming gemma-2-2b-it, makes the eos <end_of_turn>
# (107), and its actor sets that on the model config; the merger writes the base's generation config as it is.
END_OF_TURN = 107


def _gemma2_base(tiny_gemma2_dir: Path, root: Path, name: str) -> Path:
    """The tiny Gemma-2 prepared as resources/models/<name> is."""
    import shutil

    base = root / "resources" / "models" / name
    shutil.copytree(tiny_gemma2_dir, base)
    return base


def _gemma2_findings(bundle: Path, base: Path, splits: list[Path]) -> list[str]:
    from llmrnn.constants import VERL_MERGER

    return phi_guard.scan_bundle(bundle, splits, base=base, saved_dtype="bfloat16",
                                 written_by=VERL_MERGER)["findings"]


@pytest.mark.parametrize(("name", "eos"), [("gemma-2-2b-it", END_OF_TURN), ("gemma-2-2b-it", 1), ("gemma2", 1)],
                         ids=["named-gemma-2-2b-it-end-of-turn", "named-gemma-2-2b-it-eos", "named-otherwise-eos"])
def test_the_eos_verls_tokenizer_sets_on_a_gemma2_base_is_accounted_for(tiny_gemma2_dir, tmp_path,
                                                                       splits_with_header, name, eos):
    """A Gemma-2 full fine-tune as verl's merger writes it: config.json's eos is the one verl's hf_tokenizer
    loaded (<end_of_turn> where the model path names gemma-2-2b-it, else the tokenizer's <eos>; the release may
    see the path spelled otherwise than training did, so both under that name), generation_config.json the
    base's, its list of eos ids in the base's order."""
    base = _gemma2_base(tiny_gemma2_dir, tmp_path, name)
    bundle = tmp_path / "bundle"
    _as_verl_merger_writes(base, bundle, eos)
    assert json.loads((bundle / "generation_config.json").read_text())["eos_token_id"] == [1, END_OF_TURN]
    assert _gemma2_findings(bundle, base, splits_with_header) == []


def test_an_eos_verl_sets_only_under_gemma2s_name_is_refused_under_another(tiny_gemma2_dir, tmp_path,
                                                                          splits_with_header):
    """verl corrects the eos by the model path's name only: a base prepared under another name trains with the
    tokenizer's eos, so <end_of_turn> as config.json's eos is a value nobody set there."""
    base = _gemma2_base(tiny_gemma2_dir, tmp_path, "gemma2")
    bundle = tmp_path / "bundle"
    _as_verl_merger_writes(base, bundle, END_OF_TURN)
    assert _gemma2_findings(bundle, base, splits_with_header) == [
        "config.json: the value of `eos_token_id` is not the base model's and no setting made it; refused"]


@pytest.mark.parametrize(("name", "eos", "finding"), [
    ("generation_config.json", [1, END_OF_TURN, int(MRN)], "the value of `eos_token_id`"),
    ("generation_config.json", [END_OF_TURN, 1], "the value of `eos_token_id`"),  # not the order the base has
    ("generation_config.json", [1], "the value of `eos_token_id`"),
    ("config.json", [1, END_OF_TURN, int(MRN)], "the value of `eos_token_id`"),
    ("config.json", int(MRN), "the value of `eos_token_id`"),
    ("config.json", [1, END_OF_TURN], None),  # the base's own config.json value
], ids=["gen-extra-id", "gen-reordered", "gen-shortened", "config-extra-id", "config-mrn", "config-base-list"])
def test_a_list_of_eos_ids_is_accounted_for_only_as_the_base_and_verl_write_it(tiny_gemma2_dir, tmp_path,
                                                                               splits_with_header, name, eos,
                                                                               finding):
    """Beside the honest Gemma-2 bundle (verl's eos in config.json, the base's list in generation_config.json),
    an eos list with an id nobody set, or the base's ids in another order or fewer, is refused, the file named;
    the base's own list in config.json is the base's value."""
    base = _gemma2_base(tiny_gemma2_dir, tmp_path, "gemma-2-2b-it")
    bundle = tmp_path / "bundle"
    _as_verl_merger_writes(base, bundle, END_OF_TURN)
    assert _gemma2_findings(bundle, base, splits_with_header) == []
    data = json.loads((bundle / name).read_text())
    (bundle / name).write_text(json.dumps({**data, "eos_token_id": eos}, indent=2))
    expected = [] if finding is None else [f"{name}: {finding} is not the base model's and no setting made it; refused"]
    assert _gemma2_findings(bundle, base, splits_with_header) == expected


def test_a_gemma2_release_refuses_an_unexplained_eos_id_in_one_line(tiny_gemma2_dir, tmp_path, monkeypatch):
    """The release stage itself: the honest Gemma-2 bundle verl's merger writes releases; with an MRN added to
    generation_config.json's eos list it stops in one line that names the file and not the value."""
    from llmrnn.constants import VERL_MERGER

    monkeypatch.delenv("HF_TOKEN", raising=False)
    base = _gemma2_base(tiny_gemma2_dir, tmp_path, "gemma-2-2b-it")
    bundle = tmp_path / "bundle"
    _as_verl_merger_writes(base, bundle, END_OF_TURN)

    def inputs_for(root: Path) -> dict:
        inputs = _with_note_header(make_inputs(root, bundle))
        check = {**json.loads(inputs["merge_check"].read_text()), "base": str(base), "dtype": "bfloat16",
                 "source_kind": "verl_fsdp_full", "written_by": VERL_MERGER}
        io.write_json(inputs["merge_check"], check)
        return inputs

    receipt = _release(inputs_for(tmp_path / "run"), tmp_path / "run" / "release")
    assert receipt["phi_guard"]["ok"], receipt["phi_guard"]["findings"]
    gen = json.loads((bundle / "generation_config.json").read_text())
    (bundle / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [1, END_OF_TURN, int(MRN)]}))
    message = _refused(inputs_for(tmp_path / "run2"), tmp_path / "run2",
                       r"generation_config\.json: the value of `eos_token_id` is not the base model's")
    assert "107" not in message and "[1" not in message, message


@pytest.mark.verl
@pytest.mark.e2e
@pytest.mark.slow
def test_a_gemma2_full_fine_tune_merged_by_verls_own_merger_releases(tiny_gemma2_dir, tmp_path, monkeypatch):
    """The honest Gemma-2 full fine-tune end to end, the base prepared as resources/models/gemma-2-2b-it: verl's
    own tokenizer makes the eos <end_of_turn>, its merger writes that in config.json and the base's list of eos
    ids in generation_config.json, and the release accounts for both (the actor runs eager attention: Gemma-2
    has no sdpa in transformers 5)."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    base = _gemma2_base(tiny_gemma2_dir, tmp_path, "gemma-2-2b-it")
    merged = _verl_full_fine_tune_merged(base, tmp_path, attn="eager")
    assert json.loads((merged / "config.json").read_text())["eos_token_id"] == END_OF_TURN
    assert json.loads((merged / "generation_config.json").read_text())["eos_token_id"] == [1, END_OF_TURN]
    receipt = _release_merged_by_verl(merged, tmp_path)
    assert receipt["phi_guard"]["ok"] and "model.safetensors" in receipt["files"], receipt["phi_guard"]["findings"]
