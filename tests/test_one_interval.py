"""One comparison, one interval: a difference the harness quotes in two places is quoted
with the same interval in both.

* A verdict on the like-for-like pair at a budget of a ladder takes the ladder's interval
  (jointly resampled, a one-seed side with its borrowed seed spread), the one the budget
  table shows: checked on every committed reference run that has a ladder.
* Prose (README.md, docs/*.md, every reference run's RUN.md) never quotes one log-PPL
  difference (an estimate to three decimals) with two different intervals.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "results" / "reference"
LADDER_RUNS = sorted(p.parent for p in REFERENCE.glob("*/budget_*_r*.csv")
                     if not p.name.startswith("budget_strategies"))
#: a log-PPL difference with its interval in prose: ``+0.156 [+0.122, +0.189]``
QUOTED = re.compile(r"([+\-−]\d+\.\d{3}) \[([+\-−]\d+\.\d{3}), ([+\-−]\d+\.\d{3})\]")
CLAIMS = {"(a)": "log_ppl", "(b)": "avg"}


def _prose() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
            *sorted(REFERENCE.glob("*/RUN.md"))]


def quoted_intervals(paths: list[Path], root: Path = ROOT) -> dict[str, set[tuple[str, str, str]]]:
    """Estimate → {(low, high, file)} of every quoted log-PPL difference in ``paths``
    (files named relative to ``root``)."""
    found: dict[str, set[tuple[str, str, str]]] = defaultdict(set)
    for path in paths:
        for match in QUOTED.finditer(path.read_text()):
            est, low, high = (x.replace("−", "-") for x in match.groups())
            found[est].add((low, high, str(path.relative_to(root))))
    return found


#: different comparisons whose estimates happen to print alike: estimate → each one's
#: interval and what it compares (the prose check tells them apart by the interval)
DISTINCT = {"+0.416": {("+0.384", "+0.443"): "(a) at 40 %, thorough run (65.5K tokens)",
                       ("+0.384", "+0.450"): "(a) at 40 %, bracketed default (32.8K tokens)"}}


def conflicts(found: dict[str, set[tuple[str, str, str]]],
              distinct: dict[str, dict[tuple[str, str], str]] | None = None) -> dict[str, list]:
    """Estimates quoted with more than one interval, but for the intervals ``distinct``
    declares as different comparisons."""
    distinct = distinct or {}
    return {est: sorted(v) for est, v in found.items()
            if len({(lo, hi) for lo, hi, _ in v} - set(distinct.get(est, {}))) > 1
            or (est in distinct and len({(lo, hi) for lo, hi, _ in v}
                                        - set(distinct[est])) == 1)}


def test_prose_quotes_one_interval_per_difference():
    found = quoted_intervals(_prose())
    assert not conflicts(found, DISTINCT)
    for est, intervals in DISTINCT.items():  # each declared pair is still quoted, as declared
        assert set(intervals) <= {(lo, hi) for lo, hi, _ in found.get(est, set())}, est


def test_the_prose_check_finds_two_intervals(tmp_path: Path):
    (tmp_path / "a.md").write_text("Δ +0.156 [+0.144, +0.168] at 1M; +0.219 [+0.197, +0.241]\n")
    (tmp_path / "b.md").write_text("the same, +0.156 [+0.122, +0.189]; +0.219 [+0.197, +0.241]\n")
    found = conflicts(quoted_intervals([tmp_path / "a.md", tmp_path / "b.md"], tmp_path))
    assert set(found) == {"+0.156"}


@pytest.mark.skipif(not LADDER_RUNS, reason="no committed reference run with a budget ladder")
@pytest.mark.parametrize("run", LADDER_RUNS, ids=lambda p: p.name)
def test_ladder_verdicts_quote_the_budget_tables_interval(run: Path):
    verdicts = pd.read_csv(run / "verdicts.csv")
    checked = 0
    for table in sorted(run.glob("budget_*_r*.csv")):
        if table.name.startswith("budget_strategies"):
            continue
        ladder = pd.read_csv(table)
        for _, point in ladder.dropna(subset=["tokens"]).iterrows():
            for claim, metric in CLAIMS.items():
                if pd.isna(point[f"{metric}_diff"]):
                    continue
                rows = verdicts[verdicts["Claim"].str.startswith(claim)
                                & verdicts["tokens"].eq(point["tokens"])
                                & verdicts["Setting"].eq(f"{100 * point['ratio']:.0f}%")]
                assert len(rows) == 1, (claim, point["tokens"])
                row = rows.iloc[0]
                for mine, theirs in (("estimate", "diff"), ("ci_low", "low"),
                                     ("ci_high", "high")):
                    assert row[mine] == pytest.approx(point[f"{metric}_{theirs}"], abs=1e-9), \
                        (claim, point["tokens"], mine)
                checked += 1
    assert checked
