"""The report a person opens: ``report.md`` and ``report.html`` in the tables folder.

Both start with the findings and the legend, in the README's words
(:func:`flexigpt.tables.findings.run_findings` on this run's verdicts,
:func:`flexigpt.tables.findings.legend`), then every summary table (verdicts first, budget
ladders last). ``report.html`` also marks each verdict by its kind (colour and symbol,
:mod:`flexigpt.tables.marks`), links each table's files and shows each figure that plots a
table's numbers beside that table (under it where the window is too narrow); the figures
that plot no table's numbers (block influence, distances, every run's training loss) close
the page. The page is one file: its style inline, no script, no font or style from
elsewhere; its images and links are paths relative to its folder.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import quote

from markdown_it import MarkdownIt

from flexigpt.core.fileio import atomic_write_text
from flexigpt.tables import findings, marks
from flexigpt.tables.render import STYLE, Table, blocks_html, mark_span, to_markdown

REPORT_TITLE = "FlexiGPT reproduction report"
#: the name of the verdict table, whose CSV rows the findings state
VERDICTS = "verdicts"
#: what the findings say when this run decides none of their claims
NO_FINDINGS = ("- None: this run decides none of the claims (a), (b), (c) (it has no "
               "recovered like-for-like pair with per-document records).")
#: the extra style of the report page (after :data:`flexigpt.tables.render.STYLE`)
PAGE_STYLE = (
    "body{max-width:2200px;padding:0 1.5em;color:#222;line-height:1.4}"
    "h2{margin-top:0.6em;font-size:1.3em}h3{font-size:1.05em}"
    "li{font-size:14px;margin:0.3em 0}"
    "nav.contents{font-size:13px;columns:2 24em;background:#f6f6f6;padding:0.5em 1em}"
    "nav.contents li{font-size:13px;margin:0.1em 0}"
    "section{border-top:1px solid #ddd;margin-top:1.5em}"
    ".files{font-size:12px;color:#555}"
    ".pair{display:flex;flex-wrap:wrap;gap:1.5em;align-items:flex-start}"
    ".pair>.blocks{flex:0 1 auto;min-width:0;max-width:100%;overflow-x:auto}"
    ".pair>.blocks p{max-width:60em}"  # notes wrap: a narrow table leaves room for its figure
    ".figures{flex:1 1 660px;display:flex;flex-wrap:wrap;gap:1em;align-items:flex-start}"
    "figure{margin:0.5em 0;flex:0 1 auto;width:660px;max-width:100%}"
    "figure img{width:100%;height:auto;border:1px solid #eee}"
    "figcaption{font-size:12px;color:#555}"
    "p.key{font-size:14px}p.key .mark{margin-right:0.8em}"
)
_MD = MarkdownIt("commonmark", {"html": False})
_TAG = re.compile(r"(<[^>]*>)")


def findings_lines(tables: Sequence[Table], written: Sequence[Path]) -> list[str]:
    """The findings as Markdown lines: the README's sentences for this run's verdicts and
    where they come from (a link to the verdict table's file)."""
    verdicts = next((t for t in tables if t.name == VERDICTS), None)
    lines = findings.run_findings(verdicts.csv) if verdicts is not None else []
    source = next((p.name for suffix in (".csv", ".md") for p in written
                   if p.name == f"{VERDICTS}{suffix}"), None)
    origin = ([f"Generated from this run's verdicts, [`{source}`]({source}); the verdict "
               "table below gives every claim and setting."] if source else [])
    return [*(lines or [NO_FINDINGS]), "", *origin]


def report_markdown(tables: Sequence[Table], written: Sequence[Path]) -> str:
    """``report.md``: the title, the findings and the legend, then every table."""
    return "\n".join([f"# {REPORT_TITLE}", "", "## Findings", "",
                      *findings_lines(tables, written), "", "## Legend", "",
                      *findings.legend(), "", *(to_markdown(t) for t in tables)])


def mark_verdicts(fragment: str) -> str:
    """``fragment`` (HTML) with every verdict phrase of its text (:func:`marks.phrases`)
    wrapped in its mark; tags are left alone."""
    found = marks.phrases()
    words = re.compile(r"(?<![\w-])(" + "|".join(re.escape(w) for w, _ in found)
                       + r")(?![\w-])")
    by_words = dict(found)

    def wrap(match: re.Match[str]) -> str:
        mark = by_words[match.group(1)]
        return mark_span(mark.kind, mark.symbol, match.group(1))

    return "".join(part if part.startswith("<") else words.sub(wrap, part)
                   for part in _TAG.split(fragment))


def _key() -> str:
    """One line naming every mark."""
    return ('<p class="key">Verdict marks: ' + "".join(
        mark_span(m.kind, m.symbol, html.escape(m.label)) for m in marks.MARKS) + "</p>")


def _figure(path: Path) -> str:
    src = quote(path.name)
    return (f'<figure><a href="{src}"><img src="{src}" alt="{html.escape(path.stem)}"></a>'
            f"<figcaption>{html.escape(path.name)}</figcaption></figure>")


def _figures(paths: Sequence[Path]) -> str:
    shown = [p for p in paths if p.suffix == ".png"]
    return ('<div class="figures">' + "".join(_figure(p) for p in shown) + "</div>"
            if shown else "")


def _section(table: Table, files: Sequence[Path], figures: Sequence[Path]) -> str:
    links = " · ".join(f'<a href="{quote(p.name)}">{html.escape(p.name)}</a>' for p in files)
    return (f'<section id="{html.escape(table.name)}"><h2>{html.escape(table.title)}</h2>'
            + (f'<p class="files">Files: {links}</p>' if links else "")
            + f'<div class="pair"><div class="blocks">{blocks_html(table)}</div>'
            + _figures(figures) + "</div></section>\n")


def report_html(tables: Sequence[Table], written: Sequence[Path],
                beside: Mapping[str, Sequence[Path]], loose: Sequence[Path]) -> str:
    """``report.html``: the findings and the legend (:func:`findings_lines`, verdicts
    marked, the marks' key), a list of the sections, then one section per table with its
    files and the figures of ``beside[table.name]`` beside it, then the ``loose`` figures."""
    esc = html.escape
    head = ('<section id="findings"><h2>Findings</h2>'
            + mark_verdicts(_MD.render("\n".join(findings_lines(tables, written))))
            + '</section>\n<section id="legend"><h2>Legend</h2>'
            + mark_verdicts(_MD.render("\n".join(findings.legend()))) + _key()
            + "</section>\n")
    other = [p for p in loose if p.suffix == ".png"]
    contents = [*((t.name, t.title) for t in tables),
                *([("other-figures", "Figures of numbers no table shows")] if other else [])]
    nav = ('<nav class="contents"><ol>' + "".join(
        f'<li><a href="#{esc(key)}">{esc(title)}</a></li>' for key, title in contents)
        + "</ol></nav>\n")
    sections = "".join(
        _section(t, [p for p in written if p.stem == t.name and p.suffix != ".html"],
                 beside.get(t.name, [])) for t in tables)
    if other:
        sections += ('<section id="other-figures"><h2>Figures of numbers no table shows</h2>'
                     + _figures(other) + "</section>\n")
    return ('<!doctype html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(REPORT_TITLE)}</title><style>{STYLE}{PAGE_STYLE}{marks.css()}"
            f"</style></head><body><h1>{esc(REPORT_TITLE)}</h1>\n{head}{nav}{sections}"
            "</body></html>\n")


def write_report(out: Path, tables: Sequence[Table], written: Sequence[Path],
                 beside: Mapping[str, Sequence[Path]], loose: Sequence[Path]) -> list[Path]:
    """Write ``report.md`` and ``report.html`` into ``out``; returns both paths.
    ``written``: the files already in ``out`` (each table's own, linked from its section)."""
    report, page = out / "report.md", out / "report.html"
    atomic_write_text(report, report_markdown(tables, written))
    atomic_write_text(page, report_html(tables, written, beside, loose))
    return [report, page]
