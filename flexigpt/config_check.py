"""Up-front validation of a run grid, at DAG-build time (before any job runs).

:func:`check_grid` builds every run's compression options into its method's config class
(``Method.make_config``, the path ``flexigpt.api.compress`` takes) and every tuning trial's
training options into :class:`~flexigpt.training.TrainConfig` (as ``workflow/scripts/train.py``
does); checks model-dependent sizes (a FlexiGPT ``rank`` that cannot compress, with the same
bound as ``flexigpt.methods.surgery.check_flexigpt_rank``) and the reach of every block-count
ratio (:func:`flexigpt.block_count.method_plan`, the check ``flexigpt.api.compress`` repeats)
on an empty skeleton of the model — its checkpoint's config.json, or for a resource model
not built yet the config its builder writes (:func:`resource_skeleton`; a hub model is
checked by its compress job); refuses ratios that name the same run directory or one the
DAG cannot name (:func:`check_ratios`); and refuses a local-looking ``model.path`` that does
not exist and no resource rule builds. Every problem is reported in one :class:`ConfigError`
naming the run, the config key path and the problem.

At DAG build the Snakefile also refuses an empty config file (:func:`check_config_files`) and
verifies the resource directories that already exist against their build records
(:func:`check_resources`), so a tampered file stops the run before any job starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
from collections.abc import Iterable
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
#: run directory of a ratio (``flexigpt.dag``: ``setting = f"r{ratio:g}"``) and the form the
#: DAG's ``setting`` wildcard accepts
RATIO_SETTING = "r{:g}"
SETTING_PATTERN = re.compile(r"r0\.[0-9]+")
#: where :func:`check_resources` records the files it verified (relative to the workdir)
VERIFIED_RECORD = Path(".snakemake") / "flexigpt-verified-resources.json"


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

        hf_config = AutoConfig.from_pretrained(path, trust_remote_code=False)
        get_adapter(hf_config)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(hf_config)
    except Exception:  # noqa: BLE001 (an unreadable checkpoint fails in its own job)
        return None


class _Vocabulary:
    """The token facts :func:`flexigpt.resources.tiny_models.make_model` reads of a tokenizer
    (the tiny models' special ids and vocabulary size), without training one."""

    bos_token_id, eos_token_id, pad_token_id = 0, 1, 2

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


@lru_cache(maxsize=4)
def resource_skeleton(resource: str | None) -> Any:
    """An empty (meta-device) model of the shape resource builder ``resource`` writes
    (``flexigpt.dag.RESOURCE_MODELS``), for checks before the resource is built; None for
    an unknown name. Tiny models: ``make_model`` with the default ``TinyModelConfig``;
    ``smollm2``: the architecture its converter checks (``smollm2.EXPECTED``, tied
    embeddings). Parameter counts match the built models' up to the trained vocabulary."""
    if resource is None:
        return None
    import torch

    if resource == "smollm2":
        from transformers import AutoModelForCausalLM, LlamaConfig

        from flexigpt.resources.smollm2 import EXPECTED

        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(
                LlamaConfig(**EXPECTED, tie_word_embeddings=True))
    from flexigpt.resources.tiny_models import FAMILIES, TinyModelConfig, make_model

    family = {name: fam for fam, name in FAMILIES.items()}.get(resource)
    if family is None:
        return None
    cfg = TinyModelConfig()
    with torch.random.fork_rng(devices=[]), torch.device("meta"):  # make_model seeds torch
        return make_model(cfg, _Vocabulary(cfg.vocab_size), seed=0, family=family)


def model_skeleton(grid: RunGrid, key: str) -> Any:
    """The skeleton of model ``key``: its local checkpoint's, else its resource builder's
    (not built yet), else None (a hub model: its jobs check it)."""
    path = grid.model_paths.get(key)
    if path and Path(path).exists():
        return _skeleton(path)
    return resource_skeleton(grid.model_resources.get(key))


def ratio_key(config: dict[str, Any], run: Run) -> str:
    """The config key a run's ratio comes from."""
    if run.table == "ablation":
        return "ablations.ratio"
    section = {"paper_protocol": "paper_protocol", "kd": "kd"}.get(run.table)
    if section and "ratios" in (config.get(section) or {}):
        return f"{section}.ratios"
    return "ratios"


def check_reach(run: Run, cfg: Any, model: Any) -> str | None:
    """The problem when ``run``'s ratio is out of reach of its block-count policy on
    ``model`` (:func:`flexigpt.block_count.method_plan`: more than half a block step beyond
    what any block count achieves, or the policy's own refusal); None when it is reachable,
    the method removes no blocks, or the run is matched to another run's achieved ratio
    (known only when that run is compressed; its compress job checks it)."""
    from flexigpt.block_count import method_plan

    if run.match is not None or run.ratio is None:
        return None
    try:
        method_plan(run.method, model, cfg)
    except ValueError as err:
        return str(err)
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
    model = model_skeleton(grid, run.model)
    if model is not None:
        from flexigpt.models.adapters import UnsupportedArchitectureError

        try:
            spec.check_family(model)
        except UnsupportedArchitectureError as err:
            return [(f"methods.{run.method}", str(err))]
        found = check_sizes(run, cfg, model)
        if found is not None:
            return [(_where(sources, found[0]), found[1])]
        problem = check_reach(run, cfg, model)
        if problem is not None:
            return [(ratio_key(config, run), f"{problem} ({run.model})")]
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


def resource_dirs(config: dict[str, Any], grid: RunGrid) -> dict[str, tuple[str, bool]]:
    """``{directory: (config key, whole)}`` of the existing local directories the grid reads:
    model checkpoints and the benchmark folder (``whole``: the directory holds only what
    its build wrote) and the folders of the text files (which also hold the held-out
    split's outputs, so only the files the build recorded are checked)."""
    keys = list(grid.model_paths)
    out: dict[str, tuple[str, bool]] = {}
    for key, path in grid.model_paths.items():
        where = "model.path" if key == keys[0] else "extension.model_path"
        out.setdefault(str(path), (where, True))
    if grid.benchmarks:
        out.setdefault(str(grid.benchmarks), ("data.benchmarks", True))
    data = config.get("data") or {}
    for name in ("calibration_text", "train_text", "validation_text"):
        if data.get(name):
            out.setdefault(str(Path(data[name]).parent), (f"data.{name}", False))
    return {d: v for d, v in out.items() if Path(d).is_dir()}


def _listing(directory: Path) -> list[str]:
    """Every file and symlink under ``directory``, relative, sorted."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*")
                  if p.is_file() or p.is_symlink())


def _file_states(directory: Path, names: Iterable[str]) -> dict[str, list[int]]:
    """``{name: [device, inode, size, mtime_ns, ctime_ns]}``: a file rewritten in place,
    replaced or touched changes one of them (ctime cannot be set back)."""
    out = {}
    for name in sorted(names):
        try:
            st = (directory / name).lstat()
        except OSError:
            continue
        out[name] = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    return out


def _unchanged(directory: Path, whole: bool, state: Any) -> bool:
    """Whether ``directory``'s files are in the recorded ``state`` (with ``whole``: and no
    file was added)."""
    if not isinstance(state, dict) or not state:
        return False
    if whole and sorted(state) != _listing(directory):
        return False
    return _file_states(directory, state) == state


def verify_resource(directory: str | os.PathLike, whole: bool) -> dict[str, list[int]] | None:
    """Verify a harness-written ``directory`` against its ``.flexigpt-output.json``
    (``flexigpt.artifacts``: every recorded sha256; with ``whole`` also no unrecorded
    file). Returns the states of the files verified (None: no marker, nothing to check).

    Raises:
        CheckpointError: naming the directory and the changed, missing or added file(s).
    """
    from flexigpt.artifacts import MARKER, CheckpointError, verify_files, verify_marker

    root = Path(directory)
    try:
        marker = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        return None
    recorded = marker.get("files") if isinstance(marker, dict) else None
    if not isinstance(recorded, dict):
        return None
    if whole:
        verify_marker(root)
        return _file_states(root, _listing(root))
    if not all(isinstance(v, str) for v in recorded.values()):
        raise CheckpointError(f"{str(root / MARKER)!r} is not a valid marker (its 'files' "
                              "values must be strings)")
    verify_files(root, recorded, MARKER)
    return _file_states(root, [*recorded, MARKER])


def check_resources(config: dict[str, Any], grid: RunGrid,
                    record: str | os.PathLike | None = VERIFIED_RECORD) -> None:
    """Verify every existing resource directory of the grid (:func:`resource_dirs`) against
    its build record before any job reads it. Hashing is skipped for a directory whose
    files are in the state ``record`` noted when they last verified (same device, inode,
    size, mtime and ctime: any write or replacement changes one), so a repeated DAG build
    costs a ``stat`` per file; ``record`` None always hashes.

    Raises:
        ConfigError: ``<config key>: changed after its build: '<directory>': <what>``
            (one line per directory, naming the file(s)), before any job starts.
    """
    from flexigpt.artifacts import CheckpointError, atomic_write_text

    known: dict[str, Any] = {}
    if record is not None:
        try:
            known = json.loads(Path(record).read_text())
        except (OSError, ValueError):
            known = {}
    known = known if isinstance(known, dict) else {}
    verified, problems = {}, []
    for directory, (where, whole) in resource_dirs(config, grid).items():
        key = str(Path(directory).resolve())
        if _unchanged(Path(directory), whole, known.get(key)):
            verified[key] = known[key]
            continue
        try:
            states = verify_resource(directory, whole)
        except CheckpointError as err:
            problems.append(((where, f"changed after its build: {' '.join(str(err).split())}"
                              "; rebuild it (remove the directory and rerun) or restore it"),
                             ""))
            continue
        if states is not None:
            verified[key] = states
    raise_problems(problems)
    merged = {**known, **verified}  # other configs' directories stay recorded
    if record is not None and merged != known:
        Path(record).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(record, json.dumps(merged, indent=1, sort_keys=True) + "\n")


def check_grid(config: dict[str, Any], grid: RunGrid) -> None:
    """Validate every run of ``grid`` (built from ``config``) as its jobs would.

    Raises:
        ConfigError: one line per distinct problem, ``run <model/method/variant/setting>:
            <key path>: <problem>``, before any job runs.
    """
    seen: dict[tuple[str, str], str] = {}
    for where, problem in check_ratios(config) + check_model_paths(grid):
        seen.setdefault((where, problem), "")
    for run in grid.runs.values():
        found = check_run_options(config, grid, run)
        if run.recovery:
            found += check_run_training(config, grid, run)
        for item in found:
            seen.setdefault(item, run.name)
    raise_problems(seen.items())
