"""Archive a finished run's table inputs, without weights, so its tables rebuild anywhere.

:func:`table_inputs` lists exactly what the DAG's ``tables`` rule reads for a config
(evaluation and timing JSONs, FlexiGPT manifests, training logs, LR-sweep records);
:func:`archive_run` copies those files, the per-document records every evaluation names
(``eval_*.samples.jsonl.gz``, ``eval_*.windows.json``) and the trained manifest beside every
training log, under their run paths, and writes the index
(:data:`flexigpt.tables.from_archive.INDEX`). :func:`flexigpt.tables.from_archive.rebuild` turns the
archive back into the run's tables; :func:`extend_archive` adds the runs a config gained
after the archived run (``flexigpt archive --add``)::

    flexigpt tables --archive results/reference/<run>/inputs --out /tmp/tables
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from flexigpt.core.fileio import atomic_write_text
from flexigpt.methods.compression_basis import embedding_parameters
from flexigpt.tables.from_archive import INDEX, KINDS, read_index
from flexigpt.workflow.dag.grid import RunGrid
from flexigpt.workflow.model_skeletons import checkpoint_skeleton
from flexigpt.workflow.run_record import RECORD_DIR


def table_inputs(grid: RunGrid) -> dict[str, list[str]]:
    """The ``tables`` rule's inputs of ``grid`` by kind (:data:`~flexigpt.tables.from_archive.KINDS`),
    as paths relative to the working directory."""
    figures = grid.figure_inputs()
    return {"results": grid.eval_targets(), "timings": grid.inference_targets(),
            "train_logs": figures["train_logs"], "manifests": figures["manifests"],
            "selections": figures["selections"]}


def support_files(inputs: dict[str, list[str]], workdir: Path) -> list[str]:
    """Files the inputs refer to: each result's per-document records (named in its
    ``records``, beside it) and the trained ``manifest.json`` beside each training log
    (its passes over the text); relative to ``workdir``, missing ones left out."""
    found: list[str] = []
    for rel in inputs["results"]:
        named = json.loads((workdir / rel).read_text(encoding="utf-8")).get("records") or {}
        found += [str(Path(rel).parent / name) for name in named.values() if name]
    found += [str(Path(rel).parent / "manifest.json") for rel in inputs["train_logs"]]
    return [rel for rel in dict.fromkeys(found) if (workdir / rel).is_file()]


def run_records(workdir: Path, key: str | None) -> list[str]:
    """The run-time records ``flexigpt run`` wrote for model ``key``
    (:mod:`flexigpt.workflow.run_record`), relative to ``workdir``: archived with the run so
    its wall times travel with its numbers."""
    if not key:
        return []
    folder = workdir / "results" / key / RECORD_DIR
    return sorted(str(p.relative_to(workdir)) for p in folder.glob("*.json"))


def _copy(work: Path, dest: Path, rels: list[str]) -> list[Path]:
    """Copy each of ``rels`` from ``work`` to the same relative path under ``dest``."""
    written: list[Path] = []
    for rel in rels:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(work / rel, target)
        written.append(target)
    return written


def archive_run(config: dict[str, Any], out: str | os.PathLike,
                workdir: str | os.PathLike = ".") -> list[Path]:
    """Copy the table inputs of ``config``'s finished run under ``workdir`` to ``out``
    (a new or empty directory) with their index; returns the files written, index last.

    Raises:
        FileNotFoundError: an input the ``tables`` rule reads is missing (the run is not
            finished), named.
        FileExistsError: ``out`` exists and is not empty.
    """
    work, dest = Path(workdir), Path(out)
    inputs = table_inputs(RunGrid.from_config(config))
    missing = [rel for paths in inputs.values() for rel in paths if not (work / rel).is_file()]
    if missing:
        raise FileNotFoundError(f"the run is not finished: {len(missing)} table inputs are "
                                f"missing under {work.resolve()}, e.g. {missing[0]}")
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} exists and is not empty; archive into a new directory")
    model = config.get("model") or {}
    support = [*support_files(inputs, work), *run_records(work, model.get("key"))]
    written = _copy(work, dest, [*(p for kind in KINDS for p in inputs[kind]), *support])
    index = {"schema": 1, "results_dir": "results", "inputs": inputs, "support": support,
             "model_names": {model["key"]: model.get("name", model["key"])} if model else {},
             "model_facts": model_facts(config, work)}
    atomic_write_text(dest / INDEX, json.dumps(index, indent=1) + "\n")
    read_index(dest)  # every listed file arrived
    return [*written, dest / INDEX]


def extend_archive(config: dict[str, Any], out: str | os.PathLike,
                   workdir: str | os.PathLike = ".") -> list[Path]:
    """Add to the existing archive ``out`` the table inputs of ``config`` that it lacks (runs
    added to the config after the archived run), copied from the run under ``workdir`` with
    their per-document records; rewrite the index to list ``config``'s inputs. Files already
    archived are never replaced (the archived run stays what it was), and the model facts
    stay as archived. Returns the files written, index last.

    Raises:
        FileNotFoundError: an input is in neither the archive nor ``workdir`` (named), or
            ``out`` is not an archive.
        ValueError: the archive lists inputs ``config`` does not have (it is not a grid the
            config extends), or the config adds nothing.
    """
    work, dest = Path(workdir), Path(out)
    index = read_index(dest)
    inputs = table_inputs(RunGrid.from_config(config))
    wanted = {rel for paths in inputs.values() for rel in paths}
    dropped = sorted({rel for kind in KINDS for rel in index["inputs"][kind]} - wanted)
    if dropped:
        raise ValueError(f"{dest} holds {len(dropped)} table inputs the config does not list, "
                         f"e.g. {dropped[0]}: extend an archive only with the config it was "
                         f"written from plus new runs")
    new = {kind: [rel for rel in inputs[kind] if not (dest / rel).is_file()] for kind in KINDS}
    if not any(new.values()):
        raise ValueError(f"the config adds no table input to {dest}")
    missing = [rel for paths in new.values() for rel in paths if not (work / rel).is_file()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} new table inputs are missing under "
                                f"{work.resolve()}, e.g. {missing[0]}")
    support = [rel for rel in support_files(new, work) if not (dest / rel).is_file()]
    written = _copy(work, dest, [*(p for kind in KINDS for p in new[kind]), *support])
    index = {**index, "inputs": inputs,
             "support": [*index.get("support", []), *support]}
    atomic_write_text(dest / INDEX, json.dumps(index, indent=1) + "\n")
    read_index(dest)  # every listed file is there
    return [*written, dest / INDEX]


def model_facts(config: dict[str, Any], workdir: str | os.PathLike = ".") -> dict[str, Any]:
    """``{model key: {"embedding_params", "compression_basis"}}`` of ``config``'s model
    (:mod:`flexigpt.tables.facts`), counted on a meta-device skeleton of its local checkpoint
    (no weights read); ``{}`` when the checkpoint is not a local directory with a config."""
    model = config.get("model") or {}
    path = Path(workdir) / str(model.get("path", ""))
    skeleton = checkpoint_skeleton(str(path)) if model.get("path") else None
    if skeleton is None:
        return {}
    return {model["key"]: {"embedding_params": embedding_parameters(skeleton),
                           "compression_basis": config.get("compression_basis", "total")}}


def add_model_facts(config: dict[str, Any], archive: str | os.PathLike,
                    workdir: str | os.PathLike = ".") -> Path:
    """Write ``config``'s :func:`model_facts` into the index of the existing ``archive``
    (an archive written before the index had them); nothing else changes. Returns the
    index path.

    Raises:
        FileNotFoundError: no archive there, or no local checkpoint to count.
        ValueError: the archive holds another model's results.
    """
    index_path = Path(archive) / INDEX
    index = read_index(archive)
    facts = model_facts(config, workdir)
    if not facts:
        raise FileNotFoundError(f"no local checkpoint with a config.json at "
                                f"{config.get('model', {}).get('path')!r} to count")
    (key,) = facts
    if key not in (index.get("model_names") or {}):
        raise ValueError(f"{archive} is not a run of model {key!r}: it holds "
                         f"{sorted(index.get('model_names') or {})}")
    index["model_facts"] = {**(index.get("model_facts") or {}), **facts}
    atomic_write_text(index_path, json.dumps(index, indent=1) + "\n")
    read_index(archive)
    return index_path
