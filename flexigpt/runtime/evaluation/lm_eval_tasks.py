"""YAML task files that point stock ``lm_eval`` at the harness's local benchmark data.

``flexigpt.runtime.evaluation.tasks.local_config`` evaluates lm-eval's *built-in* task configs with
only the data source swapped for ``<tasks>/<task>/<split>.jsonl``. The same override
as a YAML file (``include:`` of the built-in YAML + ``dataset_path: json`` + ``data_files``)
lets the stock CLI score exactly the same documents with the same prompts and metrics::

    python -c "from flexigpt.runtime.evaluation.lm_eval_tasks import write_task_yamls as w; w('resources/tasks', 'lm_eval_tasks')"
    lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True,add_bos_token=False,dtype=float32 \\
        --include_path lm_eval_tasks --tasks arc_easy --device cpu --batch_size 16

The YAML keeps the built-in task name; lm-eval 0.4.13 lets ``--include_path`` entries override
built-in ones of the same name.
"""

from __future__ import annotations

import os
from pathlib import Path

_SPLIT_KEYS = ("training_split", "validation_split", "test_split", "fewshot_split")


def write_task_yamls(tasks_dir: str | os.PathLike, out_dir: str | os.PathLike,
                     tasks: list[str] | tuple[str, ...] | None = None) -> list[Path]:
    """Write ``out_dir/<task>.yaml`` for ``tasks`` (default: the paper's five); returns them.

    Raises:
        TaskDataError: an unknown task or a missing evaluated-split file.
    """
    import yaml

    from flexigpt.runtime.evaluation.tasks import PAPER_TASKS, local_config, task_manager

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in tasks or PAPER_TASKS:
        spec = local_config(name, tasks_dir)
        assert spec.config is not None  # a local config is always a dict
        entry = {"include": str(Path(task_manager().task_index[name].yaml_path).resolve()),
                 "task": name, "tag": [], "dataset_path": "json", "dataset_name": None,
                 "dataset_kwargs": spec.config["dataset_kwargs"]}
        entry.update({key: spec.config.get(key) for key in _SPLIT_KEYS if key in spec.config})
        path = out / f"{name}.yaml"
        path.write_text(yaml.safe_dump(entry, sort_keys=False))
        written.append(path)
    return written
