"""Many variants side by side on the same test patients: per-variant (and per-seed) accuracy and memory
recall, each variant against the frozen base and each trained variant against a named control, with paired
tests, the family of p-values Holm-corrected, and seed-pooled means whose CIs hold the seed-to-seed spread.

A run is one variant's graded records (the files `llmrnn evaluate grade` writes) for one training seed;
a variant given with seeds is a trained variant, one given without is a single run (the frozen base,
a baseline). Every run must hold the same patients: a comparison on different patients pairs nothing.
"""

from __future__ import annotations

import statistics
from typing import Any

from llmrnn.errors import InputError
from llmrnn.evaluate.gather import (
    ACCURACY_KEYS,
    accuracy,
    check_patients,
    compare_accuracy,
    compare_memory_recall,
)
from llmrnn.evaluate.recall import recall_by_patient
from llmrnn.plots import pyplot, save_png
from llmrnn.runconfig import filled
from llmrnn.stats import holm, seed_patient_bootstrap

Runs = dict[str, dict[str | None, list[dict]]]  # variant -> seed (None: a single, untrained run) -> records
METRICS = ("acc_at_1", "acc_at_5", "memory_recall")
POOLED = "bootstrap over seeds, then patients (one patient draw shared by the drawn seeds)"


def run_label(variant: str, seed: str | None) -> str:
    return f"variant {variant}" if seed is None else f"variant {variant} seed {seed}"


# ----------------------------------------------------------------------------- checks
def check_runs(runs: Runs, base: str, control: str | None) -> None:
    """Every run is graded, free of duplicates, and holds exactly the patients of the first run."""
    if base not in runs:
        raise InputError(f"compare: no base variant {base!r} among {sorted(runs)}")
    if control is not None and control not in runs:
        raise InputError(f"compare: no control variant {control!r} among {sorted(runs)}")
    if control == base:
        raise InputError(f"compare: the control {control!r} is the base; name a trained variant as control")
    first: tuple[str, set[str]] | None = None
    for variant, seeds in runs.items():
        if None in seeds and len(seeds) > 1:
            raise InputError(f"compare: variant {variant} is given both with and without a seed")
        for seed, records in seeds.items():
            label = run_label(variant, seed)
            if not records:
                raise InputError(f"compare: {label}: no graded patients")
            check_patients(label, records)
            pids = {str(r["patient_id"]) for r in records}
            if first is None:
                first = (label, pids)
                continue
            ref_label, ref_pids = first
            if missing := sorted(ref_pids - pids):
                raise InputError(f"compare: {label} was not evaluated on patient {missing[0]} ({ref_label} was); "
                                 "every variant must be evaluated on the same test patients")
            if extra := sorted(pids - ref_pids):
                raise InputError(f"compare: {label} was evaluated on patient {extra[0]}, which {ref_label} was not; "
                                 "every variant must be evaluated on the same test patients")


# ----------------------------------------------------------------------------- per-patient values
def last_grades(records: list[dict]) -> dict[str, dict]:
    return {str(r["patient_id"]): r["visits"][-1]["grade"] for r in records}


def accuracy_table(rows: list[dict[str, dict]], key: str, pids: list[str]) -> list[list[float]]:
    return [[float(bool(grades[p][key])) for p in pids] for grades in rows]


def recall_table(rows: list[dict[str, float]]) -> tuple[list[str], list[list[float]]]:
    """Per-patient memory recall of each run on the patients every run has a transition for."""
    pids = sorted(set.intersection(*(set(r) for r in rows))) if rows else []
    return pids, [[r[p] for p in pids] for r in rows]


def pooled(table: list[list[float]], boot: dict, key: str = "value") -> dict | None:
    """The mean of a (seeds x patients) table under `key`, with its CI from the bootstrap over both."""
    if not table or not table[0]:
        return None
    bs = seed_patient_bootstrap(table, samples=int(boot["samples"]), seed=int(boot["seed"]))
    return {key: bs["mean"], "ci95": bs["ci95"], "ci_method": POOLED, "n_seeds": bs["n_seeds"], "n": bs["n"],
            "bootstrap": {"samples": bs["samples"], "seed": bs["seed"], "se": bs.get("se")}}


# ----------------------------------------------------------------------------- variants
def run_row(seed: str | None, records: list[dict]) -> dict:
    """One run's Acc@1/Acc@5 at the last visit (Wilson CI) and memory recall (mean over patients)."""
    grades = list(last_grades(records).values())
    row: dict[str, Any] = {"seed": seed, "n_patients": len(grades), **accuracy(grades)}
    recall = recall_by_patient(records)
    row["memory_recall"] = ({"value": statistics.fmean(recall.values()), "n_patients": len(recall)}
                            if recall else None)
    return row


def variant_summary(seeds: dict[str | None, list[dict]], boot: dict) -> dict:
    """A variant's rows (one per seed) and, for a trained variant, its mean over seeds and patients."""
    trained = None not in seeds
    out: dict[str, Any] = {"kind": "trained" if trained else "single run",
                           "rows": [run_row(seed, recs) for seed, recs in seeds.items()]}
    if trained:
        grades = [last_grades(recs) for recs in seeds.values()]
        pids = sorted(grades[0])
        out["mean"] = {metric: pooled(accuracy_table(grades, key, pids), boot) for key, metric in ACCURACY_KEYS}
        out["mean"]["memory_recall"] = pooled(recall_table([recall_by_patient(r) for r in seeds.values()])[1], boot)
    return out


# ----------------------------------------------------------------------------- comparisons
def paired_runs(runs: Runs, a: str, b: str) -> list[tuple[str | None, list[dict], list[dict]]]:
    """(seed, a's records, b's records) per seed of b: a run of a without seeds serves every seed of b; a
    trained a is paired seed by seed (the seeds multiply every trained variant alike)."""
    out = []
    for seed, b_records in runs[b].items():
        if None in runs[a]:
            out.append((seed, runs[a][None], b_records))
        elif seed in runs[a]:
            out.append((seed, runs[a][seed], b_records))
        else:
            raise InputError(f"compare: {run_label(b, seed)} has no counterpart in variant {a} "
                             f"(its seeds: {', '.join(map(str, runs[a]))}); pair variants over the same seeds")
    return out


def compare_pair(runs: Runs, a: str, b: str, against: str, boot: dict, exact_below: int) -> dict:
    """b vs a: one row of paired tests per seed of b; for a trained b the mean difference over seeds with
    a CI from the bootstrap over seeds and patients (paired: each value is a patient's b - a)."""
    pairs = paired_runs(runs, a, b)
    rows = []
    for seed, a_records, b_records in pairs:
        row: dict[str, Any] = {"seed": seed, "n_pairs": len(a_records)}
        row.update(compare_accuracy(last_grades(a_records), last_grades(b_records), boot, exact_below))
        row["memory_recall"] = compare_memory_recall(a_records, b_records, boot)
        rows.append(row)
    out: dict[str, Any] = {"name": f"{b} vs {a}", "a": a, "b": b, "against": against, "difference": "b - a",
                           "rows": rows}
    if None not in runs[b]:
        a_grades = [last_grades(x) for _, x, _ in pairs]
        b_grades = [last_grades(y) for _, _, y in pairs]
        pids = sorted(a_grades[0])
        out["mean"] = {}
        for key, metric in ACCURACY_KEYS:
            a_tab, b_tab = accuracy_table(a_grades, key, pids), accuracy_table(b_grades, key, pids)
            out["mean"][metric] = pooled([[y - x for x, y in zip(ra, rb)] for ra, rb in zip(a_tab, b_tab)], boot,
                                         key="diff")
        recall_pids, table = recall_table([recall_by_patient(x) for _, x, _ in pairs]
                                          + [recall_by_patient(y) for _, _, y in pairs])
        half = len(pairs)
        out["mean"]["memory_recall"] = pooled(
            [[y - x for x, y in zip(ra, rb)] for ra, rb in zip(table[:half], table[half:])], boot, key="diff"
        ) if recall_pids else None
    return out


def tests_of(comparison: dict) -> list[tuple[str, str | None, str, dict]]:
    """(metric, seed, test name, the test's dict) of every p-value a comparison holds."""
    found = []
    for row in comparison["rows"]:
        for metric in ("acc_at_1", "acc_at_5"):
            found.append((metric, row["seed"], "mcnemar", row[metric]["mcnemar"]))
        if row["memory_recall"] is not None:
            found.append(("memory_recall", row["seed"], "wilcoxon", row["memory_recall"]["wilcoxon"]))
    return found


def correct_family(comparisons: list[dict], alpha: float) -> dict:
    """Holm over every p-value of every comparison; each test's dict gains p_holm, the family is listed."""
    family = [(c["name"], *t) for c in comparisons for t in tests_of(c)]
    adjusted = holm([test["p_value"] for *_, test in family])
    listed = []
    for (name, metric, seed, test_name, test), p_holm in zip(family, adjusted):
        test["p_holm"] = p_holm
        listed.append({"comparison": name, "seed": seed, "metric": metric, "test": test_name,
                       "p_value": test["p_value"], "p_holm": p_holm, "significant": p_holm <= alpha})
    return {"method": "holm", "alpha": alpha, "size": len(listed), "tests": listed}


def compare_variants(runs: Runs, base: str = "base", control: str | None = None, stats: dict | None = None,
                     alpha: float = 0.05, base_of: dict[str, str] | None = None) -> dict:
    """The comparison document (eval/comparison.json) of `runs` ({variant: {seed: graded records}}).
    `base_of`: a trained variant's own frozen base where it is not `base` (a variant whose inputs differ: its
    base model evaluated on its own prompts), so its gain is measured against the model it started from."""
    check_runs(runs, base, control)
    base_of = dict(base_of or {})
    for variant, own in base_of.items():
        if variant not in runs or None in runs[variant]:
            raise InputError(f"compare: --base-of {variant}={own}: {variant} is not a trained variant")
        if own not in runs or None not in runs[own]:
            raise InputError(f"compare: --base-of {variant}={own}: {own} is not a single (untrained) run")
    stats = filled("eval.stats", stats)
    boot, exact_below = stats["bootstrap"], int(stats["mcnemar_exact_below"])
    comparisons = [compare_pair(runs, base_of.get(v, base), v, "base", boot, exact_below) for v in runs if v != base]
    if control is not None:
        trained = [v for v, seeds in runs.items() if None not in seeds and v not in (base, control)]
        comparisons += [compare_pair(runs, control, v, "control", boot, exact_below) for v in trained]
    family = correct_family(comparisons, alpha)
    first = next(iter(next(iter(runs.values())).values()))
    return {
        "base": base,
        "base_of": base_of,
        "control": control,
        "n_patients": len(first),
        "scored_visit": "last visit of each patient (Acc@1, Acc@5); memory recall over every transition",
        "variants": {v: variant_summary(seeds, boot) for v, seeds in runs.items()},
        "comparisons": comparisons,
        "family": family,
    }


# ----------------------------------------------------------------------------- forest plot
def plot_forest(comparison: dict, out) -> None:
    """One row per comparison, one panel per metric: each seed's difference (open dots, its patient bootstrap
    CI thin) and the trained variant's mean with its seed-and-patient CI (filled, thick); the Holm-corrected
    p-values of the seeds at the right."""
    plt = pyplot()
    comps = comparison["comparisons"]
    fig, axes = plt.subplots(1, len(METRICS), figsize=(4.2 * len(METRICS), 0.55 * len(comps) + 1.6), sharey=True)
    for ax, metric in zip(axes, METRICS):
        for y, c in enumerate(comps):
            rows = [r for r in c["rows"] if r[metric] is not None]
            for k, r in enumerate(rows):
                dy = (k - (len(rows) - 1) / 2) * 0.12
                lo, hi = r[metric]["ci95"]
                ax.errorbar(r[metric]["diff"], y + dy, xerr=[[r[metric]["diff"] - lo], [hi - r[metric]["diff"]]],
                            fmt="o", mfc="white", color="#1f77b4", lw=0.8, ms=4, capsize=2)
            mean = (c.get("mean") or {}).get(metric)
            if mean is not None:
                lo, hi = mean["ci95"]
                ax.errorbar(mean["diff"], y, xerr=[[mean["diff"] - lo], [hi - mean["diff"]]], fmt="D",
                            color="black", lw=2, ms=5, capsize=3)
            tests = [r[metric]["mcnemar" if metric != "memory_recall" else "wilcoxon"] for r in rows]
            if tests:
                ax.text(1.02, y, "p_holm " + ", ".join(f"{t['p_holm']:.2g}" for t in tests), fontsize=7,
                        va="center", transform=ax.get_yaxis_transform())
        ax.axvline(0, color="grey", lw=0.8, ls="--")
        ax.set_title({"acc_at_1": "Acc@1", "acc_at_5": "Acc@5", "memory_recall": "memory recall"}[metric])
        ax.set_xlabel("difference (b - a)")
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(comps)), [c["name"] for c in comps])
    axes[0].invert_yaxis()
    fig.suptitle(f"Paired differences on {comparison['n_patients']} test patients: seeds (open, patient CI) and "
                 "seed mean (filled, seed-and-patient CI); Holm over the family", fontsize=9)
    fig.tight_layout()
    save_png(fig, out)
    plt.close(fig)
