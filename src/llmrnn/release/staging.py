"""Staging: the bundle copied into a private read-only folder (regular files, printable names, hashed as
copied), the run lock, and the release id."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

from llmrnn import io
from llmrnn.errors import CheckFailed, InputError
from llmrnn.phi_guard.accounting import NOT_ALLOWED, kind_of
from llmrnn.release.card import render_card
from llmrnn.release.manifest import config_hash

# ----------------------------------------------------------------------------- staging + upload
STAGE_PREFIX = ".bundle."
STAGE_SUFFIX = ".tmp"
STAGE_NAME = re.compile(re.escape(STAGE_PREFIX) + r"[A-Za-z0-9_]{8}" + re.escape(STAGE_SUFFIX))
COPY_CHUNK = 1 << 20
# the release's own card and manifest; a base model's README.md copied into merged/ is replaced, not merged
RELEASE_TEXTS = ("README.md", "MANIFEST.json")


def printable_name(name: str) -> str:
    """A file name safe to put on one line of an error: undecodable bytes and control characters escaped."""
    text = os.fsencode(name).decode("utf-8", "backslashreplace")
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def name_problem(rel: str) -> str | None:
    """Why a bundle path cannot go to the Hub as it is (None when it can): it must be UTF-8, printable and
    use / only. Checked while staging, before any repo is created."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return "file name is not UTF-8"
    if any(not ch.isprintable() for ch in rel):
        return "file name holds control or invisible characters"
    if "\\" in rel:
        return "file name holds a backslash"
    return None


def _copy_private(src: Path, dst: Path, shown: str) -> dict:
    """Copy one regular file (never a link, fifo or device: O_NOFOLLOW, then fstat) into the stage as a
    new read-only file; size and sha256 of the bytes copied."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)  # a fifo must not block
    try:
        fd = os.open(src, flags)
    except OSError as exc:
        what = "a symbolic link" if src.is_symlink() else f"cannot be read ({exc.strerror})"
        raise InputError(f"{shown}: {what}; a release copies regular files only and never follows a link") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise InputError(f"{shown}: not a regular file; refused (a release holds regular files only)")
        digest, size = hashlib.sha256(), 0
        with open(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600),
                  "wb") as out:
            while chunk := fh.read(COPY_CHUNK):
                out.write(chunk)
                digest.update(chunk)
                size += len(chunk)
            os.fchmod(out.fileno(), 0o400)
    return {"bytes": size, "sha256": digest.hexdigest()}


def _walk_regular(folder: Path, shown: str) -> list[tuple[str, Path]]:
    """(name, path) of every file of `folder`, hidden names left out; a link, a folder, a fifo, a device or a
    socket is refused (InputError), a name that is not plain UTF-8 too. An entry is named only when its name is
    one a bundle may hold (phi_guard.accounting); any other is named by its position (its name may be the
    identifier)."""
    out = []
    with os.scandir(folder) as listing:
        entries = [e for e in sorted(listing, key=lambda e: os.fsencode(e.name)) if not e.name.startswith(".")]
    for n, entry in enumerate(entries, 1):
        where = f"{shown}/{entry.name}" if kind_of(entry.name) else f"{shown}: entry {n} of {len(entries)}"
        if problem := name_problem(entry.name):
            raise InputError(f"{where}: {problem}; rename it (nothing was uploaded)")
        if entry.is_symlink():
            raise InputError(f"{where}: a symbolic link; a release copies regular files only and never "
                             "follows a link")
        if entry.is_dir(follow_symlinks=False):
            raise InputError(f"{where}: a folder; a release bundle holds no folders (nothing was uploaded)")
        if not entry.is_file(follow_symlinks=False):
            raise InputError(f"{where}: not a regular file (a fifo, device or socket); refused")
        out.append((entry.name, Path(entry.path)))
    return out


def release_files(merged: Path, base: Path | None) -> tuple[list[tuple[str, Path]], list[str]]:
    """The files of merged/ the bundle holds, and the ones withheld: a file whose name is not one a bundle may
    hold goes only where it is byte-identical to the base model's file of that name (the merge copied it from
    the base: a license, the base's training logs); then it is withheld and counted, never released. Any
    other such file stops the release (CheckFailed, named by its position)."""
    files = [(rel, src) for rel, src in _walk_regular(merged, str(merged)) if rel not in RELEASE_TEXTS]
    keep, withheld = [], []
    for n, (rel, src) in enumerate(files, 1):
        if kind_of(rel):
            keep.append((rel, src))
        elif base is not None and (base / rel).is_file() and io.sha256_file(base / rel) == io.sha256_file(src):
            withheld.append(rel)
        else:
            raise CheckFailed(f"{merged}: entry {n} of {len(files)} (sorted by name) is {NOT_ALLOWED}; nothing was "
                              "uploaded")
    return keep, withheld


LOCK_FILE = ".release.lock"


@contextlib.contextmanager
def run_lock(run_dir: Path):
    """An exclusive lock on the run's releases (flock on RUN/.release.lock, never waited for): a second
    release of the same run at the same time stops with one line naming the first's pid, before it stages,
    removes a stage or uploads anything. The lock goes with the process (also when it is killed)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise CheckFailed(f"another release of {run_dir} is running (pid {holder}); nothing was staged or "
                              "uploaded, rerun when it is done") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def remove_stale_stages(parent: Path) -> None:
    """Stage folders of an earlier release that was killed (each holds a full copy of the model)."""
    for old in parent.glob(f"{STAGE_PREFIX}*{STAGE_SUFFIX}"):
        if STAGE_NAME.fullmatch(old.name) and old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)


def stage_model_files(merged: Path, parent: Path, base: Path | None = None) -> tuple[Path, dict[str, dict]]:
    """A private temp folder (0700) in `parent` holding a read-only copy of every merged model file the
    bundle may hold (release_files), and the size and sha256 of each copy (what the manifest records, the
    guard accounts for and the upload sends)."""
    parent.mkdir(parents=True, exist_ok=True)
    remove_stale_stages(parent)
    files, _ = release_files(merged, base)
    stage = Path(tempfile.mkdtemp(prefix=STAGE_PREFIX, suffix=STAGE_SUFFIX, dir=parent))  # mode 0700
    try:
        staged = {}
        for rel, src in files:
            dst = stage / rel
            dst.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            staged[rel] = _copy_private(src, dst, f"{merged}/{rel}")
    except BaseException:
        _remove_stage(stage)
        raise
    return stage, staged


def stage_text(stage: Path, rel: str, text: str) -> dict:
    data = text.encode("utf-8")
    path = stage / rel
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o400), "wb") as fh:
        fh.write(data)
    return {"bytes": len(data), "sha256": io.sha256_bytes(data)}


def _remove_stage(stage: Path) -> None:
    shutil.rmtree(stage, ignore_errors=True)  # read-only files in owner-writable folders: removable


def sources_unchanged(merged: Path, staged: dict[str, dict], base: Path | None = None) -> None:
    """merged/ still holds exactly what was copied and scanned: no file changed, appeared or vanished
    (else the release would describe a folder that no longer exists); CheckFailed naming the file."""
    now = dict(release_files(merged, base)[0])
    for rel in sorted(set(now) | set(staged)):
        if rel not in now or rel not in staged:
            how = "vanished" if rel not in now else "appeared"
            raise CheckFailed(f"{merged}/{printable_name(rel)}: {how} while the release was being checked; "
                              "nothing uploaded, rerun the release")
        if io.sha256_file(now[rel]) != staged[rel]["sha256"]:
            raise CheckFailed(f"{merged}/{printable_name(rel)}: changed after the PHI guard scanned it; nothing "
                              "uploaded, rerun the release")


def release_id(staged: dict[str, dict], manifest: dict, rel: dict, repo_id: str) -> str:
    """What identifies this release on the Hub: the model files' hashes and the card and manifest as they
    would be without their creation time (a rerun of the same release has the same id)."""
    timeless = json.loads(json.dumps(manifest))
    timeless["timestamps"]["created_utc"] = None
    card = render_card(timeless, rel, repo_id)
    identity = {"model_files": {k: v["sha256"] for k, v in sorted(staged.items())},
                "card": io.sha256_bytes(card.encode()), "manifest": config_hash(timeless)}
    return config_hash(identity)
