"""The config's paths: where resource models live, which model paths can exist, and inputs
kept out of the folders the DAG writes (called by :func:`flexigpt.workflow.config_check.check_grid`
and the run grid's model section)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: offline resource builders → the checkpoint folder they produce (``model.resource``)
RESOURCE_MODELS = {"smollm2": "resources/models/smollm2-135m",
                   "gemma3-270m": "resources/models/gemma3-270m",
                   "tiny-llama": "resources/models/tiny-llama",
                   "tiny-opt": "resources/models/tiny-opt",
                   "tiny-gemma3": "resources/models/tiny-gemma3"}


def check_model_paths(grid: Any) -> list[tuple[str, str]]:
    """A local-looking model path that does not exist and no resource rule builds."""
    from flexigpt.storage.models.loading import looks_local

    out = []
    for key, path in grid.model_paths.items():
        if grid.model_resources.get(key) is None and looks_local(path) and not Path(path).exists():
            builders = ", ".join(f"{name} → {where}" for name, where in RESOURCE_MODELS.items())
            out.append(("model.path" if key == next(iter(grid.model_paths))
                        else "extension.model_path",
                        f"model {key!r}: {path!r} looks like a local path but does not exist "
                        f"(relative to {Path.cwd()}); build it with a resource rule (set "
                        f"model.resource; {builders}), fetch it (`flexigpt fetch "
                        f"{'|'.join(RESOURCE_MODELS)}`), or give a hub id (org/name)"))
    return out


#: folders (relative to the workflow root) that the DAG's rules write into or replace
DAG_OUTPUT_ROOTS = ("results", "logs", ".snakemake")
#: config keys naming a rule's input paths
INPUT_KEYS = (("model", "path"), ("data", "train_text"), ("data", "calibration_text"),
              ("data", "validation_text"), ("data", "tasks"))


def check_inputs_apart(config: dict[str, Any],
                       root: str | os.PathLike = ".") -> list[tuple[str, str]]:
    """``[(key path, problem)]``: a config input (the model, the texts, the task data) that
    lies in, is or contains a folder the DAG writes (:data:`DAG_OUTPUT_ROOTS` under
    ``root``, resolved through symlinks), where a rule could replace it."""
    from flexigpt.core.fileio import InputOverlapError, check_apart

    problems = []
    for section, key in INPUT_KEYS:
        path = (config.get(section) or {}).get(key)
        if not isinstance(path, str):
            continue
        for folder in DAG_OUTPUT_ROOTS:
            try:
                check_apart(Path(root) / folder, {f"{section}.{key}": path},
                            out_flag="the DAG's output folder")
            except InputOverlapError as err:
                problems.append((f"{section}.{key}", str(err)))
                break
    return problems


def check_model_resource(model: dict[str, Any]) -> None:
    """A resource model (``model.resource``) must live where its builder writes it.

    Raises:
        ValueError: ``model.path must be '<dir>' for resource '<name>', got '<path>'``.
    """
    resource = model.get("resource")
    if resource is None:
        return
    expected = RESOURCE_MODELS[resource]
    if Path(model["path"]) != Path(expected):
        raise ValueError(f"model.path must be {expected!r} for resource {resource!r}, "
                         f"got {model['path']!r}")
