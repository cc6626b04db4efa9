"""The training-seed component of a ladder's intervals (issue 49): per-run values, their
spread, the borrowed component of a one-seed contrast, and where each point borrows from."""

from __future__ import annotations

import numpy as np
import pytest

from flexigpt.core import stats
from flexigpt.tables.ladder import seed_components


def records(nll_shift: float, correct: int, n: int = 40) -> dict:
    """One run's records: 10 perplexity windows of 100 tokens, one task of ``n`` documents."""
    nll = (3.0 + nll_shift + 0.1 * np.arange(10)) * 100
    docs = [{"task": "piqa", "data_sha256": "a", "metric": "acc", "doc_id": i,
             "acc": float(i < correct), "doc_hash": str(i)} for i in range(n)]
    return {"perplexity": {"text_sha256": "t", "seq_len": 100, "n_windows": 10,
                           "nll": nll.tolist(), "tokens": [100] * 10},
            "tasks": {"piqa": docs}}


def test_run_values_and_seed_variance():
    runs = [records(0.0, 20), records(0.1, 24), records(-0.1, 16)]
    assert stats.run_values(runs, "log_ppl") == pytest.approx([3.45, 3.55, 3.35])
    assert stats.run_values(runs, "avg") == pytest.approx([0.5, 0.6, 0.4])
    assert stats.seed_variance(runs, "log_ppl") == pytest.approx(0.01)
    assert stats.seed_variance(runs, "avg", scale=100.0) == pytest.approx(100.0)
    assert stats.seed_variance(runs[:1], "log_ppl") is None


def test_add_seed_component_widens_only_its_contrast():
    reps = stats.Replicates(np.array([0.2, 0.1]), np.zeros((20000, 2)), 10, ((1, 1), (3, 3)))
    out = stats.add_seed_component(reps, [0.04, 0.0], seed=3)
    assert out.estimate.tolist() == [0.2, 0.1] and out.seeds == reps.seeds
    assert out.boot[:, 0].std() == pytest.approx(0.2, rel=0.03)
    assert (out.boot[:, 1] == 0).all()
    again = stats.add_seed_component(reps, [0.04, 0.0], seed=3)
    assert np.array_equal(out.boot, again.boot)  # deterministic for its seed
    for bad in ([0.1], [-0.1, 0.0], [float("nan"), 0.0]):
        with pytest.raises(ValueError, match="variances"):
            stats.add_seed_component(reps, bad)


def test_seed_components_borrow_from_the_nearest_measured_budget():
    tokens = [32768, 131072, 1048576]
    measured = [(0.01, 0.02), (0.04, None), (None, None)]
    variances, labels = seed_components(tokens, measured)
    assert labels == ["measured", "B from 32.8K", "A from 131K, B from 32.8K"]
    assert variances == pytest.approx([0.0, 0.02, 0.04 + 0.02])
    # never measured on one side: the pooled fallback, else documents only
    variances, labels = seed_components(tokens, [(None, 0.02)] * 3, fallback={131072: 0.5})
    assert labels[0] == "A from 131K pooled" and variances[0] == pytest.approx(0.5)
    variances, labels = seed_components(tokens, [(None, None)] * 3)
    assert variances == [0.0] * 3 and labels == ["documents only: no seed spread measured"] * 3
