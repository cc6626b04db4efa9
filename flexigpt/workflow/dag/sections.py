"""Builders of the run grid, one per config section, over one :class:`GridBuild`.

:meth:`flexigpt.workflow.dag.RunGrid.from_config` starts a build (:func:`start_build`: the model,
its data and what every run shares) and calls the builders in this order, which is the
order of the grid's runs (and so of its checks and targets):

1. :func:`add_table1` — ``methods`` × ``ratios`` (Table 1) and the dense model;
2. :func:`add_replicates` — ``replicates`` (seed replicates of Table 1 runs);
3. :func:`add_budget` — ``budget`` (Table 1 runs recovered again at a ladder of budgets);
4. :func:`add_paper_protocol` — ``paper_protocol`` (k = int(ratio·L) removed blocks);
5. :func:`add_kd` — ``kd`` (recovery with knowledge distillation);
6. :func:`add_ablations` — ``ablations`` (FlexiGPT option ablations at one ratio);
7. :func:`add_extension` — ``extension`` (the FlexiGPT extension and its controls);
8. :func:`add_sensitivity` — ``tuning.sensitivity`` (Table 1 runs again at their next-best
   learning rates).

Every builder reads a schema-complete config (:func:`flexigpt.workflow.dag.defaults.with_schema_defaults`):
no builder states a default of its own. A builder raises ValueError for a setting that names
something the grid does not have.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from flexigpt.core.devices import check_device
from flexigpt.core.lr_search import NEXT_SUFFIX
from flexigpt.methods.compression_basis import check_basis
from flexigpt.storage.registry import ROLES
from flexigpt.workflow.config_paths import check_model_resource
from flexigpt.workflow.dag.derived import budget_runs, replicate_runs, table1_ratios
from flexigpt.workflow.dag.runs import Key, Run

#: a method or variant block of ``methods`` (options, recovery, links, training overrides)
Block = dict[str, Any]


def _ref(spec: str, model: str, variant: str, setting: str) -> Key:
    """``"method"`` or ``"method/variant"`` → a run key at ``setting``."""
    method, _, named = spec.partition("/")
    return (model, method, named or variant, setting)


def _merge(base: Block, over: Block) -> Block:
    """A variant block: the method block's settings, overridden key by key."""
    out = {key: over.get(key, base.get(key)) for key in ("recovery", "match", "budget")}
    out["lr_from"] = over.get("lr_from")  # a variant may reuse another run's chosen LRs
    out["options"] = {**(base.get("options") or {}), **(over.get("options") or {})}
    out["training"] = {**(base.get("training") or {}), **(over.get("training") or {})}
    return out


@dataclass
class GridBuild:
    """A grid under construction.

    ``key`` is the model key (``model.key``); ``common`` the settings every run shares
    (``calibration``, ``seed``, ``dtype``, ``device``: :class:`Run` fields); ``runs`` the
    runs so far, in build order; ``blocks`` the Table 1 method blocks by (method, variant);
    ``paths`` and ``resources`` every model key's checkpoint path and resource builder.
    """

    key: str
    common: dict[str, Any]
    paths: dict[str, str]
    resources: dict[str, str | None]
    runs: dict[Key, Run] = field(default_factory=dict)
    blocks: dict[tuple[str, str], Block] = field(default_factory=dict)

    def add(self, run: Run) -> None:
        self.runs[run.key] = run

    def method_run(self, name: str, variant: str, block: Block, setting: str, table: str,
                   protocol: str, ref_variant: str, **overrides: Key | None) -> Run:
        """The run of method ``name``'s ``block`` at ``setting``: its ``match``, ``budget``
        and ``lr_from`` name runs at ``setting`` (a bare method name: at ``ref_variant``);
        ``overrides`` replaces them or adds ``compressed_from``."""

        def ref(what: str) -> Key | None:
            return _ref(block[what], self.key, ref_variant, setting) if block.get(what) else None

        links: dict[str, Any] = {"match": ref("match"), "budget": ref("budget"),
                                 "lr_from": ref("lr_from"), **overrides}
        training = dict(block.get("training") or {})
        return Run(self.key, name, variant, setting, options=dict(block["options"]),
                   recovery=bool(block.get("recovery")), recipe=training.pop("recipe", None),
                   training=training, table=table, protocol=protocol, **links, **self.common)


def start_build(config: dict[str, Any]) -> GridBuild:
    """An empty build of the config's model: what every run shares, the model's path and
    resource builder.

    Raises:
        ValueError: a bad ``device``, a resource model whose path is not where its builder
            writes, or local tasks without ``data.tasks``.
    """
    model, data = config["model"], config["data"]
    seed = int(config["seed"])
    dtype = model["dtype"]
    device = check_device(config["device"])
    calibration = {"n_calibration": config["calibration"]["n_windows"],
                   "seq_len": config["calibration"]["seq_len"]}
    check_model_resource(model)
    if data["task_source"] == "local" and not data.get("tasks"):
        raise ValueError("data.tasks is required when data.task_source is 'local'")
    key = model["key"]
    basis = check_basis(config.get("compression_basis", "total"))
    return GridBuild(key, common={"calibration": calibration, "seed": seed, "dtype": dtype,
                                  "device": device, "basis": basis},
                     paths={key: model["path"]}, resources={key: model["resource"]})


def add_table1(build: GridBuild, methods: dict[str, Any], ratios: list[float]) -> None:
    """The dense model, then every method block and variant at every ratio (table
    ``main``). A variant that only changes the recovery trains the default variant's
    compressed model (``compressed_from``) instead of compressing again."""
    for name, block in methods.items():
        block = block or {}
        if name == ROLES.reference:
            build.add(Run(build.key, ROLES.reference, "default", "full", table="dense",
                          **build.common))
            continue
        build.blocks[(name, "default")] = _merge({}, block)
        for variant, over in (block.get("variants") or {}).items():
            build.blocks[(name, variant)] = _merge(block, over or {})
    for (name, variant), block in build.blocks.items():
        base = build.blocks[(name, "default")]
        same = variant != "default" and all(block.get(k) == base.get(k)
                                            for k in ("options", "match"))
        for ratio in ratios:
            setting = f"r{ratio:g}"
            build.add(build.method_run(
                name, variant, block, setting, "main", "matched", "default",
                compressed_from=(build.key, name, "default", setting) if same else None))


def add_replicates(build: GridBuild, spec: dict[str, Any]) -> None:
    """Seed replicates of Table 1 runs (:func:`~flexigpt.workflow.dag.derived.replicate_runs`)."""
    for run in replicate_runs(build.runs, spec):
        build.add(run)


def add_budget(build: GridBuild, spec: dict[str, Any], ratios: list[float],
               training: dict[str, Any]) -> None:
    """The budget ladder (:func:`~flexigpt.workflow.dag.derived.budget_runs`); a point that would
    replace a run already in the grid is a ValueError."""
    for run in budget_runs(build.runs, spec, ratios, training):
        if run.key in build.runs:
            raise ValueError(f"budget: run {run.name} is already in the grid (rename the "
                             f"variant {run.budget_variant!r})")
        build.add(run)


def add_paper_protocol(build: GridBuild, protocol: dict[str, Any], ratios: list[float]) -> None:
    """Each named method's default block with ``policy: paper`` (variant ``paper``, no
    match); a recovered one reuses its Table 1 run's learning rates at the same ratio."""
    for name in protocol.get("methods", []):
        if (name, "default") not in build.blocks:
            raise ValueError(f"paper_protocol names {name!r}, which is not in methods")
        block = dict(build.blocks[(name, "default")])
        block["options"] = {**block["options"], "policy": "paper"}
        block["match"] = None  # same int(ratio·L) blocks: nothing to match
        block["lr_from"] = None
        for ratio in table1_ratios("paper_protocol.ratios", protocol, ratios,
                                   needed=bool(block.get("recovery"))):  # Table 1's LRs
            setting = f"r{ratio:g}"
            ref = (build.key, name, "default", setting)
            build.add(build.method_run(name, "paper", block, setting, "paper_protocol", "paper",
                                       "paper", lr_from=ref if block.get("recovery") else None))


def add_kd(build: GridBuild, kd: dict[str, Any], ratios: list[float]) -> None:
    """Each named method/variant recovered with the KD loss at ``kd.temperature`` (variant
    ``kd`` / ``<variant>_kd``), training its Table 1 run's compressed model with that run's
    learning rates."""
    for spec in kd.get("runs", []):
        name, _, variant = spec.partition("/")
        variant = variant or "default"
        if (name, variant) not in build.blocks:
            raise ValueError(f"kd.runs names {spec!r}, which is not a method/variant")
        block = dict(build.blocks[(name, variant)], lr_from=None)
        block["recovery"] = True
        block["training"] = {**block["training"], "loss": "kd",
                             "kd_temperature": kd["temperature"]}
        kd_variant = "kd" if variant == "default" else f"{variant}_kd"
        for ratio in table1_ratios("kd.ratios", kd, ratios):
            setting = f"r{ratio:g}"
            ref = (build.key, name, variant, setting)
            build.add(build.method_run(
                name, kd_variant, block, setting, "kd", "matched", "default", lr_from=ref,
                compressed_from=build.runs[ref].compressed_from or ref))


def add_ablations(build: GridBuild, ablations: dict[str, Any], ratios: list[float]) -> None:
    """Each ablation variant: FlexiGPT's default block with its option overrides at
    ``ablations.ratio``, reusing the Table 1 FlexiGPT run's learning rates there."""
    if not ablations.get("variants"):
        return
    if (ROLES.subject, "default") not in build.blocks:
        raise ValueError(f"ablations need methods.{ROLES.subject}")
    base = build.blocks[(ROLES.subject, "default")]
    table1_ratios("ablations.ratio", {"ratios": [ablations["ratio"]]}, ratios)
    setting = f"r{ablations['ratio']:g}"
    ref = (build.key, ROLES.subject, "default", setting)
    for variant, overrides in ablations["variants"].items():
        block = {**base, "options": {**base["options"], **overrides}, "lr_from": None}
        build.add(build.method_run(ROLES.subject, variant, block, setting, "ablation",
                                   "matched", "default",
                                   lr_from=ref if ref in build.runs else None))


def add_extension(build: GridBuild, ext: dict[str, Any], model_path: str) -> None:
    """The extension of ``extension.model_path`` (default: the model) to ``layers`` blocks,
    one run per pattern, with the base model (table ``dense``) and its controls: full
    training on the same tokens (``control``) and LoRA sized to the first pattern's
    trainable count (``lora_control``)."""
    if not ext.get("patterns"):
        return
    ext_key = ext.get("model_key", build.key)
    build.paths.setdefault(ext_key, ext.get("model_path", model_path))
    build.resources.setdefault(ext_key, None)
    tokens, common = ext.get("tokens"), build.common
    setting = f"L{ext['layers']}"
    for pattern in ext["patterns"]:
        options = {"layers": ext["layers"], "pattern": pattern}
        if ext["span"]:
            options["span"] = list(ext["span"])
        build.add(Run(ext_key, ROLES.extension, pattern, setting, options=options,
                      recovery=True, tokens=tokens, table="extension", **common))
    build.add(Run(ext_key, ROLES.reference, "default", "full", table="dense", **common))
    if ext["control"]:
        build.add(Run(ext_key, ROLES.reference, "trained", "full", recovery=True, recipe="full",
                      tokens=tokens, table="extension", **common))
    if ext["lora_control"]:
        build.add(Run(ext_key, ROLES.reference, "trained_lora", "full", recovery=True, recipe="lora",
                      tokens=tokens, table="extension",
                      budget=(ext_key, ROLES.extension, ext["patterns"][0], setting),
                      **common))


def add_sensitivity(build: GridBuild, names: list[str]) -> None:
    """Each named Table 1 run (method or method/variant, every ratio) trained again at its
    sweep's next-best learning rates (variant ``<variant>_next``, table ``sensitivity``):
    the same compressed model, budget and recipe, the learning rates of the best-scoring
    neighbour of its choice (:func:`flexigpt.runtime.training.choices.chosen_rates`). The
    verdicts ask whether a claim holds with either side at its next-best rates."""
    for spec in names:
        name, _, variant = spec.partition("/")
        variant = variant or "default"
        found = [run for run in list(build.runs.values())
                 if run.table == "main" and run.method == name and run.variant == variant
                 and run.recovery and run.lr_from is None]
        if not found:
            raise ValueError(f"tuning.sensitivity names {spec!r}, which is no recovered Table 1 "
                             "run that chooses its own learning rates")
        for run in found:
            build.add(replace(run, variant=f"{variant}{NEXT_SUFFIX}", table="sensitivity",
                              lr_from=run.key, lr_next=True, match=None,
                              compressed_from=run.compressed_from or run.key))
