"""Intervals, paired comparisons, verdicts and recovery curves of the tables, on synthetic
result JSONs with per-document records written into tmp_path."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from flexigpt.core import stats as S
from flexigpt.runtime.evaluation.results import write_records
from flexigpt.tables import build, build_all, claim_rows, timing_claims, verdicts
from flexigpt.tables.collect import collect_results
from flexigpt.tables.comparisons import OK, Comparator, Diff
from flexigpt.tables.curves import NEVER, add_reach, smoothed, tokens_to_reach
from flexigpt.tables.decision import (
    CONTRADICTED,
    MISSING_RUN,
    NO_DIFFERENCE,
    NOT_A_CLAIM,
    SUPPORTED,
    UNDECIDED,
    Rules,
    decide_count,
    decide_family,
)
from flexigpt.tables.published import load_published
from flexigpt.tables.report import gather_inputs
from flexigpt.tables.row_intervals import RecordStore

BASE = Path(__file__).parent / "fixtures" / "results" / "eval" / "smollm2-135m" / \
    "shortgpt-default-r0.3-final-s0.json"
TASKS = ("arc_easy", "arc_challenge", "piqa", "winogrande", "hellaswag")
SMOL = "smollm2-135m"
N_DOCS, N_WIN, TOK = 200, 40, 100


def _docs(correct: set[int], task: str, sha: str) -> list[dict]:
    return [{"task": task, "data_sha256": sha, "metric": "acc_norm", "doc_id": i,
             "acc_norm": float(i in correct), "doc_hash": f"{task}{i}"} for i in range(N_DOCS)]


def write_run(root: Path, method: str, variant: str, ratio: float | None, *, table: str,
              correct: set[int], log_ppl: np.ndarray | None, stage: str = "final",
              trained: bool = False, records: bool = True, sha: str = "0" * 64,
              tokens: int = 1000, blocks: int | None = None, tasks: bool = True) -> Path:
    """A result JSON whose every task has ``correct`` as its right doc ids and whose
    perplexity windows have per-token NLL ``log_ppl`` (None: no perplexity); ``tokens``:
    the recovery budget of a trained run; ``blocks``: blocks removed / replaced; ``tasks``
    False: a perplexity-only evaluation."""
    data = json.loads(BASE.read_text())
    data.update(method=method, blocks_pruned=blocks,
                recovery={"recipe": "lora", "loss": "lm", "tokens": tokens} if trained else None,
                trained_tokens=tokens if trained else 0)
    data["parameters"]["achieved_ratio"] = None if method == "dense" else ratio
    acc = len(correct) / N_DOCS
    for task in TASKS:
        data["tasks"][task].update(value=acc, n_docs=N_DOCS, data_sha256=sha)
    nll = None
    if log_ppl is None:
        data["perplexity"] = None
    else:
        nll = np.asarray(log_ppl, dtype=float) * TOK
        data["perplexity"].update(value=math.exp(nll.sum() / (TOK * len(nll))),
                                  n_windows=len(nll))
    data["labels"] = {"model": SMOL, "method": method, "variant": variant, "ratio": ratio,
                      "stage": stage, "seed": 0, "table": table,
                      "loss": "lm" if trained else None, "protocol": "matched"}
    setting = f"r{ratio}" if ratio is not None else "full"
    path = root / SMOL / method / variant / setting / f"eval_{stage}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not tasks:
        data["tasks"] = {}
    if records:
        docs = [d for t in (TASKS if tasks else ()) for d in _docs(correct, t, sha)]
        windows = None if nll is None else {
            "text": "t.txt", "text_sha256": "1" * 64, "seq_len": 512, "n_windows": len(nll),
            "nll": nll.tolist(), "tokens": [TOK] * len(nll), "total_nll": float(nll.sum()),
            "n_tokens": TOK * len(nll)}
        data["records"] = write_records(path, docs, windows)
    path.write_text(json.dumps(data))
    return path


def _noise(seed: int, scale: float = 0.5) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, scale, N_WIN)


BASE_LP = 3.0 + _noise(0, 0.3)  # shared per-window difficulty (pairing cancels it)


def grid(root: Path, flex_ppl_shift: float, flex_extra: set[int], base_extra: set[int],
         **kw) -> Path:
    """Dense, ShortGPT + LoRA and FlexiGPT at 30%: FlexiGPT's log-PPL = the baseline's +
    ``flex_ppl_shift`` per window; each is right on docs 0..79 plus its ``*_extra``."""
    common = set(range(80))
    write_run(root, "dense", "default", None, table="dense", correct=set(range(120)),
              log_ppl=BASE_LP - 1.0)
    write_run(root, "shortgpt_lora", "default", 0.3, table="main", trained=True,
              correct=common | base_extra, log_ppl=BASE_LP)
    flex_lp = BASE_LP + (flex_ppl_shift if isinstance(flex_ppl_shift, float) else 0.0)
    if not isinstance(flex_ppl_shift, float):  # "noise": same mean, no consistent sign
        flex_lp = BASE_LP + np.tile([0.4, -0.4], N_WIN // 2)
    write_run(root, "flexigpt", "default", 0.3, table="main", trained=True,
              correct=common | flex_extra, log_ppl=flex_lp, **kw)
    return root


def _verdicts(root: Path, out: Path) -> pd.DataFrame:
    build_all(root, out, make_plots=False, formats=("md", "csv"))
    return pd.read_csv(out / "verdicts.csv")


def _claim(v: pd.DataFrame, prefix: str, setting: str = "30%") -> pd.Series:
    rows = v[v["Claim"].str.startswith(prefix) & v["Setting"].eq(setting)]
    assert len(rows) == 1, rows
    return rows.iloc[0]


WIN = set(range(80, 110))  # 30 more docs right
NONE: set[int] = set()


@pytest.mark.parametrize("shift, flex_extra, base_extra, verdict", [
    (-0.1, WIN, NONE, SUPPORTED),      # FlexiGPT lower PPL, more docs right
    (+0.1, NONE, WIN, CONTRADICTED),   # the same difference, sign flipped
    ("noise", set(range(80, 95)), set(range(95, 110)), UNDECIDED),  # straddles 0
])
def test_verdict_follows_the_interval(tmp_path, shift, flex_extra, base_extra, verdict):
    v = _verdicts(grid(tmp_path / "r", shift, flex_extra, base_extra), tmp_path / "o")
    ppl, avg = _claim(v, "(a)"), _claim(v, "(b)")
    assert ppl["Verdict"] == verdict and avg["Verdict"] == verdict
    if verdict == UNDECIDED:
        assert ppl["ci_low"] < 0 < ppl["ci_high"] and avg["ci_low"] < 0 < avg["ci_high"]
    else:
        sign = 1 if verdict == SUPPORTED else -1
        assert (ppl["ci_high"] < 0) if sign > 0 else (ppl["ci_low"] > 0)  # lower PPL wins
        assert (avg["ci_low"] > 0) if sign > 0 else (avg["ci_high"] < 0)
        assert avg["estimate"] == pytest.approx(sign * 100 * len(WIN) / N_DOCS)
    # Runs that are not in this config say so instead of disappearing.
    assert _claim(v, "(a)", "40%")["Verdict"] == MISSING_RUN
    assert _claim(v, "(e)")["Verdict"] == MISSING_RUN
    assert v["Claim"].str.startswith("(f)").any() and v["Claim"].str.startswith("(g)").any()
    assert set(v.loc[v["Claim"].str.startswith("(f)"), "Verdict"]) == {MISSING_RUN}
    report = (tmp_path / "o" / "report.md").read_text()
    assert report.index("## Verdicts on the paper's claims") < report.index("## Table 1")
    page = (tmp_path / "o" / "report.html").read_text()  # the Snakemake report embeds it
    assert page.startswith("<!doctype html>") and page.index("<h2>Verdicts on the paper") < \
        page.index("<h2>Table 1")
    assert page.count("<table>") == report.count("\n### ") and "<td" in page


def test_intervals_in_table1_cover_the_point_value(tmp_path):
    root = grid(tmp_path / "r", -0.1, WIN, NONE)
    build_all(root, tmp_path / "o", make_plots=False, formats=("md", "csv"))
    csv = pd.read_csv(tmp_path / "o" / "table1_smollm2-135m.csv")
    ours = csv[csv["source"].eq("ours")]
    for col in ("ppl", *TASKS, "avg"):
        lo, hi = ours[f"{col}_lo"], ours[f"{col}_hi"]
        assert lo.notna().all() and (lo <= ours[col] + 1e-9).all() and (ours[col] <= hi + 1e-9).all()
        assert (hi > lo).all()
    # Accuracy half-width ≈ 1.96 · sqrt(p(1-p)/n) in points.
    flex = ours[ours["method"].eq("flexigpt")].iloc[0]
    p = 110 / N_DOCS
    expected = 196 * math.sqrt(p * (1 - p) / N_DOCS)
    assert (flex["arc_easy_hi"] - flex["arc_easy_lo"]) / 2 == pytest.approx(expected, rel=0.15)
    md = (tmp_path / "o" / "table1_smollm2-135m.md").read_text()
    hw = (flex["arc_easy_hi"] - flex["arc_easy_lo"]) / 2
    line = next(x for x in md.splitlines() if x.startswith("| FlexiGPT*"))
    assert f"{flex['arc_easy']:.2f} ±{hw:.1f}" in line
    assert "95% bootstrap interval" in md


def test_records_are_loaded_once_and_bootstrap_is_deterministic(tmp_path, monkeypatch):
    from flexigpt.runtime.evaluation import results

    root = grid(tmp_path / "r", -0.1, WIN, NONE)
    calls = []
    real = results.load_records
    monkeypatch.setattr(results, "load_records", lambda p: calls.append(p) or real(p))
    build_all(root, tmp_path / "a", make_plots=False, formats=("csv",))
    assert len(calls) == len(set(calls)) == 3
    build_all(root, tmp_path / "b", make_plots=False, formats=("csv",))
    for name in ("verdicts.csv", "comparisons.csv", "table1_smollm2-135m.csv"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()


def test_old_files_show_points_and_unpaired_cells_are_marked(tmp_path):
    root = grid(tmp_path / "r", -0.1, WIN, NONE, records=False)
    v = _verdicts(root, tmp_path / "o")
    assert _claim(v, "(a)")["Verdict"].startswith("no records")
    md = (tmp_path / "o" / "table1_smollm2-135m.md").read_text()
    flex_line = next(line for line in md.splitlines() if line.startswith("| FlexiGPT*"))
    assert "±" not in flex_line
    assert "±" in next(line for line in md.splitlines() if line.startswith("| ShortGPT + LoRA*"))
    # Different documents (another data sha): the task cells are unpaired, PPL still pairs.
    root2 = grid(tmp_path / "r2", -0.1, WIN, NONE, sha="9" * 64)
    v2 = _verdicts(root2, tmp_path / "o2")
    assert _claim(v2, "(b)")["Verdict"] == "unpaired"
    assert _claim(v2, "(a)")["Verdict"] == SUPPORTED
    comp = pd.read_csv(tmp_path / "o2" / "comparisons.csv")
    cell = comp[comp["method"].eq("flexigpt") & comp["comparison"].str.contains("LoRA")]
    assert set(cell.loc[cell["metric"].isin(TASKS), "status"]) == {"unpaired"}
    assert "unpaired" in (tmp_path / "o2" / "comparisons.md").read_text()


def test_counted_claims():
    six = [SUPPORTED] * 5 + [UNDECIDED]
    assert decide_count(six, 5) == SUPPORTED
    assert decide_count(six, 6) == UNDECIDED
    assert decide_count([SUPPORTED] * 4 + [CONTRADICTED] * 2, 5) == CONTRADICTED
    assert decide_count([SUPPORTED] * 4 + [CONTRADICTED, UNDECIDED], 5) == UNDECIDED
    assert decide_count([MISSING_RUN] * 6, 5) == MISSING_RUN


def _log(losses) -> pd.DataFrame:
    n = len(losses)
    return pd.DataFrame({"step": range(n + 1), "tokens": [0] + [1000 * (i + 1) for i in range(n)],
                         "loss": [None, *losses], "lr": 1e-3, "ppl": [50.0] + [None] * n})


def test_tokens_to_reach_the_baseline_loss():
    curve = smoothed(_log([6.0, 5.0, 4.0, 3.0, 3.0, 3.0]))
    assert list(curve["loss"]) == pytest.approx([6.0, 5.5, 5.0, 4.0, 10 / 3, 3.0])
    assert tokens_to_reach(curve, 4.0) == 4000
    assert tokens_to_reach(curve, 2.0) is None
    agg = pd.DataFrame([
        {"model": SMOL, "method": m, "variant": "default", "ratio": 0.3, "stage": "final",
         "table": "main", "trained": True, "loss": "lm"} for m in ("flexigpt", "shortgpt_lora")])
    logs = {f"{SMOL}/flexigpt/default/r0.3/trained": _log([6.0, 5.0, 4.0, 3.0, 3.0, 3.0]),
            f"{SMOL}/shortgpt_lora/default/r0.3/trained": _log([6.0, 5.0, 4.0, 4.0, 4.0])}
    out = add_reach(agg, logs).set_index("method")["tokens_to_baseline"]
    assert out["flexigpt"] == "4K" and out["shortgpt_lora"] is None
    logs[f"{SMOL}/shortgpt_lora/default/r0.3/trained"] = _log([2.0, 2.0, 2.0])
    assert add_reach(agg, logs).set_index("method").at["flexigpt", "tokens_to_baseline"] == NEVER


def test_error_bars_and_recovery_figure(tmp_path, monkeypatch):
    from flexigpt.tables import curves, plots

    root = grid(tmp_path / "r", -0.1, WIN, NONE)
    for method in ("flexigpt", "shortgpt_lora"):
        log_path = root / SMOL / method / "default" / "r0.3" / "trained" / "train_log.csv"
        log_path.parent.mkdir(parents=True)
        _log([6.0, 5.0, 4.0, 3.5]).to_csv(log_path, index=False)
    figs = {}
    real = plots.save_figure
    monkeypatch.setattr(plots, "save_figure",
                        lambda fig, out, stem: figs.setdefault(stem, fig) and real(fig, out, stem))
    written = build_all(root, tmp_path / "o", formats=("md", "csv"))
    assert tmp_path / "o" / "fig_recovery_smollm2-135m_r0.3.png" in written
    ax = figs["fig_accuracy_vs_ratio_smollm2-135m"].axes[0]
    assert ax.containers, "error bars drawn"
    assert "KD runs excluded" in " ".join(t.get_text() for t in
                                         figs["fig_recovery_smollm2-135m_r0.3"].axes[0].texts)
    md = (tmp_path / "o" / "table1_smollm2-135m.md").read_text()
    assert "Tokens to SG+LoRA loss" in md and curves.REACH_NOTE in md


def test_comparisons_cover_paper_protocol_and_kd_rows(tmp_path):
    root = grid(tmp_path / "r", -0.1, WIN, NONE)
    common = set(range(80))
    write_run(root, "flexigpt", "paper", 0.3, table="paper_protocol", trained=True,
              correct=common | WIN, log_ppl=BASE_LP - 0.2)
    write_run(root, "shortgpt_lora", "paper", 0.3, table="paper_protocol", trained=True,
              correct=common, log_ppl=BASE_LP)
    write_run(root, "flexigpt", "kd", 0.3, table="kd", trained=True, correct=common,
              log_ppl=BASE_LP + 0.3)  # FlexiGPT (LM) is BASE_LP - 0.1
    build_all(root, tmp_path / "o", make_plots=False, formats=("md", "csv"))
    comp = pd.read_csv(tmp_path / "o" / "comparisons.csv")
    ppl = comp[comp["metric"].eq("log_ppl")].set_index(["variant", "comparison"])
    paper = ppl.loc[("paper", "vs ShortGPT + LoRA* (paper protocol)")]
    assert paper["baseline"] == "shortgpt_lora/paper" and paper["estimate"] == pytest.approx(-0.2)
    kd = ppl.loc[("kd", "KD vs LM loss")]
    assert kd["baseline"] == "flexigpt/default" and kd["estimate"] == pytest.approx(0.4)
    assert kd["ci_low"] > 0 and paper["ci_high"] < 0
    avg = comp[comp["metric"].eq("avg") & comp["variant"].eq("kd")].iloc[0]
    assert avg["estimate"] == pytest.approx(-100 * len(WIN) / N_DOCS)


# ---- margins, Holm, seeds, budgets, (e) at equal block counts, (f) from the paper -------
def _frames(root: Path) -> tuple[pd.DataFrame, Comparator]:
    """The aggregated frame and a comparator of every result JSON under ``root``."""
    df = collect_results(gather_inputs(root).results)
    return build.aggregate(df), Comparator(RecordStore(df))


def test_counted_claims_count_ties_as_lost():
    tie = [SUPPORTED] * 4 + [NO_DIFFERENCE, NO_DIFFERENCE]
    assert decide_count(tie, 5) == CONTRADICTED  # two benchmarks without a lead > 6 − 5
    assert decide_count([SUPPORTED] * 5 + [NO_DIFFERENCE], 5) == SUPPORTED
    assert decide_count([SUPPORTED] * 4 + [NO_DIFFERENCE, UNDECIDED], 5) == UNDECIDED


def _diff(boot: np.ndarray) -> Diff:
    iv = S.Interval(float(boot.mean()), *np.quantile(boot, [0.025, 0.975]), float(boot.std()),
                    0.95, 100, len(boot))
    return Diff(OK, iv, replicates=boot)


def test_holm_family_is_stricter_than_one_interval_at_a_time():
    rng = np.random.default_rng(0)
    borderline = [rng.normal(2.3, 1.0, 2000) for _ in range(6)]  # ~1 % below 0 each
    assert all(verdicts.decide(_diff(b), "greater") == SUPPORTED for b in borderline)
    held = decide_family([_diff(b) for b in borderline], ["greater"] * 6, [0.0] * 6)
    assert held == [UNDECIDED] * 6
    strong = rng.normal(6.0, 1.0, 2000)
    held = decide_family([_diff(strong), *map(_diff, borderline[:5])], ["greater"] * 6,
                         [0.0] * 6)
    assert held[0] == SUPPORTED and set(held[1:]) == {UNDECIDED}
    one = decide_family([_diff(borderline[0]), Diff("not run")], ["greater"] * 2, [0.0] * 2)
    assert one == [SUPPORTED, MISSING_RUN]  # a family of one decides as its interval does
    tie = decide_family([_diff(rng.normal(0.0, 0.1, 2000))], ["greater"], [1.0])
    assert tie == [NO_DIFFERENCE]


def test_single_seed_marker():
    iv = S.Interval(0.1, 0.0, 0.2, 0.05, 0.95, 100, 2000, seeds=(1, 3))
    assert claim_rows._seeds([Diff(OK, iv)]) == ("1 vs 3 †", True)
    iv3 = S.Interval(0.1, 0.0, 0.2, 0.05, 0.95, 100, 2000, seeds=(3, 3))
    assert claim_rows._seeds([Diff(OK, iv3), Diff("not run")]) == ("3 vs 3", False)
    assert claim_rows._seeds([]) == ("–", False)
    with pytest.raises(ValueError, match="log_ppl_margin"):
        Rules(log_ppl_margin=-1.0)


def test_budgets_give_one_row_each_and_a_trend(tmp_path):
    """The like-for-like pair at 1K and 4K tokens (a budget per variant): (a), (b), (c) get
    a row per budget; equal accuracy is "no practical difference"; the trend fits the gap."""
    root = grid(tmp_path / "r", 0.2, NONE, NONE)  # +0.2 nats at 1K tokens, same docs right
    common = set(range(80))
    write_run(root, "shortgpt_lora", "long", 0.3, table="main", trained=True, tokens=4000,
              correct=common, log_ppl=BASE_LP)
    write_run(root, "flexigpt", "long", 0.3, table="main", trained=True, tokens=4000,
              correct=common, log_ppl=BASE_LP + 0.1 + _noise(3, 0.02))
    for method in ("shortgpt_lora", "flexigpt"):  # a perplexity-only budget in between
        write_run(root, method, "mid", 0.3, table="main", trained=True, tokens=2000,
                  correct=common, tasks=False,
                  log_ppl=BASE_LP + (0.15 if method == "flexigpt" else 0.0))
    v = _verdicts(root, tmp_path / "o")
    for prefix in ("(a)", "(b)", "(c)"):
        rows = v[v["Claim"].str.startswith(prefix) & v["Setting"].eq("30%")]
        assert list(rows["tokens"]) == [1000, 2000, 4000], prefix
        rows = rows[~rows["tokens"].eq(2000)]
        assert rows["Budget"].str.startswith("1K tokens").iloc[0]
        assert rows["tokens_per_param"].iloc[1] == pytest.approx(4000 / 134515008, rel=1e-4)
    a = v[v["Claim"].str.startswith("(a)") & v["Setting"].eq("30%")]
    assert list(a["Verdict"]) == [CONTRADICTED] * 3
    b = v[v["Claim"].str.startswith("(b)") & v["Setting"].eq("30%")]
    assert list(b["Verdict"]) == [NO_DIFFERENCE, "no records (point values only)",
                                  NO_DIFFERENCE]
    assert set(v.loc[v["Claim"].str.startswith("(a)"), "Seeds"].dropna()) >= {"1 vs 1 †"}
    md = (tmp_path / "o" / "verdicts.md").read_text()
    assert md.index("### Decision rules") < md.index("### smollm2-135m: the paper's claims")
    assert "0.02 nats" in md and "Holm" in md and "†" in md


def test_e_needs_equal_block_counts_and_a_paper_number(tmp_path):
    root = grid(tmp_path / "r", -0.1, WIN, NONE)
    common = set(range(80))
    runs = [("flexigpt", "default", 0.3, "start", 13, "main", 2.0),
            ("shortgpt", "default", 0.3, "final", 12, "main", 2.3),
            ("flexigpt", "paper", 0.3, "start", 9, "paper_protocol", 1.5),
            ("shortgpt", "paper", 0.3, "final", 9, "paper_protocol", 1.8),
            ("flexigpt", "default", 0.4, "start", 17, "main", 3.0),
            ("shortgpt", "default", 0.4, "final", 15, "main", 2.5)]
    for i, (method, variant, ratio, stage, blocks, table, shift) in enumerate(runs):
        write_run(root, method, variant, ratio, table=table, stage=stage, blocks=blocks,
                  correct=common, log_ppl=BASE_LP + shift + _noise(10 + i, 0.02),
                  trained=method == "flexigpt")
    write_run(root, "flexigpt", "no_svdinit", 0.3, table="ablation", stage="start",
              trained=True, correct=common, log_ppl=BASE_LP + 2.009 + _noise(10, 0.02))
    v = _verdicts(root, tmp_path / "o")
    matched = _claim(v, "(e)")
    assert matched["Verdict"].startswith("not decided: unequal block counts (13 replaced vs 12")
    assert _claim(v, "(e)", "30%, paper protocol")["Verdict"] == SUPPORTED
    assert _claim(v, "(e)", "40%")["Verdict"] == NOT_A_CLAIM
    svd = _claim(v, "(d) no SVD init. → lower start PPL")
    assert svd["estimate"] == pytest.approx(0.009, abs=1e-9)
    assert svd["Verdict"] == NO_DIFFERENCE  # +0.9 % PPL: inside ±0.02 nats
    agg, comp = _frames(root)
    strict = [r for r in verdicts.claim_d(agg, load_published(), comp, SMOL,
                                          Rules(log_ppl_margin=0.0))
              if r["Claim"].startswith("(d) no SVD init. → lower")]
    assert strict[0]["Verdict"] == CONTRADICTED  # without a margin: the old call


def test_paper_columns_of_b_c_and_f(tmp_path):
    v = _verdicts(grid(tmp_path / "r", -0.1, WIN, NONE), tmp_path / "o")
    b = _claim(v, "(b)")["Paper"]
    assert "+1.28 as reported" in b and "+0.68 recomputed" in b
    assert "as reported" not in _claim(v, "(b)", "40%")["Paper"]  # the paper's avg adds up
    assert _claim(v, "(c)")["Paper"] == "best on 5/6 (not ARC-e 62.84 vs 63.09)"
    assert _claim(v, "(c)", "40%")["Paper"] == "best on 6/6"
    f = v[v["Claim"].str.startswith("(f)")].set_index("Claim")["Paper"]
    assert f["(f) FlexiGPT extension (block) beats Base"].endswith(
        "better on 5/6 (not PIQA 73.23 vs 73.29)")
    assert f["(f) FlexiGPT extension (sequential) beats Base"].endswith(
        "better on 5/6 (not WinoG. 57.85 vs 59.11)")


def test_timing_rows_name_the_commit_that_measured_them(tmp_path):
    old = "a757c7cea84b4369046a63a05d1ae684f226fc09"  # before 68be9e3's decoding fixes
    path = tmp_path / "inference.json"
    path.write_text(json.dumps({"provenance": {"git_commit": old},
                                "created": "2026-12-02T18:52:00+00:00"}))
    note = timing_claims.timing_provenance(path, timing_claims.DECODE_FIXES)
    assert note.startswith("measured at commit a757c7c (2026-12-02)")
    if timing_claims._is_ancestor(old, "68be9e3797d282a6f5543042e0f380b212fe0dd0"):
        assert "predates the decoding fixes of 68be9e3" in note
    assert "predates" not in timing_claims.timing_provenance(path)  # no fixes named
    path.write_text(json.dumps({"created": "2026-12-02T18:52:00+00:00"}))
    assert timing_claims.timing_provenance(path) == "measured 2026-12-02; commit not recorded"
    assert timing_claims.timing_provenance(None) == ""


def test_claim_c_names_its_baselines_in_table_order_whatever_the_file_order(tmp_path):
    """The recovered baselines of (c) are listed in the tables' method order, not in the
    order the result files were read (a DAG's input list and a directory scan differ)."""
    root = grid(tmp_path / "r", 0.3, set(), set())
    for method, variant in (("llm_pruner", "lora"), ("slicegpt", "rft")):
        write_run(root, method, variant, 0.3, table="main", trained=True,
                  correct=set(range(80)), log_ppl=BASE_LP)
    files = sorted(root.rglob("eval_*.json"))
    files = [f for f in files if not f.name.endswith(".windows.json")]
    names = set()
    for order in (files, files[::-1]):
        out = tmp_path / f"o{len(names)}"
        build_all(root, out, results=order, make_plots=False, formats=("md", "csv"))
        names.add(_claim(pd.read_csv(out / "verdicts.csv"), "(c)")["Ours"])
    assert names == {"0/6 supported vs ShortGPT + LoRA*, SliceGPT + RFT*, LLM-Pruner + LoRA*"}
