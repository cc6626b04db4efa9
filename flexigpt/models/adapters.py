"""Architecture adapters: the only place that knows family-specific attribute names.

Methods (FlexiGPT, ShortGPT, SliceGPT, LLM-Pruner) touch models exclusively through an
:class:`ArchAdapter`, selected by ``config.model_type`` from :data:`ADAPTERS`. Adding a family
(e.g. OPT) means one new adapter instance registered here or in a sibling module.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn


class UnsupportedArchitectureError(ValueError):
    """Raised when a model's ``model_type`` has no registered adapter."""


@dataclass(frozen=True)
class ArchAdapter:
    """Names of the parts of a decoder-only transformer, for one model family.

    All attribute paths are dotted and relative to the object named in the field doc.
    """

    model_types: tuple[str, ...]
    layers_path: str = "model.layers"  # from the CausalLM to the nn.ModuleList of blocks
    embed_path: str = "model.embed_tokens"  # from the CausalLM
    final_norm_path: str = "model.norm"  # from the CausalLM
    lm_head_path: str = "lm_head"  # from the CausalLM
    attn_name: str = "self_attn"  # from a block
    mlp_name: str = "mlp"  # from a block
    input_norm_name: str = "input_layernorm"  # from a block, the norm before attention
    post_attn_norm_name: str = "post_attention_layernorm"  # from a block, the norm before the MLP
    attn_linears: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")  # from attn
    mlp_linears: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")  # from mlp
    attn_in_linears: tuple[str, ...] = ("q_proj", "k_proj", "v_proj")  # read the residual stream
    attn_out_linears: tuple[str, ...] = ("o_proj",)  # write the residual stream
    mlp_in_linears: tuple[str, ...] = ("gate_proj", "up_proj")
    mlp_out_linears: tuple[str, ...] = ("down_proj",)
    layer_idx_attr: str = "layer_idx"  # on attn: the KV-cache slot of the block

    # ---- whole model -------------------------------------------------------------------
    def layers(self, model: nn.Module) -> nn.ModuleList:
        """The decoder blocks, in order (an ``nn.ModuleList``)."""
        return _get(model, self.layers_path)

    def set_layers(self, model: nn.Module, blocks: list[nn.Module]) -> None:
        """Replace the block list, renumber KV-cache indices and update the config depth."""
        parent_path, name = self.layers_path.rsplit(".", 1)
        setattr(_get(model, parent_path), name, nn.ModuleList(blocks))
        for i, block in enumerate(blocks):
            attn = getattr(block, self.attn_name)
            inner = attn.get_base_layer() if hasattr(attn, "get_base_layer") else attn
            if hasattr(inner, self.layer_idx_attr):
                setattr(inner, self.layer_idx_attr, i)
        cfg = model.config
        old = cfg.num_hidden_layers
        cfg.num_hidden_layers = len(blocks)
        layer_types = getattr(cfg, "layer_types", None)
        if layer_types is not None and len(layer_types) == old and len(set(layer_types)) == 1:
            cfg.layer_types = [layer_types[0]] * len(blocks)
        elif layer_types is not None and len(layer_types) != len(blocks):
            raise UnsupportedArchitectureError(
                f"model has per-layer types {sorted(set(layer_types))}; changing its depth is "
                "not supported by this adapter"
            )

    def embed(self, model: nn.Module) -> nn.Embedding:
        return _get(model, self.embed_path)

    def final_norm(self, model: nn.Module) -> nn.Module:
        return _get(model, self.final_norm_path)

    def lm_head(self, model: nn.Module) -> nn.Linear:
        return _get(model, self.lm_head_path)

    # ---- one block ---------------------------------------------------------------------
    def attn(self, block: nn.Module) -> nn.Module:
        return getattr(block, self.attn_name)

    def mlp(self, block: nn.Module) -> nn.Module:
        return getattr(block, self.mlp_name)

    def input_norm(self, block: nn.Module) -> nn.Module:
        return getattr(block, self.input_norm_name)

    def post_attn_norm(self, block: nn.Module) -> nn.Module:
        return getattr(block, self.post_attn_norm_name)

    def linear_names(self) -> tuple[str, ...]:
        """Dotted names (relative to a block) of every linear matrix of a block, in order."""
        return tuple(f"{self.attn_name}.{n}" for n in self.attn_linears) + tuple(
            f"{self.mlp_name}.{n}" for n in self.mlp_linears
        )

    def block_linears(self, block: nn.Module) -> dict[str, nn.Linear]:
        """``{dotted name: linear}`` for one block (wrappers are returned as they are)."""
        return {name: _get(block, name) for name in self.linear_names()}


LLAMA = ArchAdapter(model_types=("llama", "mistral", "qwen2", "qwen3"))

#: model_type → adapter. Register a new family by adding its adapter here.
ADAPTERS: dict[str, ArchAdapter] = {t: a for a in (LLAMA,) for t in a.model_types}


def get_adapter(model_or_config: object) -> ArchAdapter:
    """The adapter for a model (or its config), chosen by ``config.model_type``.

    Raises:
        UnsupportedArchitectureError: the family has no adapter.
    """
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    try:
        return ADAPTERS[model_type]
    except KeyError:
        raise UnsupportedArchitectureError(
            f"unsupported architecture {model_type!r}: supported model types are "
            f"{sorted(ADAPTERS)} (add an ArchAdapter in flexigpt/models/adapters.py)"
        ) from None


def _get(obj: object, dotted: str) -> nn.Module:
    for part in dotted.split("."):
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    return obj  # type: ignore[return-value]
