"""Statistics for the held-out comparison: Wilson intervals, paired bootstrap (over patients, and over seeds and
patients), McNemar, Wilcoxon signed-rank, Holm's correction of a family of p-values."""

from __future__ import annotations

import math
from collections.abc import Sequence

Z95 = 1.959963984540054


def percentile(values: Sequence[float], q: float, method: str = "linear") -> float | None:
    """The q-th percentile (q in [0, 100]) of `values`, None when empty. `method` is numpy's: "linear"
    interpolates; "inverted_cdf" is the nearest rank (always an observed value, e.g. a token length)."""
    import numpy as np

    if len(values) == 0:
        return None
    return np.percentile(np.asarray(values), q, method=method).item()


def wilson_ci(correct: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score 95% interval of a proportion correct/n; (0, 1) when n == 0."""
    if n == 0:
        return (0.0, 1.0)
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def _replicates(samples: int, n: int, draw):
    """`samples` bootstrap statistics over n units, drawn `draw(size)` at a time in chunks that bound the
    index arrays' memory (n = 6288 patients in the reference)."""
    import numpy as np

    out = np.empty(samples)
    chunk = max(1, min(samples, 2_000_000 // max(n, 1)))
    for start in range(0, samples, chunk):
        stop = min(samples, start + chunk)
        out[start:stop] = draw(stop - start)
    return out


def paired_bootstrap(
    a: Sequence[bool | int | float],
    b: Sequence[bool | int | float],
    samples: int = 10_000,
    seed: int = 0,
    level: float = 0.95,
) -> dict:
    """Difference mean(b) - mean(a) over paired units, with a percentile bootstrap CI.

    Units (patients) are resampled with replacement, keeping each unit's pair together.
    """
    import numpy as np

    if len(a) != len(b):
        raise ValueError(f"paired_bootstrap: {len(a)} vs {len(b)} outcomes; pairs must align")
    n = len(a)
    if n == 0:
        return {"diff": None, "ci95": [None, None], "samples": samples, "seed": seed, "n": 0}
    diff_units = np.asarray(b, dtype=float) - np.asarray(a, dtype=float)
    rng = np.random.default_rng(seed)
    diffs = _replicates(samples, n, lambda size: diff_units[rng.integers(0, n, size=(size, n))].mean(axis=1))
    alpha = (1 - level) / 2
    lo, hi = np.quantile(diffs, [alpha, 1 - alpha])
    return {
        "diff": float(diff_units.mean()),
        "ci95": [float(lo), float(hi)],
        "se": float(diffs.std(ddof=1)) if samples > 1 else None,
        "samples": samples,
        "seed": seed,
        "n": n,
    }


def mcnemar(a: Sequence[bool], b: Sequence[bool], exact_below: int = 25) -> dict:
    """McNemar's test on paired binary outcomes.

    Discordant counts: n01 = a wrong & b right, n10 = a right & b wrong. With n01 + n10 < exact_below the
    exact two-sided binomial test (p = min(1, 2 * P[X <= min(n01, n10)]), X ~ Bin(n01 + n10, 1/2));
    otherwise the chi-square statistic with continuity correction (|n01 - n10| - 1)^2 / (n01 + n10), 1 df.
    """
    from scipy import stats as sps

    if len(a) != len(b):
        raise ValueError(f"mcnemar: {len(a)} vs {len(b)} outcomes; pairs must align")
    n11 = sum(1 for x, y in zip(a, b) if x and y)
    n00 = sum(1 for x, y in zip(a, b) if not x and not y)
    n01 = sum(1 for x, y in zip(a, b) if not x and y)
    n10 = sum(1 for x, y in zip(a, b) if x and not y)
    discordant = n01 + n10
    table = {"both_correct": n11, "both_wrong": n00, "only_b_correct": n01, "only_a_correct": n10}
    if discordant == 0:
        return {**table, "method": "none (no discordant pairs)", "statistic": None, "p_value": 1.0}
    if discordant < exact_below:
        p = sps.binomtest(min(n01, n10), discordant, 0.5, alternative="two-sided").pvalue
        return {**table, "method": "exact binomial", "statistic": min(n01, n10), "p_value": float(min(1.0, p))}
    stat = (abs(n01 - n10) - 1) ** 2 / discordant
    return {
        **table,
        "method": "chi-square, continuity corrected",
        "statistic": float(stat),
        "p_value": float(sps.chi2.sf(stat, 1)),
    }


def wilcoxon_signed_rank(a: Sequence[float], b: Sequence[float]) -> dict:
    """Two-sided Wilcoxon signed-rank test of b - a over paired units (scipy; zero differences dropped,
    exact distribution for small n without ties, normal approximation otherwise)."""
    from scipy import stats as sps

    if len(a) != len(b):
        raise ValueError(f"wilcoxon_signed_rank: {len(a)} vs {len(b)} values; pairs must align")
    diffs = [float(y) - float(x) for x, y in zip(a, b)]
    nonzero = [d for d in diffs if d != 0]
    out = {"n": len(diffs), "n_nonzero": len(nonzero), "b_better": sum(d > 0 for d in nonzero),
           "a_better": sum(d < 0 for d in nonzero)}
    if not nonzero:
        return {**out, "method": "none (all differences zero)", "statistic": None, "p_value": 1.0}
    res = sps.wilcoxon(nonzero, zero_method="wilcox", alternative="two-sided")
    return {**out, "method": "wilcoxon signed-rank", "statistic": float(res.statistic), "p_value": float(res.pvalue)}


def seed_patient_bootstrap(
    values: Sequence[Sequence[float]],
    samples: int = 10_000,
    seed: int = 0,
    level: float = 0.95,
) -> dict:
    """Mean of a (seeds x patients) table with a percentile bootstrap CI that holds both spreads.

    Each replicate draws the seeds with replacement, then the patients with replacement; the same patient
    draw serves every drawn seed, since every seed was evaluated on the same patients. `values` is one
    value per (seed, patient) (a per-patient difference b - a keeps each patient's pair together), so a
    mean that one seed makes and another does not gets a wide interval, which patients alone cannot give.
    """
    import numpy as np

    table = np.asarray(values, dtype=float)
    if table.ndim != 2:
        raise ValueError(f"seed_patient_bootstrap: expected a seeds x patients table, got shape {table.shape}")
    n_seeds, n = table.shape
    out = {"samples": samples, "seed": seed, "n_seeds": n_seeds, "n": n}
    if n_seeds == 0 or n == 0:
        return {**out, "mean": None, "ci95": [None, None]}
    rng = np.random.default_rng(seed)

    def replicate(size: int):
        picked = rng.integers(0, n_seeds, size=(size, n_seeds))
        # a drawn seed's weight = how often it was drawn: the replicate's per-patient mean over its seeds
        weights = (picked[:, :, None] == np.arange(n_seeds)).sum(axis=1) / n_seeds
        per_patient = weights @ table
        patients = rng.integers(0, n, size=(size, n))
        return np.take_along_axis(per_patient, patients, axis=1).mean(axis=1)

    means = _replicates(samples, n, replicate)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return {**out, "mean": float(table.mean()), "ci95": [float(lo), float(hi)],
            "se": float(means.std(ddof=1)) if samples > 1 else None}


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order.

    Sorted ascending, the k-th smallest (k from 0) is multiplied by m - k, the running maximum keeps the
    adjusted values in the order of the raw ones, and each is capped at 1. Rejecting where the adjusted
    value is <= alpha controls the family-wise error rate at alpha, whatever the dependence between tests.
    """
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for k, i in enumerate(order):
        p = float(p_values[i])
        if not 0.0 <= p <= 1.0 or math.isnan(p):
            raise ValueError(f"holm: p-value {p_values[i]!r} is not in [0, 1]")
        running = max(running, min(1.0, (m - k) * p))
        adjusted[i] = running
    return adjusted
