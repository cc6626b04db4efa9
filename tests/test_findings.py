"""The README's findings and legend (:mod:`flexigpt.tables.findings`) are what the committed
verdicts give, change when a verdict changes, and define every mark the headline uses."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from flexigpt.tables import findings, headline

ROOT = Path(__file__).resolve().parent.parent


def _readme_block(name: str, start: str, end: str) -> str:
    text = (ROOT / "README.md").read_text()
    assert text.count(start) == 1 and text.count(end) == 1, f"README has no {name} block"
    return text[text.index(start):text.index(end) + len(end)]


def test_readme_findings_are_what_the_committed_verdicts_give(monkeypatch):
    """Regenerate with ``python -m flexigpt.tables.findings README.md``."""
    monkeypatch.chdir(ROOT)
    block = _readme_block("findings", findings.START, findings.END)
    assert block == findings.block(), "README findings are stale: regenerate them"
    assert len(re.findall(r"^- Claim \(", block, re.M)) == 3


def test_a_changed_verdict_changes_the_findings(tmp_path: Path):
    across = pd.read_csv(ROOT / findings.ACROSS)
    first = across.index[across["claim"].str.startswith("(a)")][0]
    assert across.loc[first, "verdict"] == "contradicted"
    before = findings.block(ROOT / findings.ACROSS, [ROOT / p for p in findings.RUNS])
    across.loc[first, "verdict"] = "supported"
    across.to_csv(tmp_path / "across.csv", index=False)
    after = findings.block(tmp_path / "across.csv", [ROOT / p for p in findings.RUNS])
    assert after != before
    assert "contradicted in 6, supported in 1 of the 7 settings run" in after


def test_the_sentence_counts_each_verdict_and_spans_the_deltas():
    rows = pd.DataFrame({
        "letter": ["a"] * 3, "claim": ["(a) X lower PPL than Y"] * 3,
        "model": ["m1", "m2", "m1"], "setting": ["30%", "30%", "40%"],
        "tokens": [32768, 32768, 1048576],
        "verdict": ["contradicted", "undecided at this budget", "contradicted"],
        "delta": ["+0.2 [+0.1, +0.3]", "-0.1 [-0.5, +0.3]", "+0.9 [+0.8, +1.0]"]})
    assert findings.sentence(rows) == (
        "Claim (a) X lower PPL than Y: contradicted in 2, undecided at this budget in 1 of the "
        "3 settings run (m1, m2; 30% and 40% compression; 32,768 to 1.05M recovery tokens; "
        "Δ from -0.1 [-0.5, +0.3] to +0.9 [+0.8, +1.0] nats of log-PPL).")


def test_the_legend_defines_every_mark_and_claim_letter_of_the_headline(monkeypatch):
    monkeypatch.chdir(ROOT)
    legend = "\n".join(findings.legend())
    table = _readme_block("headline", headline.START, headline.END)
    letters = set(re.findall(r"^\| \(([a-z])\)", table, re.M))
    across = pd.read_csv(ROOT / findings.ACROSS)
    letters |= {m.group(1) for c in across["claim"] if (m := re.match(r"\(([a-z])\)", c))}
    assert letters and letters <= set(findings.LETTERS)
    for letter in letters:
        assert f"({letter}) " in legend
    marks = {"*": "**\\***", "†": "**†**", "(one-shot)": "**(one-shot)**",
             "not decided:": "**not decided: …**", "Δ": "**Δ [95% CI]**"}
    for mark, defined in marks.items():
        if mark in table or mark == "(one-shot)":
            assert defined in legend, mark
    for verdict in set(across["verdict"]):
        word = str(verdict).removesuffix(" †")
        if not word.startswith((*headline._SKIP, "not decided", "reported")):
            assert f"**{word}**" in legend, word
    assert "**Holm**" in legend and "**m**" in legend
