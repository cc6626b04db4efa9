"""Load a flexigpt-bench compressed checkpoint with plain ``transformers`` (remote code).

The file ``modeling_flexigpt_compressed.py`` in a saved model directory whose architecture is
not a stock Hugging Face one is this module followed by the replay fragment of every method
that declares one (``MethodFacts.replay``: ``flexigpt/methods/flexigpt/replay.py``,
``baselines/<name>/replay.py``), assembled at export by :mod:`flexigpt.export.standalone`
into one self-contained file; ``config.json`` points at it through ``auto_map``::

    AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=True)

It needs only ``torch`` and ``transformers`` (>= 5). The model is the family's own
``*ForCausalLM`` (Llama, Mistral, Qwen2, Qwen3: same forward, KV cache and ``generate``); its
``__init__`` builds the dense skeleton and then replays the compression recorded in
``config.json["flexigpt_compression"]`` (``method`` + ``structure``) with the replay its
method's fragment registered (:func:`register_replay`). Each fragment mirrors its method's
modules in flexigpt-bench (same parameter names, same arithmetic); the package's tests check
that both give identical logits.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

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


#: method → its replay ``(model, structure) -> None``, registered by the method fragments
REPLAY: dict[str, Callable[[PreTrainedModel, dict[str, Any]], None]] = {}
#: method → the prefix of its checkpoints' class names (``"SliceGPT"``:
#: ``SliceGPTLlamaConfig``, ``SliceGPTLlamaForCausalLM``), registered with its replay
CLASS_PREFIX: dict[str, str] = {}


def class_names(method: str, base_type: str) -> tuple[str, str]:
    """``(config class, model class)`` names of ``method``'s checkpoints of the family
    ``base_type`` (a key of :data:`BASES`), as ``config.json``'s ``auto_map`` names them."""
    family = BASES[base_type][0]
    return (f"{CLASS_PREFIX[method]}{family}Config",
            f"{CLASS_PREFIX[method]}{family}ForCausalLM")


def register_replay(method: str, replay: Callable[[PreTrainedModel, dict[str, Any]], None],
                    class_prefix: str) -> None:
    """Make ``replay`` rebuild the saved models of ``method`` (a fragment's last statement),
    and define in this module the classes its checkpoints name, one config and one model
    class per family of :data:`BASES` (:func:`class_names`): the checkpoint class names the
    method that made it."""
    REPLAY[method] = replay
    CLASS_PREFIX[method] = class_prefix
    for base_type, (_, config_base, model_base) in BASES.items():
        config_name, model_name = class_names(method, base_type)
        config_cls = type(config_name, (config_base,),
                          {"model_type": MODEL_TYPE, "__module__": __name__})
        globals()[config_name] = config_cls
        globals()[model_name] = type(model_name, (CompressedMixin, model_base),
                                     {"config_class": config_cls, "__module__": __name__})


# ---- surgery helpers the fragments share ----------------------------------------------------
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


#: base ``model_type`` → (its name in class names, the family's config class, its model class):
#: each method's checkpoint classes subclass these (:func:`register_replay`)
BASES: dict[str, tuple[str, type, type]] = {
    "llama": ("Llama", LlamaConfig, LlamaForCausalLM),
    "mistral": ("Mistral", MistralConfig, MistralForCausalLM),
    "qwen2": ("Qwen2", Qwen2Config, Qwen2ForCausalLM),
    "qwen3": ("Qwen3", Qwen3Config, Qwen3ForCausalLM)}
