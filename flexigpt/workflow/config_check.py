"""Up-front validation of a run grid, at DAG-build time (before any job runs).

:func:`check_grid` builds every run's compression options into its method's config class
(``Method.make_config``, the path ``flexigpt.api.compression.compress`` takes) and every tuning trial's
training options into :class:`~flexigpt.runtime.training.TrainConfig` (as ``workflow/scripts/train.py``
does); checks model-dependent sizes (a FlexiGPT ``rank`` that cannot compress, with the same
bound as ``flexigpt.methods.surgery.check_flexigpt_rank``) and the reach of every block-count
ratio (:func:`flexigpt.methods.block_count.method_plan`, the check ``flexigpt.api.compression.compress`` repeats)
on an empty skeleton of the model — its checkpoint's config.json, or for a resource model
not built yet the config its builder writes (:func:`resource_skeleton`; a hub model is
checked by its compress job); refuses ratios that name the same run directory or one the
DAG cannot name (:func:`check_ratios`); and refuses a local-looking ``model.path`` that does
not exist and no resource rule builds, or an input inside a folder the DAG writes
(:mod:`flexigpt.workflow.config_paths`). Every problem is reported in one :class:`ConfigError`
naming the run, the config key path and the problem.

The checks sit below the run grid (:mod:`flexigpt.workflow.dag`), which calls :func:`check_grid` once
it is built: they read a grid and its runs through :class:`GridView` and :class:`RunView`.
At DAG build the Snakefile also refuses an empty config file (:func:`check_config_files`);
the resource directories that already exist are verified against their build records by
:func:`flexigpt.workflow.resource_check.check_resources`.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from flexigpt.methods.compression_basis import total_target
from flexigpt.workflow.config_paths import check_inputs_apart, check_model_paths
from flexigpt.workflow.model_skeletons import checkpoint_skeleton, resource_skeleton

MAX_LISTED = 10
#: run directory of a ratio (``flexigpt.workflow.dag``: ``setting = f"r{ratio:g}"``) and the form the
#: DAG's ``setting`` wildcard accepts
RATIO_SETTING = "r{:g}"
SETTING_PATTERN = re.compile(r"r0\.[0-9]+")


class ConfigError(ValueError):
    """A config that would fail once its jobs run; the message lists every problem."""


class RunView(Protocol):
    """What the checks read of one run (:class:`flexigpt.workflow.dag.Run` is one): the checks sit
    below the run grid, which calls them once it is built."""

    @property
    def model(self) -> str: ...
    @property
    def method(self) -> str: ...
    @property
    def variant(self) -> str: ...
    @property
    def table(self) -> str: ...
    @property
    def recovery(self) -> bool: ...
    @property
    def training(self) -> dict[str, Any]: ...
    @property
    def recipe(self) -> str | None: ...
    @property
    def match(self) -> tuple[str, str, str, str] | None: ...
    @property
    def ratio(self) -> float | None: ...
    @property
    def name(self) -> str: ...
    def compress_params(self) -> dict[str, Any]: ...
    def recovery_recipe(self) -> str: ...


class GridView(Protocol):
    """What the checks read of a run grid (:class:`flexigpt.workflow.dag.RunGrid` is one)."""

    @property
    def runs(self) -> Mapping[tuple[str, str, str, str], RunView]: ...
    @property
    def model_paths(self) -> dict[str, str]: ...
    @property
    def model_resources(self) -> dict[str, str | None]: ...
    @property
    def tasks_dir(self) -> str | None: ...
    @property
    def tuning(self) -> dict[str, Any]: ...
    def trials(self, run: Any) -> list[dict[str, Any]]: ...
    def trial_ids(self, run: Any) -> list[str]: ...
    def train_params(self, run: Any, trial: str | None = None) -> dict[str, Any]: ...


def unknown_key(key: str, known: list[str], what: str) -> str:
    """``unknown <what> 'key'; did you mean 'x'?`` (difflib), or the known names."""
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"known: {sorted(known)}"
    return f"unknown {what} {key!r}; {hint}"


def _sources(config: dict[str, Any], run: RunView, part: str) -> list[tuple[str, dict]]:
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


def model_skeleton(grid: GridView, key: str) -> Any:
    """The skeleton of model ``key``: its local checkpoint's, else its resource builder's
    (not built yet), else None (a hub model: its jobs check it)."""
    path = grid.model_paths.get(key)
    if path and Path(path).exists():
        return checkpoint_skeleton(path)
    return resource_skeleton(grid.model_resources.get(key))


def ratio_key(config: dict[str, Any], run: RunView) -> str:
    """The config key a run's ratio comes from."""
    if run.table == "ablation":
        return "ablations.ratio"
    section = {"paper_protocol": "paper_protocol", "kd": "kd"}.get(run.table)
    if section and "ratios" in (config.get(section) or {}):
        return f"{section}.ratios"
    return "ratios"


def check_reach(run: RunView, cfg: Any, model: Any) -> str | None:
    """The problem when ``run``'s ratio is out of reach of its block-count policy on
    ``model`` (:func:`flexigpt.methods.block_count.method_plan`: more than half a block step beyond
    what any block count achieves, or the policy's own refusal); None when it is reachable,
    the method removes no blocks, or the run is matched to another run's achieved ratio
    (known only when that run is compressed; its compress job checks it)."""
    from flexigpt.methods.block_count import method_plan

    if run.match is not None or run.ratio is None:
        return None
    try:
        method_plan(run.method, model, cfg)
    except ValueError as err:
        return str(err)
    return None


def check_sizes(run: RunView, cfg: Any, model: Any) -> tuple[str, str] | None:
    """``(option, problem)`` when a size option of ``cfg`` is useless on ``model`` (the
    method's ``Method.check_sizes``)."""
    from flexigpt.storage.registry import get_method

    hook = get_method(run.method).check_sizes
    return None if hook is None else hook(model, cfg)


def check_run_options(config: dict[str, Any], grid: GridView,
                      run: RunView) -> list[tuple[str, str]]:
    """``[(key path, problem)]`` of ``run``'s compression options."""
    from flexigpt.storage.registry import get_method

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
    model = model_skeleton(grid, run.model)
    if model is not None:
        from flexigpt.storage.models.adapters import UnsupportedArchitectureError

        try:
            spec.check_family(model)
        except UnsupportedArchitectureError as err:
            return [(f"methods.{run.method}", str(err))]
        basis = run.compress_params().get("basis", "total")
        if basis != "total" and hasattr(cfg, "ratio"):
            if spec.facts.embedding_surgery:
                return [("compression_basis", f"{run.method} removes embedding parameters, so "
                         f"its ratio is defined on the total basis only (got {basis!r})")]
            cfg.ratio = total_target(model, cfg.ratio, basis)
        found = check_sizes(run, cfg, model)
        if found is not None:
            return [(_where(sources, found[0]), found[1])]
        problem = check_reach(run, cfg, model)
        if problem is not None:
            return [(ratio_key(config, run), f"{problem} ({run.model})")]
    return []


def check_run_training(config: dict[str, Any], grid: GridView,
                       run: RunView) -> list[tuple[str, str]]:
    """``[(key path, problem)]`` of the TrainConfig of each tuning trial of ``run``."""
    from flexigpt.runtime.training import TrainConfig

    known = [f.name for f in dataclasses.fields(TrainConfig)]
    sources = _sources(config, run, "training")
    problems: list[tuple[str, str]] = []
    for trial in grid.trial_ids(run):
        params = grid.train_params(run, trial)
        unknown = [(_training_where(grid, run, trial, sources, k),
                    unknown_key(k, known, "training option"))
                   for k in params if k not in known]
        if unknown:
            problems += unknown
            continue
        try:
            # the recipe as the trainer resolves it (the method's own when not overridden)
            TrainConfig(**{"recipe": run.recovery_recipe(), **params})
        except (ValueError, TypeError) as err:
            key = _named_key(str(err), list(params))
            problems.append((_training_where(grid, run, trial, sources, key), str(err)))
    return problems


def _training_where(grid: GridView, run: RunView, trial: str,
                    sources: list[tuple[str, dict]], key: str | None) -> str:
    """The config key path training option ``key`` of ``run``'s ``trial`` comes from: its
    tuning grid, ``tuning.windows``, the extension section, the method/variant block that
    writes it (:func:`_sources`), else ``training``."""
    if key in ("lr", "gamma_lr") and key in grid.trials(run)[int(trial[1:])]:
        return f"tuning.grid.{run.recovery_recipe()}"
    if key == "eval_windows" and grid.tuning.get("windows"):
        return "tuning.windows"
    if key in ("tokens", "recipe") and run.table == "extension":
        return "extension"
    if key in run.training or (key == "recipe" and run.recipe is not None):
        return _where(sources, key)  # a method/variant block's override
    return "training"


def check_ratios(config: dict[str, Any]) -> list[tuple[str, str]]:
    """``[("ratios", problem)]``: ratios whose run directory (``r{ratio:g}``) the DAG cannot
    name (``r0.<digits>``: below 1e-4 ``:g`` writes an exponent), several ratios naming the
    same directory (they would silently merge into one run), or a ratio its directory names
    differently (``:g`` keeps 6 significant digits; the run would use the rounded value)."""
    ratios = [r for r in config.get("ratios") or [] if isinstance(r, (int, float))]
    by_dir: dict[str, list[float]] = {}
    for ratio in ratios:
        by_dir.setdefault(RATIO_SETTING.format(ratio), []).append(ratio)
    problems = []
    for setting, values in by_dir.items():
        if not SETTING_PATTERN.fullmatch(setting):
            problems.append(("ratios", f"ratio {values[0]!r} would be run directory "
                             f"{setting!r}, which the DAG cannot name (r0.<digits>); "
                             f"ratios must be at least 0.0001"))
        elif len(values) > 1:
            problems.append(("ratios", f"ratios {', '.join(map(repr, values))} all name run "
                             f"directory {setting!r} (6 significant digits) and would merge "
                             "into one run; keep one"))
        elif float(setting[1:]) != values[0]:
            problems.append(("ratios", f"ratio {values[0]!r} names run directory {setting!r}, "
                             f"whose runs use {setting[1:]} (6 significant digits); write "
                             f"{setting[1:]}"))
    return problems


def raise_problems(problems: Iterable[tuple[tuple[str, str], str]]) -> None:
    """Raise one :class:`ConfigError` listing ``((key path, problem), run name)`` pairs
    (run name "" for config-wide problems); nothing when there are none."""
    lines = [f"{f'run {name}: ' if name else ''}{where}: {problem}"
             for (where, problem), name in problems]
    if not lines:
        return
    more = len(lines) - MAX_LISTED
    text = "\n  ".join(lines[:MAX_LISTED]) + (f"\n  ... and {more} more" if more > 0 else "")
    raise ConfigError(f"invalid config ({len(lines)} problem(s)):\n  {text}")


def check_config_files(paths: Iterable[str | os.PathLike]) -> None:
    """Refuse a config file that is empty or whose top level is not a mapping of keys:
    a given ``--configfile`` is used as written (never replaced by the embedded default),
    so an empty one cannot mean "the default".

    Raises:
        ConfigError: one line naming the file and what it holds.
    """
    import yaml

    for path in paths:
        try:
            data = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as err:
            raise ConfigError(f"config file {str(path)!r} cannot be read: "
                              f"{' '.join(str(err).split())}") from None
        if data is None:
            raise ConfigError(f"config file {str(path)!r} is empty; a --configfile is used "
                              "as written, never replaced by config/config.yaml: write its "
                              "settings, or give no --configfile to run the default")
        if not isinstance(data, dict):
            raise ConfigError(f"config file {str(path)!r} holds a {type(data).__name__}, "
                              "not a mapping of settings (model:, data:, methods: ...)")
        if not data:
            raise ConfigError(f"config file {str(path)!r} holds no settings (an empty "
                              "mapping); a --configfile is used as written, never replaced "
                              "by config/config.yaml: write its settings, or give no "
                              "--configfile to run the default")


def check_grid(config: dict[str, Any], grid: GridView) -> None:
    """Validate every run of ``grid`` (built from ``config``) as its jobs would.

    Raises:
        ConfigError: one line per distinct problem, ``run <model/method/variant/setting>:
            <key path>: <problem>``, before any job runs.
    """
    seen: dict[tuple[str, str], str] = {}
    for where, problem in (check_ratios(config) + check_model_paths(grid)
                           + check_inputs_apart(config)):
        seen.setdefault((where, problem), "")
    for run in grid.runs.values():
        found = check_run_options(config, grid, run)
        if run.recovery:
            found += check_run_training(config, grid, run)
        for item in found:
            seen.setdefault(item, run.name)
    raise_problems(seen.items())
