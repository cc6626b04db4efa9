"""Render tables (one or more blocks of rows) to Markdown, LaTeX and CSV.

A :class:`Block` holds numbers in display units (accuracies and ratios in %) and says per
column how to format it and whether lower or higher is best; bolding is computed per
group (e.g. per compression ratio) among groups with at least two values, on the values
as displayed (so ties after rounding are all bold).
"""

from __future__ import annotations

import html
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from flexigpt.core.fileio import atomic_write_text

log = logging.getLogger(__name__)

#: column kind → formatter of a non-missing value.
FORMATS = {
    "text": lambda v: str(v),
    "int": lambda v: f"{int(v)}",
    "num": lambda v: f"{v:.2f}",
    "num0": lambda v: f"{v:.0f}",
    "num1": lambda v: f"{v:.1f}",
    "num3": lambda v: f"{v:.3f}",
    "ppl": lambda v: f"{v:.2f}" if abs(v) < 1e4 else f"{v:.2e}",
    "pct0": lambda v: f"{v:.0f}%",
    "pct1": lambda v: f"{v:.1f}%",
    "delta": lambda v: f"{v:+.2f}",
    "delta_pct": lambda v: f"{v:+.1f}",
}
MISSING = "–"


def replace_marked(text: str, start: str, end: str, new: str, name: str) -> str:
    """``text`` with the generated block from marker ``start`` through marker ``end``
    replaced by ``new`` (which carries both markers). ValueError naming the ``name`` block
    when the markers are missing or out of order."""
    i, j = text.find(start), text.find(end)
    if i < 0 or j < i:
        raise ValueError(f"no {name} block (its START and END markers) in the text")
    return text[:i] + new + text[j + len(end):]


def si(v: float) -> str:
    """A count with an SI suffix, 3 significant digits: 40960 → 41K, 5.03e7 → 50.3M."""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(v) >= div:
            return f"{v / div:.3g}{suffix}"
    return f"{v:.0f}"


def sci(v: float) -> str:
    """Compact scientific notation for learning rates: 3e-4, 2.5e-4, 1e-3."""
    if v == 0 or not math.isfinite(v):
        return f"{v:g}"
    mantissa, exponent = f"{v:.2e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


FORMATS["si"] = si
FORMATS["sci"] = sci


@dataclass
class Block:
    """A titled set of rows.

    Attributes:
        title: heading (Markdown ``###``; a LaTeX comment + caption line).
        frame: rows; columns are the displayed headers, values in display units.
        kinds: column → key of :data:`FORMATS` (default "text").
        best: column → "min" | "max": bold the best value per ``group``.
        group: column whose values split rows into bolding groups (None: one group).
        markers: (row position, column) → suffix such as "†".
        notes: footnote lines printed under the block.
        errors: column → per-row 95 % CI half-width (None: not shown), rendered
            ``value ±hw`` after the value; bolding uses the value only.
        marks: column → function of a cell's text giving ``(kind, symbol)`` (None: no
            mark): in HTML the cell gets the class ``mark mark-<kind>`` and the symbol
            before its text (:mod:`flexigpt.tables.marks`); Markdown, LaTeX and CSV show
            the text alone.
    """

    title: str
    frame: pd.DataFrame
    kinds: dict[str, str] = field(default_factory=dict)
    best: dict[str, str] = field(default_factory=dict)
    group: str | None = None
    markers: dict[tuple[int, str], str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    errors: dict[str, list[float | None]] = field(default_factory=dict)
    marks: dict[str, Callable[[str], tuple[str, str] | None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for col, kind in self.kinds.items():
            if kind not in FORMATS:
                raise ValueError(f"unknown format kind {kind!r} for column {col!r}")
        for col, how in self.best.items():
            if how not in ("min", "max"):
                raise ValueError(f"best[{col!r}] must be 'min' or 'max', got {how!r}")


@dataclass
class Table:
    """A named table: blocks for Markdown/LaTeX and one tidy frame for CSV."""

    name: str
    title: str
    blocks: list[Block]
    csv: pd.DataFrame
    notes: list[str] = field(default_factory=list)


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA


def _cell(block: Block, col: str, v: Any) -> str:
    return MISSING if _missing(v) else FORMATS[block.kinds.get(col, "text")](v)


def _error(block: Block, col: str, i: int, v: Any) -> str:
    """`` ±hw`` of row ``i`` in ``col`` ("" when no half-width or no value)."""
    hw = block.errors.get(col)
    h = hw[i] if hw is not None and i < len(hw) else None
    if h is None or _missing(v) or _missing(h):
        return ""
    h = float(h)
    return f" ±{h:.1f}" if abs(h) < 1e4 else f" ±{h:.1e}"


def bold_mask(block: Block) -> set[tuple[int, str]]:
    """(row position, column) of the best displayed value per group and column."""
    out: set[tuple[int, str]] = set()
    df = block.frame.reset_index(drop=True)
    groups = [df.index] if block.group is None else [
        idx for _, idx in df.groupby(block.group, dropna=False, sort=False).groups.items()]
    for col, how in block.best.items():
        if col not in df:
            continue
        for idx in groups:
            shown = {i: _cell(block, col, df.at[i, col]) for i in idx
                     if not _missing(df.at[i, col])}
            if len(shown) < 2:
                continue
            values = {i: float(s.rstrip("%")) for i, s in shown.items()}
            target = min(values.values()) if how == "min" else max(values.values())
            out.update((i, col) for i, v in values.items() if v == target)
    return out


def _strings(block: Block, bold: str, escape: bool) -> list[list[str]]:
    df = block.frame.reset_index(drop=True)
    mask = bold_mask(block)
    rows = []
    for i in df.index:
        cells = []
        for col in df.columns:
            text = _cell(block, col, df.at[i, col]) + _error(block, col, i, df.at[i, col])
            text = tex_escape(text) if escape else text
            text = bold.format(text) if (i, col) in mask else text
            marker = block.markers.get((i, col), "")
            cells.append(text + (tex_escape(marker) if escape else marker))
        rows.append(cells)
    return rows


def tex_escape(text: str) -> str:
    """Escape LaTeX specials in a cell."""
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("$", r"\$"),
                 ("#", r"\#"), ("_", r"\_"), ("{", r"\{"), ("}", r"\}"), ("–", "--"),
                 ("†", r"$^\dagger$"), ("Δ", r"$\Delta$"), ("−", "-"), ("×", r"$\times$"),
                 ("γ", r"$\gamma$"), ("±", r"$\pm$"), ("≈", r"$\approx$"),
                 ("✓", r"$\checkmark$")):
        text = text.replace(a, b)
    return text.replace(r"\textbackslash\{\}", r"\textbackslash{}")


def to_markdown(table: Table) -> str:
    """GitHub Markdown: ``## title``, then each block as ``### title``, table, notes."""
    lines = [f"## {table.title}", ""]
    for block in table.blocks:
        lines += [f"### {block.title}", ""]
        cols = list(block.frame.columns)
        lines.append("| " + " | ".join(cols) + " |")
        lines.append("|" + "|".join("---" if block.kinds.get(c, "text") == "text" else "---:"
                                    for c in cols) + "|")
        lines += ["| " + " | ".join(r) + " |" for r in _strings(block, "**{}**", escape=False)]
        lines.append("")
        if block.notes:
            lines += [*block.notes, ""]
    if table.notes:
        lines += [*table.notes, ""]
    return "\n".join(lines)


def to_html(table: Table, level: int = 2) -> str:
    """An HTML fragment: ``<h{level}>`` title, then :func:`blocks_html`."""
    return f"<h{level}>{html.escape(table.title)}</h{level}>\n" + blocks_html(table, level + 1)


def blocks_html(table: Table, level: int = 3) -> str:
    """Each block of ``table`` as a ``<h{level}>`` heading, ``<table>`` (best values in
    ``<b>``, numeric columns right-aligned, marked cells as :attr:`Block.marks` says) and its
    notes, then the table's notes; text is escaped."""
    esc = html.escape
    parts = []
    for block in table.blocks:
        cols = list(block.frame.columns)
        align = ["left" if block.kinds.get(c, "text") == "text" else "right" for c in cols]
        head = "".join(f'<th style="text-align:{a}">{esc(str(c))}</th>'
                       for c, a in zip(cols, align))
        frame = block.frame.reset_index(drop=True)
        body = "".join(
            "<tr>" + "".join(_td(cell, a, block, col, frame.at[i, col])
                             for cell, a, col in zip(row, align, cols)) + "</tr>"
            for i, row in enumerate(_strings(_escaped(block), "<b>{}</b>", escape=False)))
        parts += [f"<h{level}>{esc(block.title)}</h{level}>",
                  f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>",
                  *(f"<p>{esc(n)}</p>" for n in block.notes)]
    parts += [f"<p>{esc(n)}</p>" for n in table.notes]
    return "\n".join(parts) + "\n"


def _td(cell: str, align: str, block: Block, col: str, value: Any) -> str:
    """One ``<td>``: ``cell`` (escaped), marked when ``block.marks`` marks ``value``."""
    mark = None if _missing(value) or col not in block.marks else block.marks[col](str(value))
    if mark is None:
        return f'<td style="text-align:{align}">{cell}</td>'
    return f'<td style="text-align:{align}">{mark_span(*mark, cell)}</td>'


def mark_span(kind: str, symbol: str, text: str) -> str:
    """``text`` (HTML) in the mark of ``kind``: the class ``mark mark-<kind>`` and the symbol
    before the text (hidden from screen readers, which read the words)."""
    return (f'<span class="mark mark-{html.escape(kind)}"><span class="symbol" '
            f'aria-hidden="true">{html.escape(symbol)}</span>{text}</span>')


#: the style every HTML page of tables shares
STYLE = ("body{font-family:sans-serif;max-width:1400px;margin:auto}"
         "table{border-collapse:collapse;margin:0.5em 0}"
         "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}"
         "p{font-size:13px;color:#333}")


def html_page(title: str, tables: list[Table]) -> str:
    """A self-contained HTML page of ``tables``."""
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}"
            f"</title><style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>\n"
            + "".join(to_html(t) for t in tables) + "</body></html>\n")


def _escaped(block: Block) -> Block:
    """``block`` with its text cells and markers HTML-escaped (numbers are formatted later)."""
    frame = block.frame.copy()
    for col in frame.columns:
        if block.kinds.get(col, "text") == "text":
            frame[col] = [v if _missing(v) else html.escape(str(v)) for v in frame[col]]
    return replace(block, frame=frame,
                   markers={k: html.escape(v) for k, v in block.markers.items()})


def to_latex(table: Table) -> str:
    """One ``tabular`` per block (booktabs), bold as ``\\textbf``; notes as comments."""
    parts = [f"% {table.title}", "% generated by flexigpt tables; needs \\usepackage{booktabs}"]
    for block in table.blocks:
        cols = list(block.frame.columns)
        body = pd.DataFrame(_strings(block, r"\textbf{{{}}}", escape=True),
                            columns=[tex_escape(c) for c in cols])
        fmt = "".join("l" if block.kinds.get(c, "text") == "text" else "r" for c in cols)
        parts += ["", f"% {block.title}", *(f"% {n}" for n in block.notes)]
        parts.append(body.to_latex(index=False, escape=False, column_format=fmt or "l"))
    parts += [f"% {n}" for n in table.notes]
    return "\n".join(parts) + "\n"


def write_table(table: Table, out_dir: str | os.PathLike,
                formats: tuple[str, ...] = ("md", "csv", "tex")) -> list[Path]:
    """Write ``<name>.md/.csv/.tex/.html`` (``formats``) into ``out_dir``; returns the paths
    written."""
    out = Path(out_dir)
    written = []
    render = {"md": to_markdown, "tex": to_latex, "html": lambda t: html_page(t.title, [t]),
              "csv": lambda t: t.csv.to_csv(index=False, float_format="%.6g")}
    for fmt in formats:
        if fmt not in render:
            raise ValueError(f"unknown table format {fmt!r}; expected one of {sorted(render)}")
        path = out / f"{table.name}.{fmt}"
        atomic_write_text(path, render[fmt](table))
        written.append(path)
    log.info("wrote %s.{%s}", out / table.name, ",".join(formats))
    return written
