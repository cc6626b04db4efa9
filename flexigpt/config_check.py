"""Up-front validation of a run grid, at DAG-build time (before any job runs).

:func:`check_grid` builds every run's compression options into its method's config class
(``Method.make_config``, the path ``flexigpt.api.compress`` takes) and every tuning trial's
training options into :class:`~flexigpt.training.TrainConfig` (as ``workflow/scripts/train.py``
does); checks model-dependent sizes (a FlexiGPT ``rank`` that cannot compress, with the same
bound as ``flexigpt.methods.surgery.check_flexigpt_rank``) on local checkpoints; and refuses
a local-looking ``model.path`` that does not exist and no resource rule builds. Every problem
is reported in one :class:`ConfigError` naming the run, the config key path and the problem.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flexigpt.dag import Run, RunGrid

#: LoRA-rank options clamped to min(out, in) per matrix: useful only below the hidden size.
LORA_RANK_OPTIONS = {"flexigpt_extend": ("rank",), "shortgpt_lora": ("lora_rank",),
                     "slicegpt": ("lora_rank",)}
MAX_LISTED = 10


class ConfigError(ValueError):
    """A config that would fail once its jobs run; the message lists every problem."""


def unknown_key(key: str, known: list[str], what: str) -> str:
    """``unknown <what> 'key'; did you mean 'x'?`` (difflib), or the known names."""
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"known: {sorted(known)}"
    return f"unknown {what} {key!r}; {hint}"


def _sources(config: dict[str, Any], run: Run, part: str) -> list[tuple[str, dict]]:
    """Where ``run``'s ``part`` (``options`` or ``training``) keys may be written, most
    specific first; the last entry is the fallback."""
    if run.table == "extension":
        return [("extension", {})]
    method = run.method
    variant = run.variant
    out: list[tuple[str, dict]] = []
    if run.table == "kd":
        out.append(("kd", {"loss": 1, "kd_temperature": 1} if part == "training" else {}))
        variant = "default" if variant == "kd" else variant[: -len("_kd")]
    elif run.table == "paper_protocol":
        out.append(("paper_protocol", {"policy": 1} if part == "options" else {}))
        variant = "default"
    elif run.table == "ablation":
        overrides = ((config.get("ablations") or {}).get("variants") or {}).get(variant) or {}
        out.append((f"ablations.variants.{variant}", overrides if part == "options" else {}))
        variant = "default"
    block = (config.get("methods") or {}).get(method) or {}
    if variant != "default":
        over = (block.get("variants") or {}).get(variant) or {}
        out.append((f"methods.{method}.variants.{variant}.{part}", over.get(part) or {}))
    out.append((f"methods.{method}.{part}", block.get(part) or {}))
    return out


def _where(sources: list[tuple[str, dict]], key: str | None) -> str:
    """The first source that writes ``key``, else the fallback."""
    for path, block in sources:
        if key is not None and key in block:
            return path
    return sources[-1][0]


def _named_key(message: str, keys: list[str]) -> str | None:
    """The option a config class's error message is about (its first word, by convention)."""
    match = re.match(r"\W*(\w+)", message)
    return match.group(1) if match and match.group(1) in keys else None


@lru_cache(maxsize=8)
def _skeleton(path: str) -> Any:
    """An empty (meta-device) model of the local checkpoint ``path``, or None when it has no
    readable config.json or no adapter (the job's own checks then apply)."""
    if not (Path(path) / "config.json").is_file():
        return None
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from flexigpt.models.adapters import get_adapter

        hf_config = AutoConfig.from_pretrained(path)
        get_adapter(hf_config)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(hf_config)
    except Exception:  # noqa: BLE001 (an unreadable checkpoint fails in its own job)
        return None


def check_sizes(run: Run, cfg: Any, model: Any) -> tuple[str, str] | None:
    """``(option, problem)`` when a size option of ``cfg`` is useless on ``model``."""
    from flexigpt.methods.surgery import check_distance_rank, check_flexigpt_rank

    if run.method == "flexigpt":
        try:
            check_distance_rank(model, cfg)
        except ValueError as err:
            return "distance_rank", str(err)
    ranks = {"flexigpt": "rank", "shortgpt_lora": "flexigpt_rank"}
    name = ranks.get(run.method)
    if name is not None and (name == "rank" or getattr(cfg, name) is not None):
        probe = cfg if name == "rank" else SimpleNamespace(rank=getattr(cfg, name))
        try:
            check_flexigpt_rank(model, probe)  # the bound flexigpt.api.compress applies
        except ValueError as err:
            return name, str(err) if name == "rank" else f"{name}: {err}"
    hidden = int(model.config.hidden_size)
    for option in LORA_RANK_OPTIONS.get(run.method, ()):
        value = getattr(cfg, option, None)
        if isinstance(value, int) and value >= hidden:
            return option, (f"{option} {value} is not below the model's hidden size {hidden} "
                            f"(LoRA ranks are clamped per matrix); the largest useful "
                            f"{option} is {hidden - 1}")
    return None


def check_run_options(config: dict[str, Any], grid: RunGrid, run: Run) -> list[tuple[str, str]]:
    """``[(key path, problem)]`` of ``run``'s compression options."""
    from flexigpt.registry import get_method

    spec = get_method(run.method)
    options = run.compress_params()["options"]
    sources = _sources(config, run, "options")
    known = [f.name for f in dataclasses.fields(spec.config_cls)]
    problems = [(_where(sources, key), unknown_key(key, known, f"{run.method} option"))
                for key in options if key not in known]
    if problems:
        return problems
    try:
        cfg = spec.make_config(**options)
    except (ValueError, TypeError) as err:
        key = _named_key(str(err), list(options))
        where = "ratios" if key == "ratio" else _where(sources, key)
        return [(where, str(err))]
    path = grid.model_paths.get(run.model)
    model = _skeleton(path) if path and Path(path).exists() else None
    if model is not None:
        from flexigpt.models.adapters import UnsupportedArchitectureError

        try:
            spec.check_family(model)
        except UnsupportedArchitectureError as err:
            return [(f"methods.{run.method}", str(err))]
        found = check_sizes(run, cfg, model)
        if found is not None:
            return [(_where(sources, found[0]), found[1])]
    return []


def check_run_training(config: dict[str, Any], grid: RunGrid, run: Run) -> list[tuple[str, str]]:
    """``[(key path, problem)]`` of the TrainConfig of each tuning trial of ``run``."""
    from flexigpt.training import TrainConfig

    known = [f.name for f in dataclasses.fields(TrainConfig)]
    sources = _sources(config, run, "training")
    problems: list[tuple[str, str]] = []
    for trial in grid.trial_ids(run):
        params = grid.train_params(run, trial)

        def where(key: str | None) -> str:
            if key in ("lr", "gamma_lr") and key in grid.trials(run)[int(trial[1:])]:
                return f"tuning.grid.{run.recovery_recipe()}"
            if key == "eval_windows" and grid.tuning.get("windows"):
                return "tuning.windows"
            if key in ("tokens", "recipe") and run.table == "extension":
                return "extension"
            if key in run.training:
                return _where(sources, key)
            return "training"

        unknown = [(where(k), unknown_key(k, known, "training option"))
                   for k in params if k not in known]
        if unknown:
            problems += unknown
            continue
        try:
            TrainConfig(**params)
        except (ValueError, TypeError) as err:
            problems.append((where(_named_key(str(err), list(params))), str(err)))
    return problems


def check_model_paths(grid: RunGrid) -> list[tuple[str, str]]:
    """A local-looking model path that does not exist and no resource rule builds."""
    from flexigpt.models.loading import looks_local
    from flexigpt.dag import RESOURCE_MODELS

    out = []
    for key, path in grid.model_paths.items():
        if grid.model_resources.get(key) is None and looks_local(path) and not Path(path).exists():
            builders = ", ".join(f"{name} → {where}" for name, where in RESOURCE_MODELS.items())
            out.append(("model.path" if key == next(iter(grid.model_paths))
                        else "extension.model_path",
                        f"model {key!r}: {path!r} looks like a local path but does not exist "
                        f"(relative to {Path.cwd()}); build it with a resource rule (set "
                        f"model.resource; {builders}), fetch it (`flexigpt fetch "
                        f"smollm2|tiny-llama|tiny-opt`), or give a hub id (org/name)"))
    return out


def check_grid(config: dict[str, Any], grid: RunGrid) -> None:
    """Validate every run of ``grid`` (built from ``config``) as its jobs would.

    Raises:
        ConfigError: one line per distinct problem, ``run <model/method/variant/setting>:
            <key path>: <problem>``, before any job runs.
    """
    seen: dict[tuple[str, str], str] = {}
    for where, problem in check_model_paths(grid):
        seen.setdefault((where, problem), "")
    for run in grid.runs.values():
        found = check_run_options(config, grid, run)
        if run.recovery:
            found += check_run_training(config, grid, run)
        for item in found:
            seen.setdefault(item, run.name)
    if not seen:
        return
    lines = [f"{f'run {name}: ' if name else ''}{where}: {problem}"
             for (where, problem), name in seen.items()]
    more = len(lines) - MAX_LISTED
    text = "\n  ".join(lines[:MAX_LISTED]) + (f"\n  ... and {more} more" if more > 0 else "")
    raise ConfigError(f"invalid config ({len(lines)} problem(s)):\n  {text}")
