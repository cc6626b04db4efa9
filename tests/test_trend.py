"""flexigpt.tables.trend: the gap FlexiGPT − ShortGPT + LoRA against log10(recovery tokens),
fitted to jointly resampled replicates (synthetic data with a known line)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flexigpt.core import stats as S
from flexigpt.tables import trend as T

BUDGETS = np.array([1e5, 1e6, 1e7, 1e8])


def simulate(rng: np.random.Generator, a: float, b: float, n: int = 150,
             doc_sd: float = 1.0, noise_sd: float = 0.5) -> list[dict[str, tuple]]:
    """One contrast per budget on the SAME n documents: per-doc difference = a + b·log10(t)
    + u_doc (shared by every budget) + e (budget-specific)."""
    shared = rng.normal(0, doc_sd, n)
    base = rng.normal(0, 1, n)
    out = []
    for t in BUDGETS:
        diff = a + b * math.log10(t) + shared + rng.normal(0, noise_sd, n)
        out.append({"task": (base + diff, base)})
    return out


def test_point_estimates_recover_slope_and_crossover():
    a, b = 0.8, -0.1  # crosses 0 at 10^8 tokens
    contrasts = simulate(np.random.default_rng(0), a, b, n=4000, doc_sd=0.2, noise_sd=0.1)
    reps = S.average_diff_replicates(contrasts, n_boot=400, seed=1)
    fit = T.fit_trend(BUDGETS, reps.estimate, reps.boot, at_tokens=1e9, metric="log_ppl",
                      unit="nats")
    assert fit.slope == pytest.approx(b, abs=0.01)
    assert fit.intercept == pytest.approx(a, abs=0.05)
    assert fit.slope_low < b < fit.slope_high and fit.slope_high < 0
    assert math.log10(fit.crossover) == pytest.approx(8.0, abs=0.15)
    assert fit.crossover_low <= fit.crossover <= fit.crossover_high
    assert fit.crossover_fraction == pytest.approx(1.0)
    assert fit.at_estimate == pytest.approx(a + 9 * b, abs=0.05) and fit.at_extrapolated
    assert fit.tokens == tuple(BUDGETS) and len(fit.lows) == len(BUDGETS)
    d = fit.to_dict()
    assert d["slope"] == fit.slope and isinstance(d["tokens"], list)
    md = T.render_markdown(fit, "demo")
    assert md.startswith("### demo") and md.count("\n| ") == len(BUDGETS) + 5
    assert "fit: slope b per decade" in md and "crossover" in md and "(extrapolated)" in md


def test_extrapolation_flag():
    tokens, r = BUDGETS[:3], np.zeros((50, 3))
    ahead = T.fit_trend(tokens, [0.3, 0.2, 0.1], r + [0.3, 0.2, 0.1])  # 0 at 1e8 > 1e7
    assert ahead.crossover == pytest.approx(1e8) and ahead.crossover_extrapolated is True
    inside = T.fit_trend(tokens, [0.1, 0.0, -0.1], r + [0.1, 0.0, -0.1])  # 0 at 1e6
    assert inside.crossover == pytest.approx(1e6) and inside.crossover_extrapolated is False
    at = T.fit_trend(tokens, [0.1, 0.0, -0.1], r + [0.1, 0.0, -0.1], at_tokens=2e6)
    assert at.at_estimate == pytest.approx(-0.1 * math.log10(2)) and not at.at_extrapolated


def test_no_crossover_when_the_gap_widens():
    tokens = BUDGETS[:3]
    rng = np.random.default_rng(3)
    est = np.array([0.1, 0.2, 0.3])  # positive and growing: moving away from 0
    fit = T.fit_trend(tokens, est, est + rng.normal(0, 0.01, (200, 3)))
    assert math.isinf(fit.crossover) and fit.crossover_extrapolated is None
    assert fit.crossover_fraction == 0.0 and math.isinf(fit.crossover_high)
    flat = T.fit_trend(tokens, [0.2, 0.2, 0.2], np.full((20, 3), 0.2))
    assert flat.slope == pytest.approx(0.0, abs=1e-12) and math.isinf(flat.crossover)
    assert "none: the line moves away from 0" in T.render_markdown(fit)
    assert fit.to_dict()["crossover"] == "inf"


def test_slope_interval_covers_at_the_nominal_rate():
    """200 simulated datasets, 4 budgets on the same 150 documents: the 95 % slope interval
    of the joint bootstrap covers the true slope at about 95 %."""
    rng = np.random.default_rng(11)
    a, b, hits, n_sets = 0.5, -0.07, 0, 200
    for k in range(n_sets):
        reps = S.average_diff_replicates(simulate(rng, a, b), n_boot=500, seed=k)
        fit = T.fit_trend(BUDGETS, reps.estimate, reps.boot)
        hits += fit.slope_low <= b <= fit.slope_high
    assert 0.88 <= hits / n_sets <= 0.99, hits / n_sets


def test_joint_resampling_keeps_the_shared_document_effect_out_of_the_slope():
    """Documents shared by every budget shift all Δ_j together: the joint draw cancels that
    in the slope, independent draws per budget would not."""
    contrasts = simulate(np.random.default_rng(5), 0.5, -0.07, doc_sd=2.0, noise_sd=0.2)
    joint = S.average_diff_replicates(contrasts, n_boot=400, seed=0)
    apart = np.stack([S.average_diff_replicates([c], n_boot=400, seed=j).boot[:, 0]
                      for j, c in enumerate(contrasts)], axis=1)
    fj = T.fit_trend(BUDGETS, joint.estimate, joint.boot)
    fa = T.fit_trend(BUDGETS, joint.estimate, apart)
    assert (fj.slope_high - fj.slope_low) < 0.3 * (fa.slope_high - fa.slope_low)
    assert np.corrcoef(joint.boot.T)[0, 3] > 0.9  # budgets move together per replicate


def test_input_validation():
    ok = np.zeros((20, 3))
    with pytest.raises(ValueError, match="tokens"):
        T.fit_trend([1e5], [0.1], np.zeros((20, 1)))
    with pytest.raises(ValueError, match="distinct"):
        T.fit_trend([1e5, 1e5, 1e5], [0, 0, 0], ok)
    with pytest.raises(ValueError, match="tokens"):
        T.fit_trend([0, 1e5, 1e6], [0, 0, 0], ok)
    with pytest.raises(ValueError, match="estimates"):
        T.fit_trend(BUDGETS[:3], [0, 0], ok)
    with pytest.raises(ValueError, match="replicates"):
        T.fit_trend(BUDGETS[:3], [0, 0, 0], np.zeros((20, 2)))
    with pytest.raises(ValueError, match="replicates"):
        T.fit_trend(BUDGETS[:3], [0, 0, 0], np.full((20, 3), np.nan))
    with pytest.raises(ValueError, match="level"):
        T.fit_trend(BUDGETS[:3], [0, 0, 0], ok, level=1.5)
    with pytest.raises(ValueError, match="at_tokens"):
        T.fit_trend(BUDGETS[:3], [0, 0, 0], ok, at_tokens=-1.0)
    with pytest.raises(ValueError, match="same, non-empty set of tasks"):
        S.average_diff_replicates([{"x": ([1.0, 2.0], [1.0, 2.0])},
                                   {"y": ([1.0, 2.0], [1.0, 2.0])}])
    with pytest.raises(S.PairingError, match="sizes"):
        S.average_diff_replicates([{"x": ([1.0, 2.0], [1.0, 2.0])},
                                   {"x": ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])}])
