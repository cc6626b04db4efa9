"""The timing claims of ``verdicts.md``: (g) inference cost (paper Tables 6, 7) and (h)
self-speculative decoding. Both are single runs, reported and never decided; each row's
note says which commit measured it (:func:`timing_provenance`)."""

from __future__ import annotations

import math
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from flexigpt.storage.registry import ROLES
from flexigpt.tables.claim_rows import PAPER_T1, PAPER_T5, claim_row, num_text
from flexigpt.tables.decision import NOT_MEASURED, REPORTED
from flexigpt.tables.decode import PAPER_SPECULATIVE_FASTER
from flexigpt.tables.labels import method_label
from flexigpt.tables.published import match_published
from flexigpt.tables.schema import read_json

#: commits that changed decoding measurements: (h) figures from before them say so.
DECODE_FIXES = {"68be9e3797d282a6f5543042e0f380b212fe0dd0": "68be9e3 (lean decode loops, EOS)",
                "bc8534b8be7360161e00bf844ecd43b631b9b794": "bc8534b (BLAS timing before runs)"}


def claim_g(times: pd.DataFrame, pub: pd.DataFrame, model: str) -> Iterator[dict[str, Any]]:
    """(g) inference cost ratios (Tables 6, 7): reported, never decided (no interval)."""
    rows = times[times["model"].eq(model)] if not times.empty else times
    if rows.empty:
        yield claim_row("(g) inference cost (Tables 6, 7)", "–", "", NOT_MEASURED, None,
                        NOT_MEASURED)
        return
    for _, t in rows[~rows["method"].eq(ROLES.reference)].iterrows():
        table = 7 if t["method"] == ROLES.extension else 6
        ref = match_published(pub, (table,), PAPER_T1 if table == 6 else PAPER_T5,
                              t["method"], t["variant"], None, None)
        paper = "" if ref is None else (f"time {num_text(ref['relative_time'], '')}%, "
                                        f"throughput {num_text(ref['relative_throughput'], '')}%")
        ours = (f"time {100 * t['relative_time']:.1f}%, throughput "
                f"{100 * t['relative_throughput']:.1f}% (batch {t['batch']})")
        yield claim_row(f"(g) Table {table}: {method_label(t['method'], t['variant'])} "
                        "relative to dense", "", paper, ours, None, REPORTED,
                        notes=timing_provenance(t.get("file")))


def _is_ancestor(older: str, newer: str) -> bool | None:
    """Whether commit ``older`` is an ancestor of ``newer`` in this checkout (None when git
    or either commit is unavailable)."""
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "merge-base", "--is-ancestor", older, newer], cwd=root,
                             capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return {0: True, 1: False}.get(out.returncode)


def timing_provenance(path: Any, fixes: dict[str, str] | None = None) -> str:
    """Where a timing row's figures come from: the timing JSON's recorded commit and date,
    and each commit of ``fixes`` ({full sha: name}) that commit predates, when git can tell
    ("" when nothing is recorded)."""
    if path is None or (isinstance(path, float) and math.isnan(path)):
        return ""
    try:
        data = read_json(path)
    except Exception:  # noqa: BLE001 - a note, never a failure
        return ""
    commit = (data.get("provenance") or {}).get("git_commit")
    created = str(data.get("created") or "")[:10]
    if not commit:
        return f"measured {created}; commit not recorded" if created else ""
    stale = [name for fix, name in (fixes or {}).items()
             if commit != fix and _is_ancestor(fix, commit) is False]
    text = f"measured at commit {commit[:7]}" + (f" ({created})" if created else "")
    return text + (f"; predates the decoding fixes of {', '.join(stale)}" if stale else "")


def claim_h(decodes: pd.DataFrame | None, model: str) -> Iterator[dict[str, Any]]:
    """(h) self-speculative decoding is faster than plain FlexiGPT decoding (paper: 30.11 %
    faster): reported from the decoding timings, never decided (no interval); the note says
    which commit measured them."""
    rows = (decodes[decodes["model"].eq(model) & decodes["mode"].eq("speculative")]
            if decodes is not None and not decodes.empty else pd.DataFrame())
    if rows.empty:
        return
    for _, d in rows.iterrows():
        same = "identical" if d["identical"] else "NOT identical"
        ours = (f"{100 * (d['speedup'] - 1):+.1f}% (speed-up {d['speedup']:.3f}, bound "
                f"{d['bound']:.3f}; α {d['alpha']:.3f}, c {d['c']:.3f}, k {int(d['k'])}; "
                f"greedy output {same})")
        yield claim_row(f"(h) self-speculative decoding faster than plain "
                        f"{method_label(d['method'], d['variant'])} decoding", "batch 1",
                        f"+{PAPER_SPECULATIVE_FASTER:.2f}%", ours, None, REPORTED,
                        notes=timing_provenance(d.get("file"), DECODE_FIXES))
