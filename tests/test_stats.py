"""Statistics checked against values computed by hand."""

from __future__ import annotations

import math

import pytest

from llmrnn.stats import holm, mcnemar, paired_bootstrap, seed_patient_bootstrap, wilson_ci


def test_wilson_8_of_10_by_hand():
    # p = .8, z^2 = 3.8415: centre = (0.8 + 0.19207) / 1.38415 = 0.71681, half = 1.96*sqrt(.016+.0096)/1.38415
    lo, hi = wilson_ci(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-4)
    assert hi == pytest.approx(0.9433, abs=1e-4)
    assert wilson_ci(0, 0) == (0.0, 1.0)


def _pairs(both: int, neither: int, only_b: int, only_a: int) -> tuple[list[bool], list[bool]]:
    a = [True] * both + [False] * neither + [False] * only_b + [True] * only_a
    b = [True] * both + [False] * neither + [True] * only_b + [False] * only_a
    return a, b


def test_mcnemar_exact_small_table_by_hand():
    # 7 discordant pairs split 6/1: P[X <= 1] = (1 + 7) / 2^7 = 0.0625, two-sided p = 0.125
    a, b = _pairs(both=10, neither=5, only_b=6, only_a=1)
    res = mcnemar(a, b)
    assert res["method"] == "exact binomial"
    assert (res["only_b_correct"], res["only_a_correct"]) == (6, 1)
    assert res["p_value"] == pytest.approx(0.125, abs=1e-12)


def test_mcnemar_chi_square_large_table_by_hand():
    # 35 discordant pairs split 25/10: (|25 - 10| - 1)^2 / 35 = 5.6; p = erfc(sqrt(5.6 / 2)) = 0.017960
    a, b = _pairs(both=50, neither=40, only_b=25, only_a=10)
    res = mcnemar(a, b)
    assert res["method"].startswith("chi-square")
    assert res["statistic"] == pytest.approx(5.6)
    assert res["p_value"] == pytest.approx(math.erfc(math.sqrt(2.8)), rel=1e-9)
    assert res["p_value"] == pytest.approx(0.01796, abs=1e-5)


def test_mcnemar_no_discordant_pairs():
    a, b = _pairs(both=3, neither=2, only_b=0, only_a=0)
    assert mcnemar(a, b)["p_value"] == 1.0


def test_paired_bootstrap_matches_the_analytic_paired_interval():
    # 200 pairs, 35 only-b, 15 only-a: diff = 20/200 = 0.1; per-pair d in {-1,0,1} has
    # var = 50/200 - 0.1^2 = 0.24, se = sqrt(0.24/200) = 0.034641, normal CI = 0.1 -+ 0.0679
    a, b = _pairs(both=80, neither=70, only_b=35, only_a=15)
    res = paired_bootstrap(a, b, samples=20_000, seed=1)
    assert res["diff"] == pytest.approx(0.1)
    assert res["se"] == pytest.approx(0.034641, abs=0.0015)
    assert res["ci95"][0] == pytest.approx(0.1 - 0.0679, abs=0.006)
    assert res["ci95"][1] == pytest.approx(0.1 + 0.0679, abs=0.006)
    assert res == paired_bootstrap(a, b, samples=20_000, seed=1)  # seeded: reproducible


def test_paired_bootstrap_keeps_pairs_together():
    # identical outcomes -> every resample has difference 0, whatever the accuracy
    a = [True, False, True, True, False]
    res = paired_bootstrap(a, list(a), samples=500, seed=3)
    assert res["ci95"] == [0.0, 0.0]
    with pytest.raises(ValueError):
        paired_bootstrap([True], [True, False])


def test_holm_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04; the running max lifts the last
    # to 0.06 (a larger raw p never gets a smaller adjusted one); back in the input order
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # capped at 1; ties share their adjusted value
    assert holm([0.5, 0.2]) == pytest.approx([0.5, 0.4])
    assert holm([0.6, 0.6, 0.01]) == pytest.approx([1.0, 1.0, 0.03])
    assert holm([0.04, 0.04]) == pytest.approx([0.08, 0.08])
    assert holm([]) == []
    # one test: no correction
    assert holm([0.03]) == pytest.approx([0.03])
    with pytest.raises(ValueError):
        holm([0.2, 1.5])


def test_seed_patient_bootstrap_by_hand():
    # two seeds, one gains 1 on every patient, the other 0: patient draws change nothing; the seed draw is
    # (s1, s1) 1/4 -> 1, mixed 1/2 -> 0.5, (s2, s2) 1/4 -> 0, so the 95% interval is [0, 1] around 0.5
    res = seed_patient_bootstrap([[1.0] * 20, [0.0] * 20], samples=4000, seed=2)
    assert res["mean"] == 0.5 and res["ci95"] == [0.0, 1.0]
    assert res["se"] == pytest.approx(math.sqrt(0.125), abs=0.02)  # var = 1/4 * 1/4 + 1/4 * 1/4 = 0.125
    # the seeds agree: only the patients spread it, as the paired bootstrap over patients does
    table = [[1.0] * 8 + [0.0] * 12] * 3
    pooled, patients = seed_patient_bootstrap(table, samples=4000, seed=1), paired_bootstrap([0] * 20, table[0], 4000, 1)
    assert pooled["mean"] == pytest.approx(0.4)
    assert pooled["se"] == pytest.approx(patients["se"], rel=0.1)
    assert res == seed_patient_bootstrap([[1.0] * 20, [0.0] * 20], samples=4000, seed=2)  # seeded
    with pytest.raises(ValueError):
        seed_patient_bootstrap([1.0, 2.0])
