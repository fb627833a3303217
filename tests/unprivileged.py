"""Commands that must meet file permissions even when the tests run as root (CI does): root reads a
chmod-000 file and writes into a read-only folder only through its capabilities CAP_DAC_OVERRIDE /
CAP_DAC_READ_SEARCH (and changes modes through CAP_FOWNER). `without_override(argv)` runs argv with those
dropped from its bounding set (util-linux setpriv), so root meets file modes like any user; as a normal
user it runs argv as it is."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DROP = "--bounding-set=-dac_override,-dac_read_search,-fowner"


def without_override(argv: list[str], **kw) -> subprocess.CompletedProcess:
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without util-linux setpriv: root ignores file modes")
        argv = [setpriv, DROP, "--", *argv]
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=300, **kw)


def llmrnn(*args: str) -> subprocess.CompletedProcess:
    """`llmrnn <args>` from this checkout, meeting file permissions."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    return without_override([sys.executable, "-m", "llmrnn.cli", *args], env=env)
