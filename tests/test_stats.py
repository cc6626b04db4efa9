"""flexigpt.core.stats: paired bootstrap intervals, seeds, pairing checks, verdicts (synthetic data)."""

from __future__ import annotations

import numpy as np
import pytest

from flexigpt.core import stats as S


def paired_docs(rng: np.random.Generator, n: int, probs=(0.45, 0.15, 0.10, 0.30)):
    """Per-doc (a, b) correct/incorrect with P(1,1), P(1,0), P(0,1), P(0,0) = ``probs``:
    true accuracy difference E[a − b] = probs[1] − probs[2]; a and b correlated."""
    cat = rng.choice(4, size=n, p=probs)
    a = np.isin(cat, (0, 1)).astype(float)
    b = np.isin(cat, (0, 2)).astype(float)
    return a, b


def records(task: str, values, sha: str = "s" * 64, ids=None, metric: str = "acc_norm",
            ppl=None) -> dict:
    ids = list(range(len(values))) if ids is None else ids
    docs = [{"task": task, "data_sha256": sha, "metric": metric, "doc_id": i,
             metric: float(v), "doc_hash": f"h{i}"} for i, v in zip(ids, values)]
    return {"tasks": {task: docs}, "perplexity": ppl}


def windows(nll, tokens=None, sha: str = "t" * 64) -> dict:
    tokens = [63] * len(nll) if tokens is None else tokens
    return {"text_sha256": sha, "seq_len": 64, "n_windows": len(nll), "nll": list(nll),
            "tokens": list(tokens)}


def test_paired_interval_covers_the_true_difference_at_the_stated_rate():
    rng = np.random.default_rng(123)
    true_diff, hits = 0.05, 0
    n_sets = 400
    for k in range(n_sets):
        a, b = paired_docs(rng, 200)
        hits += S.diff_interval(a, b, seed=k).contains(true_diff)
    coverage = hits / n_sets
    assert 0.92 <= coverage <= 0.98, coverage


def test_average_over_tasks_covers_and_is_the_mean_of_task_differences():
    rng = np.random.default_rng(7)
    probs = {"t1": (0.45, 0.15, 0.10, 0.30), "t2": (0.30, 0.10, 0.10, 0.50),
             "t3": (0.50, 0.05, 0.15, 0.30)}
    true_avg = np.mean([p[1] - p[2] for p in probs.values()])
    hits, n_sets = 0, 200
    for k in range(n_sets):
        pairs = {t: paired_docs(rng, 150 + 20 * i, p) for i, (t, p) in enumerate(probs.items())}
        ci = S.average_diff_interval(pairs, seed=k)
        assert ci.estimate == pytest.approx(np.mean([a.mean() - b.mean()
                                                     for a, b in pairs.values()]))
        hits += ci.contains(true_avg)
    assert 0.92 <= hits / n_sets <= 0.98, hits / n_sets


def test_paired_is_narrower_than_unpaired_for_correlated_runs():
    rng = np.random.default_rng(0)
    skill = rng.normal(size=500)  # shared per-document difficulty
    a = (skill + 0.3 * rng.normal(size=500) > 0).astype(float)
    b = (skill + 0.3 * rng.normal(size=500) > 0.1).astype(float)
    paired = S.diff_interval(a, b)
    unpaired = S.diff_interval(a, b, paired=False)
    assert paired.estimate == unpaired.estimate == pytest.approx(a.mean() - b.mean())
    assert paired.half_width < 0.6 * unpaired.half_width
    single = S.mean_interval(a)
    assert single.low < a.mean() < single.high
    assert single.half_width == pytest.approx(1.96 * a.std() / np.sqrt(500), rel=0.15)


def test_deterministic_and_degenerate():
    rng = np.random.default_rng(1)
    a, b = paired_docs(rng, 300)
    assert S.diff_interval(a, b, seed=3) == S.diff_interval(a, b, seed=3)
    assert S.diff_interval(a, b, seed=3) != S.diff_interval(a, b, seed=4)
    same = S.diff_interval(a, a)
    assert same.low == same.high == same.estimate == 0.0
    with pytest.raises(ValueError, match="n_boot"):
        S.mean_interval(a, n_boot=1)
    with pytest.raises(ValueError, match="non-finite"):
        S.mean_interval([0.0, float("nan")])
    with pytest.raises(S.PairingError, match="sizes"):
        S.diff_interval(a, b[:-1])


def test_logppl_difference_from_windows():
    rng = np.random.default_rng(2)
    n, t = 60, 63
    base = rng.gamma(5.0, 30.0, size=n)  # per-window difficulty shared by both models
    nll_a = base + rng.normal(0, 5, size=n)
    nll_b = base * 1.1 + rng.normal(0, 5, size=n)
    tok = np.full(n, t)
    ci = S.logppl_diff_interval(nll_a, tok, nll_b, tok)
    assert ci.estimate == pytest.approx(nll_a.sum() / (n * t) - nll_b.sum() / (n * t))
    assert ci.high < 0  # a is clearly better
    assert ci.half_width < S.logppl_diff_interval(nll_a, tok, nll_b, tok,
                                                  paired=False).half_width
    one = S.logppl_interval(nll_a, tok)
    assert one.contains(nll_a.sum() / (n * t))


def test_hierarchical_seeds_add_seed_variance():
    rng = np.random.default_rng(5)
    n, seeds = 400, 4
    skill = rng.normal(size=n)
    offsets_a = rng.normal(0, 0.5, size=seeds)  # large seed-to-seed shifts
    runs_a = np.stack([(skill + o + 0.5 * rng.normal(size=n) > 0).astype(float)
                       for o in offsets_a])
    runs_b = np.stack([(skill + 0.5 * rng.normal(size=n) > 0).astype(float)
                       for _ in range(seeds)])
    hier = S.diff_interval(runs_a, runs_b)
    assert hier.seeds == (seeds, seeds)
    assert hier.estimate == pytest.approx(runs_a.mean() - runs_b.mean())
    docs_only = S.diff_interval(runs_a.mean(0), runs_b.mean(0))  # seed-averaged per doc
    assert hier.half_width > 1.5 * docs_only.half_width
    assert S.mean_interval(runs_a).seeds == (seeds,)


def test_records_api_pairs_checks_and_compares():
    rng = np.random.default_rng(9)
    a, b = paired_docs(rng, 120)
    nll = rng.gamma(5.0, 30.0, size=20)
    ra = records("arc_easy", a, ppl=windows(nll))
    rb = records("arc_easy", b, ppl=windows(nll * 1.05))
    out = S.compare_runs(ra, rb)
    assert out["tasks"]["arc_easy"] == S.diff_interval(a, b)
    assert out["average"].estimate == pytest.approx(a.mean() - b.mean())
    assert out["log_ppl"].estimate == pytest.approx((nll.sum() - 1.05 * nll.sum()) / (20 * 63))
    single = S.run_intervals(ra)
    assert single["tasks"]["arc_easy"].estimate == pytest.approx(a.mean())
    assert single["log_ppl"].contains(nll.sum() / (20 * 63))
    assert S.run_intervals([ra, rb])["tasks"]["arc_easy"].seeds == (2,)
    # docs shuffled in the file: paired by doc id, not by position
    shuffled = records("arc_easy", b[::-1], ids=list(range(119, -1, -1)))
    assert S.compare_runs(ra, shuffled)["tasks"]["arc_easy"] == out["tasks"]["arc_easy"]

    with pytest.raises(S.PairingError, match="data_sha256"):
        S.compare_runs(ra, records("arc_easy", b, sha="x" * 64))
    with pytest.raises(S.PairingError, match="doc ids differ.*only in the first \\[0\\]"):
        S.compare_runs(ra, records("arc_easy", b[1:], ids=list(range(1, 120))))
    with pytest.raises(S.PairingError, match="metric"):
        S.compare_runs(ra, records("arc_easy", b, metric="acc"))
    other_hash = records("arc_easy", b)
    other_hash["tasks"]["arc_easy"][3]["doc_hash"] = "zzz"
    with pytest.raises(S.PairingError, match="doc 3 has a different doc_hash"):
        S.compare_runs(ra, other_hash)
    with pytest.raises(S.PairingError, match="text_sha256"):
        S.compare_runs(ra, records("arc_easy", b, ppl=windows(nll, sha="u" * 64)))
    with pytest.raises(S.PairingError, match="piqa"):
        S.compare_runs(ra, rb, tasks=["piqa"])


def test_verdict_rule():
    assert S.verdict(0.01, 0.05, "greater") == "supported"
    assert S.verdict(-0.05, -0.01, "greater") == "contradicted"
    assert S.verdict(-0.01, 0.05, "greater") == "undecided"
    assert S.verdict(0.0, 0.05, "greater") == "undecided"  # touching 0 is not "whole interval"
    assert S.verdict(-0.05, -0.01, "less") == "supported"
    assert S.verdict(0.01, 0.05, "less") == "contradicted"
    assert S.verdict(-0.01, 0.01, "<") == "undecided"
    ci = S.Interval(0.02, 0.01, 0.03, 0.005, 0.95, 100, 2000)
    assert ci.verdict(">") == "supported" and ci.to_dict()["seeds"] == [1]
    with pytest.raises(ValueError, match="direction"):
        S.verdict(0.0, 1.0, "bigger")
    with pytest.raises(ValueError, match="interval"):
        S.verdict(1.0, 0.0, "greater")


def test_verdict_rule_with_a_margin():
    m = 0.02
    assert S.verdict(0.007, 0.012, "less", m) == S.NO_DIFFERENCE  # (d): +0.009 [+0.007, +0.012]
    assert S.verdict(0.007, 0.012, "less") == "contradicted"       # the same without a margin
    assert S.verdict(0.03, 0.05, "greater", m) == "supported"
    assert S.verdict(0.01, 0.05, "greater", m) == "undecided"      # excludes 0, reaches < m
    assert S.verdict(-0.05, -0.03, "greater", m) == "contradicted"
    assert S.verdict(-0.05, -0.01, "greater", m) == "undecided"    # straddles −m
    assert S.verdict(-0.05, -0.03, "less", m) == "supported"
    assert S.verdict(-0.01, 0.01, "less", m) == S.NO_DIFFERENCE
    assert S.verdict(-0.02, 0.01, "less", m) == "undecided"        # touching −m is not inside
    ci = S.Interval(0.0, -0.5, 0.5, 0.2, 0.95, 100, 2000)
    assert ci.verdict(">", 1.0) == S.NO_DIFFERENCE and ci.verdict(">") == "undecided"
    with pytest.raises(ValueError, match="margin"):
        S.verdict(0.0, 1.0, "greater", -0.1)


def test_tail_pvalues_and_holm():
    boot = np.linspace(-1.0, 3.0, 2001)  # 501 replicates <= 0, 1501 >= 0
    p = S.tail_pvalues(boot, "greater")
    assert p["supported"] == pytest.approx(502 / 2002)
    assert p["contradicted"] == pytest.approx(1502 / 2002)
    assert S.tail_pvalues(boot, "less")["contradicted"] == p["supported"]
    assert S.tail_pvalues(np.zeros(100), ">", 0.1)[S.NO_DIFFERENCE] == pytest.approx(1 / 101)
    assert S.holm([0.01, 0.04, 0.03], 0.05) == [True, False, False]  # 0.03 > 0.05 / 2
    assert S.holm([0.01, 0.02, 0.03], 0.05) == [True, True, True]
    assert S.holm([0.2, 0.001], 0.05) == [False, True] and S.holm([], 0.05) == []
    with pytest.raises(ValueError, match="alpha"):
        S.holm([0.1], 1.5)
    with pytest.raises(ValueError, match="replicates"):
        S.tail_pvalues([0.1, 0.2], ">")


def test_holm_verdicts_of_one_equal_the_interval_rule():
    """K = 1: the Holm decision from replicates is the 95 % percentile interval's verdict."""
    rng = np.random.default_rng(4)
    for k in range(60):
        boot = rng.normal(rng.uniform(-0.06, 0.06), 0.02, 2000)
        margin = [0.0, 0.02][k % 2]
        lo, hi = np.quantile(boot, [0.025, 0.975])
        assert S.holm_verdicts([boot], ["greater"], [margin]) == [
            S.verdict(lo, hi, "greater", margin)], (k, lo, hi)


def test_replicates_match_the_intervals_and_are_joint_across_contrasts():
    rng = np.random.default_rng(9)
    a, b = paired_docs(rng, 120)
    c = np.where(rng.random(120) < 0.1, 1 - a, a)  # a second "budget": a few docs flipped
    nll = rng.gamma(5.0, 30.0, size=20)
    ra = records("arc_easy", a, ppl=windows(nll))
    rb = records("arc_easy", b, ppl=windows(nll * 1.05))
    rc = records("arc_easy", c, ppl=windows(nll * 1.02))
    out = S.compare_runs(ra, rb)
    for metric, ref in (("arc_easy", out["tasks"]["arc_easy"]), ("avg", out["average"]),
                        ("log_ppl", out["log_ppl"])):
        assert S.paired_replicates([(ra, rb)], metric).interval(0) == ref
    joint = S.paired_replicates([(ra, rb), (rc, rb)], "arc_easy", n_boot=500)
    assert joint.boot.shape == (500, 2) and joint.seeds == ((1, 1), (1, 1))
    assert joint.estimate == pytest.approx([a.mean() - b.mean(), c.mean() - b.mean()])
    assert np.corrcoef(joint.boot.T)[0, 1] > 0.8  # the same documents in every replicate
    assert joint.interval(1).contains(c.mean() - b.mean())
    pts = joint.scaled(100.0)
    assert pts.interval(0).estimate == pytest.approx(100 * joint.estimate[0])
    seeds = S.paired_replicates([([ra, rc], rb)], "log_ppl", n_boot=100)
    assert seeds.seeds == ((2, 1),)
    with pytest.raises(S.PairingError, match="data_sha256"):
        S.paired_replicates([(ra, rb), (records("arc_easy", c, sha="x" * 64), rb)], "arc_easy")
    with pytest.raises(ValueError, match="pair"):
        S.paired_replicates([], "avg")
