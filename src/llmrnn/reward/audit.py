"""The judge audit: every scored sample appended to AUDIT_DIR/calls_<pid>.jsonl (mode 0600)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path

from llmrnn.errors import CheckFailed


class AuditLog:
    """Append-only JSONL per process (calls_<pid>.jsonl, mode 0600, directory 0700); fork-safe."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self._lock = threading.Lock()
        self._fh = None
        self._pid = None

    @property
    def path(self) -> Path:
        return self.directory / f"calls_{os.getpid()}.jsonl"

    def write(self, record: dict) -> None:
        """Append one record; a full disk or an unwritable audit dir is one CheckFailed naming the file
        (every scored sample must be audited: scoring stops rather than goes on unaudited)."""
        line = json.dumps(record, ensure_ascii=False, default=str) + "\n"
        with self._lock:
            try:
                if self._fh is None or self._pid != os.getpid():
                    self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
                    fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                    os.fchmod(fd, 0o600)
                    self._fh = os.fdopen(fd, "a", encoding="utf-8")
                    self._pid = os.getpid()
                self._fh.write(line)
                self._fh.flush()
            except OSError as exc:
                fh, self._fh = self._fh, None  # a half-written line is not appended to on the next try
                if fh is not None:
                    with contextlib.suppress(OSError):
                        fh.close()
                raise CheckFailed(f"{self.path}: cannot write the judge audit ({exc.strerror or exc}); "
                                  "free disk space or fix the audit directory, then rerun") from None

