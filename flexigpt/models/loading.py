"""Loading dense models from a local checkpoint or the Hugging Face hub."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from flexigpt.models.adapters import get_adapter


class ModelLoadError(RuntimeError):
    """A model spec could not be resolved to a checkpoint (bad path, unknown id, no hub)."""


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"float32" | "bfloat16" | "float16"`` (or a torch dtype) → torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    try:
        return table[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(table)}") from None


def load_model(spec: str | os.PathLike, dtype: str | torch.dtype = "float32",
               device: str = "cpu") -> tuple[nn.Module, object]:
    """Load a dense causal LM and its tokenizer.

    Args:
        spec: a local checkpoint directory (``config.json`` inside) or a hub id such as
            ``meta-llama/Llama-2-7b-hf``.
        dtype: weight dtype.
        device: torch device for the weights.

    Returns:
        ``(model, tokenizer)`` with the model in eval mode.

    Raises:
        ModelLoadError: the path does not exist / holds no checkpoint, or the hub id cannot
            be resolved (unknown id, no network, gated model without a token).
        UnsupportedArchitectureError: the model family has no adapter.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    spec = str(spec)
    local = Path(spec)
    looks_local = local.exists() or spec.startswith((".", "/", "~")) or spec.count("/") > 1
    if looks_local and not (local / "config.json").is_file():
        raise ModelLoadError(f"model path {spec!r} is not a checkpoint directory "
                             "(no config.json); build it first or give a hub id")
    try:
        config = AutoConfig.from_pretrained(spec)
    except (OSError, ValueError) as err:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        raise ModelLoadError(
            f"cannot resolve model {spec!r}: not a local checkpoint, and the Hugging Face hub "
            f"{'is disabled (HF_HUB_OFFLINE=1)' if offline else 'did not provide it'} — check the "
            f"id, your network and token. ({type(err).__name__}: {str(err).splitlines()[0]})"
        ) from None
    get_adapter(config)  # fail early on unsupported families
    model = AutoModelForCausalLM.from_pretrained(spec, dtype=parse_dtype(dtype))
    tokenizer = AutoTokenizer.from_pretrained(spec)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device).eval(), tokenizer
