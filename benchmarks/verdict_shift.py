"""What a re-tuned run changed: each claim row's Δ and verdict before and after, beside the
learning rates each side of the comparison chose before and after.

Reads two runs' committed tables (``verdicts.csv`` and ``lr_sweep_<model>.csv`` of each
folder) and prints a Markdown table, one row per claim row present in both (matched by
claim, setting and budget), with the chosen learning rates of the runs the like-for-like
claims (a), (b) compare::

    python -m benchmarks.verdict_shift BEFORE_DIR AFTER_DIR [--out FILE]

No number is recomputed: both columns are the runs' own verdict rows.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from flexigpt.storage.registry import ROLES
from flexigpt.tables.decision import MISSING_RUN as MISSING

#: the claims whose two sides are the Table 1 pair (their chosen LRs are shown)
PAIR_CLAIMS = ("(a)", "(b)")
KEY = ["Claim", "Setting", "Budget"]


def _tables(folder: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    verdicts = pd.read_csv(folder / "verdicts.csv")
    sweeps = sorted(folder.glob("lr_sweep_*.csv"))
    if not sweeps:
        raise FileNotFoundError(f"{folder}: no lr_sweep_<model>.csv")
    return verdicts, pd.concat([pd.read_csv(p) for p in sweeps], ignore_index=True)


def _rate(value: float) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else f"{value:.2g}"


def chosen_rates(sweeps: pd.DataFrame, method: str, ratio: float) -> str:
    """``lr`` (``/ γ gamma_lr``) the Table 1 run of ``method`` at ``ratio`` chose."""
    rows = sweeps[sweeps["chosen"].astype(bool) & sweeps["method"].eq(method)
                  & sweeps["variant"].eq("default") & (sweeps["ratio"] - ratio).abs().lt(1e-6)]
    if rows.empty:
        return "–"
    row = rows.iloc[0]
    text = _rate(row["lr"])
    return text if pd.isna(row.get("gamma_lr")) else f"{text} / γ {_rate(row['gamma_lr'])}"


def shift_table(before: Path, after: Path) -> str:
    """The Markdown table of every claim row both runs have."""
    (vb, sb), (va, sa) = _tables(before), _tables(after)
    both = vb.merge(va, on=KEY, suffixes=(" before", " after"))
    lines = ["| Claim | Setting | Δ before | Verdict before | Δ after | Verdict after | "
             "Sensitivity after | LRs before (A; B) | LRs after (A; B) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for _, row in both.iterrows():
        rates = ["", ""]
        if str(row["Claim"]).startswith(PAIR_CLAIMS) and str(row["Setting"]).endswith("%"):
            ratio = float(str(row["Setting"]).rstrip("%")) / 100
            rates = ["; ".join(chosen_rates(s, m, ratio)
                               for m in (ROLES.subject, ROLES.comparator)) for s in (sb, sa)]
        lines.append(f"| {row['Claim']} | {row['Setting']} | {row['Δ [95% CI] before']} | "
                     f"{row['Verdict before']} | {row['Δ [95% CI] after']} | "
                     f"{row['Verdict after']} | {row.get('Sensitivity after', '–')} | "
                     f"{rates[0]} | {rates[1]} |")
    ran = both[~both["Verdict before"].eq(MISSING) & ~both["Verdict after"].eq(MISSING)]
    changed = int((ran["Verdict before"] != ran["Verdict after"]).sum())
    lines.append("")
    lines.append(f"{changed} of the {len(ran)} claim rows run in both changed verdict "
                 f"({len(both) - len(ran)} not run in one of them); A = FlexiGPT*, B = "
                 "ShortGPT + LoRA* (LR / γ LR chosen by each run's sweep).")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    text = shift_table(args.before, args.after)
    if args.out:
        args.out.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
