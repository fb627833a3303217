"""Bundle scan: every entry of a release folder scanned or refused, and the refusal of a bundle with findings."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from llmrnn.errors import CheckFailed, InputError
from llmrnn.phi_guard.files import scan_file
from llmrnn.phi_guard.identifiers import redact
from llmrnn.phi_guard.scan import Scan, find_clinical_text
from llmrnn.phi_guard.secrets import SPLIT_FORMATS

log = logging.getLogger(__name__)


def bundle_entries(root: Path) -> Iterator[Path]:
    """Every entry under `root` that is not a real folder (files, links of any kind, fifos, devices),
    without descending into linked folders."""
    for folder, dirs, names in os.walk(root, followlinks=False):
        for name in [*names, *(d for d in dirs if os.path.islink(os.path.join(folder, d)))]:
            yield Path(folder, name)


def scan_bundle(bundle: str | Path, split_files: Iterable[str | Path], min_words: int = 8,
                min_id_digits: int = 5, min_line_words: int = 3, split_format: str = "cohort") -> dict:
    """Scan every file under `bundle` for the data of `split_files` (`split_format`: cohort split JSONs or
    QA split JSONL); the report's `findings` lists what was found. Links are refused, never followed (a
    linked folder is one finding, its files are not listed), and so is anything but a regular file."""
    root = Path(bundle)
    if split_format not in SPLIT_FORMATS:
        raise InputError(f"PHI guard: split format {split_format!r} is not one of {sorted(SPLIT_FORMATS)}")
    secrets = SPLIT_FORMATS[split_format](split_files, min_id_digits)
    secrets.min_words, secrets.min_line_words = min_words, min_line_words
    files = sorted(bundle_entries(root))
    scan = Scan(secrets)
    for path in files:
        scan_file(scan, root, path, redact(path.relative_to(root).as_posix(), secrets))
    find_clinical_text(scan)
    return {
        "ok": not scan.findings,
        "reference": split_format,
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
