"""The one registry of compression methods.

Keys are exactly the ``{method}`` wildcard values of the Snakemake DAG and the values of
``flexigpt compress --method``. Entries are loaded lazily (``"module:attr"``) so heavy
baseline imports happen only when used.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flexigpt.storage.recipe_facts import RecipeFacts

if TYPE_CHECKING:  # the registry imports nothing heavy (tables read its facts)
    from torch import nn


@dataclass
class CompressionResult:
    """What a method's ``compress`` returns.

    Attributes:
        model: the compressed model (in memory, ready for forward).
        structure: JSON-serialisable description that ``Method.rebuild`` needs to rebuild an
            empty skeleton whose ``state_dict`` matches ``model``'s (pruned blocks, sharing
            map, per-layer widths, ...).
        info: JSON-serialisable record for the manifest only (scores, distances, timings).
    """

    model: nn.Module
    structure: dict[str, Any]
    info: dict[str, Any] = field(default_factory=dict)


#: names an older manifest's ``info.recovery`` used → the field they mean (read, never written)
_LEGACY_RECOVERY_KEYS = {"rank": "lora_rank", "alpha": "lora_alpha", "dropout": "lora_dropout",
                         "targets": "lora_targets"}


@dataclass(frozen=True)
class RecoveryRecipe:
    """What a compression method hands the shared trainer: ``info["recovery"]`` of its
    manifest (:meth:`to_dict`), read back by ``flexigpt.runtime.training.config.resolve_plan``
    (:meth:`from_info`). Fields left None take the trainer's defaults.

    Attributes:
        recipe: trainable-set recipe (``none``, ``flexigpt``, ``lora``, ``full``); None:
            the method's registered default (``Method.recovery``).
        lr, gamma_lr: learning rates of the method's own recipe.
        lora_rank, lora_alpha, lora_dropout, lora_targets: the recipe's LoRA (targets are
            short linear names, the adapter's).
        trainable_params: the trainable count this recipe trains (the budget like-for-like
            baselines are matched to).
        facts: method-specific records for the manifest (how a rank was matched, ...); the
            trainer never reads them.
    """

    recipe: str | None
    lr: float | None = None
    gamma_lr: float | None = None
    lora_rank: int | None = None
    lora_alpha: float | None = None
    lora_dropout: float | None = None
    lora_targets: tuple[str, ...] | None = None
    trainable_params: int | None = None
    facts: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The manifest form: set fields (targets as a list), then ``facts`` flattened."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != "facts" and getattr(self, f.name) is not None}
        if "lora_targets" in out:
            out["lora_targets"] = list(out["lora_targets"])
        clash = sorted(set(out) & set(self.facts))
        if clash:
            raise ValueError(f"recovery facts {clash} shadow recipe fields")
        return {**out, **self.facts}

    @classmethod
    def from_info(cls, info: dict[str, Any] | None) -> RecoveryRecipe | None:
        """The recipe in a manifest's ``info`` (None when it records none). Manifests of
        earlier versions named the LoRA fields ``rank``/``alpha``/``dropout``/``targets``;
        those names are understood here, and only here."""
        raw = dict((info or {}).get("recovery") or {})
        if not raw:
            return None
        for old, new in _LEGACY_RECOVERY_KEYS.items():
            if old in raw and new not in raw:
                raw[new] = raw.pop(old)
        names = {f.name for f in dataclasses.fields(cls)} - {"facts"}
        raw.setdefault("recipe", None)
        known = {k: v for k, v in raw.items() if k in names}
        if known.get("lora_targets") is not None:
            known["lora_targets"] = tuple(known["lora_targets"])
        return cls(**known, facts={k: v for k, v in raw.items() if k not in names})


@dataclass(frozen=True)
class Method:
    """A compression method behind the uniform interface.

    Attributes:
        name: registry key.
        config_cls: dataclass of the method's options; ``__post_init__`` validates.
        compress: ``(model, tokenizer, calibration, cfg) -> CompressionResult``;
            ``calibration`` is a LongTensor ``[N, T]`` of token windows, or None when
            ``needs_calibration`` is False. Must not mutate anything it does not return.
        rebuild: ``(hf_config, structure) -> nn.Module`` an initialised skeleton with the
            compressed architecture; weights are loaded into it afterwards.
        recovery: default trainable-set recipe name for ``flexigpt train`` (see train.py).
        description: one line for model cards and ``--help``.

    Optional hooks (None: the method needs none) — everything method-specific the rest of
    the harness asks, so that no module outside the method's folder branches on its key:
        check_model: ``(model, cfg) -> None``; raise ``ValueError`` when ``cfg`` cannot
            work on the loaded (or skeleton) ``model`` (``flexigpt.api.compression.compress`` and the
            DAG's config check call it before any work).
        check_sizes: ``(model, cfg) -> (option, problem) | None``: a size option that is
            useless on ``model`` (the DAG's config check names the option).
        draft_skip: ``(structure) -> [block positions]``: the blocks a self-speculative
            draft of a saved model skips (``flexigpt generate --speculative``).
        plain: ``(loaded, unshare) -> (stock model, how)`` for a saved model that is not
            already a stock checkpoint; raise :class:`NotExportable` (why) where no stock
            model computes the same function (``flexigpt export``).
        card_lines: ``(manifest) -> [Markdown lines]`` describing the saved structure in
            its model card.
        check_structure: ``(structure, config) -> None``; raise ``ValueError`` naming the
            field when a saved manifest's ``structure`` is malformed or does not fit the
            saved ``config.json`` (:mod:`flexigpt.storage.structure`; checked on every load).
        ratio_curve: ``(model, cfg) -> (n_blocks, achieved(k))`` for a method whose ratio
            becomes a block count by its own arithmetic (``MethodFacts.block_count`` covers
            plain removal and FlexiGPT's replacement): the ratio rule of
            :func:`flexigpt.methods.block_count.method_plan` then refuses its unreachable targets
            before any work, as for every block-count method.
    """

    name: str
    config_cls: type
    compress: Callable[..., CompressionResult]
    rebuild: Callable[..., nn.Module]
    recovery: str = "none"
    description: str = ""
    check_model: Callable[[Any, Any], None] | None = None
    check_sizes: Callable[[Any, Any], tuple[str, str] | None] | None = None
    draft_skip: Callable[[dict[str, Any]], list[int]] | None = None
    plain: Callable[[Any, bool], tuple[Any, str]] | None = None
    card_lines: Callable[[Any], list[str]] | None = None
    ratio_curve: Callable[[Any, Any], tuple[int, Callable[[int], float]]] | None = None
    check_structure: Callable[[dict[str, Any], Any], None] | None = None

    @property
    def needs_calibration(self) -> bool:
        """Whether ``compress`` reads calibration windows (``facts.calibration``)."""
        return self.facts.calibration

    @property
    def facts(self) -> MethodFacts:
        """What the rest of the harness knows about this method (:data:`METHODS`)."""
        return METHODS[self.name]

    def check_family(self, model_or_config: Any) -> None:
        """Raise ``UnsupportedArchitectureError`` (naming the method and the family) unless
        the model's family is one of ``facts.families``."""
        from flexigpt.storage.models.adapters import require_family

        require_family(model_or_config, self.name, self.facts.families,
                       dict(self.facts.family_refusals))

    def accepts(self, option: str) -> bool:
        """Whether the method's config has a field named ``option``."""
        return option in {f.name for f in dataclasses.fields(self.config_cls)}

    def make_config(self, **options: Any) -> Any:
        """Build (and so validate) the method's config; unknown options are an error."""
        known = {f.name for f in dataclasses.fields(self.config_cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"method {self.name!r} has no option(s) {unknown}; "
                             f"known options: {sorted(known)}")
        return self.config_cls(**options)


class NotExportable(ValueError):
    """A saved model with no exact stock (plain transformers) form; the message says why."""


@dataclass(frozen=True)
class MethodFacts:
    """Everything the DAG, the tables and the decoders know about a method, in one place
    (importing nothing heavy: the implementation loads lazily from ``target``).

    Attributes:
        target: ``"module:attribute"`` of its :class:`Method`.
        label: display name in tables and figures.
        calibration: ``compress`` reads calibration windows (the DAG feeds it the
            calibration text; ``flexigpt compress`` requires ``--calibration``).
        families: model families (``ArchAdapter.family``) it handles; any other is refused
            (:meth:`Method.check_family`) with an error naming both.
        embedding_surgery: its compression removes embedding parameters (SliceGPT slices
            them), so its ratio is defined on the total basis only
            (:mod:`flexigpt.methods.compression_basis`).
        family_refusals: ``(family, reason)`` pairs: why it refuses a family the adapters
            know (added to the refusal; docs/families.md).
        block_influence: it ranks blocks by Block Influence (the DAG computes the scores
            once per model and passes them to every such method).
        speculative: its models have a self-speculative draft (the model without its
            weight-shared blocks; :mod:`flexigpt.runtime.generation.draft`).
        timed: Tables 6/7 time it against the dense model (at its lowest ratio).
        block_count: its ``ratio`` becomes a number of removed blocks by the ``policy`` option
            (:mod:`flexigpt.methods.block_count`): ``"remove"`` deletes whole blocks (ShortGPT),
            ``"replace"`` replaces them by weight-shared copies with adapters (FlexiGPT);
            None for any other method. The DAG-build check and ``flexigpt.api.compression.compress``
            refuse a ratio no block count reaches (:func:`flexigpt.methods.block_count.method_plan`).
        start_stage: a recovered run of it is also evaluated right after compression (stage
            ``start``: its compressed model is no other row's, e.g. FlexiGPT's replacement
            blocks; Table 4's Start PPL).
        manifest_figures: its compressed manifests feed the Block Influence and base-distance
            figures.
        variant_labels: ``(variant, display name)`` of its named DAG variants (e.g.
            ``("rft", "SliceGPT + RFT")``); other variants read "<label> [<variant>]".
        structure_defaults: ``(key, value)`` pairs a saved structure gained in a later
            version, with the value older saved models mean (filled in on reading a
            manifest: :func:`flexigpt.storage.manifest.migrate_structure`).
        replacement: what it puts where removed blocks were, for the replacement-strategies
            table (e.g. ``"nothing (skip)"``, ``"linear map"``); None: not a block-removal
            method (it has no row there).
        paper_variants: its DAG variants that are baselines of the paper's Table 1 (claim
            (c), "FlexiGPT* best vs the recovered baselines", compares against these only;
            later baselines such as ReplaceMe are compared in their own tables).
        recipes: recovery recipes it brings to the shared trainer beside the trainer's own
            (:class:`~flexigpt.storage.recipe_facts.RecipeFacts`, implemented in its folder).
        section: the config section that runs it in the DAG: ``methods`` (a key of the
            config's ``methods:``; the schema's list of them is this registry's) or
            ``extension`` (the FlexiGPT extension, configured under ``extension:``).
        tiny_options: ``(option, value)`` pairs under which it changes a tiny random model
            of 6-8 blocks (hidden 64-128): the options every contract test compresses it
            with (:func:`tiny_options`; a :class:`Depth` value is relative to the model).
    """

    target: str
    label: str
    calibration: bool = True
    families: tuple[str, ...] = ("llama", "opt")
    family_refusals: tuple[tuple[str, str], ...] = ()
    embedding_surgery: bool = False
    block_influence: bool = False
    speculative: bool = False
    timed: bool = False
    block_count: str | None = None
    start_stage: bool = False
    manifest_figures: bool = False
    variant_labels: tuple[tuple[str, str], ...] = ()
    structure_defaults: tuple[tuple[str, Any], ...] = ()
    replacement: str | None = None
    paper_variants: tuple[str, ...] = ()
    recipes: tuple[RecipeFacts, ...] = ()
    section: str = "methods"
    tiny_options: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Depth:
    """An option value of ``MethodFacts.tiny_options``: the tiny model's block count +
    ``extra`` (e.g. the extension's target depth)."""

    extra: int


def tiny_options(name: str, n_blocks: int) -> dict[str, Any]:
    """The options of method ``name`` for a tiny model of ``n_blocks`` decoder blocks
    (``MethodFacts.tiny_options`` with :class:`Depth` values resolved)."""
    return {key: n_blocks + value.extra if isinstance(value, Depth) else value
            for key, value in METHODS[name].tiny_options}


#: the ratio every tiny contract test compresses at (a block or more of a 6-block model)
_TINY = (("ratio", 0.3),)

#: FlexiGPT's recipe: the replacement/repeat blocks' adapters, γ at its own learning rate
FLEXIGPT_RECIPE = RecipeFacts("flexigpt", 4e-3, "flexigpt.methods.flexigpt.recipe:RECIPE",
                              grid_keys=("lr", "gamma_lr"), own_lrs=("gamma_lr",), lora=True,
                              other_blocks=True)

#: every family the adapters know (``flexigpt.storage.models.adapters.ADAPTERS``; a test keeps them equal)
ALL_FAMILIES = ("llama", "opt", "gemma3")
#: why methods refuse Gemma 3 (docs/families.md)
SANDWICH_NORMS_BREAK_INVARIANCE = (
    "its post-norms on every sub-layer's output break the computational invariance SliceGPT's "
    "rotation needs (the official code does not support it either)")
MAP_PAST_POST_NORM = (
    "the linear map cannot be folded into down_proj past the MLP's post-norm, and the harness "
    "has no non-stock ReplaceMe checkpoint to hold it")

#: name → facts, in table order (rows of every table follow this order).
METHODS: dict[str, MethodFacts] = {
    "dense": MethodFacts("flexigpt.methods.dense:METHOD", "Dense", calibration=False,
                         timed=True, families=ALL_FAMILIES),
    "slicegpt": MethodFacts("baselines.slicegpt.method:METHOD", "SliceGPT",
                            tiny_options=(*_TINY, ("round_to", 2), ("tolerance", 0.05)),
                            variant_labels=(("rft", "SliceGPT + RFT"),),
                            paper_variants=("default", "rft"),
                            structure_defaults=(("head_bias", False),),
                            family_refusals=(("gemma3", SANDWICH_NORMS_BREAK_INVARIANCE),),
                            embedding_surgery=True),
    "llm_pruner": MethodFacts("baselines.llm_pruner.method:METHOD", "LLM-Pruner",
                              tiny_options=_TINY,
                              variant_labels=(("lora", "LLM-Pruner + LoRA"),),
                              paper_variants=("default", "lora"), families=ALL_FAMILIES),
    "shortgpt": MethodFacts("baselines.shortgpt.method:METHOD", "ShortGPT", tiny_options=_TINY,
                            block_influence=True, timed=True, block_count="remove",
                            variant_labels=(("last3", "ShortGPT + FT last 3 blocks & head"),),
                            replacement="nothing (skip)", paper_variants=("default",),
                            families=ALL_FAMILIES),
    "shortgpt_lora": MethodFacts("baselines.shortgpt.method:METHOD_LORA", "ShortGPT + LoRA",
                                 tiny_options=_TINY,
                                 block_influence=True, block_count="remove",
                                 replacement="nothing (skip)", paper_variants=("default",),
                                 families=ALL_FAMILIES),
    "replaceme": MethodFacts("baselines.replaceme.method:METHOD", "ReplaceMe", tiny_options=_TINY,
                             block_count="remove", timed=True,
                             variant_labels=(("lora", "ReplaceMe + LoRA"),),
                             replacement="linear map (folded)",
                             family_refusals=(("gemma3", MAP_PAST_POST_NORM),)),
    "streamline": MethodFacts("baselines.streamline.method:METHOD", "LLM-Streamline",
                              tiny_options=(*_TINY, ("epochs", 1)),
                              timed=True, variant_labels=(("lora", "LLM-Streamline + LoRA"),),
                              replacement="one trained module", families=ALL_FAMILIES),
    "flexigpt": MethodFacts("flexigpt.methods.flexigpt.prune:METHOD", "FlexiGPT",
                            tiny_options=(*_TINY, ("rank", 4)),
                            block_influence=True, speculative=True, timed=True,
                            block_count="replace", start_stage=True, manifest_figures=True,
                            variant_labels=(("lora_all", "FlexiGPT + LoRA on unpruned blocks"),),
                            replacement="weight-shared block + LoRA", families=ALL_FAMILIES,
                            recipes=(FLEXIGPT_RECIPE,)),
    "flexigpt_extend": MethodFacts("flexigpt.methods.flexigpt.extend:METHOD", "FlexiGPT extension",
                                   tiny_options=(("layers", Depth(2)), ("rank", 4),
                                                 ("gamma_init", 0.5)),
                                   calibration=False, speculative=True, timed=True,
                                   families=ALL_FAMILIES, section="extension"),
}


@dataclass(frozen=True)
class Roles:
    """Which registry key plays each part of the paper's protocol. The tables and the DAG's
    table sections read these roles, never a method key, so a new method needs no table code.

    Attributes:
        reference: the uncompressed model every ratio and accuracy is measured against.
        subject: the paper's method (FlexiGPT): the ablations vary it, its start stage and
            its manifests feed Table 4 and the figures, and every claim is about it.
        comparator: its like-for-like baseline (Table 1's matched pair, the paired
            comparisons, the budget ladder's trend): the same blocks removed, the same
            trainable count and tokens, nothing put in their place.
        extension: the extension (Table 5: the model grown by weight-shared repeats).
    """

    reference: str = "dense"
    subject: str = "flexigpt"
    comparator: str = "shortgpt_lora"
    extension: str = "flexigpt_extend"

    def __post_init__(self) -> None:
        missing = [k for k in dataclasses.astuple(self) if k not in METHODS]
        if missing:
            raise ValueError(f"roles name unknown methods {missing}")


#: the protocol's roles (see :class:`Roles`)
ROLES = Roles()


def is_paper_baseline(method: str, variant: str) -> bool:
    """Whether ``method``'s ``variant`` is a baseline of the paper's Table 1
    (:attr:`MethodFacts.paper_variants`)."""
    facts = METHODS.get(method)
    return facts is not None and variant in facts.paper_variants


def methods_in_section(section: str) -> tuple[str, ...]:
    """The methods a config section runs (``MethodFacts.section``), in table order."""
    return tuple(name for name, facts in METHODS.items() if facts.section == section)


def method_recipes() -> tuple[RecipeFacts, ...]:
    """The recovery recipes the registered methods bring, in table order (each once)."""
    found: dict[str, RecipeFacts] = {}
    for facts in METHODS.values():
        for recipe in facts.recipes:
            found.setdefault(recipe.name, recipe)
    return tuple(found.values())


def methods_with(fact: str) -> tuple[str, ...]:
    """Names of the methods whose boolean fact ``fact`` is true, in table order."""
    return tuple(name for name, f in METHODS.items() if getattr(f, fact))


class UnknownMethodError(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0])


def get_method(name: str) -> Method:
    """Resolve a registry key to its :class:`Method`.

    Raises:
        UnknownMethodError: with a "did you mean" suggestion.
    """
    try:
        target = METHODS[name].target
    except KeyError:
        close = difflib.get_close_matches(name, METHODS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UnknownMethodError(
            f"unknown method {name!r}{hint} Known methods: {sorted(METHODS)}") from None
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def validate_ratio(ratio: float, what: str = "ratio") -> float:
    """Check ``0 < ratio < 1`` with an error that names the value."""
    if not isinstance(ratio, (int, float)) or not 0.0 < float(ratio) < 1.0:
        raise ValueError(f"{what} must be strictly between 0 and 1, got {ratio!r}")
    return float(ratio)
