"""`make gpu-env`'s first step: is this machine's glibc new enough for the GPU lock's wheels?

vLLM 0.17.1 (envs/gpu-lock.txt) publishes only manylinux_2_31 x86_64 wheels: on an older glibc (EL8 login
nodes have 2.28) uv/pip fall back to building vLLM from source, which needs a CUDA toolchain and fails late
and obscurely. Say so in one line, with the route that works there: the container.

    python3 scripts/check_glibc.py [VERSION]    (VERSION: check that glibc instead of this machine's)
Exit 0 when new enough, 1 otherwise. Standard library only: it runs before any venv exists.
"""

from __future__ import annotations

import os
import sys

MIN_GLIBC = (2, 31)  # vLLM 0.17.1's wheel tag manylinux_2_31_x86_64
CONTAINER = ("apptainer build llmrnn-verl.sif profiles/slurm/llmrnn-verl.def && "
             "export LLMRNN_SDM=apptainer LLMRNN_CONTAINER=$PWD/llmrnn-verl.sif")


def glibc_version() -> str | None:
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()  # "glibc 2.36"
    except (ValueError, OSError, AttributeError):
        return None
    return version if name == "glibc" else None


def main(argv: list[str]) -> int:
    version = argv[0] if argv else glibc_version()
    need = ".".join(map(str, MIN_GLIBC))
    try:
        ok = version is not None and tuple(int(x) for x in version.split(".")[:2]) >= MIN_GLIBC
    except ValueError:
        ok = False
    if ok:
        return 0
    print(f"make gpu-env: glibc {version or 'not found'} is older than {need}, and vLLM 0.17.1 ships only "
          f"manylinux_2_31 wheels (it would be built from source): use the container instead: {CONTAINER} "
          "(docs/cluster.md 'Software environments: gpu-env, conda, containers')", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
