"""What a method declares about itself (:class:`MethodFacts`), in its own folder.

Every method folder (``flexigpt/methods/<name>/``, ``baselines/<name>/``) holds a light
``facts.py`` (importing nothing heavy) with ``METHODS = {key: MethodFacts(...)}``: the
registry (:mod:`flexigpt.storage.registry`) discovers those modules and builds its table
from them, so a new method is one new folder. The implementation loads lazily from
``MethodFacts.target``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from flexigpt.storage.recipe_facts import RecipeFacts

#: every family the adapters know (``flexigpt.storage.models.adapters.ADAPTERS``; a test keeps them equal)
ALL_FAMILIES = ("llama", "opt", "gemma3")
#: the ratio every tiny contract test compresses at (a block or more of a 6-block model)
TINY_RATIO = (("ratio", 0.3),)


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
            with (``registry.tiny_options``; a :class:`Depth` value is relative to the model).
        replay: the module (in its folder) of its fragment of the standalone remote-code
            loader, for a method whose checkpoints are not stock architectures
            (:mod:`flexigpt.export.standalone` assembles the fragments into the one file a
            published checkpoint carries); None: its checkpoints are stock, or have no
            standalone form.
        official_check: ``"module:function"`` (in its folder) comparing its own choice rule
            with its authors' code, for ``benchmarks.check_official``: called as
            ``(checkout, model, windows, span, batch_size) -> row`` with a checkout of
            ``official_code`` (a ``same_span`` field in the row); None: nothing to compare.
        official_code: the repository of its authors' code (``owner/name`` on GitHub).
        calibration_flop: FLOP its whole compression spends per calibration token and dense
            parameter (a forward pass 2, forward + backward 6), for the resource plan of
            ``benchmarks.bench_scaling`` (which times it at every model size); None: not
            planned there (Block Influence methods are planned by that stage).
        roles: the parts of the paper's protocol it plays (``"reference"``, ``"subject"``,
            ``"comparator"``, ``"skip"``, ``"extension"``: :class:`flexigpt.storage.registry.Roles`);
            each role is declared by exactly one method.
        order: its place in every table (rows follow ascending ``order``; the registry is
            sorted by it).
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
    replay: str | None = None
    official_check: str | None = None
    official_code: str | None = None
    calibration_flop: int | None = None
    roles: tuple[str, ...] = ()
    order: int = 1000

    @property
    def class_prefix(self) -> str:
        """The prefix of this method's checkpoint class names: the label's words joined,
        each capitalised (``"LLM-Pruner"``: ``LLMPruner``; ``"FlexiGPT extension"``:
        ``FlexiGPTExtension``); a replay fragment registers the same."""
        return "".join(w[:1].upper() + w[1:] for w in re.split(r"[^0-9A-Za-z]+", self.label))


@dataclass(frozen=True)
class Depth:
    """An option value of ``MethodFacts.tiny_options``: the tiny model's block count +
    ``extra`` (e.g. the extension's target depth)."""

    extra: int
