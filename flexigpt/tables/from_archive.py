"""Rebuild a run's tables from its archived inputs alone (no models, no rerun).

An *archive* is a directory holding a finished run's table inputs under their run paths
(``results/<model>/…``) and an index, ``inputs.json`` (:data:`INDEX`), written by
:func:`flexigpt.workflow.dag.table_inputs.archive_run`::

    {"schema": 1, "results_dir": "results",
     "inputs": {"results": [...], "timings": [...], "train_logs": [...],
                "manifests": [...], "selections": [...]},   # paths relative to the archive
     "support": [...],        # files the inputs refer to: each result's per-document
                              # records, the trained manifest beside each training log
     "model_names": {key: display name},
     "model_facts": {key: {"embedding_params": int, "compression_basis": str}}}  # optional

:func:`rebuild` passes exactly the listed files to :func:`flexigpt.tables.build_all`, as the
DAG's ``tables`` rule did, relative to the archive root as the rule's were to the run's working
directory, so the tables it writes equal the run's (the committed reference runs are checked
this way by ``tests/test_reference_tables.py``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from flexigpt.tables.facts import check_facts
from flexigpt.tables.schema import ResultFileError, read_json

#: The archive's index file.
INDEX = "inputs.json"
#: The input kinds of :func:`flexigpt.tables.build_all`, in its argument order.
KINDS = ("results", "timings", "train_logs", "manifests", "selections")


def read_index(archive: str | os.PathLike) -> dict[str, Any]:
    """The validated ``inputs.json`` of an archive; every listed file must exist.

    Raises:
        FileNotFoundError: no index, or a listed file is missing (named).
        ResultFileError: the index is malformed (the key is named).
    """
    root = Path(archive)
    path = root / INDEX
    if not path.is_file():
        raise FileNotFoundError(f"{root} is not a run archive: {INDEX} not found")
    data = read_json(path)
    if not isinstance(data, dict) or data.get("schema") != 1:
        raise ResultFileError(path, "expected an object with schema 1")
    inputs = data.get("inputs")
    if not isinstance(inputs, dict) or set(inputs) != set(KINDS):
        raise ResultFileError(path, f"'inputs' must map exactly {list(KINDS)} to path lists")
    results_dir = data.get("results_dir", "results")
    if (not isinstance(results_dir, str) or Path(results_dir).is_absolute()
            or ".." in Path(results_dir).parts):
        raise ResultFileError(path, f"'results_dir' must be a folder inside the archive, "
                                    f"got {results_dir!r}")
    lists = {kind: inputs[kind] for kind in KINDS}
    lists["support"] = data.get("support", [])
    for kind, listed in lists.items():
        if not isinstance(listed, list) or not all(isinstance(p, str) for p in listed):
            raise ResultFileError(path, f"{kind!r} must be a list of paths")
        for rel in listed:
            if Path(rel).is_absolute() or ".." in Path(rel).parts:
                raise ResultFileError(path, f"path {rel!r} leaves the archive")
            if not (root / rel).is_file():
                raise FileNotFoundError(f"{root / rel} is listed in {path} but missing")
    names = data.get("model_names") or {}
    if not isinstance(names, dict):
        raise ResultFileError(path, "'model_names' must map model keys to display names")
    try:
        check_facts(data.get("model_facts"))
    except ValueError as exc:
        raise ResultFileError(path, str(exc)) from exc
    return data


def rebuild(archive: str | os.PathLike, out_dir: str | os.PathLike, *,
            formats: tuple[str, ...] = ("md", "csv", "tex"),
            make_plots: bool = True) -> list[Path]:
    """Write the archived run's tables (and figures) to ``out_dir`` from its inputs alone;
    returns the files written (:func:`flexigpt.tables.build_all`)."""
    from flexigpt.tables.report import build_all

    root = Path(archive)
    index = read_index(root)
    out = Path(out_dir).resolve()
    listed: dict[str, list[str | os.PathLike]] = {kind: list(index["inputs"][kind])
                                                  for kind in KINDS}
    # the run's tables name some inputs by their path relative to its working directory
    # (the timing tables' ``file`` column): read them from the archive root the same way
    with contextlib.chdir(root):
        written = build_all(index.get("results_dir", "results"), out,
                            results=listed["results"], timings=listed["timings"],
                            train_logs=listed["train_logs"], manifests=listed["manifests"],
                            selections=listed["selections"], formats=formats,
                            make_plots=make_plots, model_names=index.get("model_names") or {},
                            model_facts=index.get("model_facts") or {})
    return written
