"""Zero-shot task configs: lm-eval's built-in tasks, from the hub or from local files.

``source="hub"`` uses lm-eval's registered task as is. ``source="local"`` loads the *same*
built-in YAML (includes merged, ``!function`` hooks resolved) and overrides only the data
source: ``dataset_path: json``, ``dataset_name: null`` and ``data_files`` pointing at
``<tasks>/<task>/<split>.jsonl``. Splits the config names but that have no local file
are set to null, except the evaluated split (``test_split`` if the config has one, else
``validation_split``), whose absence is an error. Prompts, targets, choices and metrics are
therefore lm-eval's own; the task keeps its built-in name.

lm-eval 0.4.13 ``limit``: an int N evaluates the first N docs of the evaluated split in file
order (a float < 1 would be a fraction, and 1.0 would mean one doc, so we accept ints only).
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flexigpt.core.fileio import sha256_file

log = logging.getLogger(__name__)

#: task → headline metric (SliceGPT/FlexiGPT convention; boolq/openbookqa as LLM-Pruner).
HEADLINE_METRIC: dict[str, str] = {
    "arc_easy": "acc_norm", "arc_challenge": "acc_norm", "piqa": "acc_norm",
    "hellaswag": "acc_norm", "winogrande": "acc", "boolq": "acc", "openbookqa": "acc_norm",
}
#: task → the folder under ``lm_eval/tasks/`` that holds its YAML. Indexing only these
#: folders builds the same task entries (same YAML path) in milliseconds; lm-eval's full
#: index of every built-in task takes ~16 s per process (once per evaluation job).
BUILTIN_FOLDER: dict[str, str] = {
    "arc_easy": "arc", "arc_challenge": "arc", "piqa": "piqa", "hellaswag": "hellaswag",
    "winogrande": "winogrande", "boolq": "super_glue/boolq", "openbookqa": "openbookqa",
}
#: the five zero-shot tasks of the FlexiGPT paper.
PAPER_TASKS: tuple[str, ...] = ("arc_easy", "arc_challenge", "piqa", "winogrande", "hellaswag")
SOURCES = ("local", "hub")
_SPLIT_KEYS = ("training_split", "validation_split", "test_split", "fewshot_split")


class TaskDataError(ValueError):
    """A task name is unknown, or its local data files are missing, malformed or changed
    since their recorded build."""


@dataclass
class TaskSpec:
    """A ready-to-build lm-eval task.

    Attributes:
        name: lm-eval task name (same for both sources).
        config: the task config dict handed to ``TaskManager.load`` (None: built-in by name).
        source: ``"local"`` or ``"hub"``.
        split: the split lm-eval evaluates.
        data_file: local file of that split (None for hub).
    """

    name: str
    config: dict[str, Any] | None
    source: str
    split: str
    data_file: Path | None

    @property
    def metric(self) -> str:
        return HEADLINE_METRIC[self.name]

    def data_sha256(self) -> str | None:
        return None if self.data_file is None else sha256_file(self.data_file)


def offline_env() -> None:
    """Forbid network access by ``datasets``/``huggingface_hub`` (local runs)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"


@functools.lru_cache(maxsize=1)
def task_manager() -> Any:
    """lm-eval's ``TaskManager`` over the built-in folders of the supported tasks (cached).

    Same YAML files and configs as ``TaskManager()`` for these tasks (tested), without
    indexing the other ~200 task folders.
    """
    import lm_eval.tasks
    from lm_eval.tasks import TaskManager

    root = Path(lm_eval.tasks.__file__).parent
    folders = sorted({root / BUILTIN_FOLDER[name] for name in HEADLINE_METRIC})
    return TaskManager(include_defaults=False, include_path=[str(f) for f in folders])


def _load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """The one use of lm-eval's private YAML loader (pinned lm-eval 0.4.13)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    return load_yaml(path, resolve_func=True, recursive=True)


def check_task(name: str) -> None:
    if name not in HEADLINE_METRIC:
        raise TaskDataError(f"unknown task {name!r}; supported: {sorted(HEADLINE_METRIC)}")


def builtin_config(name: str) -> dict[str, Any]:
    """lm-eval's built-in config of ``name`` (includes merged, functions resolved)."""
    check_task(name)
    entry = task_manager().task_index.get(name)
    if entry is None or entry.yaml_path is None:
        raise TaskDataError(f"lm-eval has no YAML task {name!r}")
    return _load_yaml(entry.yaml_path)


def evaluated_split(config: dict[str, Any]) -> str:
    """The split lm-eval scores: test if the config names one, else validation."""
    split = config.get("test_split") or config.get("validation_split")
    if not split:
        raise TaskDataError(f"task {config.get('task')!r} names no test or validation split")
    return split


def local_config(name: str, tasks_dir: str | os.PathLike) -> TaskSpec:
    """The built-in config of ``name`` reading ``<tasks_dir>/<name>/<split>.jsonl``.

    Every data file handed to lm-eval is checked first (:func:`check_data_file`), so a
    malformed or edited file is one error naming it, not a ``datasets`` traceback.

    Raises:
        TaskDataError: unknown task, the evaluated split's file is missing, or a data file
            is malformed or differs from its recorded sha256.
    """
    cfg = builtin_config(name)
    split = evaluated_split(cfg)
    folder = Path(tasks_dir) / name
    data_files: dict[str, str] = {}
    for key in _SPLIT_KEYS:
        value = cfg.get(key)
        if not value:
            continue
        path = folder / f"{value}.jsonl"
        if path.is_file():
            data_files[value] = str(check_data_file(path).resolve())
        elif value == split:
            raise TaskDataError(f"task {name!r} evaluates split {split!r} but {str(path)!r} "
                                f"does not exist (build it: flexigpt fetch tasks)")
        else:
            cfg[key] = None
    cfg.pop("tag", None)
    cfg.update(dataset_path="json", dataset_name=None,
               dataset_kwargs={"data_files": data_files})
    return TaskSpec(name, cfg, "local", split, Path(data_files[split]))


def check_data_file(path: str | os.PathLike) -> Path:
    """``path`` if it is a well-formed JSONL file matching its recorded sha256
    (:func:`flexigpt.storage.input_files.check_jsonl`, cached per path, size and mtime).

    Raises:
        TaskDataError: one line naming the file and the first bad line.
    """
    from flexigpt.storage.input_files import InputFileError, check_jsonl

    try:
        return check_jsonl(path, "benchmark file")
    except InputFileError as err:
        raise TaskDataError(str(err)) from None


def hub_config(name: str) -> TaskSpec:
    """The built-in task ``name`` as registered (data from the Hugging Face hub)."""
    cfg = builtin_config(name)
    return TaskSpec(name, None, "hub", evaluated_split(cfg), None)


def task_specs(names: list[str] | tuple[str, ...], source: str,
               tasks_dir: str | os.PathLike | None) -> list[TaskSpec]:
    """Validated specs for ``names`` (no data is loaded yet)."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    for name in names:
        check_task(name)
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate task in {list(names)}")
    if source == "local":
        if tasks_dir is None or not Path(tasks_dir).is_dir():
            raise TaskDataError(f"task data directory {str(tasks_dir)!r} does not exist")
        offline_env()
        return [local_config(n, tasks_dir) for n in names]
    return [hub_config(n) for n in names]


def build_task(spec: TaskSpec) -> Any:
    """Instantiate the lm-eval ``Task`` (loads the dataset).

    Raises:
        TaskDataError: the hub dataset cannot be fetched (offline, unknown, gated), or
            lm-eval cannot load a local file.
    """
    from datasets.exceptions import DatasetGenerationError

    try:
        loaded = task_manager().load([spec.config if spec.config is not None else spec.name])
    except (OSError, ConnectionError, ValueError, DatasetGenerationError) as err:
        if spec.source != "hub":  # checked by check_data_file: a last resort
            raise TaskDataError(f"lm-eval cannot load task {spec.name!r} from "
                                f"{str(spec.data_file)!r}: {_first_line(err)}") from err
        raise TaskDataError(f"cannot load {spec.name!r} from the Hugging Face hub "
                            f"({_first_line(err)});"
                            " use source='local' with resources/tasks when offline") from err
    try:
        return loaded["tasks"][spec.name]
    except KeyError:
        raise TaskDataError(f"lm-eval built {sorted(loaded['tasks'])}, not {spec.name!r}") from None


def _first_line(err: BaseException) -> str:
    """``Type: first line of the message`` of an exception from lm-eval or ``datasets``."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
