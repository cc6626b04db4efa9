"""Architecture adapters: the only place that knows family-specific attribute names.

Methods (FlexiGPT, ShortGPT, SliceGPT, LLM-Pruner) touch models exclusively through an
:class:`ArchAdapter`, selected by ``config.model_type`` from :data:`ADAPTERS`, and answer by
role: the blocks, the linears that read / write the residual stream, the module whose
output is each sub-layer's contribution to it (``*_writer_name``), the pre-norms. Families:
Llama (2, 3), Mistral, Qwen2, Qwen3 (:data:`LLAMA`), OPT (:data:`OPT`: no MLP module,
``fc1``/``fc2`` on the block, LayerNorms with bias, learned positions) and Gemma 3 text
(:data:`GEMMA3`: sandwich norms, q/k norms, sliding-window and global layers interleaved). A
method that cannot handle a family says so with :func:`require_family`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from torch import nn


class UnsupportedArchitectureError(ValueError):
    """Raised when a model's ``model_type`` has no registered adapter."""


@dataclass(frozen=True)
class ArchAdapter:
    """Names of the parts of a decoder-only transformer, for one model family.

    All attribute paths are dotted and relative to the object named in the field doc.
    """

    model_types: tuple[str, ...]
    family: str = "llama"  # what methods name in "supports" checks (require_family)
    layers_path: str = "model.layers"  # from the CausalLM to the nn.ModuleList of blocks
    embed_path: str = "model.embed_tokens"  # from the CausalLM
    final_norm_path: str = "model.norm"  # from the CausalLM
    lm_head_path: str = "lm_head"  # from the CausalLM
    attn_name: str = "self_attn"  # from a block
    mlp_name: str = "mlp"  # from a block; "" = the MLP linears live on the block itself
    input_norm_name: str = "input_layernorm"  # from a block, the norm before attention
    post_attn_norm_name: str = "post_attention_layernorm"  # from a block, the norm before the MLP
    attn_linears: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")  # from attn
    mlp_linears: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")  # from mlp
    attn_in_linears: tuple[str, ...] = ("q_proj", "k_proj", "v_proj")  # read the residual stream
    attn_out_linears: tuple[str, ...] = ("o_proj",)  # write the residual stream
    mlp_in_linears: tuple[str, ...] = ("gate_proj", "up_proj")
    mlp_out_linears: tuple[str, ...] = ("down_proj",)
    layer_idx_attr: str = "layer_idx"  # on attn: the KV-cache slot of the block
    # from a block: the modules whose outputs are the attention's / MLP's contribution to the
    # residual stream (what FlexiGPT's output normalisation wraps)
    attn_writer_name: str = "self_attn"
    mlp_writer_name: str = "mlp"
    # role → short linear name: q / k / v / o of attention, gate / up / down of the MLP
    # (a role a family lacks, e.g. OPT's gate, is absent)
    roles: tuple[tuple[str, str], ...] = (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"),
                                          ("o", "o_proj"), ("gate", "gate_proj"),
                                          ("up", "up_proj"), ("down", "down_proj"))
    # from the CausalLM: a learned position table added to the token embeddings before block 0
    # (a second writer of the residual stream); "" = none (rotary families)
    position_embed_path: str = ""
    # from a block without an MLP module: the activation between its in- and out-linears
    mlp_activation_name: str = ""
    # config attribute: dropout on each sub-layer's residual write (training only); "" = none
    residual_dropout_attr: str = ""
    # config attributes that must hold for a plain pre-norm residual stream: a flag that is
    # True for pre-norm blocks, and an embedding width that must equal hidden_size
    pre_norm_attr: str = ""
    embed_width_attr: str = ""
    # from a block: norms besides the two pre-norms (post-norms on each sub-layer's output,
    # q/k norms inside attention); FlexiGPT's ``prenorm="share"`` shares them with the rest
    extra_norm_names: tuple[str, ...] = ()
    # why the blocks' residual stream is not a plain pre-norm one whatever the config says
    # (e.g. post-norms on each sub-layer's output); "" = it is, up to the config checks above
    residual_stream_note: str = ""

    # ---- whole model -------------------------------------------------------------------
    def layers(self, model: nn.Module) -> nn.ModuleList:
        """The decoder blocks, in order (an ``nn.ModuleList``)."""
        return _get(model, self.layers_path)

    def set_layers(self, model: nn.Module, blocks: list[nn.Module]) -> None:
        """Replace the block list, renumber KV-cache indices and update the config depth.

        Per-layer ``layer_types`` (sliding-window vs global attention) follow the blocks: a
        block of the current stack keeps its own type, a new block (a repeat or copy) the
        type its attention was built with, and a module without attention (LLM-Streamline's
        FFN, which reads no mask) its predecessor's type (the next block's when first).
        """
        cfg: Any = model.config  # an HF config: its fields vary by family
        layer_types = getattr(cfg, "layer_types", None)
        new_types = None if layer_types is None else self._types_of(model, blocks, layer_types)
        parent_path, name = self.layers_path.rsplit(".", 1)
        setattr(_get(model, parent_path), name, nn.ModuleList(blocks))
        for i, block in enumerate(blocks):
            attn: Any = getattr(block, self.attn_name, None)  # None: a block without one
            inner = attn.get_base_layer() if hasattr(attn, "get_base_layer") else attn
            if hasattr(inner, self.layer_idx_attr):
                setattr(inner, self.layer_idx_attr, i)
            if hasattr(block, self.layer_idx_attr):  # Gemma 3 blocks carry it too
                setattr(block, self.layer_idx_attr, i)
        cfg.num_hidden_layers = len(blocks)
        if new_types is not None:
            cfg.layer_types = new_types

    def _types_of(self, model: nn.Module, blocks: list[nn.Module],
                  layer_types: list[str]) -> list[str]:
        """``layer_types`` of the stack ``blocks`` (see :meth:`set_layers`)."""
        if len(set(layer_types)) == 1:
            return [layer_types[0]] * len(blocks)
        current = list(self.layers(model))
        if len(current) != len(layer_types):
            raise UnsupportedArchitectureError(
                f"config has {len(layer_types)} layer_types for {len(current)} blocks")
        by_id = {id(b): t for b, t in zip(current, layer_types)}
        found: list[str | None] = []
        for block in blocks:
            attn: Any = getattr(block, self.attn_name, None)
            inner = attn.get_base_layer() if hasattr(attn, "get_base_layer") else attn
            found.append(by_id.get(id(block), getattr(inner, "layer_type", None)))
        known = [t for t in found if t is not None]
        if not known:
            raise UnsupportedArchitectureError("no block of the new stack has a layer type")
        out: list[str] = []
        for t in found:
            out.append(t if t is not None else (out[-1] if out else known[0]))
        return out

    def with_blocks(self, config: Any, kept: list[int]) -> Any:
        """A copy of ``config`` for a model made of the blocks ``kept`` (positions in
        ``config``'s stack): the depth and any per-layer ``layer_types`` follow."""
        out = copy.deepcopy(config)
        out.num_hidden_layers = len(kept)
        layer_types = getattr(config, "layer_types", None)
        if layer_types is not None:
            out.layer_types = [layer_types[i] for i in kept]
        return out

    def embed(self, model: nn.Module) -> nn.Embedding:
        return _get(model, self.embed_path)

    def final_norm(self, model: nn.Module) -> nn.Module:
        return _get(model, self.final_norm_path)

    def lm_head(self, model: nn.Module) -> nn.Linear:
        return _get(model, self.lm_head_path)

    # ---- one block ---------------------------------------------------------------------
    def attn(self, block: nn.Module) -> nn.Module:
        return getattr(block, self.attn_name)

    def position_embed(self, model: nn.Module) -> nn.Embedding | None:
        """The learned position table (``[positions, D]``), or None for a rotary family."""
        return _get(model, self.position_embed_path) if self.position_embed_path else None

    def residual_dropout(self, config: Any) -> float:
        """Dropout probability on each sub-layer's write to the residual stream (training)."""
        return float(getattr(config, self.residual_dropout_attr, 0.0) or 0.0) \
            if self.residual_dropout_attr else 0.0

    def residual_stream_problems(self, config: Any) -> list[str]:
        """Why ``config``'s blocks do not form one pre-norm residual stream of width
        ``hidden_size`` from the embedding to the final norm (empty = they do)."""
        problems = []
        if self.pre_norm_attr and not getattr(config, self.pre_norm_attr, True):
            problems.append(f"post-norm blocks ({self.pre_norm_attr}=False)")
        if self.residual_stream_note:
            problems.append(self.residual_stream_note)
        width = getattr(config, self.embed_width_attr, None) if self.embed_width_attr else None
        if width is not None and width != config.hidden_size:
            problems.append(f"embeddings of width {self.embed_width_attr}={width} projected to "
                            f"hidden_size={config.hidden_size}")
        return problems

    def mlp_owner(self, block: nn.Module) -> nn.Module:
        """The module holding the MLP linears: the MLP module, or the block itself."""
        return self.mlp(block) if self.mlp_name else block

    def mlp(self, block: nn.Module) -> nn.Module:
        if not self.mlp_name:
            raise UnsupportedArchitectureError(
                f"{self.family} blocks have no MLP module (the MLP linears "
                f"{self.mlp_linears} are attributes of the block)")
        return getattr(block, self.mlp_name)

    def writers(self) -> tuple[str, str]:
        """Dotted names (from a block) of the attention's and the MLP's residual writers."""
        return self.attn_writer_name, self.mlp_writer_name

    def input_norm(self, block: nn.Module) -> nn.Module:
        return getattr(block, self.input_norm_name)

    def norm_names(self) -> tuple[str, ...]:
        """Dotted names (from a block) of every norm of a block: the two pre-norms first."""
        return (self.input_norm_name, self.post_attn_norm_name, *self.extra_norm_names)

    def block_norms(self, block: nn.Module) -> dict[str, nn.Module]:
        """``{dotted name: norm module}`` of one block (:meth:`norm_names`)."""
        return {name: _get(block, name) for name in self.norm_names()}

    def post_attn_norm(self, block: nn.Module) -> nn.Module:
        return getattr(block, self.post_attn_norm_name)

    def linear_names(self) -> tuple[str, ...]:
        """Dotted names (relative to a block) of every linear matrix of a block, in order."""
        mlp = f"{self.mlp_name}." if self.mlp_name else ""
        return tuple(f"{self.attn_name}.{n}" for n in self.attn_linears) + tuple(
            f"{mlp}{n}" for n in self.mlp_linears
        )

    def role_name(self, role: str) -> str:
        """Short name of the linear playing ``role`` (``q``, ``k``, ``v``, ``o``, ``gate``,
        ``up``, ``down``); UnsupportedArchitectureError when the family has no such role."""
        names = dict(self.roles)
        if role not in names:
            raise UnsupportedArchitectureError(
                f"{self.family} blocks have no {role!r} linear (roles: {sorted(names)})")
        return names[role]

    def has_role(self, role: str) -> bool:
        """Whether the family's blocks have a linear playing ``role``."""
        return role in dict(self.roles)

    def mlp_in_roles(self) -> tuple[str, ...]:
        """Roles of the MLP linears that read the normalised stream: gate (if any) and up."""
        return tuple(r for r in ("gate", "up") if self.has_role(r))

    def linear(self, block: nn.Module, role: str) -> nn.Linear:
        """The linear of ``block`` playing ``role`` (see :meth:`role_name`)."""
        name = self.role_name(role)
        owner = self.attn(block) if name in self.attn_linears else self.mlp_owner(block)
        return _unwrap_output_norm(getattr(owner, name))

    def block_linears(self, block: nn.Module) -> dict[str, nn.Linear]:
        """``{dotted name: linear}`` for one block (LoRA/sharing wrappers are returned as they
        are; an output-norm wrapper around a linear itself, as on OPT's ``fc2``, is looked
        through)."""
        return {name: _unwrap_output_norm(_get(block, name)) for name in self.linear_names()}


LLAMA = ArchAdapter(model_types=("llama", "mistral", "qwen2", "qwen3"))

#: OPT (paper Table 3): ``model.decoder.*``, pre-norms ``self_attn_layer_norm`` /
#: ``final_layer_norm`` (LayerNorm with bias), ``fc1``/``fc2`` on the block (the MLP's
#: residual writer is ``fc2`` itself), learned positional embeddings, residual dropout;
#: OPT-350m's post-norm blocks and projected embeddings are flagged by
#: :meth:`ArchAdapter.residual_stream_problems`.
OPT = ArchAdapter(model_types=("opt",), family="opt", layers_path="model.decoder.layers",
                  embed_path="model.decoder.embed_tokens",
                  position_embed_path="model.decoder.embed_positions",
                  mlp_activation_name="activation_fn", residual_dropout_attr="dropout",
                  pre_norm_attr="do_layer_norm_before", embed_width_attr="word_embed_proj_dim",
                  final_norm_path="model.decoder.final_layer_norm", mlp_name="",
                  input_norm_name="self_attn_layer_norm", post_attn_norm_name="final_layer_norm",
                  attn_linears=("q_proj", "k_proj", "v_proj", "out_proj"),
                  mlp_linears=("fc1", "fc2"), attn_out_linears=("out_proj",),
                  mlp_in_linears=("fc1",), mlp_out_linears=("fc2",), mlp_writer_name="fc2",
                  roles=(("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "out_proj"),
                         ("up", "fc1"), ("down", "fc2")))

#: Gemma 3, text only (``Gemma3ForCausalLM``, ``model_type`` ``gemma3_text``): each sub-layer
#: is wrapped in a pre-norm *and* a post-norm (``input_layernorm`` → attention →
#: ``post_attention_layernorm``; ``pre_feedforward_layernorm`` → MLP →
#: ``post_feedforward_layernorm``), so what a sub-layer adds to the residual stream is its
#: post-norm's output (the residual writers); q/k RMSNorms over ``head_dim`` inside attention;
#: RMSNorms scale by ``1 + w``; embeddings scaled by √d; ``config.layer_types`` interleaves
#: sliding-window and global attention (each with its own rotary base), read by position.
GEMMA3 = ArchAdapter(
    model_types=("gemma3_text",), family="gemma3",
    post_attn_norm_name="pre_feedforward_layernorm",
    attn_writer_name="post_attention_layernorm", mlp_writer_name="post_feedforward_layernorm",
    extra_norm_names=("post_attention_layernorm", "post_feedforward_layernorm",
                      "self_attn.q_norm", "self_attn.k_norm"),
    residual_stream_note="post-norms on every sub-layer's output (Gemma's sandwich norms: "
                         "a rotation of the residual stream does not commute with them)")

#: model_type → adapter. Register a new family by adding its adapter here.
ADAPTERS: dict[str, ArchAdapter] = {t: a for a in (LLAMA, OPT, GEMMA3) for t in a.model_types}


def require_family(model_or_config: object, method: str, families: tuple[str, ...],
                   reasons: dict[str, str] | None = None) -> None:
    """Raise :class:`UnsupportedArchitectureError` naming ``method`` and the model's family
    unless the family (``ArchAdapter.family``) is one of ``families``; the message (one
    line) gives ``reasons[family]`` where the method states one."""
    adapter = get_adapter(model_or_config)
    if adapter.family not in families:
        why = (reasons or {}).get(adapter.family)
        raise UnsupportedArchitectureError(
            f"{method} does not support the {adapter.family!r} family (model_type "
            f"{getattr(getattr(model_or_config, 'config', model_or_config), 'model_type', None)!r}"
            f"){': ' + why if why else ''}; it supports {list(families)}")


def get_adapter(model_or_config: object) -> ArchAdapter:
    """The adapter for a model (or its config), chosen by ``config.model_type``.

    Raises:
        UnsupportedArchitectureError: the family has no adapter.
    """
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    if isinstance(model_type, str) and model_type in ADAPTERS:
        return ADAPTERS[model_type]
    raise UnsupportedArchitectureError(
        f"unsupported architecture {model_type!r}: supported model types are "
        f"{sorted(ADAPTERS)} (add an ArchAdapter in flexigpt/storage/models/adapters.py)"
    )


def _unwrap_output_norm(module: Any) -> Any:
    """The sub-layer inside an output-norm wrapper (``wraps_sublayer`` class attribute)."""
    # Any: a linear, a LoRA/sharing wrapper or an output-norm wrapper (attributes by role)
    while getattr(type(module), "wraps_sublayer", False):
        module = module.inner
    return module


def _get(obj: Any, dotted: str) -> Any:
    # Any: the module at a dotted path depends on the family (ModuleList, Embedding, Linear)
    for part in dotted.split("."):
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    return obj
