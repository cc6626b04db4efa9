"""Self-speculative draft of a FlexiGPT model: the model without its shared blocks.

The draft is the ShortGPT architecture on FlexiGPT's own unpruned blocks: embeddings,
every *original* block, final norm and LM head of the full model — the same module objects
(no copy; :func:`draft_extra_bytes` measures what the draft owns beyond the full model,
which is 0) — and none of the replacement blocks (``structure.base_map`` of ``flexigpt``) or
repeated blocks (``structure.layout`` of ``flexigpt_extend``).

The draft is an ordinary ``PreTrainedModel`` of the full model's class with a config of
fewer layers, so it drives transformers' assisted generation (``assistant_model=``) and owns
its own KV cache of ``len(kept)`` layers. The kept blocks' attention modules still carry the
full model's ``layer_idx`` (they *are* the full model's modules and are not mutated); each
kept block is wrapped in :class:`RenumberedBlock`, which hands its attention a view of the
draft's cache that writes to the block's draft position instead.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from flexigpt.storage.models.adapters import get_adapter
from flexigpt.storage.registry import METHODS, get_method, methods_with

if TYPE_CHECKING:
    from transformers import PreTrainedModel

#: methods whose models have a self-speculative draft (``MethodFacts.speculative``)
SPECULATIVE_METHODS = methods_with("speculative")
#: default draft length k (tokens drafted per verification): the fastest measured on
#: SmolLM2-135M at ratio 0.3 (k = 1, 2, 3: speed-up 0.732, 0.521, 0.387; α ≈ 0.12-0.15:
#: results/reference/smollm2-135m/bench_decode_k_5x64.json); the paper configs keep k = 2
DEFAULT_DRAFT_LENGTH = 1


class _CacheView:
    """A cache proxy whose ``update`` writes to layer ``draft_idx`` whatever index it is given."""

    __slots__ = ("_cache", "_idx")

    def __init__(self, cache: Any, draft_idx: int) -> None:
        self._cache = cache
        self._idx = draft_idx

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> Any:
        return self._cache.update(key_states, value_states, self._idx, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cache, name)


class RenumberedBlock(nn.Module):
    """One decoder block of the full model run at position ``draft_idx`` of the draft's cache.

    ``block`` is the full model's module itself (registered as a submodule, so its
    parameters are the full model's parameters); only the cache argument is swapped.
    """

    def __init__(self, block: nn.Module, draft_idx: int, full_idx: int) -> None:
        super().__init__()
        self.block = block
        self.draft_idx = draft_idx
        self.full_idx = full_idx

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        for key in ("cache", "past_key_values"):
            if kwargs.get(key) is not None:
                kwargs[key] = _CacheView(kwargs[key], self.draft_idx)
        return self.block(hidden_states, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"draft_idx={self.draft_idx}, full_idx={self.full_idx}"


def skipped_blocks(method: str | None, structure: dict[str, Any] | None,
                   n_blocks: int) -> list[int]:
    """Positions of the shared (replacement / repeat) blocks of a saved model, sorted.

    Args:
        method, structure: the model's manifest fields (``Manifest.method`` /
            ``.structure``); n_blocks: the model's block count.

    Raises:
        ValueError: the model is not a FlexiGPT (pruned or extended) model.
    """
    hook = get_method(method).draft_skip if method is not None and method in METHODS else None
    if hook is None:
        raise ValueError(f"self-speculative decoding needs a FlexiGPT model "
                         f"({'/'.join(SPECULATIVE_METHODS)}), got method {method!r}")
    skip = hook(structure or {})
    if not skip or any(not 0 <= i < n_blocks for i in skip) or len(skip) >= n_blocks:
        raise ValueError(f"shared blocks {skip} do not fit a model of {n_blocks} blocks")
    return skip


def build_draft(model: PreTrainedModel, skip: list[int],
                draft_length: int = DEFAULT_DRAFT_LENGTH) -> PreTrainedModel:
    """The draft of ``model`` without the blocks ``skip`` (shares every tensor with ``model``).

    Args:
        model: the full causal LM (HF ``PreTrainedModel``); not modified.
        skip: block positions the draft leaves out (see :func:`skipped_blocks`).
        draft_length: tokens drafted per round (``num_assistant_tokens``, constant schedule,
            no confidence early stop).
    """
    from transformers.initialization import no_init_weights

    if draft_length < 1:
        raise ValueError(f"draft_length must be ≥ 1, got {draft_length}")
    adapter = get_adapter(model)
    blocks = adapter.layers(model)
    kept = [i for i in range(len(blocks)) if i not in set(skip)]
    if not kept:
        raise ValueError("the draft would have no blocks")
    config = adapter.with_blocks(model.config, kept)
    with torch.device("meta"), no_init_weights():
        draft = type(model)(config)
    # share every module except the block list with the full model
    parent_path, list_name = adapter.layers_path.rsplit(".", 1)
    _share_children(draft, model, parent_path.split("."))
    draft_parent = _get(draft, parent_path)
    setattr(draft_parent, list_name, nn.ModuleList(
        RenumberedBlock(blocks[i], d, i) for d, i in enumerate(kept)))
    meta = [n for n, t in _named_tensors(draft) if t.is_meta]
    if meta:
        raise RuntimeError(f"draft holds tensors not shared with the full model: {meta[:5]}")
    draft.generation_config = copy.deepcopy(model.generation_config)
    set_draft_length(draft, draft_length)
    draft.eval()
    draft.draft_kept_blocks = kept  # type: ignore[assignment]  # torch types Module.__setattr__ values as Tensor | Module; any attribute works
    return draft


def set_draft_length(draft: PreTrainedModel, draft_length: int) -> None:
    """Fixed draft length ``k``: constant schedule, no confidence-based early stop."""
    gc = draft.generation_config
    gc.num_assistant_tokens = int(draft_length)
    gc.num_assistant_tokens_schedule = "constant"
    gc.assistant_confidence_threshold = 0.0


def draft_extra_bytes(draft: nn.Module, model: nn.Module) -> int:
    """Bytes of the draft's parameters/buffers whose storage the full model does not hold."""
    full = {t.untyped_storage().data_ptr() for _, t in _named_tensors(model)}
    seen: set[int] = set()
    extra = 0
    for _, t in _named_tensors(draft):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in full and ptr not in seen:
            seen.add(ptr)
            extra += t.untyped_storage().nbytes()
    return extra


def _named_tensors(module: nn.Module):
    yield from module.named_parameters(remove_duplicate=False)
    yield from module.named_buffers(remove_duplicate=False)


def _share_children(draft: nn.Module, model: nn.Module, path: list[str]) -> None:
    """Set each child of ``draft`` to ``model``'s child of the same name, except along
    ``path`` (the modules that lead to the block list), where it recurses; the block list
    itself is shared too and replaced by the caller."""
    for name, child in model.named_children():
        if path and name == path[0]:
            _share_children(getattr(draft, name), child, path[1:])
        else:
            setattr(draft, name, child)


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj
