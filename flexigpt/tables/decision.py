"""The decision rules of the verdicts: the verdict words, the smallest effects that matter
(:class:`Rules`), how one paired difference, a Holm family of them, or a count of won
benchmarks is decided, and the rules block printed first in ``verdicts.md``.

The rules themselves are stated in :mod:`flexigpt.tables.verdicts`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from flexigpt.core import stats
from flexigpt.tables.comparisons import NO_RECORDS, NOT_RUN, UNPAIRED, Diff
from flexigpt.tables.render import Block

SUPPORTED, CONTRADICTED, UNDECIDED = "supported", "contradicted", "undecided at this budget"
NO_DIFFERENCE = stats.NO_DIFFERENCE
NOT_A_CLAIM = "not a claim of the paper"
MISSING_RUN = "not run in this config"
REPORTED = "reported (timing; single run, no interval)"
NOT_MEASURED = "not measured"
#: smallest differences that matter (defaults of :class:`Rules`)
LOG_PPL_MARGIN = 0.02
ACCURACY_MARGIN = 1.0
SINGLE_SEED = "†"
_STATUS = {NOT_RUN: MISSING_RUN, NO_RECORDS: "no records (point values only)",
           UNPAIRED: "unpaired"}
#: the verdicts of a difference that could not be decided (no run, no records, unpaired)
STATUS_VERDICTS = tuple(_STATUS.values())
_STATS_VERDICT = {"supported": SUPPORTED, "contradicted": CONTRADICTED,
                  NO_DIFFERENCE: NO_DIFFERENCE, "undecided": UNDECIDED}


@dataclass(frozen=True)
class Rules:
    """The decision rules' parameters: margins m (log-PPL in nats, accuracy in points) and
    the level of every interval and of the Holm family (family-wise error 1 − level)."""

    log_ppl_margin: float = LOG_PPL_MARGIN
    accuracy_margin: float = ACCURACY_MARGIN
    level: float = stats.LEVEL

    def __post_init__(self) -> None:
        for name in ("log_ppl_margin", "accuracy_margin"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if self.level != stats.LEVEL:
            raise ValueError(f"level: the comparisons' intervals are at {stats.LEVEL}")

    def margin(self, metric: str) -> float:
        return self.log_ppl_margin if metric == "log_ppl" else self.accuracy_margin


def decide(diff: Diff, direction: str, margin: float = 0.0) -> str:
    """The verdict of one paired difference (``direction``: ``greater`` | ``less``) with
    the smallest effect that matters ``margin`` (:func:`flexigpt.core.stats.verdict`)."""
    if diff.interval is None:
        return _STATUS.get(diff.status, diff.status)
    return _STATS_VERDICT[diff.interval.verdict(direction, margin)]


def decide_family(diffs: list[Diff], directions: list[str], margins: list[float],
                  level: float = stats.LEVEL) -> list[str]:
    """Verdicts of K differences decided as one family (Holm, family-wise error
    1 − ``level``); a difference without replicates gets its status."""
    idx = [i for i, d in enumerate(diffs) if d.replicates is not None]
    held = stats.holm_verdicts([diffs[i].replicates for i in idx],
                               [directions[i] for i in idx], [margins[i] for i in idx], level)
    out = [_STATUS.get(d.status, d.status) for d in diffs]
    for i, v in zip(idx, held, strict=True):
        out[i] = _STATS_VERDICT[v]
    return out


def decide_count(verdicts: list[str], need: int) -> str:
    """Verdict of "at least ``need`` of these benchmarks are won" from per-benchmark ones:
    a benchmark is lost when contradicted or practically tied (no practical difference)."""
    if all(v == MISSING_RUN for v in verdicts):
        return MISSING_RUN
    won = sum(v == SUPPORTED for v in verdicts)
    lost = sum(v in (CONTRADICTED, NO_DIFFERENCE) for v in verdicts)
    if won >= need:
        return SUPPORTED
    if lost > len(verdicts) - need:
        return CONTRADICTED
    return UNDECIDED


def rules_block(rules: Rules) -> Block:
    """The first block of ``verdicts.md``: every rule a verdict follows, with its numbers."""
    m, a = rules.log_ppl_margin, rules.accuracy_margin
    pct = 100 * (1 - rules.level)
    items = [
        ("Interval", f"{100 * rules.level:.0f}% paired percentile bootstrap of Δ = A − B over "
         "the same documents / windows (2000 replicates; seeds resampled too where a side "
         "has several runs)"),
        ("Smallest effect that matters m", f"log-PPL {m:g} nats (PPL ratio ×{math.exp(m):.3f}); "
         f"accuracy {a:g} point(s), per task and for the average"),
        (SUPPORTED, "the whole interval lies beyond +m on the claimed side (minimum-effect "
         "test)"),
        (CONTRADICTED, "the whole interval lies beyond −m on the other side"),
        (NO_DIFFERENCE, "the whole interval lies inside (−m, +m) (equivalence: two one-sided "
         f"tests at {pct / 2:g}% each); neither supported nor contradicted"),
        (UNDECIDED, "anything else: an interval that touches or straddles ±m, including one "
         "that excludes 0 but reaches into (−m, +m)"),
        ("Multi-benchmark claims (c), (f)", "the row's K tests (6 benchmarks × comparison "
         f"runs) form one family: Holm step-down at family-wise error {pct:g}% on the "
         "bootstrap p-values dual to the intervals (each outcome's one-sided tail fraction "
         "beyond ±m, doubled; K = 1 gives the interval rule). A benchmark is won iff "
         "supported against every comparison run and lost iff contradicted or of no practical "
         "difference against one; the row is supported iff ≥ k are won, contradicted iff "
         "more than 6 − k are lost"),
        (f"Seeds, {SINGLE_SEED}", f"runs per side; {SINGLE_SEED} = decided from a single "
         "training seed on a side: the interval covers documents and windows, not "
         "training seeds"),
        ("Budget", "recovery tokens of the compared runs (tokens per dense-model parameter; "
         "the paper: 1B / 6.7B ≈ 0.15); like-for-like claims get one row per budget run"),
        ("(e)", "decided only at equal block counts (the paper-protocol pair when run) and "
         "only where the paper gives FlexiGPT's start PPL; else "
         f"'{NOT_A_CLAIM}' or 'not decided: unequal block counts'"),
        ("(g), (h)", "timings: a single run each, reported, never decided; Notes give the "
         "commit that measured them"),
    ]
    return Block("Decision rules", pd.DataFrame(items, columns=["Rule", "Definition"]))
