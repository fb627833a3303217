"""Bundle: `llmrnn release build` from the inputs to README.md, MANIFEST.json and upload_receipt.json."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from llmrnn import io, upload
from llmrnn.errors import InputError
from llmrnn.models import model_folder
from llmrnn.release.card import _chosen_checkpoint, _ran_attention
from llmrnn.release.manifest import build_manifest, judge_entry, metrics_summary, settings
from llmrnn.release.staging import _remove_stage, run_lock, stage_model_files
from llmrnn.release.upload import _check_and_upload

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _release_outputs(*paths: str | Path):
    """Temp files beside each output, created NOW (an unwritable release folder stops the release before
    anything is scanned or uploaded); each is renamed into place only when the block succeeds. On a
    failure, folders this made are removed again when empty: nothing is left half-written."""
    made = [d for d in dict.fromkeys(q for p in paths for q in [Path(p).parent, *Path(p).parent.parents])
            if not d.exists()]
    try:
        with contextlib.ExitStack() as stack:
            temps = []
            for path in paths:
                try:
                    temps.append(stack.enter_context(io.atomic_path(path)))
                except OSError as exc:
                    raise InputError(f"{Path(path).parent}: cannot write the release there ({exc.strerror}); "
                                     "nothing was uploaded") from None
            yield temps
    except BaseException:
        for folder in sorted(made, key=lambda d: len(d.parts), reverse=True):
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


def _base_model(check: dict, merge_check: str | Path) -> Path:
    """The base model's prepared copy the merge folded the adapter into (merge_check.json `base`): the bundle's
    model files are compared with it, so a release without it cannot be accounted for and stops here."""
    given = check.get("base")
    folder = model_folder(given) if isinstance(given, str) and given else None
    if folder is None or not (folder / "config.json").is_file():
        raise InputError(f"{merge_check}: `base` does not name the base model folder the merge used (a folder with "
                         "config.json); the bundle cannot be compared with it, nothing was uploaded")
    return folder


def build_release(*, merged: str | Path, merge_check: str | Path, splits: str | Path, split_files: list[str],
                  metrics: str | Path | None, rubric: str | Path | None,
                  cfg: dict, card_out: str | Path, manifest_out: str | Path, receipt_out: str | Path,
                  split_format: str = "cohort", train_summary: str | Path | None = None) -> dict:
    """`split_files` are what must not leak: the cohort splits (`split_format` cohort) or the QA data
    stage's record files (qa)."""
    merged = Path(merged)
    secrets = upload.env_problems({"release": cfg.get("release") or {}, "knobs": cfg.get("knobs") or {}})
    if secrets:  # before anything is written: the manifest copies both sections
        raise InputError(f"release --cfg: {secrets[0]}")
    # what is written (manifest, card, receipt, logs) never holds the user:password@ of a URL; the Hub
    # authenticates with the token, so the endpoint is called without them (httpx would log them)
    rel = upload.redact_credentials(settings(cfg.get("release")))
    endpoint = upload.without_userinfo(rel["endpoint"] or os.environ.get("HF_ENDPOINT") or None)
    run_name = cfg.get("run_name") or "run"
    knobs = upload.redact_credentials(cfg.get("knobs") or {})
    if not (merged / "config.json").is_file():
        raise InputError(f"{merged}: merged model folder has no config.json")
    check = io.read_json(merge_check)
    if not check.get("ok"):
        raise InputError(f"{merge_check}: ok is not true; the merge check failed, nothing to release")
    base = _base_model(check, merge_check)
    repo_id = rel["repo_id"] or f"llmrnn-{run_name}-merged"
    inputs = {"merge_check": str(merge_check), "splits": str(splits), "metrics": str(metrics) if metrics else None,
              "rubric": str(rubric) if rubric else None}
    chosen = _chosen_checkpoint(train_summary)  # before anything is written: a missing summary is one line
    # the receipt's temp is entered first, so it is renamed into place last
    with _release_outputs(receipt_out, card_out, manifest_out) as (receipt_tmp, card_tmp, manifest_tmp):
        run_dir = Path(card_out).parent.parent
        locked = contextlib.ExitStack()  # the run's lock: from before any stage is made or removed to the end
        try:
            locked.enter_context(run_lock(run_dir))
            stage, staged = stage_model_files(merged, run_dir, base)
        except BaseException as exc:
            locked.close()
            if not isinstance(exc, OSError):
                raise  # a full disk, an unwritable run folder: nothing was scanned or uploaded
            raise InputError(f"{Path(card_out).parent.parent}: cannot stage the release bundle there "
                             f"({exc.strerror or type(exc).__name__}); nothing was uploaded") from None
        try:
            receipt = _check_and_upload(
                stage, staged, merged=merged, rel=rel, endpoint=endpoint, repo_id=repo_id, run_name=run_name,
                split_files=split_files, split_format=split_format, card_tmp=card_tmp, manifest_tmp=manifest_tmp,
                base=base, saved_dtype=check.get("dtype"), written_by=check.get("written_by"),
                manifest=upload.redact_credentials(build_manifest(
                    run_name=run_name, knobs=knobs, rel=rel, merge_check=check, splits=io.read_json(splits),
                    metrics={**metrics_summary(metrics), "checkpoint": chosen,
                             "attention": _ran_attention(train_summary)}, model_files=staged, inputs=inputs,
                    rubric=judge_entry(rubric, knobs),
                )),
            )
            try:
                receipt_tmp.write_text(io.json_text(upload.redact_credentials(receipt)), encoding="utf-8")
            except OSError as exc:
                done = ("it was uploaded; a rerun finds that commit and pushes nothing again"
                        if receipt["uploaded"] else "nothing was uploaded")
                raise InputError(f"{receipt_out}: cannot write the receipt ({exc.strerror}); {done}") from None
        finally:
            _remove_stage(stage)
            locked.close()
    log.info("release: card %s, manifest %s, uploaded=%s", card_out, manifest_out, receipt["uploaded"])
    return receipt
