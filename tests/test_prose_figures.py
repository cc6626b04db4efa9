"""No number in prose that a file does not produce (issue 49): every result figure quoted in
the README or in a reference run's RUN.md is found, at the precision quoted, in a generated
file (a table, CSV or JSON written by the harness) of that run's folder (the README: of any
reference run).

A *result figure* is a decimal number (``24.64``, ``+0.156``, ``[−1.3, +1.3]``) not followed
by a unit of time, speed, size or work (those measure the machine, not the method: ``80.4
min``, ``1.36×``, ``616 tok/s``, ``3.3 GB``) and not a factor or a bound asked for (``× 1.47``,
``≤ 1.5``). Integers are not checked (counts, budgets). A figure matches a generated number
that rounds to it. A RUN.md may quote its own run's files, the cross-model tables and the
benchmark records beside the runs (``results/reference/*.json``); the README any of them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "results" / "reference"
#: a decimal in prose: optional sign (ASCII or Unicode minus), digits with thousands commas.
FIGURE = re.compile(r"(?<![\w.])([+\-−]?)(\d[\d,]*\.\d+)(?![\w.])")
#: what follows a machine measurement: a range or a ratio of such ("6.2-7.8 s", "0.404 / 0.511
#: ×") then its unit.
MEASUREMENT = re.compile(
    r"^(?:\s*(?:-|–|/|to|and)\s*[+\-−]?\d[\d,]*(?:\.\d+)?)*\s*"
    r"(?:×|x\b|ms\b|s\b|min\b|h\b|tok/s|tokens/s|tokens per second|MB\b|GB\b|GiB\b|MiB\b|"
    r"GFLOP|TFLOP|MFLOP|M FLOP|job-s|job-min|% MFU|% of the parallel|% of dense)")
#: a scaling factor ("3,541 × 1.47") or a bound asked for ("≤ 1.5"), not a result.
FACTOR_OR_BOUND = re.compile(r"[×≤≥<>]\s?$")
#: any number in a generated file (plain, with commas, or scientific).
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?")
GENERATED = (".md", ".csv", ".json")
PROSE = ("RUN.md", "README.md")


def generated_values(folders: list[Path]) -> set[str]:
    """Every number of the generated files in or under ``folders`` (folders or files),
    rounded to 0-6 decimals."""
    out: set[str] = set()
    for path in (p for f in folders for p in ([f] if f.is_file() else f.rglob("*"))):
        if (path.suffix not in GENERATED or path.name in PROSE or not path.is_file()
                or path.stat().st_size > 5_000_000):
            continue
        for match in NUMBER.finditer(path.read_text(errors="ignore")):
            try:
                value = float(match.group(0).replace(",", ""))
            except ValueError:
                continue
            out.update(f"{value:.{d}f}" for d in range(7))
    return out


def result_figures(text: str) -> list[tuple[int, str]]:
    """``(line, figure)`` of every result figure of ``text`` (see the module doc)."""
    found = []
    for match in FIGURE.finditer(text):
        if (MEASUREMENT.match(text[match.end():match.end() + 40])
                or FACTOR_OR_BOUND.search(text[max(0, match.start() - 3):match.start()])):
            continue
        found.append((text.count("\n", 0, match.start()) + 1, match.group(2).replace(",", "")))
    return found


def unsourced(prose: Path, folders: list[Path]) -> list[str]:
    """The result figures of ``prose`` that no generated file in ``folders`` holds."""
    values = generated_values(folders)
    return [f"{prose.relative_to(ROOT)}:{line}: {figure}"
            for line, figure in result_figures(prose.read_text()) if figure not in values]


def sources(run: Path) -> list[Path]:
    """Where a RUN.md's figures may come from: its run folder, the cross-model tables and
    the benchmark records beside the runs."""
    return [run.parent, REFERENCE / "across_models", *sorted(REFERENCE.glob("*.json"))]


DOCUMENTS = [(ROOT / "README.md", [REFERENCE]), (ROOT / "docs" / "results.md", [REFERENCE])] + [
    (run, sources(run)) for run in sorted(REFERENCE.glob("*/RUN.md"))]


@pytest.mark.parametrize("prose,folders", DOCUMENTS,
                         ids=[str(p.relative_to(ROOT)) for p, _ in DOCUMENTS])
def test_every_quoted_result_comes_from_a_generated_file(prose, folders):
    missing = unsourced(prose, folders)
    assert not missing, ("result figures in prose that no generated file holds (quote them "
                         "from the run's tables, or regenerate):\n" + "\n".join(missing))


def test_the_check_fails_on_a_planted_figure(tmp_path):
    """A figure no table holds is caught; the same text quoting the table's value, a rounding
    of it, or a timing is not."""
    (tmp_path / "table.md").write_text("| FlexiGPT* | 24.6351 | +0.156 [+0.144, +0.168] |\n")
    run = tmp_path / "RUN.md"
    run.write_text("PPL 24.64, Δ +0.156 [+0.144, +0.168]; 80.4 min, 1.36× faster, 6.2-7.8 s, "
                   "3,541 × 1.47, ≤ 1.5 asked.\n")
    values = generated_values([tmp_path])
    assert [f for _, f in result_figures(run.read_text()) if f not in values] == []
    run.write_text("PPL 24.64, and a typed-in 23.91 that no file produced.\n")
    assert [f for _, f in result_figures(run.read_text()) if f not in values] == ["23.91"]


@pytest.mark.parametrize("run", sorted(REFERENCE.glob("*/RUN.md")),
                         ids=lambda p: p.parent.name)
def test_run_md_names_the_commit_its_records_were_made_at(run):
    """Every ``git_commit`` in the provenance of a reference run's archived results is named
    (7 digits) in its RUN.md."""
    commits = {c[:7] for path in run.parent.glob("inputs/**/eval_*.json")
               for c in re.findall(r'"git_commit": "([0-9a-f]{40})"', path.read_text())}
    missing = sorted(c for c in commits if c not in run.read_text())
    assert not missing, f"{run.relative_to(ROOT)} does not name the records' commits {missing}"


def test_readme_headline_is_what_the_committed_verdicts_give():
    """The README's headline block is exactly :func:`flexigpt.tables.headline.headline` of the
    committed verdict files (regenerate: ``python -m flexigpt.tables.headline README.md``)."""
    import os

    from flexigpt.tables.headline import ACROSS, END, RUNS, START, headline

    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index(START):readme.index(END) + len(END)]
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        assert block == headline(ACROSS, RUNS), "README headline is stale: regenerate it"
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("doc", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))],
                         ids=lambda p: p.name)
def test_relative_links_resolve(doc):
    """Every relative Markdown link of the README and docs/ names a file or folder that
    exists (the docs moved out of the README keep working)."""
    broken = []
    for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", doc.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue
        if not (doc.parent / target).exists():
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)}: broken links {broken}"
