"""Many variants and seeds on the same 30 test patients: a planted gain is found after Holm, a marginal one is
not, unpaired patients are refused, and a gain one seed makes and the other does not gets a wide CI."""

from __future__ import annotations

import json

import pytest

from llmrnn import cli, evaluate, io
from llmrnn.errors import InputError
from llmrnn.evaluate.comparison import compare_variants, plot_forest

TRUTH = ["congestive heart failure", "type 2 diabetes mellitus"]
RIGHT = {"primary_diagnosis": "CHF", "top_5_diagnoses": ["CHF", "anemia"]}
TOP5_ONLY = {"primary_diagnosis": "anemia", "top_5_diagnoses": ["anemia", "T2DM"]}
WRONG = {"primary_diagnosis": "hip fracture", "top_5_diagnoses": ["hip fracture"]}
REMEMBERS = json.dumps({"evolving_summary": "congestive heart failure, type 2 diabetes mellitus"})
FORGETS = json.dumps({"evolving_summary": "no known history"})
N = 30
STATS = {"bootstrap": {"samples": 2000, "seed": 0}, "mcnemar_exact_below": 25}
JUDGE = evaluate.FinalJudge({"mode": "matcher", "matcher": {"threshold": 0.5, "primary_target": "first"}})


def run(right: set[int], top5: set[int] = frozenset(), memory: str = FORGETS, patients=range(N)) -> list[dict]:
    """Graded records (the real matcher grades them): two visits per patient, the last one predicted RIGHT for
    the patients in `right`, TOP5_ONLY for those in `top5`, WRONG otherwise; `memory` is h_0, shown at visit 1."""
    records = []
    for i in patients:
        last = RIGHT if i in right else TOP5_ONLY if i in top5 else WRONG
        visits = [{"visit_index": t, "visit_id": f"v{t}", "ground_truth": TRUTH, "prediction": pred,
                   "prediction_ok": True, "h_prev": h}
                  for t, (pred, h) in enumerate([(WRONG, FORGETS), (last, memory)])]
        records.append({"patient_id": f"p{i:02d}", "visits": visits})
    return evaluate.grade_records(records, JUDGE)


BASE_RIGHT = set(range(6))  # 6 of 30 right at the last visit
# the control: 8 base-wrong patients right, 1 base-right patient wrong; exact McNemar p = 2 * 10 / 2^9 = 0.039
CONTROL_RIGHT = (BASE_RIGHT - {0}) | set(range(6, 14))
GOOD_RIGHT = set(range(24))  # 18 more than the base, none fewer: p = 2 / 2^18


@pytest.fixture(scope="module")
def runs():
    return {
        "base": {None: run(BASE_RIGHT, top5=set(range(6, 10)))},
        "control": {s: run(CONTROL_RIGHT, top5=set(range(14, 16))) for s in ("1", "2")},
        "good": {s: run(GOOD_RIGHT, memory=REMEMBERS) for s in ("1", "2")},
    }


@pytest.fixture(scope="module")
def comparison(runs):
    return compare_variants(runs, base="base", control="control", stats=STATS)


def by_name(comparison: dict) -> dict[str, dict]:
    return {c["name"]: c for c in comparison["comparisons"]}


def test_every_variant_and_seed_has_its_row(comparison):
    v = comparison["variants"]
    assert v["base"]["kind"] == "single run" and "mean" not in v["base"]
    assert [r["seed"] for r in v["good"]["rows"]] == ["1", "2"]
    assert v["good"]["rows"][0]["acc_at_1"]["correct"] == 24 and v["good"]["rows"][0]["acc_at_1"]["n"] == N
    assert v["base"]["rows"][0]["acc_at_5"]["correct"] == 10
    lo, hi = v["good"]["rows"][0]["acc_at_1"]["ci95"]
    assert lo < 0.8 < hi and v["good"]["rows"][0]["acc_at_1"]["ci_method"] == "wilson"
    assert v["good"]["rows"][1]["memory_recall"]["value"] == 1.0
    assert v["base"]["rows"][0]["memory_recall"]["value"] == 0.0
    assert v["good"]["mean"]["acc_at_1"]["value"] == pytest.approx(0.8)
    assert v["good"]["mean"]["acc_at_1"]["n_seeds"] == 2
    # which pairs: each variant vs the base, each trained variant other than the control vs the control
    assert set(by_name(comparison)) == {"control vs base", "good vs base", "good vs control"}
    assert comparison["n_patients"] == N


def test_a_planted_gain_is_significant_after_holm_and_a_marginal_one_is_not(comparison):
    comps = by_name(comparison)
    family = comparison["family"]
    assert family["size"] == 3 * 2 * 3  # comparisons x seeds x (McNemar Acc@1, McNemar Acc@5, Wilcoxon recall)
    good = comps["good vs base"]["rows"][0]["acc_at_1"]
    assert good["diff"] == pytest.approx(18 / N)
    assert good["mcnemar"]["p_value"] == pytest.approx(2 / 2**18)
    assert good["mcnemar"]["p_holm"] < 0.001
    assert comps["good vs base"]["rows"][1]["memory_recall"]["wilcoxon"]["p_holm"] < 0.05
    assert comps["good vs control"]["rows"][0]["acc_at_1"]["mcnemar"]["p_holm"] < 0.05
    marginal = comps["control vs base"]["rows"][0]["acc_at_1"]["mcnemar"]
    assert marginal["p_value"] == pytest.approx(20 / 2**9)  # below 0.05 uncorrected
    assert marginal["p_holm"] > 0.05  # not after Holm over the 18 tests
    mean = comps["good vs base"]["mean"]
    assert mean["acc_at_1"]["diff"] == pytest.approx(0.6) and mean["acc_at_1"]["ci95"][0] > 0.3
    assert mean["memory_recall"]["diff"] == 1.0 and mean["acc_at_1"]["n_seeds"] == 2
    assert "mean" not in comps["good vs base"]["rows"][0]  # a row is one seed; the mean is the variant's
    listed = {(t["comparison"], t["seed"], t["metric"]): t for t in family["tests"]}
    assert listed[("control vs base", "1", "acc_at_1")]["significant"] is False
    assert listed[("good vs base", "2", "acc_at_1")]["significant"] is True
    assert listed[("control vs base", "2", "memory_recall")]["p_value"] == 1.0  # both memories recall nothing


def test_variants_on_different_patients_are_refused(runs):
    short = {**runs, "good": {"1": runs["good"]["1"], "2": run(GOOD_RIGHT, patients=range(1, N))}}
    with pytest.raises(InputError, match=r"^compare: variant good seed 2 was not evaluated on patient p00 "):
        compare_variants(short, control="control", stats=STATS)
    longer = {**runs, "zero_shot": {None: run(set(), patients=range(N + 1))}}
    with pytest.raises(InputError, match=r"variant zero_shot was evaluated on patient p30, which variant base"):
        compare_variants(longer, control="control", stats=STATS)
    with pytest.raises(InputError, match=r"^compare: variant good seed 1: no graded patients$"):
        compare_variants({**runs, "good": {"1": []}}, stats=STATS)
    with pytest.raises(InputError, match=r"no control variant 'ctrl'"):
        compare_variants(runs, control="ctrl", stats=STATS)


def test_a_gain_one_seed_makes_and_the_other_does_not_gets_a_wider_ci():
    base = run(BASE_RIGHT)
    runs = {
        "base": {None: base},
        "steady": {s: run(BASE_RIGHT | set(range(6, 15))) for s in ("1", "2")},  # +9 patients on both seeds
        "fickle": {"1": run(BASE_RIGHT | set(range(6, 24))), "2": run(BASE_RIGHT)},  # +18, then +0
    }
    comps = by_name(compare_variants(runs, stats=STATS))
    steady, fickle = comps["steady vs base"]["mean"]["acc_at_1"], comps["fickle vs base"]["mean"]["acc_at_1"]
    assert steady["diff"] == pytest.approx(0.3) and fickle["diff"] == pytest.approx(0.3)  # the same mean gain
    assert [r["acc_at_1"]["diff"] for r in comps["fickle vs base"]["rows"]] == pytest.approx([0.6, 0.0])
    width = lambda m: m["ci95"][1] - m["ci95"][0]
    assert width(fickle) > 1.5 * width(steady)
    assert fickle["ci95"][0] <= 0.05  # the seed that gained nothing is inside the interval
    assert steady["ci95"][0] > 0.1


def test_seeds_pair_seed_by_seed_with_a_trained_control(runs):
    unpaired = {**runs, "good": {"3": runs["good"]["1"]}}
    with pytest.raises(InputError, match=r"variant good seed 3 has no counterpart in variant control"):
        compare_variants(unpaired, control="control", stats=STATS)


def test_forest_plot_and_cli(tmp_path, runs, comparison, capsys):
    argv = []
    for variant, seeds in runs.items():
        for seed, records in seeds.items():
            for k in range(2):  # two shards per run: a run's shards are one set of patients
                path = tmp_path / variant / (seed or "single") / f"graded_{k}.jsonl"
                path.parent.mkdir(parents=True, exist_ok=True)
                io.write_jsonl(path, records[k::2])
                argv += ["--variant", f"{variant}{'@' + seed if seed else ''}={path}"]
    out, plot = tmp_path / "comparison.json", tmp_path / "forest.png"
    assert cli.main(["evaluate", "compare", *argv, "--control", "control", "--out", str(out), "--plot", str(plot),
                     "--cfg", json.dumps({"stats": STATS})]) in (0, None)
    assert json.loads(out.read_text()) == json.loads(json.dumps(comparison))  # shards change nothing
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plot_forest(comparison, tmp_path / "again.png")
    assert (tmp_path / "again.png").stat().st_size > 10_000

    capsys.readouterr()
    bad = [a.replace("good@2=", "good@2=" + str(tmp_path / "missing") + "/") if a.startswith("good@2=") else a
           for a in argv]
    assert cli.main(["evaluate", "compare", *bad, "--out", str(tmp_path / "x.json")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "graded shard not found" in err[0] and "good@2" in err[0]
    assert cli.main(["evaluate", "compare", "--variant", "good@=x.jsonl", "--out", str(tmp_path / "x.json")]) != 0
    assert "expected NAME=PATH or NAME@SEED=PATH" in capsys.readouterr().err


def test_a_variant_on_other_inputs_is_measured_against_its_own_base(runs):
    """--base-of: a trained variant whose inputs differ (another cohort's prompts) is compared with its own frozen
    base, not the shared one; a name that is not a trained variant, or a base that is not a single run, is one
    line."""
    own_base = run(set(range(20)))  # its inputs make the untrained model right on 20 of 30
    with_own = {**runs, "base_other": {None: own_base}, "other": {s: run(GOOD_RIGHT) for s in ("1", "2")}}
    comps = by_name(compare_variants(with_own, control="control", stats=STATS, base_of={"other": "base_other"}))
    assert comps["other vs base_other"]["against"] == "base" and "other vs base" not in comps
    assert comps["other vs base_other"]["mean"]["acc_at_1"]["diff"] == pytest.approx(4 / 30)
    assert comps["good vs base"]["mean"]["acc_at_1"]["diff"] == pytest.approx(18 / 30)  # the others: the shared base
    with pytest.raises(InputError, match="base_other is not a trained variant"):
        compare_variants(with_own, stats=STATS, base_of={"base_other": "base"})
    with pytest.raises(InputError, match="good is not a single"):
        compare_variants(with_own, stats=STATS, base_of={"other": "good"})
