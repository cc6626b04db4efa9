"""Load a flexigpt-bench compressed checkpoint with plain ``transformers`` (remote code).

This file is copied verbatim into every saved model directory whose architecture is not a
stock Hugging Face one, and ``config.json`` points at it through ``auto_map``::

    AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=True)

It needs only ``torch`` and ``transformers`` (>= 5). The model is the family's own
``*ForCausalLM`` (Llama, Mistral, Qwen2, Qwen3: same forward, KV cache and ``generate``); its
``__init__`` builds the dense skeleton and then replays the compression recorded in
``config.json["flexigpt_compression"]`` (``method`` + ``structure``):

* ``flexigpt`` / ``flexigpt_extend``: weight-shared blocks. Each linear of a replacement or
  repeated block is ``base(x) + (x Aᵀ) Bᵀ`` over *the base block's own* ``nn.Linear`` (the
  same module, so the weights are stored once in ``model.safetensors``); attention and MLP
  outputs optionally go through a bias-free LayerNorm times ``gamma`` (``OutputNorm``).
* ``slicegpt``: sliced residual stream with shortcut matrices and weight-free RMS norms.
* ``llm_pruner``: per-layer attention-head counts and MLP widths.
* ``streamline`` (FFN module): a two-layer ReLU FFN in place of a span of blocks.

The modules mirror ``flexigpt.methods.sharing``, ``baselines.slicegpt.modules``,
``baselines.llm_pruner.surgery`` and ``baselines.streamline.modules`` of flexigpt-bench (same parameter names, same arithmetic);
the package's tests check that both give identical logits.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from transformers.modeling_layers import GradientCheckpointingLayer

#: ``config.json`` ``model_type`` of every checkpoint that needs this file
MODEL_TYPE = "flexigpt_compressed"
#: ``config.json`` key holding ``{"format", "method", "structure", "base_model_type", ...}``
KEY = "flexigpt_compression"
FORMAT = 1

# attribute names shared by the supported families (flexigpt's LLAMA ArchAdapter)
ATTN, MLP, INPUT_NORM, POST_ATTN_NORM = ("self_attn", "mlp", "input_layernorm",
                                         "post_attention_layernorm")
ATTN_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_LINEARS = ("gate_proj", "up_proj", "down_proj")
LINEARS = tuple(f"{ATTN}.{n}" for n in ATTN_LINEARS) + tuple(f"{MLP}.{n}" for n in MLP_LINEARS)


# ---- modules --------------------------------------------------------------------------------
class SharedLoRALinear(nn.Module):
    """``y = base(x) + (x @ lora_Aᵀ) @ lora_Bᵀ · scaling``; ``base_layer`` is a shared linear.

    Forward as flexigpt's ``"auto"`` mode: without autograd and with more tokens than
    ``in·out/(in+out)`` the merged weight ``W + s·B@A`` is formed, else the low-rank path.
    """

    def __init__(self, base_layer: nn.Linear, rank: int, scaling: float = 1.0) -> None:
        super().__init__()
        w = base_layer.weight
        self.base_layer = base_layer
        self.lora_A = nn.Parameter(torch.zeros(rank, w.shape[1], dtype=w.dtype, device=w.device))
        self.lora_B = nn.Parameter(torch.zeros(w.shape[0], rank, dtype=w.dtype, device=w.device))
        self.scaling = float(scaling)

    @property
    def weight(self) -> torch.Tensor:
        return self.base_layer.weight

    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    @property
    def out_features(self) -> int:
        return self.base_layer.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.base_layer.weight, self.base_layer.bias
        in_f, out_f = self.in_features, self.out_features
        if not torch.is_grad_enabled() and x.numel() // x.shape[-1] > in_f * out_f / (in_f + out_f):
            return F.linear(x, torch.addmm(weight, self.lora_B, self.lora_A, alpha=self.scaling),
                            bias)
        y = F.linear(x, weight, bias)
        low = F.linear(x, self.lora_A)
        out = torch.addmm(y.reshape(-1, y.shape[-1]), low.reshape(-1, low.shape[-1]),
                          self.lora_B.t(), alpha=self.scaling)
        return out.view(y.shape)


class OutputNorm(nn.Module):
    """``gamma ⊙ LayerNorm(h)`` (bias-free, fp32) on the output ``h`` of ``inner``."""

    def __init__(self, inner: nn.Module, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.inner = inner
        ref = next(inner.parameters())
        self.gamma = nn.Parameter(torch.zeros(hidden_size, dtype=ref.dtype, device=ref.device))
        self.eps = float(eps)

    def normalize(self, h: torch.Tensor) -> torch.Tensor:
        if h.dtype == torch.float32 and self.gamma.dtype == torch.float32:
            return F.layer_norm(h, (h.shape[-1],), weight=self.gamma, eps=self.eps)
        y = F.layer_norm(h.float(), (h.shape[-1],), eps=self.eps) * self.gamma.float()
        return y.to(h.dtype)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self.inner(*args, **kwargs)
        if isinstance(out, tuple):
            return (self.normalize(out[0]), *out[1:])
        return self.normalize(out)

    def __getattr__(self, name: str) -> Any:  # e.g. ``self_attn.layer_idx`` reaches ``inner``
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = self.__dict__.get("_modules", {}).get("inner")
            if inner is None or name == "inner":
                raise
            return getattr(inner, name)


class RMSN(nn.Module):
    """Weight-free ``x · rsqrt(Σx²/D + eps)`` in fp32, D the *original* hidden size."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.hidden_size, self.eps = int(hidden_size), float(eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float() if dtype in (torch.float16, torch.bfloat16) else x
        scale = torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) / self.hidden_size + self.eps)
        return (xf * scale).to(dtype)


class ProjectedRMSN(nn.Module):
    """Final norm of a SliceGPT model with a re-tied head: ``RMSN(x) @ proj.weightᵀ``."""

    def __init__(self, hidden_size: int, eps: float, d_in: int, d_out: int) -> None:
        super().__init__()
        self.norm = RMSN(hidden_size, eps)
        self.proj = nn.Linear(d_in, d_out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


class SlicedBlock(GradientCheckpointingLayer):
    """``h = S_attn(x) + attn(RMSN(x))``; ``y = S_mlp(h) + mlp(RMSN(h))`` (SliceGPT block)."""

    def __init__(self, attn: nn.Module, mlp: nn.Module, hidden_size: int, eps: float,
                 d_in: int, d_mid: int, d_out: int) -> None:
        super().__init__()
        self.self_attn, self.mlp = attn, mlp
        self.input_layernorm = RMSN(hidden_size, eps)
        self.post_attention_layernorm = RMSN(hidden_size, eps)
        ref = next(attn.parameters())
        kw: dict[str, Any] = {"bias": False, "dtype": ref.dtype, "device": ref.device}
        self.attn_shortcut = nn.Linear(d_in, d_mid, **kw)
        self.mlp_shortcut = nn.Linear(d_mid, d_out, **kw)

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if args:
            raise TypeError("SlicedBlock takes the decoder-layer arguments by keyword only")
        x = hidden_states
        out = self.self_attn(hidden_states=self.input_layernorm(x), **kwargs)
        h = self.attn_shortcut(x) + (out[0] if isinstance(out, tuple) else out)
        return self.mlp_shortcut(h) + self.mlp(self.post_attention_layernorm(h))


# ---- surgery ----------------------------------------------------------------------------------
def _get(root: nn.Module, dotted: str) -> Any:
    for part in dotted.split("."):
        root = getattr(root, part)
    return root


def _set(root: nn.Module, dotted: str, module: nn.Module) -> None:
    parent, _, name = dotted.rpartition(".")
    setattr(_get(root, parent) if parent else root, name, module)


def _linear(like: nn.Linear, in_features: int, out_features: int) -> nn.Linear:
    w = like.weight
    return nn.Linear(in_features, out_features, bias=like.bias is not None, dtype=w.dtype,
                     device=w.device)


def _share_block(target: nn.Module, base: nn.Module, s: dict[str, Any], hidden: int,
                 share_prenorms: bool) -> None:
    """``target``'s linears become ``SharedLoRALinear`` over ``base``'s (flexigpt surgery)."""
    for name in LINEARS:
        _set(target, name, SharedLoRALinear(_get(base, name), int(s["ranks"][name])))
    if share_prenorms:
        setattr(target, INPUT_NORM, getattr(base, INPUT_NORM))
        setattr(target, POST_ATTN_NORM, getattr(base, POST_ATTN_NORM))
    if s["output_norm"]:
        eps = s.get("output_norm_eps", 1e-6)
        for sub in (ATTN, MLP):
            setattr(target, sub, OutputNorm(getattr(target, sub), hidden, eps))


def replay_flexigpt(model: PreTrainedModel, s: dict[str, Any]) -> None:
    """FlexiGPT pruning: block i is replaced by a weight-shared copy of block ``base_map[i]``."""
    layers = model.model.layers
    for i, j in s["base_map"].items():
        _share_block(layers[int(i)], layers[int(j)], s, model.config.hidden_size,
                     share_prenorms=s.get("prenorm") == "share")


def replay_flexigpt_extend(model: PreTrainedModel, s: dict[str, Any]) -> None:
    """FlexiGPT extension: position p repeats block ``layout[p]`` (first occurrence = original)."""
    layers = model.model.layers
    first: dict[int, int] = {}
    if len(layers) != len(s["layout"]):
        raise ValueError(f"layout has {len(s['layout'])} blocks, config {len(layers)}")
    for pos, src in enumerate(s["layout"]):
        if src in first:
            _share_block(layers[pos], layers[first[src]], s, model.config.hidden_size, False)
        else:
            first[src] = pos


def replay_slicegpt(model: PreTrainedModel, s: dict[str, Any]) -> None:
    """SliceGPT: per-block residual widths, shortcut matrices, weight-free RMS norms."""
    plan, hidden, eps = s["plan"], int(s["hidden_size"]), float(s["eps"])
    outs, mids = plan["out"], plan["mid"]
    inputs = [plan["embed"]] + outs[:-1]
    layers = model.model.layers
    if len(layers) != len(mids):
        raise ValueError(f"structure has {len(mids)} blocks, config {len(layers)}")
    for i, (d_in, d_mid, d_out) in enumerate(zip(inputs, mids, outs)):
        attn, mlp = getattr(layers[i], ATTN), getattr(layers[i], MLP)
        for parent, names, d_new, side in ((attn, ATTN_LINEARS[:3], d_in, "in"),
                                           (attn, ATTN_LINEARS[3:], d_mid, "out"),
                                           (mlp, MLP_LINEARS[:2], d_mid, "in"),
                                           (mlp, MLP_LINEARS[2:], d_out, "out")):
            for name in names:
                old = getattr(parent, name)
                setattr(parent, name, _linear(old, d_new, old.out_features) if side == "in"
                        else _linear(old, old.in_features, d_new))
        block = SlicedBlock(attn, mlp, hidden, eps, d_in, d_mid, d_out)
        if hasattr(layers[i], "attention_type"):
            block.attention_type = layers[i].attention_type
        layers[i] = block
    embed, head = model.model.embed_tokens, model.lm_head
    w = embed.weight
    embed.weight = nn.Parameter(torch.zeros(w.shape[0], plan["embed"], dtype=w.dtype,
                                            device=w.device))
    embed.embedding_dim = plan["embed"]
    if plan["head"] == "tied":
        model.model.norm = ProjectedRMSN(hidden, eps, outs[-1], plan["embed"]).to(w.device, w.dtype)
        head.weight, head.in_features = embed.weight, plan["embed"]
    else:
        model.model.norm = RMSN(hidden, eps)
        model.lm_head = _linear(head, outs[-1], head.out_features)


def replay_llm_pruner(model: PreTrainedModel, s: dict[str, Any]) -> None:
    """LLM-Pruner: per-layer query/KV head counts and MLP widths (whole KV groups removed)."""
    hd = int(s["head_dim"])
    layers = model.model.layers
    counts = list(zip(s["num_attention_heads"], s["num_key_value_heads"], s["intermediate_size"]))
    if len(counts) != len(layers):
        raise ValueError(f"structure describes {len(counts)} layers, config {len(layers)}")
    for block, (n_heads, n_kv, inter) in zip(layers, counts):
        attn, mlp = getattr(block, ATTN), getattr(block, MLP)
        for name, rows in zip(ATTN_LINEARS[:3], (n_heads, n_kv, n_kv)):
            old = getattr(attn, name)
            setattr(attn, name, _linear(old, old.in_features, rows * hd))
        attn.o_proj = _linear(attn.o_proj, n_heads * hd, attn.o_proj.out_features)
        attn.num_key_value_groups = n_heads // n_kv
        for name, value in (("num_heads", n_heads), ("num_key_value_heads", n_kv)):
            if hasattr(attn, name):
                setattr(attn, name, value)
        for name in MLP_LINEARS[:2]:
            old = getattr(mlp, name)
            setattr(mlp, name, _linear(old, old.in_features, inter))
        mlp.down_proj = _linear(mlp.down_proj, inter, mlp.down_proj.out_features)
        if hasattr(mlp, "intermediate_size"):
            mlp.intermediate_size = inter


class StreamlineFFN(nn.Module):
    """LLM-Streamline's FFN replacement of a span of blocks: ``fc2(relu(fc1(h)))``, no
    residual; it stands in a decoder block's place and mixes no tokens."""

    def __init__(self, hidden: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, 4 * hidden, dtype=dtype)
        self.fc2 = nn.Linear(4 * hidden, hidden, dtype=dtype)

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(hidden_states)))


def replay_streamline(model: PreTrainedModel, s: dict[str, Any]) -> None:
    """The FFN module at the span's start (the block variant is a stock checkpoint)."""
    if s.get("module") != "ffn":
        return
    layers = model.model.layers
    start = int(s["span"][0])
    dtype = _get(layers[start], f"{MLP}.down_proj").weight.dtype
    layers[start] = StreamlineFFN(model.config.hidden_size, dtype)


REPLAY = {"flexigpt": replay_flexigpt, "flexigpt_extend": replay_flexigpt_extend,
          "slicegpt": replay_slicegpt, "llm_pruner": replay_llm_pruner,
          "streamline": replay_streamline}


# ---- model classes ----------------------------------------------------------------------------
if TYPE_CHECKING:  # the mixin always comes before a family's PreTrainedModel in the MRO
    _MixinBase = PreTrainedModel
else:
    _MixinBase = object


class CompressedMixin(_MixinBase):
    """``__init__``: the family's dense skeleton, then the recorded compression replayed."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        spec = getattr(config, KEY, None)
        if not isinstance(spec, dict) or spec.get("method") not in REPLAY:
            raise ValueError(f"config.{KEY} must name one of {sorted(REPLAY)}, got {spec!r}")
        if spec.get("format") != FORMAT:
            raise ValueError(f"config.{KEY} has format {spec.get('format')!r}; this file reads "
                             f"format {FORMAT}")
        REPLAY[spec["method"]](self, spec["structure"])
        # parameters reachable under several names (shared modules) are stored once: declare
        # the later names tied to the first, so loading and ``save_pretrained`` treat them as
        # aliases (``_tied_weights_keys`` holds regex patterns, hence escaped and anchored)
        tied = dict(getattr(self, "all_tied_weights_keys", None) or {})
        patterns = dict(self._tied_weights_keys or {})
        first: dict[int, str] = {}
        for name, param in self.named_parameters(remove_duplicate=False):
            if id(param) not in first:
                first[id(param)] = name
            elif name not in tied:
                tied[name] = first[id(param)]
                patterns[re.escape(name) + "$"] = re.escape(first[id(param)]) + "$"
        self.all_tied_weights_keys = tied
        self._tied_weights_keys = patterns


class FlexiGPTLlamaConfig(LlamaConfig):
    model_type = MODEL_TYPE


class FlexiGPTMistralConfig(MistralConfig):
    model_type = MODEL_TYPE


class FlexiGPTQwen2Config(Qwen2Config):
    model_type = MODEL_TYPE


class FlexiGPTQwen3Config(Qwen3Config):
    model_type = MODEL_TYPE


class FlexiGPTLlamaForCausalLM(CompressedMixin, LlamaForCausalLM):
    config_class = FlexiGPTLlamaConfig


class FlexiGPTMistralForCausalLM(CompressedMixin, MistralForCausalLM):
    config_class = FlexiGPTMistralConfig


class FlexiGPTQwen2ForCausalLM(CompressedMixin, Qwen2ForCausalLM):
    config_class = FlexiGPTQwen2Config


class FlexiGPTQwen3ForCausalLM(CompressedMixin, Qwen3ForCausalLM):
    config_class = FlexiGPTQwen3Config


#: base ``model_type`` → (config class name, model class name) for ``auto_map``
FAMILIES = {"llama": ("FlexiGPTLlamaConfig", "FlexiGPTLlamaForCausalLM"),
            "mistral": ("FlexiGPTMistralConfig", "FlexiGPTMistralForCausalLM"),
            "qwen2": ("FlexiGPTQwen2Config", "FlexiGPTQwen2ForCausalLM"),
            "qwen3": ("FlexiGPTQwen3Config", "FlexiGPTQwen3ForCausalLM")}
