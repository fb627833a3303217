"""Upload: the PHI guard over the staged copy, the hashes checked again, then the Hub upload (or the
reason nothing was uploaded)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from llmrnn import phi_guard, upload
from llmrnn.errors import InputError
from llmrnn.release.card import render_card
from llmrnn.release.manifest import utc
from llmrnn.release.staging import release_files, release_id, sources_unchanged, stage_text

log = logging.getLogger(__name__)


# the manifest's parts that hold what a user wrote (the settings, the run's name, the rubric's names, the base
# model's path); the rest is numbers, hashes and versions the code produced. The card is made from these.
USER_SUPPLIED = ("run_name", "knobs", "release", "judge", "base_model")


def _check_and_upload(stage: Path, staged: dict[str, dict], *, merged: Path, rel: dict, endpoint: str | None,
                      repo_id: str, run_name: str, split_files: list[str], split_format: str, card_tmp: Path,
                      manifest_tmp: Path, manifest: dict, base: Path, saved_dtype: str | None,
                      written_by: str | None = None) -> dict:
    """Card and manifest into the stage, the PHI guard over the stage, the card and manifest temps filled
    with the staged text, then (when asked) the upload of exactly the staged bytes; returns the receipt."""
    card = upload.redact_credentials(render_card(manifest, rel, repo_id))
    manifest_text = json.dumps(manifest, indent=2) + "\n"
    files = {name: f["sha256"] for name, f in staged.items()}
    files["README.md"] = stage_text(stage, "README.md", card)["sha256"]
    files["MANIFEST.json"] = stage_text(stage, "MANIFEST.json", manifest_text)["sha256"]
    # fail closed: the stage is accounted for file by file against the base model and against the card and
    # manifest written again from the run's records; what a user supplied is the only text scanned
    expected = {"README.md": upload.redact_credentials(render_card(manifest, rel, repo_id)).encode("utf-8"),
                "MANIFEST.json": (json.dumps(manifest, indent=2) + "\n").encode("utf-8")}
    free_text = [("MANIFEST.json", f"$.{key}", manifest[key]) for key in USER_SUPPLIED if key in manifest]
    guard = phi_guard.scan_bundle(stage, split_files, **rel["phi_guard"], split_format=split_format, base=base,
                                  expected=expected, free_text=free_text, saved_dtype=saved_dtype,
                                  written_by=written_by)
    phi_guard.enforce(guard, f"{stage.name} (merged model + card + manifest)")
    try:  # before the upload: a full disk stops the release here, not after a push
        card_tmp.write_text(card, encoding="utf-8")
        manifest_tmp.write_text(manifest_text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{card_tmp.parent}: cannot write the card and manifest ({exc.strerror}); nothing "
                         "was uploaded") from None
    receipt: dict[str, Any] = {"uploaded": False, "repo_id": repo_id, "private": rel["private"],
                               "created_utc": utc(), "files": sorted(manifest["model_files"]) + ["README.md", "MANIFEST.json"],
                               "sha256": dict(sorted(files.items())), "phi_guard": guard,
                               # files of merged/ the merge copied from the base that a bundle does not hold
                               "withheld_base_files": len(release_files(merged, base)[1])}
    token = upload.token_from_env(rel["token_env"])
    if not rel["upload"]:
        receipt["reason"] = "release.upload is off (set release.upload: true and export a Hub token to upload)"
    elif token is None:
        receipt["reason"] = f"release.upload is on but ${rel['token_env']} is not set; nothing was uploaded"
        log.warning("%s", receipt["reason"])
    elif upload.offline():
        receipt["reason"] = "release.upload is on but HF_HUB_OFFLINE is set; nothing was uploaded"
        log.warning("%s", receipt["reason"])
    else:
        sources_unchanged(merged, staged, base)  # merged/ is still what was copied and scanned
        result = upload.upload_bundle(
            stage, repo_id, token=token, files=files, release_id=release_id(staged, manifest, rel, repo_id),
            private=rel["private"], endpoint=endpoint,
            commit_message=rel["commit_message"] or f"llmrnn release of run {run_name}",
        )
        receipt.update(uploaded=True, **result)
        receipt["reason"] = ("already uploaded: the repo holds a commit of this release id; nothing pushed again"
                             if result["already_uploaded"] else "uploaded")
    return receipt
