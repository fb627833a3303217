"""PHI guard: scan a release bundle (the exact folder that would be uploaded) for cohort data.

It refuses (CheckFailed, one line naming the file and what was found) when the bundle holds:
- a file type that is not model/card/manifest material (allow-list: safetensors, json, md, txt, jinja,
  model, yaml, gitattributes); so audit logs (*.jsonl), parquet trajectories, pickles, logs never pass;
- a file that looks like an audit log or a cohort file by name (audit, calls_*, cohort, cleaned, splits,
  train/val/test.json), or whose bytes equal one of the split files;
- a JSON file shaped like a cohort (records with subject_id + visits);
- a patient identifier of the cohort (subject_id, visit_id) as a whole digit run in any text, including
  the JSON header of safetensors files (tensor data is numbers, not text, and is not scanned);
- clinical text of the cohort: any run of `min_words` consecutive words from a clinical section.

Identifiers shorter than `min_id_digits` cannot be told apart from ordinary numbers (token ids, sizes,
seeds) and are not matched by digits; the report says how many were skipped (MIMIC-IV ids are 8 digits,
the synthetic cohort's are 8-9). Clinical text is still matched for those patients.
"""

from __future__ import annotations

import json
import logging
import re
import struct
from collections.abc import Iterable
from pathlib import Path

from llmrnn import io
from llmrnn.errors import CheckFailed, InputError

log = logging.getLogger(__name__)

ALLOWED_SUFFIXES = {".safetensors", ".json", ".md", ".txt", ".jinja", ".model", ".yaml", ".yml", ".gitattributes"}
SUSPECT_NAME = re.compile(
    r"(audit|calls_|cohort|cleaned|splits?\b|^(train|val|test)\.json$|trajector|rollout|patient)", re.IGNORECASE
)
TEXT_SUFFIXES = ALLOWED_SUFFIXES - {".safetensors", ".model"}
DIGITS = re.compile(r"(?<!\d)\d+(?!\d)")
WORD = re.compile(r"[a-z0-9]+")
ID_KEYS = ("subject_id", "visit_id", "hadm_id", "patient_id")


def _words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def _shingles(words: list[str], k: int) -> Iterable[int]:
    for i in range(len(words) - k + 1):
        yield hash(" ".join(words[i : i + k]))


def load_cohort_secrets(split_files: Iterable[str | Path]) -> tuple[set[str], list[str], set[str]]:
    """(identifiers as digit strings, clinical texts, sha256 of the split files) from the split files."""
    ids: set[str] = set()
    texts: list[str] = []
    hashes: set[str] = set()
    for path in split_files:
        path = Path(path)
        try:
            data = io.read_json(path)
        except (OSError, json.JSONDecodeError) as exc:
            raise InputError(f"{path}: cannot read split file: {exc}") from exc
        hashes.add(io.sha256_file(path))
        for patient in data:
            for key in ID_KEYS:
                if patient.get(key) is not None:
                    ids.add(str(patient[key]))
            for visit in patient.get("visits", []):
                for key in ID_KEYS:
                    if visit.get(key) is not None:
                        ids.add(str(visit[key]))
                for value in (visit.get("clinical_sections") or {}).values():
                    if isinstance(value, str) and value.strip():
                        texts.append(value)
    return ids, texts, hashes


def _safetensors_header(path: Path) -> str:
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return ""
        (n,) = struct.unpack("<Q", head)
        return fh.read(min(n, 100_000_000)).decode("utf-8", errors="replace")


def _looks_like_cohort(text: str) -> bool:
    try:
        data = json.loads(text)
    except ValueError:
        return False
    records = data if isinstance(data, list) else [data]
    return any(isinstance(r, dict) and "visits" in r and any(k in r for k in ID_KEYS) for r in records[:50])


def scan_bundle(bundle: str | Path, split_files: Iterable[str | Path], min_words: int = 8,
                min_id_digits: int = 5) -> dict:
    """Scan every file under `bundle` (links followed); the report's `findings` lists what was found."""
    root = Path(bundle)
    ids, texts, split_hashes = load_cohort_secrets(split_files)
    scan_ids = {i for i in ids if len(i) >= min_id_digits}
    files = sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink())
    findings: list[str] = []
    texts_by_file: dict[str, str] = {}

    for path in files:
        rel = path.relative_to(root).as_posix()
        if path.is_symlink() and not path.exists():
            findings.append(f"{rel}: dangling link")
            continue
        suffix = path.suffix.lower() if path.suffix else path.name.lower()
        if suffix not in ALLOWED_SUFFIXES and path.name != ".gitattributes":
            findings.append(f"{rel}: file type not allowed in a release ({suffix or 'no suffix'})")
            continue
        if any(SUSPECT_NAME.search(part) for part in rel.split("/")):
            findings.append(f"{rel}: name looks like an audit log or cohort file")
            continue
        if io.sha256_file(path) in split_hashes:
            findings.append(f"{rel}: identical to a cohort split file")
            continue
        if suffix == ".safetensors":
            texts_by_file[rel] = _safetensors_header(path)
        elif suffix in TEXT_SUFFIXES or path.name == ".gitattributes":
            texts_by_file[rel] = path.read_text(encoding="utf-8", errors="replace")
        if suffix == ".json" and _looks_like_cohort(texts_by_file.get(rel, "")):
            findings.append(f"{rel}: JSON records with subject_id and visits (a cohort file)")

    for rel, text in texts_by_file.items():
        hits = sorted({d for d in DIGITS.findall(text) if d in scan_ids})
        if hits:
            findings.append(f"{rel}: cohort identifier(s) {', '.join(hits[:3])}")

    # clinical text: shingles of the bundle's words, looked up for every clinical text of the cohort
    bundle_shingles: dict[int, str] = {}
    for rel, text in texts_by_file.items():
        for sh in _shingles(_words(text), min_words):
            bundle_shingles.setdefault(sh, rel)
    text_hits: dict[str, str] = {}
    if bundle_shingles:
        for clinical in texts:
            words = _words(clinical)
            for i, sh in enumerate(_shingles(words, min_words)):
                rel = bundle_shingles.get(sh)
                if rel is not None and rel not in text_hits:
                    text_hits[rel] = " ".join(words[i : i + min_words])
    for rel, snippet in sorted(text_hits.items()):
        findings.append(f"{rel}: clinical text from the cohort (\"{snippet[:60]}...\")")

    report = {
        "ok": not findings,
        "files_scanned": len(files),
        "text_files": len(texts_by_file),
        "identifiers_checked": len(scan_ids),
        "identifiers_too_short_to_check": len(ids) - len(scan_ids),
        "clinical_texts_checked": len(texts),
        "min_words": min_words,
        "min_id_digits": min_id_digits,
        "findings": findings,
    }
    return report


def enforce(report: dict, bundle: str | Path) -> None:
    """Raise CheckFailed (one line: the first finding) unless the scan found nothing."""
    findings = report["findings"]
    if findings:
        more = f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
        raise CheckFailed(f"PHI guard refused the release bundle {bundle}: {findings[0]}{more}")
    log.info(
        "PHI guard: %d files clean (%d identifiers, %d clinical texts checked)",
        report["files_scanned"], report["identifiers_checked"], report["clinical_texts_checked"],
    )
