"""How much the user may still write where a path lives: the filesystem's free space (statvfs) AND the user's
quota, which statvfs does not see (a Lustre scratch with terabytes free refuses a write over the quota).

- Lustre: `lfs quota -q -u $USER <dir>` (the kbytes used and the block limits of that filesystem);
- other filesystems: `quota -w` (the blocks used and limits per filesystem, matched by device or mount point);
- neither answers: the report says quotas were not checked.
"""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Quota:
    left_gb: float | None  # GB the quota still allows (None: no quota limits this user there)
    limit_gb: float | None
    note: str  # what was checked, said in the preflight report


def _run(argv: list[str], timeout_s: float, ok: tuple[int, ...] = (0,)) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode in ok else None


def _kb(value: str) -> int | None:
    value = value.rstrip("*")  # `*`: over the soft limit
    return int(value) if value.isdigit() else None


def _limit(used_kb: int, soft: int | None, hard: int | None, tool: str) -> Quota:
    limits = [q for q in (soft, hard) if q]  # 0: no limit; the tighter one counts
    if not limits:
        return Quota(None, None, f"{tool}: no quota limit on this filesystem")
    limit = min(limits)
    left = max(0, limit - used_kb) * 1024 / 1e9
    return Quota(round(left, 2), round(limit * 1024 / 1e9, 2),
                 f"{tool}: {round(used_kb * 1024 / 1e9, 2)} GB used of a {round(limit * 1024 / 1e9, 2)} GB quota")


def parse_lfs(out: str) -> tuple[int, int | None, int | None] | None:
    """(kbytes used, soft, hard) from `lfs quota -q -u USER DIR` (its first line: fs kbytes quota limit grace
    files ...; a long filesystem name may stand on a line of its own)."""
    fields = out.split()
    for i in range(len(fields) - 3):
        used, soft, hard = (_kb(f) for f in fields[i + 1:i + 4])
        if fields[i].startswith("/") and used is not None and soft is not None and hard is not None:
            return used, soft, hard
    return None


def _mount_of(path: Path) -> tuple[str, str]:
    """(device, mount point) of the filesystem holding path (/proc/mounts; the longest mount point prefix)."""
    path = path.resolve()
    best = ("", "/")
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return best
    for line in mounts:
        parts = line.split()
        if len(parts) >= 2 and (path == Path(parts[1]) or Path(parts[1]) in path.parents) \
                and len(parts[1]) >= len(best[1]):
            best = (parts[0], parts[1])
    return best


def parse_quota(out: str, device: str, mount: str) -> tuple[int, int | None, int | None] | None:
    """(blocks used in KiB, soft, hard) of the filesystem `device`/`mount` from `quota -w` (one line per
    filesystem: fs blocks quota limit grace files quota limit grace; blocks are 1 KiB)."""
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[0] in (device, mount):
            used, soft, hard = (_kb(f) for f in fields[1:4])
            if used is not None:
                return used, soft, hard
    return None


def user_quota(path: str | os.PathLike, timeout_s: float = 30) -> Quota:
    """The user's quota where path lives, by the first tool that answers for it."""
    user = os.environ.get("USER") or getpass.getuser()
    path = Path(path)
    out = _run(["lfs", "quota", "-q", "-u", user, str(path)], timeout_s)
    if out is not None and (found := parse_lfs(out)):
        return _limit(*found, tool=f"lfs quota -u {user}")
    out = _run(["quota", "-w"], timeout_s, ok=(0, 1))  # 1: over a quota (quota-tools)
    if out is not None:
        device, mount = _mount_of(path)
        found = parse_quota(out, device, mount)
        return _limit(*found, tool="quota -w") if found else Quota(None, None, f"quota -w: no quota on {mount}")
    return Quota(None, None, "quotas not checked: neither `lfs quota` nor `quota` answered here (free disk only)")
