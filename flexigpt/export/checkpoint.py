"""Self-contained checkpoints: what publishing adds so plain ``transformers`` loads a dir.

:func:`make_self_contained` runs inside ``save_compressed``'s staging directory when a
model is published (:func:`flexigpt.export.publish.publish_compressed`), before the files
are hashed into the manifest.

A saved model is *plain* when a stock ``AutoModelForCausalLM.from_config(config)`` has exactly
its parameter names, shapes and sharing and every module is a torch/transformers class (dense,
ShortGPT, merged ShortGPT + LoRA). Its ``config.json`` stays the family's own.

Any other model gets, in ``config.json``, ``model_type = "flexigpt_compressed"`` (a type plain
transformers does not know, so ``AutoModelForCausalLM.from_pretrained(dir)`` refuses instead
of half-loading), ``architectures`` naming the remote class, ``auto_map`` pointing at
``modeling_flexigpt_compressed.py`` (copied into the dir) and ``flexigpt_compression``:
``{"format", "method", "structure", "base_model_type", "base_architectures", "not_plain"}``.
Before writing ``auto_map`` the standalone replay is built on the meta device and its
parameter names/shapes/sharing are compared with the model's; a method the standalone file
cannot replay (or a mismatch) keeps the custom type but gets no ``auto_map``
(``remote_code: false`` with the reason), so only ``flexigpt.load_compressed`` loads it.

The facts of that format the loaders read (``KEY``, ``MODEL_TYPE``, ``base_config_dict``,
``compression_spec`` ...) live in :mod:`flexigpt.storage.models.checkpoint_format`, ``family_config`` in
:mod:`flexigpt.storage.models.loading`; they are still importable from here.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from flexigpt.export.standalone import write_standalone
from flexigpt.storage.models.checkpoint_format import (
    ADDED_KEYS,
    FORMAT,
    KEY,
    MODEL_TYPE,
    MODELING_FILE,
    base_config_dict,
    compression_spec,
)
from flexigpt.storage.models.loading import family_config
from flexigpt.storage.registry import METHODS

if TYPE_CHECKING:
    from types import ModuleType

    from flexigpt.storage.manifest import Manifest

__all__ = ["ADDED_KEYS", "FORMAT", "KEY", "MODELING_FILE", "MODEL_TYPE", "base_config_dict",
           "compression_spec", "family_config", "make_self_contained", "plain_mismatch",
           "remote_mismatch"]

log = logging.getLogger(__name__)


def _standalone() -> ModuleType:
    """The assembled standalone modeling file as a module (:mod:`flexigpt.export.standalone`:
    the base and every method's replay fragment; it loads the transformers model classes of
    every family it replays, too heavy for ``import flexigpt``), checked to agree with
    :mod:`flexigpt.storage.models.checkpoint_format` on ``MODEL_TYPE`` / ``KEY`` / ``FORMAT``."""
    from flexigpt.export.standalone import standalone_module

    standalone = standalone_module()
    if (standalone.MODEL_TYPE, standalone.KEY, standalone.FORMAT) != (MODEL_TYPE, KEY, FORMAT):
        raise ImportError("flexigpt/storage/standalone.py and "
                          "flexigpt/storage/models/checkpoint_format.py disagree on MODEL_TYPE / KEY "
                          "/ FORMAT")
    return standalone


def _meta_skeleton(build: Any) -> nn.Module:
    from transformers.initialization import no_init_weights

    with torch.device("meta"), no_init_weights():
        model = build()
    model.tie_weights()
    return model


def _signature(model: nn.Module, meta: bool) -> tuple[dict[str, tuple[int, ...]], set]:
    """``({state-dict name: shape}, {frozenset of names sharing one tensor})``.

    Sharing is by storage for real tensors (what safetensors deduplicates) and by object
    identity on the meta device.
    """
    shapes: dict[str, tuple[int, ...]] = {}
    groups: dict[object, set[str]] = {}  # by id (meta) or (storage, offset, shape)
    for name, t in model.state_dict(keep_vars=True).items():
        shapes[name] = tuple(t.shape)
        key = id(t) if meta or t.device.type == "meta" else (
            t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        groups.setdefault(key, set()).add(name)
    return shapes, {frozenset(g) for g in groups.values() if len(g) > 1}


def _compare(mine: nn.Module, ref: nn.Module) -> str | None:
    a_shapes, a_groups = _signature(mine, meta=False)
    b_shapes, b_groups = _signature(ref, meta=True)
    if a_shapes.keys() != b_shapes.keys():
        extra, missing = sorted(a_shapes.keys() - b_shapes), sorted(b_shapes.keys() - a_shapes)
        return (f"{len(extra)} parameters a stock model lacks (e.g. {extra[:3]}) and "
                f"{len(missing)} it expects that are absent (e.g. {missing[:3]})")
    bad = [k for k in a_shapes if a_shapes[k] != b_shapes[k]]
    if bad:
        return (f"{len(bad)} parameters with other shapes, e.g. {bad[0]} "
                f"{list(a_shapes[bad[0]])} vs {list(b_shapes[bad[0]])}")
    if a_groups != b_groups:
        diff = sorted(sorted(g) for g in a_groups ^ b_groups)[0]
        return f"parameters shared differently, e.g. {diff[:3]}"
    return None


def plain_mismatch(model: nn.Module) -> str | None:
    """Why ``model`` is not a stock checkpoint of ``model.config`` (None when it is)."""
    from transformers import AutoModelForCausalLM

    foreign = sorted({type(m).__name__ for m in model.modules()
                      if type(m).__module__.split(".")[0] not in ("torch", "transformers")})
    if foreign:
        return f"modules that stock transformers does not have: {foreign}"
    try:
        ref = _meta_skeleton(lambda: AutoModelForCausalLM.from_config(copy.deepcopy(model.config)))
    except (ValueError, KeyError, TypeError) as err:
        return f"no stock architecture for its config ({err})"
    return _compare(model, ref)


def remote_mismatch(model: nn.Module, config_dict: dict[str, Any]) -> str | None:
    """Why the standalone remote code would *not* rebuild ``model`` from ``config_dict``."""
    standalone = _standalone()
    spec = config_dict[KEY]
    if spec["method"] not in standalone.REPLAY:
        return f"the standalone loader cannot replay method {spec['method']!r}"
    if spec["base_model_type"] not in standalone.BASES:
        return (f"the standalone loader has no class for model type "
                f"{spec['base_model_type']!r} (has {sorted(standalone.BASES)})")
    cls = getattr(standalone, standalone.class_names(spec["method"], spec["base_model_type"])[1])
    try:
        config = cls.config_class.from_dict(copy.deepcopy(config_dict))
        ref = _meta_skeleton(lambda: cls(config))
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
        return f"the standalone loader fails on this structure: {type(err).__name__}: {err}"
    return _compare(model, ref)


def make_self_contained(model_dir: str | os.PathLike, model: nn.Module,
                        manifest: Manifest) -> dict[str, Any] | None:
    """Rewrite ``model_dir/config.json`` (written by ``config.save_pretrained``) so stock
    transformers either loads the model exactly (remote code) or refuses it.

    Returns:
        The ``flexigpt_compression`` entry written, or None for a plain model.
    """
    standalone = _standalone()
    model_dir = Path(model_dir)
    path = model_dir / "config.json"
    written = json.loads(path.read_text())
    config_dict = base_config_dict(written)
    reason = plain_mismatch(model)
    if reason is None:
        if config_dict != written:  # a model loaded through the remote code, saved again
            path.write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n")
        return None
    base_type = config_dict.get("model_type")
    spec = {"format": FORMAT, "method": manifest.method, "structure": manifest.structure,
            "base_model_type": base_type, "base_architectures": config_dict.get("architectures"),
            "not_plain": reason}
    out = {**config_dict, "model_type": MODEL_TYPE, KEY: spec}
    remote = remote_mismatch(model, out)
    if remote is None:
        config_cls, model_cls = standalone.class_names(manifest.method, base_type)
        out["architectures"] = [model_cls]
        out["auto_map"] = {"AutoConfig": f"{MODELING_FILE[:-3]}.{config_cls}",
                           "AutoModelForCausalLM": f"{MODELING_FILE[:-3]}.{model_cls}"}
        spec["remote_code"] = True
        write_standalone(model_dir)
    else:
        spec.update(remote_code=False, remote_code_reason=remote)
        # a class no code defines: stock transformers refuses the checkpoint, naming its method
        out["architectures"] = [f"{METHODS[manifest.method].class_prefix}CompressedForCausalLM"]
        log.warning("%s: no remote code written (%s); the checkpoint loads with "
                    "flexigpt.load_compressed only", model_dir, remote)
    path.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    return spec
