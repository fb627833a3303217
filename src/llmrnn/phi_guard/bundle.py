"""Bundle scan: every entry of a release folder accounted for (phi_guard.accounting) or refused, the free text a
user supplied scanned, and the refusal of a bundle with findings."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from llmrnn.errors import CheckFailed, InputError
from llmrnn.phi_guard import accounting
from llmrnn.phi_guard.files import refuse_irregular, scan_file
from llmrnn.phi_guard.formats import scan_joined, scan_json_value, scan_safetensors
from llmrnn.phi_guard.scan import Scan, find_clinical_text
from llmrnn.phi_guard.secrets import SPLIT_FORMATS

log = logging.getLogger(__name__)


def bundle_entries(root: Path) -> Iterator[Path]:
    """Every entry under `root` that is not a real folder (files, links of any kind, fifos, devices),
    without descending into linked folders."""
    for folder, dirs, names in os.walk(root, followlinks=False):
        for name in [*names, *(d for d in dirs if os.path.islink(os.path.join(folder, d)))]:
            yield Path(folder, name)


def scan_free_text(scan: Scan, where: str, value: Any, path: str = "$") -> None:
    """Text a user supplied (a tag, a commit message, a prompt, any setting copied into the card or manifest):
    normalised, read as shown (bidi, table cells), across its JSON structure; encoded data in it is refused."""
    scan.free_text = True
    try:
        if isinstance(value, str):
            scan.ids_in(where, value)
        else:
            scan_json_value(scan, where, value, path)
            scan_joined(scan, where, value, path)
    except RecursionError:
        scan.refuse(where, "nested too deeply to scan; refused")
    finally:
        scan.free_text = False


def scan_bundle(bundle: str | Path, split_files: Iterable[str | Path], min_words: int = 8,
                min_id_digits: int = 5, min_line_words: int = 3, split_format: str = "cohort", *,
                base: str | Path | None = None, expected: dict[str, bytes] | None = None,
                free_text: Iterable[tuple[str, str, Any]] = (), saved_dtype: str | None = None,
                written_by: str | None = None) -> dict:
    """Account for every entry under `bundle` (fail closed, phi_guard.accounting): model files against the
    `base` model folder (`saved_dtype`: the dtype the merge saved at; `written_by`: the merged folder's writer
    when not our PEFT merge, accounting.VERL_MERGER), the card and manifest against the bytes
    the release writes (`expected`; without it, as a person's check of a folder, they are scanned as free
    text), anything else refused. `free_text` ((file, JSON path, value)) is what a user supplied, scanned for
    the data of `split_files` (`split_format`: cohort split JSONs or QA split JSONL); the report's `findings`
    lists what was refused. Links are refused, never followed, and so is anything but a regular file."""
    root = Path(bundle)
    if split_format not in SPLIT_FORMATS:
        raise InputError(f"PHI guard: split format {split_format!r} is not one of {sorted(SPLIT_FORMATS)}")
    secrets = SPLIT_FORMATS[split_format](split_files, min_id_digits)
    secrets.min_words, secrets.min_line_words = min_words, min_line_words
    files = sorted(bundle_entries(root))
    scan = Scan(secrets)
    regular = []
    for n, path in enumerate(files, 1):
        rel = path.relative_to(root).as_posix()
        shown = accounting.where(rel, n, len(files))
        if not refuse_irregular(scan, path, shown):
            regular.append((n, rel))
    base_dir = Path(base) if base is not None else None
    try:
        found, to_scan = accounting.account(root, regular, len(files), base_dir, expected, saved_dtype,
                                             written_by)
    except OSError as exc:
        found, to_scan = [("bundle", f"cannot be read ({type(exc).__name__}); refused rather than skipped")], []
    for where, what in found:
        scan.refuse(where, what)
    refused = {where for where, _ in found}
    for _, rel in regular:  # the weights' bytes too: strings hidden in tensors of the right architecture
        if accounting.kind_of(rel) == "weights" and base_dir is not None and rel not in refused:
            scan_safetensors(scan, rel, root / rel)
    for rel in to_scan:
        scan.free_text = True
        try:
            scan_file(scan, root, root / rel, rel)
        finally:
            scan.free_text = False
    for where, path, value in free_text:
        scan_free_text(scan, where, value, path)
    find_clinical_text(scan)
    return {
        "ok": not scan.findings,
        "reference": split_format,
        "rule": "fail closed: every file accounted for against the base model and the release's own records",
        "base": str(base_dir) if base_dir is not None else None,
        "files_scanned": len(files),
        "identifiers_checked": len(secrets.ids),
        "identifiers_too_short_to_check": len(secrets.too_short),
        "clinical_texts_checked": len(secrets.texts),
        "min_words": min_words,
        "min_line_words": min_line_words,
        "min_id_digits": min_id_digits,
        "findings": scan.findings,
    }


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
