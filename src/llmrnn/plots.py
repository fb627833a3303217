"""Matplotlib without a display, and PNGs written whole: what every report's figures share."""

from __future__ import annotations

from pathlib import Path

from llmrnn import io


def pyplot():
    # lazy: matplotlib (+0.5 s) only where a figure is drawn
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: str | Path) -> None:
    with io.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
