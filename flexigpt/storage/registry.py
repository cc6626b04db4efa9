"""The one registry of compression methods, built from the methods' own declarations.

Every method folder (``flexigpt/methods/<name>/``, ``baselines/<name>/``) declares its
methods in a light ``facts.py`` (:class:`~flexigpt.storage.method_facts.MethodFacts`);
:func:`discover_methods` collects them into :data:`METHODS` in table order, so a new method
is one new folder and no list here. Keys are exactly the ``{method}`` wildcard values of the
Snakemake DAG and the values of ``flexigpt compress --method``. Implementations are loaded
lazily (``"module:attr"``) so heavy baseline imports happen only when used.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flexigpt.storage.method_facts import ALL_FAMILIES, Depth, MethodFacts
from flexigpt.storage.recipe_facts import RecipeFacts
from flexigpt.storage.targets import load_target

__all__ = ["ALL_FAMILIES", "FACTS_MODULES", "METHODS", "ROLES", "CompressionResult", "Depth",
           "Method", "MethodFacts", "NotExportable", "RecoveryRecipe", "Roles",
           "UnknownMethodError", "discover_methods", "get_method", "is_paper_baseline",
           "load_target", "method_recipes", "methods_in_section", "methods_with", "tiny_options",
           "validate_ratio"]

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


#: the method folders' declaration modules (``<package>.*.<module>``: every subpackage's
#: ``facts``); :mod:`flexigpt.core.code_deps` expands the same patterns, so a rule's code
#: version covers every declaration and what it names
FACTS_MODULES = ("flexigpt.methods.*.facts", "baselines.*.facts")


def discover_methods(patterns: tuple[str, ...] = FACTS_MODULES) -> dict[str, MethodFacts]:
    """``{key: facts}`` of every method declared in a ``facts`` module matching
    ``patterns`` (``METHODS`` of each), sorted by ``MethodFacts.order`` (ValueError for a
    key declared twice)."""
    found: dict[str, MethodFacts] = {}
    for pattern in patterns:
        package, _, module = pattern.partition(".*.")
        root = importlib.import_module(package)
        for info in sorted(pkgutil.iter_modules(root.__path__), key=lambda m: m.name):
            name = f"{package}.{info.name}.{module}"
            if not info.ispkg or importlib.util.find_spec(name) is None:
                continue
            for key, facts in importlib.import_module(name).METHODS.items():
                if key in found:
                    raise ValueError(f"method {key!r} is declared twice ({name})")
                found[key] = facts
    return dict(sorted(found.items(), key=lambda item: item[1].order))


#: name → facts, in table order (rows of every table follow this order): the declarations
#: of the method folders (:func:`discover_methods`)
METHODS: dict[str, MethodFacts] = discover_methods()


def tiny_options(name: str, n_blocks: int) -> dict[str, Any]:
    """The options of method ``name`` for a tiny model of ``n_blocks`` decoder blocks
    (``MethodFacts.tiny_options`` with :class:`~flexigpt.storage.method_facts.Depth` values
    resolved)."""
    return {key: n_blocks + value.extra if isinstance(value, Depth) else value
            for key, value in METHODS[name].tiny_options}


@dataclass(frozen=True)
class Roles:
    """Which registry key plays each part of the paper's protocol, as the methods declare it
    (``MethodFacts.roles``, :func:`declared_roles`). The tables and the DAG's table sections
    read these roles, never a method key, so a new method needs no table code.

    Attributes:
        reference: the uncompressed model every ratio and accuracy is measured against.
        subject: the paper's method (FlexiGPT): the ablations vary it, its start stage and
            its manifests feed Table 4 and the figures, and every claim is about it.
        comparator: its like-for-like baseline (Table 1's matched pair, the paired
            comparisons, the budget ladder's trend): the same blocks removed, the same
            trainable count and tokens, nothing put in their place.
        skip: the one-shot block-removal baseline whose compressed model the subject's start
            stage is compared with (claim (e): FlexiGPT's start PPL against ShortGPT's).
        extension: the extension (Table 5: the model grown by weight-shared repeats).
    """

    reference: str
    subject: str
    comparator: str
    skip: str
    extension: str


def declared_roles(methods: dict[str, MethodFacts]) -> Roles:
    """The :class:`Roles` the ``methods`` declare (``MethodFacts.roles``).

    Raises:
        ValueError: a role no method or several methods declare, or an unknown role (named).
    """
    roles = [f.name for f in dataclasses.fields(Roles)]
    claimed: dict[str, list[str]] = {role: [] for role in roles}
    for key, facts in methods.items():
        for role in facts.roles:
            if role not in claimed:
                raise ValueError(f"method {key!r} declares an unknown role {role!r} "
                                 f"(known: {roles})")
            claimed[role].append(key)
    bad = {role: keys for role, keys in claimed.items() if len(keys) != 1}
    if bad:
        raise ValueError(f"each role needs exactly one method declaring it: {bad}")
    return Roles(**{role: keys[0] for role, keys in claimed.items()})


#: the protocol's roles (see :class:`Roles`), from the methods' declarations
ROLES = declared_roles(METHODS)


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
    return load_target(target)


def validate_ratio(ratio: float, what: str = "ratio") -> float:
    """Check ``0 < ratio < 1`` with an error that names the value."""
    if not isinstance(ratio, (int, float)) or not 0.0 < float(ratio) < 1.0:
        raise ValueError(f"{what} must be strictly between 0 and 1, got {ratio!r}")
    return float(ratio)
