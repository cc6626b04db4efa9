"""How the report page marks a verdict so that the kinds are told apart at a glance: one
:class:`Mark` per kind (a colour and a symbol, so a kind still reads in grey print or to a
colour-blind reader), found from the verdict's own words (:mod:`flexigpt.tables.decision`).

The verdict table marks its ``Verdict`` cells with :func:`verdict_mark`
(:attr:`flexigpt.tables.render.Block.marks`); the page marks the same words in the findings
and the legend (:func:`phrases`) and keys every mark once (:data:`MARKS`).
"""

from __future__ import annotations

from dataclasses import dataclass

from flexigpt.tables.decision import (
    CONTRADICTED,
    NO_DIFFERENCE,
    NOT_A_CLAIM,
    NOT_MEASURED,
    REPORTED,
    SINGLE_SEED,
    STATUS_VERDICTS,
    SUPPORTED,
    UNDECIDED,
)

#: how a verdict of a claim whose condition does not hold in the run begins
NOT_DECIDED = "not decided"


@dataclass(frozen=True)
class Mark:
    """One kind of verdict on the page: ``kind`` (the CSS class ``mark-<kind>``), its
    ``symbol``, its text and background ``colour`` and ``background``, what the key calls it
    (``label``) and the verdicts it marks, by how they begin (``starts``)."""

    kind: str
    symbol: str
    colour: str
    background: str
    label: str
    starts: tuple[str, ...]


#: every kind of verdict, in the order the key lists them
MARKS = (
    Mark("supported", "✔", "#0b5d1e", "#d3f5dc", SUPPORTED, (SUPPORTED,)),
    Mark("contradicted", "✘", "#8a1020", "#fbd9dd", CONTRADICTED, (CONTRADICTED,)),
    Mark("no-difference", "=", "#4a2a80", "#e8defa", NO_DIFFERENCE, (NO_DIFFERENCE,)),
    Mark("undecided", "?", "#6b4800", "#fdecc0", UNDECIDED, (UNDECIDED,)),
    Mark("untested", "○", "#444444", "#e9e9e9", "not tested (not decided, not run, not "
         "measured, not a claim of the paper, no records)",
         (NOT_DECIDED, NOT_A_CLAIM, NOT_MEASURED, *STATUS_VERDICTS)),
    Mark("reported", "ℹ", "#0b4a6f", "#dcecf7", "reported (timings, never decided)", (REPORTED,)),
)


def mark_of(text: str) -> Mark | None:
    """The mark of a verdict's text (a † after it allowed); None for text that is no
    verdict."""
    words = str(text).removesuffix(f" {SINGLE_SEED}")
    return next((mark for mark in MARKS if words.startswith(mark.starts)), None)


def verdict_mark(text: str) -> tuple[str, str] | None:
    """(kind, symbol) of a verdict cell (:attr:`flexigpt.tables.render.Block.marks`)."""
    mark = mark_of(text)
    return None if mark is None else (mark.kind, mark.symbol)


#: the verdict words the findings and the legend use in their sentences
PROSE = (SUPPORTED, CONTRADICTED, NO_DIFFERENCE, UNDECIDED, NOT_DECIDED)


def phrases() -> list[tuple[str, Mark]]:
    """Each of :data:`PROSE` with its mark, longest first (a longer phrase is found before
    a shorter one it may contain)."""
    found = [(words, mark_of(words)) for words in PROSE]
    return sorted(((w, m) for w, m in found if m is not None), key=lambda p: -len(p[0]))


def css() -> str:
    """The style of every mark: a marked cell or phrase (``mark mark-<kind>``) in its
    colours, its symbol (``symbol``) in bold before the words."""
    rules = [".mark{border-radius:3px;padding:0 4px;white-space:nowrap}",
             ".mark .symbol{font-weight:bold;margin-right:3px}"]
    rules += [f".mark-{m.kind}{{color:{m.colour};background:{m.background}}}" for m in MARKS]
    return "".join(rules)
