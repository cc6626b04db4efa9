"""The run grid of the Snakemake DAG, as typed objects (config → runs → paths/params).

``workflow/rules/common.smk`` builds one :class:`RunGrid` from the validated config; rules
only look things up in it. A *run* is one model produced by the DAG, addressed by the
wildcards ``{model}/{method}/{variant}/{setting}``:

- ``setting`` is ``r<ratio>`` for compression, ``full`` for the dense model and ``L<layers>``
  for the extension; ``variant`` is ``default`` or an ablation / extension pattern name.
- Each run is evaluated at stage ``final`` (perplexity + tasks) and, when it has recovery
  training, at stage ``start`` (perplexity right after compression: Table 4's "Start PPL").
- Held-out text is split by document (:func:`flexigpt.calibration.split_heldout`): every
  recovery choice reads the tuning split, perplexity only the test split.
- A recovered run trains every point of its recipe's tuning grid in one job, by successive
  halving (:func:`flexigpt.training.tuning.run_sweep`, rung ``tuning.rung`` of the
  schedule), and keeps the best on the tuning split as ``trained/`` (its
  ``selection.json`` lists every trial). Its training log records the tuning-split
  perplexity every ``training.eval_every_tokens`` tokens (:func:`curve_every_steps`).
- The budget axis (``budget:``, :func:`budget_runs`): named Table 1 runs recovered again at
  a ladder of token budgets, each a run of its own (variant ``tok<n>`` / ``<variant>_tok<n>``,
  table ``budget``) whose schedule ends at its own budget.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from flexigpt.devices import check_device
from flexigpt.registry import METHODS, methods_with

#: methods whose configs accept precomputed Block Influence scores (computed once per model).
BI_METHODS = methods_with("block_influence")
#: offline resource builders → the checkpoint folder they produce.
RESOURCE_MODELS = {"smollm2": "resources/models/smollm2-135m",
                   "tiny-llama": "resources/models/tiny-llama",
                   "tiny-opt": "resources/models/tiny-opt"}
#: tables a run can belong to (``labels.table`` of its result JSONs).
TABLES = ("dense", "main", "paper_protocol", "kd", "ablation", "extension", "budget")
#: how a budget ladder chooses learning rates (``budget.lr``): a sweep on the tuning split at
#: every point, or the smallest point's choice reused above it.
BUDGET_LR = ("sweep", "smallest")
#: which budget points are scored on the tasks (``budget.tasks``; perplexity at every point).
BUDGET_TASKS = ("all", "top")
#: learning-rate keys a tuning grid may sweep, per trainer recipe.
GRID_KEYS = {"flexigpt": ("lr", "gamma_lr"), "lora": ("lr",), "full": ("lr",)}
#: name of the inference_cost rule's prompt-text input (every other input is a timed model)
PROMPT_TEXT = "prompt_text"

Key = tuple[str, str, str, str]


@dataclass(frozen=True)
class Run:
    """One model the DAG produces (see module doc for the wildcards).

    ``match``, ``budget``, ``lr_from`` and ``compressed_from`` name other runs of the grid:
    the run whose achieved ratio this run's block count is matched to, whose trainable
    count its LoRA is sized to, whose chosen learning rates it reuses (no sweep of its
    own), and whose compressed model it trains (instead of compressing again).
    """

    model: str
    method: str  # registry key of the compression step
    variant: str
    setting: str
    options: dict[str, Any] = field(default_factory=dict)
    recovery: bool = False
    recipe: str | None = None  # trainer recipe override (None: the method's own)
    tokens: int | None = None  # recovery token budget override
    training: dict[str, Any] = field(default_factory=dict)  # TrainConfig overrides
    match: Key | None = None
    budget: Key | None = None
    lr_from: Key | None = None
    compressed_from: Key | None = None
    table: str = "main"
    protocol: str | None = None
    calibration: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    dtype: str = "float32"
    device: str = "auto"  # where every job of the run computes (flexigpt.devices)
    label_variant: str | None = None  # a seed replicate's base variant (labels, tables)
    budget_tokens: int | None = None  # a budget-ladder point: its token budget
    budget_variant: str | None = None  # ... and the Table 1 variant it recovers again
    scored_tasks: bool = True  # stage final scores the tasks (else perplexity only)

    @property
    def key(self) -> Key:
        return (self.model, self.method, self.variant, self.setting)

    @property
    def ratio(self) -> float | None:
        return float(self.setting[1:]) if self.setting.startswith("r") else None

    @property
    def needs_calibration(self) -> bool:
        return METHODS[self.method].calibration

    @property
    def uses_block_influence(self) -> bool:
        return self.method in BI_METHODS

    @property
    def loss(self) -> str:
        return str(self.training.get("loss", "lm"))

    @property
    def prefix(self) -> str:
        return prefix_of(self.key)

    @property
    def name(self) -> str:
        """``model/method/variant/setting``."""
        return "{}/{}/{}/{}".format(*self.key)

    @property
    def compressed_dir(self) -> str:
        return f"{prefix_of(self.compressed_from or self.key)}/compressed"

    @property
    def trained_dir(self) -> str:
        return f"{self.prefix}/trained"

    def final_dir(self) -> str:
        return self.trained_dir if self.recovery else self.compressed_dir

    def recovery_recipe(self) -> str:
        """The trainer recipe: the override, else the method's registered one."""
        from flexigpt.registry import get_method

        return self.recipe or get_method(self.method).recovery

    def eval_json(self, stage: str) -> str:
        return f"{self.prefix}/eval_{stage}.json"

    def stages(self) -> list[str]:
        """``start`` (perplexity right after compression) only where it is news: a FlexiGPT
        compression (its replacement blocks change the function: Table 4's Start PPL). A
        LoRA-recovered run starts as its one-shot model (LoRA B = 0), the extension as the
        base (γ = 0), a dense control as the dense model, and a run that trains another
        run's compressed model at that run's start: none is evaluated twice."""
        if (self.recovery and self.compressed_from is None and self.method == "flexigpt"):
            return ["start", "final"]
        return ["final"]

    def wildcards_ns(self) -> SimpleNamespace:
        return SimpleNamespace(model=self.model, method=self.method, variant=self.variant,
                               setting=self.setting)

    def compress_params(self) -> dict[str, Any]:
        options = dict(self.options)
        if self.ratio is not None:
            options["ratio"] = self.ratio
        return {"method": self.method, "options": options, "seed": self.seed,
                "dtype": self.dtype, "device": self.device, **self.calibration}

    def labels(self, stage: str) -> dict[str, Any]:
        """The result JSON's ``labels``; a budget-ladder point adds ``budget_tokens`` and
        ``budget_variant`` (the Table 1 variant it recovers again)."""
        out = {"model": self.model, "method": self.method,
               "variant": self.label_variant or self.variant,
               "setting": self.setting, "ratio": self.ratio, "stage": stage, "seed": self.seed,
               "table": self.table, "protocol": self.protocol, "loss": self.loss}
        if self.budget_tokens is not None:
            out.update(budget_tokens=self.budget_tokens, budget_variant=self.budget_variant)
        return out


def prefix_of(key: Key) -> str:
    return "results/{}/{}/{}/{}".format(*key)


def _ref(spec: str, model: str, variant: str, setting: str) -> Key:
    """``"method"`` or ``"method/variant"`` → a run key at ``setting``."""
    method, _, named = spec.partition("/")
    return (model, method, named or variant, setting)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """A variant block: the method block's settings, overridden key by key."""
    out = {key: over.get(key, base.get(key)) for key in ("recovery", "match", "budget")}
    out["lr_from"] = over.get("lr_from")  # a variant may reuse another run's chosen LRs
    out["options"] = {**(base.get("options") or {}), **(over.get("options") or {})}
    out["training"] = {**(base.get("training") or {}), **(over.get("training") or {})}
    return out


def _table1_ratios(where: str, section: dict[str, Any], ratios: list[float],
                   needed: bool = True) -> list[float]:
    """``section["ratios"]`` (default: every Table 1 ratio); when the section's runs reuse a
    Table 1 run (its learning rates or compressed model), each must be a Table 1 ratio."""
    chosen = list(section.get("ratios", ratios))
    missing = [r for r in chosen if r not in ratios]
    if needed and missing:
        raise ValueError(f"{where}: {missing} not in ratios {list(ratios)} (these runs reuse "
                         "the Table 1 run at the same ratio; add it to ratios or drop it here)")
    return chosen


def replicate_runs(runs: dict[Key, Run], spec: dict[str, Any]) -> list[Run]:
    """Seed replicates of Table 1 runs: ``spec = {"seeds": [1, 2], "runs": ["flexigpt",
    "shortgpt_lora", "slicegpt/rft"]}`` → for every named run at every ratio and every seed,
    a copy at variant ``<variant>_s<seed>`` with that seed (calibration sample, data order,
    adapter init) and labels of the base variant, so tables average over seeds. A replicate
    reuses the base run's chosen learning rates (no sweep per seed); its ``match`` and
    ``budget`` point to the same seed's replicate of the run named there when that is
    replicated too.

    Raises:
        ValueError: a named run that is not a Table 1 method/variant, or a seed that equals
            the base seed of a run.
    """
    out: list[Run] = []
    names = [(method, variant or "default") for method, _, variant in
             (name.partition("/") for name in spec.get("runs", []))]
    base = {k: r for k, r in runs.items() if r.table == "main" and (r.method, r.variant) in names}
    for name in names:
        if not any((r.method, r.variant) == name for r in base.values()):
            raise ValueError(f"replicates.runs names {'/'.join(name)!r}, which is not a "
                             "Table 1 method/variant of this config")

    def twin(ref: Key | None, seed: int) -> Key | None:
        if ref is None or ref not in base:
            return ref
        return (ref[0], ref[1], f"{ref[2]}_s{seed}", ref[3])

    for seed in spec.get("seeds", []):
        for key, run in base.items():
            if seed == run.seed:
                raise ValueError(f"replicates.seeds repeats the base seed {seed}")
            out.append(replace(
                run, variant=f"{run.variant}_s{seed}", seed=int(seed), label_variant=run.variant,
                match=twin(run.match, seed), budget=twin(run.budget, seed),
                lr_from=(run.lr_from or key) if run.recovery else None,
                compressed_from=twin(run.compressed_from, seed)))
    return out


def budget_variant(variant: str, tokens: int) -> str:
    """The variant of a budget-ladder point: ``tok<n>`` for a default run, else
    ``<variant>_tok<n>`` (so its paths are a pure function of the wildcards)."""
    return f"tok{tokens}" if variant == "default" else f"{variant}_tok{tokens}"


def step_tokens(training: dict[str, Any]) -> int:
    """Tokens of one optimizer step (``global_batch · seq_len``, TrainConfig's defaults)."""
    return (int(training.get("global_batch", _train_default("global_batch")))
            * int(training.get("seq_len", _train_default("seq_len"))))


def _ladder(spec: dict[str, Any], training: dict[str, Any]) -> list[int]:
    """``budget.tokens`` sorted; each a whole number of optimizer steps, so every point's
    schedule ends exactly at its own budget (ValueError otherwise)."""
    ladder = sorted({int(t) for t in spec["tokens"]})
    step = step_tokens(training)
    odd = [t for t in ladder if t % step]
    if odd:
        raise ValueError(f"budget.tokens {odd} are not multiples of the {step} tokens of one "
                         "optimizer step (training.global_batch x training.seq_len)")
    return ladder


def _ladder_bases(runs: dict[Key, Run], spec: dict[str, Any],
                  ratios: list[float]) -> dict[Key, Run]:
    """The Table 1 runs (base seed) the ladder recovers again: ``budget.runs`` at
    ``budget.ratios`` (ValueError for a name that is not a recovered Table 1 run)."""
    chosen = _table1_ratios("budget.ratios", spec, ratios)
    names = [(method, variant or "default") for method, _, variant in
             (name.partition("/") for name in spec["runs"])]
    table1 = {k: r for k, r in runs.items() if r.table == "main" and r.label_variant is None}
    for name in names:
        if not any((r.method, r.variant) == name and r.recovery for r in table1.values()):
            raise ValueError(f"budget.runs names {'/'.join(name)!r}, which is not a recovered "
                             "Table 1 method/variant of this config")
    return {k: r for k, r in table1.items()
            if (r.method, r.variant) in names and r.ratio in chosen}


def budget_runs(runs: dict[Key, Run], spec: dict[str, Any], ratios: list[float],
                training: dict[str, Any]) -> list[Run]:
    """The budget axis: every run of ``budget.runs`` at every ratio of ``budget.ratios``,
    recovered again at every ``budget.tokens`` point as a run of its own (variant
    :func:`budget_variant`, table ``budget``): it trains the Table 1 run's compressed model
    for exactly that many tokens (its own warm-up + cosine schedule, annealed at its
    budget: never a checkpoint of a longer run). A point equal to ``training.tokens`` is the
    Table 1 run itself (no second run).

    Links: ``budget`` and ``lr_from`` name the same point's twin of the run they name
    (when that run is on the ladder too). Learning rates (``budget.lr``): ``sweep`` (default)
    = the recipe's tuning grid on the tuning split at every point; ``smallest`` = the
    smallest point sweeps, the others reuse its choice (``lr_from``). ``budget.tasks: top``
    scores the tasks only at the largest point (perplexity at every point).

    Raises:
        ValueError: a name that is not a recovered Table 1 run, a ratio not in ``ratios``, a
            point that is not a whole number of optimizer steps, an unknown ``lr`` /
            ``tasks`` choice.
    """
    if not spec:
        return []
    ladder = _ladder(spec, training)
    base_tokens = int(training.get("tokens", _train_default("tokens")))
    bases = _ladder_bases(runs, spec, ratios)
    lr_mode, tasks = spec.get("lr", "sweep"), spec.get("tasks", "all")
    if lr_mode not in BUDGET_LR or tasks not in BUDGET_TASKS:
        raise ValueError(f"budget.lr must be one of {BUDGET_LR} and budget.tasks one of "
                         f"{BUDGET_TASKS}, got {lr_mode!r} and {tasks!r}")
    top_only = tasks == "top"

    def at(ref: Key | None, tokens: int) -> Key | None:
        """The run standing for ``ref`` at ``tokens`` (ref itself off the ladder)."""
        if ref is None or ref not in bases or tokens == base_tokens:
            return ref
        return (ref[0], ref[1], budget_variant(ref[2], tokens), ref[3])

    out: list[Run] = []
    for tokens in ladder:
        for key, run in bases.items():
            if tokens == base_tokens:
                continue
            lr_from = at(run.lr_from, tokens)
            if lr_from is None and lr_mode == "smallest" and tokens != ladder[0]:
                lr_from = at(key, ladder[0])
            out.append(replace(
                run, variant=budget_variant(run.variant, tokens), tokens=tokens,
                table="budget", budget_tokens=tokens, budget_variant=run.variant,
                compressed_from=run.compressed_from or key, budget=at(run.budget, tokens),
                lr_from=lr_from, scored_tasks=not top_only or tokens == ladder[-1]))
    return out


def _train_default(name: str) -> Any:
    from flexigpt.training.config import TrainConfig

    return TrainConfig.__dataclass_fields__[name].default


@dataclass
class RunGrid:
    """All runs of one config, with the shared settings rules need."""

    runs: dict[Key, Run]
    model_paths: dict[str, str]
    model_resources: dict[str, str | None]
    calibration_text: str
    train_text: str
    validation_text: str
    benchmarks: str | None
    task_source: str
    training: dict[str, Any]
    evaluation: dict[str, Any]
    inference: dict[str, Any]
    calibration: dict[str, Any]
    seed: int
    hub_text: dict[str, Any] = field(default_factory=dict)
    tuning: dict[str, Any] = field(default_factory=dict)

    # ---- construction ------------------------------------------------------------------
    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "RunGrid":
        """Build the grid from a schema-validated config dict.

        Raises:
            ValueError: inconsistent settings the schema cannot express (e.g. a resource
                model whose path is not where its builder writes, a ``match``/``budget``
                naming a run that is not in the grid).
            flexigpt.config_check.ConfigError (a ValueError): an option, training setting,
                size or model path its jobs would reject (:func:`~flexigpt.config_check.check_grid`).
        """
        model = config["model"]
        data = config["data"]
        seed = int(config.get("seed", 0))
        dtype = model.get("dtype", "float32")
        device = check_device(config.get("device", "auto"))
        calib = {"n_calibration": config["calibration"].get("n_windows", 128),
                 "seq_len": config["calibration"].get("seq_len", 512)}
        key = model["key"]
        paths = {key: model["path"]}
        resources = {key: model.get("resource")}
        if resources[key] is not None:
            expected = RESOURCE_MODELS[resources[key]]
            if Path(model["path"]) != Path(expected):
                raise ValueError(f"model.path must be {expected!r} for resource "
                                 f"{resources[key]!r}, got {model['path']!r}")
        if data.get("task_source", "local") == "local" and not data.get("benchmarks"):
            raise ValueError("data.benchmarks is required when data.task_source is 'local'")
        runs: dict[Key, Run] = {}
        common = {"calibration": calib, "seed": seed, "dtype": dtype, "device": device}

        def add(run: Run) -> None:
            runs[run.key] = run

        def method_run(name: str, variant: str, block: dict[str, Any], setting: str,
                       table: str, protocol: str, ref_variant: str, **extra: Any) -> Run:
            return Run(key, name, variant, setting, options=dict(block["options"]),
                       recovery=bool(block.get("recovery")),
                       training=dict(block.get("training") or {}),
                       match=_ref(block["match"], key, ref_variant, setting)
                       if block.get("match") else None,
                       budget=_ref(block["budget"], key, ref_variant, setting)
                       if block.get("budget") else None,
                       table=table, protocol=protocol,
                       **{"lr_from": _ref(block["lr_from"], key, ref_variant, setting)
                          if block.get("lr_from") else None, **extra}, **common)

        methods = config["methods"]
        blocks: dict[tuple[str, str], dict[str, Any]] = {}
        for name, block in methods.items():
            block = block or {}
            if name == "dense":
                add(Run(key, "dense", "default", "full", table="dense", **common))
                continue
            blocks[(name, "default")] = _merge({}, block)
            for variant, over in (block.get("variants") or {}).items():
                blocks[(name, variant)] = _merge(block, over or {})
        for (name, variant), block in blocks.items():
            base = blocks[(name, "default")]
            # a variant that only changes the recovery trains the default's compressed model
            same = variant != "default" and all(block.get(k) == base.get(k)
                                                for k in ("options", "match"))
            for ratio in config["ratios"]:
                setting = f"r{ratio:g}"
                add(method_run(name, variant, block, setting, "main", "matched", "default",
                               compressed_from=(key, name, "default", setting) if same
                               else None))
        for run in replicate_runs(runs, config.get("replicates") or {}):
            add(run)
        for run in budget_runs(runs, config.get("budget") or {}, config["ratios"],
                               config["training"]):
            if run.key in runs:
                raise ValueError(f"budget: run {run.name} is already in the grid (rename the "
                                 f"variant {run.budget_variant!r})")
            add(run)
        protocol = config.get("paper_protocol") or {}
        for name in protocol.get("methods", []):
            if (name, "default") not in blocks:
                raise ValueError(f"paper_protocol names {name!r}, which is not in methods")
            block = dict(blocks[(name, "default")])
            block["options"] = {**block["options"], "policy": "paper"}
            block["match"] = None  # same int(ratio·L) blocks: nothing to match
            block["lr_from"] = None
            for ratio in _table1_ratios("paper_protocol.ratios", protocol, config["ratios"],
                                        needed=bool(block.get("recovery"))):  # Table 1's LRs
                setting = f"r{ratio:g}"
                ref = (key, name, "default", setting)
                add(method_run(name, "paper", block, setting, "paper_protocol", "paper",
                               "paper", lr_from=ref if block.get("recovery") else None))
        kd = config.get("kd") or {}
        for spec in kd.get("runs", []):
            name, _, variant = spec.partition("/")
            variant = variant or "default"
            if (name, variant) not in blocks:
                raise ValueError(f"kd.runs names {spec!r}, which is not a method/variant")
            block = dict(blocks[(name, variant)], lr_from=None)
            block["recovery"] = True
            block["training"] = {**block["training"], "loss": "kd",
                                 "kd_temperature": kd.get("temperature", 2.0)}
            kd_variant = "kd" if variant == "default" else f"{variant}_kd"
            for ratio in _table1_ratios("kd.ratios", kd, config["ratios"]):
                setting = f"r{ratio:g}"
                ref = (key, name, variant, setting)
                add(method_run(name, kd_variant, block, setting, "kd", "matched", "default",
                               lr_from=ref, compressed_from=runs[ref].compressed_from or ref))
        ablations = config.get("ablations") or {}
        if ablations.get("variants"):
            if ("flexigpt", "default") not in blocks:
                raise ValueError("ablations need methods.flexigpt")
            base = blocks[("flexigpt", "default")]
            _table1_ratios("ablations.ratio", {"ratios": [ablations["ratio"]]}, config["ratios"])
            setting = f"r{ablations['ratio']:g}"
            ref = (key, "flexigpt", "default", setting)
            for variant, overrides in ablations["variants"].items():
                block = {**base, "options": {**base["options"], **overrides}, "lr_from": None}
                add(method_run("flexigpt", variant, block, setting, "ablation", "matched",
                               "default", lr_from=ref if ref in runs else None))
        ext = config.get("extension") or {}
        if ext.get("patterns"):
            ext_key = ext.get("model_key", key)
            paths.setdefault(ext_key, ext.get("model_path", model["path"]))
            resources.setdefault(ext_key, None)
            tokens = ext.get("tokens")
            setting = f"L{ext['layers']}"
            for pattern in ext["patterns"]:
                options = {"layers": ext["layers"], "pattern": pattern}
                if ext.get("span"):
                    options["span"] = list(ext["span"])
                add(Run(ext_key, "flexigpt_extend", pattern, setting, options=options,
                        recovery=True, tokens=tokens, table="extension", **common))
            add(Run(ext_key, "dense", "default", "full", table="dense", **common))
            if ext.get("control", True):
                add(Run(ext_key, "dense", "trained", "full", recovery=True, recipe="full",
                        tokens=tokens, table="extension", **common))
            if ext.get("lora_control", False):
                add(Run(ext_key, "dense", "trained_lora", "full", recovery=True, recipe="lora",
                        tokens=tokens, table="extension",
                        budget=(ext_key, "flexigpt_extend", ext["patterns"][0], setting),
                        **common))
        grid = cls(runs=runs, model_paths=paths, model_resources=resources,
                   calibration_text=data.get("calibration_text", data["train_text"]),
                   train_text=data["train_text"], validation_text=data["validation_text"],
                   benchmarks=data.get("benchmarks"),
                   task_source=data.get("task_source", "local"),
                   training=dict(config["training"]), evaluation=dict(config["evaluation"]),
                   inference={**(config.get("inference") or {}), "device": device},
                   calibration={**calib, "seed": seed, "dtype": dtype, "device": device},
                   seed=seed,
                   hub_text=dict(data.get("hub_text") or {}),
                   tuning=dict(config.get("tuning") or {}))
        grid.check_references()
        from flexigpt.config_check import check_grid

        check_grid(config, grid)  # options, TrainConfigs, sizes, model paths: as jobs would
        return grid

    def check_references(self) -> None:
        """Every ``match``/``budget``/``lr_from``/``compressed_from`` names another run that
        exists and can serve (a budget source must be recovered with adapters)."""
        for run in self.runs.values():
            for what in ("match", "budget", "lr_from", "compressed_from"):
                ref = getattr(run, what)
                if ref is None:
                    continue
                where = "{}/{}/{}/{}".format(*run.key)
                if ref == run.key:
                    raise ValueError(f"run {where}: {what} names the run itself")
                if ref not in self.runs:
                    raise ValueError(f"run {where}: {what} names {'/'.join(ref)}, which is "
                                     "not in the grid")
                if what == "lr_from" and not self.runs[ref].recovery:
                    raise ValueError(f"run {where}: lr_from names {'/'.join(ref)}, which is "
                                     "not trained")
            if run.budget is not None and not run.recovery:
                raise ValueError(f"run {'/'.join(run.key)}: a budget needs recovery: true")

    # ---- lookups -------------------------------------------------------------------------
    @property
    def model_keys(self) -> list[str]:
        return sorted(self.model_paths)

    @property
    def tune_text(self) -> str:
        """Documents of the held-out text used for every recovery choice (never scored)."""
        return str(Path(self.validation_text).with_suffix(".tune.txt"))

    @property
    def test_text(self) -> str:
        """Documents of the held-out text whose perplexity the tables report."""
        return str(Path(self.validation_text).with_suffix(".test.txt"))

    def model_path(self, key: str) -> str:
        return self.model_paths[key]

    def local_model_inputs(self, key: str) -> dict[str, str]:
        """``{"model": path}`` when the base model is a local checkpoint (built by a resource
        rule or already on disk), else ``{}``: hub ids are not files."""
        path = self.model_paths[key]
        if self.model_resources.get(key) is not None or Path(path).exists():
            return {"model": path}
        return {}

    def hub_text_source(self, name: str, split: str) -> dict[str, Any]:
        """The ``data.hub_text`` entry that builds ``resources/text/<name>/<split>.txt``."""
        try:
            source = dict(self.hub_text[name])
        except KeyError:
            raise ValueError(f"resources/text/{name}/{split}.txt has no data.hub_text entry "
                             f"{name!r} to build it from") from None
        return source

    def run(self, model: str, method: str, variant: str, setting: str) -> Run:
        try:
            return self.runs[(model, method, variant, setting)]
        except KeyError:
            raise ValueError(f"no run {model}/{method}/{variant}/{setting} in the config") from None

    def eval_targets(self) -> list[str]:
        return [run.eval_json(stage) for run in self.runs.values() for stage in run.stages()]

    def figure_inputs(self) -> dict[str, list[str]]:
        """This grid's FlexiGPT manifests, training logs and LR-sweep records (files inside
        directory outputs, so passed as params): figures never pick up other runs."""
        trained = [run for run in self.runs.values() if run.recovery]
        return {"manifests": [f"{run.prefix}/compressed/manifest.json"
                              for run in self.runs.values()
                              if run.method == "flexigpt" and run.compressed_from is None],
                "train_logs": [f"{run.trained_dir}/train_log.csv" for run in trained],
                "selections": [f"{run.trained_dir}/selection.json" for run in trained]}

    def inference_runs(self, model: str) -> dict[str, Run]:
        """Models timed together for Tables 6/7: every ``timed`` method of the registry
        (dense, ShortGPT, FlexiGPT, the extensions) present in the grid, those with ratios at
        their lowest ratio."""
        out: dict[str, Run] = {}
        timed = methods_with("timed")
        for run in self.runs.values():
            if (run.model != model or run.method not in timed
                    or run.variant not in ("default", "block", "sequential")):
                continue
            if run.ratio is None or run.ratio == min(
                    r.ratio for r in self.runs.values() if r.method == run.method
                    and r.ratio is not None and r.variant == "default"):
                out[f"{run.method}/{run.variant}/{run.setting}"] = run
        return dict(sorted(out.items(), key=lambda kv: kv[0] != "dense/default/full"))

    def inference_targets(self) -> list[str]:
        return [f"results/{m}/inference.json" for m in self.model_keys
                if len(self.inference_runs(m)) > 1]

    # ---- recovery: tuning trials and training --------------------------------------------
    def trials(self, run: Run) -> list[dict[str, Any]]:
        """The learning-rate trials of a recovered run: the tuning grid of its recipe (the
        product of its ``lr`` and ``gamma_lr`` lists), or one trial when it reuses another
        run's choice (``lr_from``) or the grid has nothing for its recipe."""
        if run.lr_from is not None:
            return [{"lr_from": prefix_of(run.lr_from)}]
        grid = (self.tuning.get("grid") or {}).get(run.recovery_recipe()) or {}
        trials: list[dict[str, Any]] = [{}]
        for name in GRID_KEYS.get(run.recovery_recipe(), ()):
            if grid.get(name):
                trials = [{**t, name: float(v)} for t in trials for v in grid[name]]
        return trials

    def trial_ids(self, run: Run) -> list[str]:
        return [f"t{i}" for i in range(len(self.trials(run)))]

    @property
    def tuning_rung(self) -> float:
        """Fraction of the schedule at which a sweep's trials are compared (``tuning.rung``,
        default 0.5; 1 = every trial trained fully)."""
        return float(self.tuning.get("rung", 0.5))

    def train_params(self, run: Run, trial: str | None = None) -> dict[str, Any]:
        """TrainConfig fields of one trial (``trial`` None: the first); ``eval_every``
        (steps) from ``training.eval_every_tokens`` (:func:`curve_every_steps`)."""
        from flexigpt.training.config import curve_every_steps

        cfg = dict(self.training)
        every = cfg.pop("eval_every_tokens", None)
        if run.tokens is not None:
            cfg["tokens"] = run.tokens
        cfg["seed"] = run.seed
        cfg["device"] = run.device
        if run.recipe is not None:
            cfg["recipe"] = run.recipe
        cfg.update(run.training)
        if self.tuning.get("windows"):
            cfg["eval_windows"] = int(self.tuning["windows"])
        trials = self.trials(run)
        chosen = trials[int(trial[1:]) if trial else 0]
        cfg.update({k: v for k, v in chosen.items() if k in ("lr", "gamma_lr")})
        cfg["eval_every"] = curve_every_steps(
            every, step_tokens=step_tokens(cfg),
            eval_tokens=int(cfg.get("eval_windows") or _train_default("eval_windows"))
            * int(cfg.get("seq_len", _train_default("seq_len"))))
        return cfg

    def eval_params(self, run: Run, stage: str) -> dict[str, Any]:
        ev = self.evaluation
        scored = stage == "final" and run.scored_tasks
        return {"tasks": list(ev.get("tasks", [])) if scored else [],
                "limit": ev.get("limit"), "source": self.task_source,
                "ppl_seq_len": ev.get("ppl_seq_len", 512), "ppl_windows": ev.get("ppl_windows"),
                "backend": ev.get("backend", "fast"), "batch_size": ev.get("batch_size", 16),
                "dtype": run.dtype, "device": run.device, "autocast_dtype": ev.get("autocast"),
                "labels": run.labels(stage)}


def checkout_on_pythonpath(root: str | Path) -> None:
    """Put the checkout ``root`` first on ``PYTHONPATH`` for the jobs this process starts.

    Under ``snakemake --use-conda`` a job's environment (``workflow/envs/flexigpt.yaml``)
    holds only the dependencies: a ``-e .`` there would install ``.snakemake/conda/``, the
    folder conda runs pip in. In the venv route the editable install names the same code.
    """
    import os

    root = str(Path(root).resolve())
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    os.environ["PYTHONPATH"] = os.pathsep.join([root, *rest])


def script_logging(log_path: str | Path, threads: int | None = None) -> logging.Logger:
    """Route logging and stderr of a Snakemake script to its log file; set torch threads."""
    handler = logging.FileHandler(log_path, mode="w")
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.stderr = open(log_path, "a", buffering=1)  # noqa: SIM115 (tqdm and warnings)
    if threads:
        import torch

        torch.set_num_threads(int(threads))
    return logging.getLogger("flexigpt.dag")
