"""Tiny random-init models + a byte-level BPE tokenizer: the models of CI smoke runs.

Families (:data:`FAMILIES`): ``llama`` (resource ``tiny-llama``), ``opt`` (``tiny-opt``,
the paper's Table 3 family: pre-LayerNorm with biases, learned positions, ReLU MLP on the
block) and ``gemma3`` (``tiny-gemma3``: sandwich norms, q/k norms, ``head_dim`` = hidden /
heads, a 64-token sliding window on five of every six layers, one KV head like Gemma 3
270M). Defaults: 8 decoder blocks, hidden 128, 4 query heads (Llama: over 2 KV heads, GQA;
OPT is multi-head), intermediate 384 (SwiGLU / OPT's ``ffn_dim``), tied embeddings, vocab
2048 (BPE trained on the wiki train text), 1024 positions — about 1.8M parameters (OPT: a
learned 1026 × 128 position table more). Weights come from ``torch.manual_seed(seed)`` and
the tokenizer from a deterministic BPE training run, so a rebuild with the same text and
seed gives the same files. The tokenizer adds no special tokens (like SmolLM2's);
``<s>`` = 0 (BOS), ``</s>`` = 1 (EOS), ``<pad>`` = 2.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flexigpt.core.fileio import atomic_directory, sha256_file
from flexigpt.runtime.resources.stamp import is_current, make_key, write_stamp
from flexigpt.runtime.resources.wheels import ResourceError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")
#: family → resource name (its folder under resources/models/)
FAMILIES = {"llama": "tiny-llama", "opt": "tiny-opt", "gemma3": "tiny-gemma3"}
#: the tiny Gemma 3's sliding window (tokens): shorter than the smoke runs' windows
GEMMA3_SLIDING_WINDOW = 64


@dataclass
class TinyModelConfig:
    """Shape of the tiny model (``kv_heads``: Llama only); validated on construction."""

    layers: int = 8
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 384
    vocab_size: int = 2048
    max_positions: int = 1024

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by heads={self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} is not divisible by kv_heads={self.kv_heads}")
        if self.vocab_size < 256 + len(SPECIAL_TOKENS):
            raise ValueError(f"vocab_size={self.vocab_size} is below the 259 byte-level "
                             "base tokens")


def train_tokenizer(documents: list[str], vocab_size: int) -> Any:
    """Byte-level BPE trained on ``documents``, wrapped as ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(documents, trainer)
    bos, eos, pad = SPECIAL_TOKENS
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos,
                                   pad_token=pad)


def make_model(cfg: TinyModelConfig, tokenizer: Any, seed: int,
               family: str = "llama") -> PreTrainedModel:
    """Random-init ``LlamaForCausalLM`` / ``OPTForCausalLM`` / ``Gemma3ForCausalLM`` of shape
    ``cfg`` (fp32), ids taken from ``tokenizer``."""
    import torch
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        LlamaConfig,
        LlamaForCausalLM,
        OPTConfig,
        OPTForCausalLM,
    )

    ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    model_cls: type[PreTrainedModel]
    hf_cfg: Any  # LlamaConfig or OPTConfig, whichever model_cls takes
    if family == "llama":
        model_cls, hf_cfg = LlamaForCausalLM, LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=cfg.hidden,
            intermediate_size=cfg.intermediate, num_hidden_layers=cfg.layers,
            num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
            max_position_embeddings=cfg.max_positions, **ids)
    elif family == "opt":
        model_cls, hf_cfg = OPTForCausalLM, OPTConfig(
            vocab_size=len(tokenizer), hidden_size=cfg.hidden, ffn_dim=cfg.intermediate,
            num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
            max_position_embeddings=cfg.max_positions, word_embed_proj_dim=cfg.hidden,
            do_layer_norm_before=True, **ids)
    elif family == "gemma3":
        model_cls, hf_cfg = Gemma3ForCausalLM, Gemma3TextConfig(
            vocab_size=len(tokenizer), hidden_size=cfg.hidden,
            intermediate_size=cfg.intermediate, num_hidden_layers=cfg.layers,
            num_attention_heads=cfg.heads, num_key_value_heads=1,
            head_dim=cfg.hidden // cfg.heads, sliding_window=GEMMA3_SLIDING_WINDOW,
            max_position_embeddings=cfg.max_positions, **ids)
    else:
        raise ValueError(f"unknown tiny-model family {family!r}; known: {sorted(FAMILIES)}")
    torch.manual_seed(seed)
    return model_cls(hf_cfg).eval()


def check_reload(model_dir: Path, cfg: TinyModelConfig, sample: str, name: str) -> int:
    """Reload with ``flexigpt.load_model``; check depth, finite logits, tokenizer round trip.

    Returns the parameter count.
    """
    import torch

    from flexigpt.core.params import count_parameters
    from flexigpt.storage.models import get_adapter
    from flexigpt.storage.models.loading import load_model

    tok: Any  # the checkpoint's HF tokenizer
    model, tok = load_model(model_dir)
    depth = len(get_adapter(model).layers(model))
    if depth != cfg.layers:
        raise ResourceError(f"{name} reloads with {depth} layers, expected {cfg.layers}")
    ids = tok(sample, return_tensors="pt")["input_ids"][:, :64]
    if tok.decode(tok(sample)["input_ids"]) != sample:
        raise ResourceError(f"{name} tokenizer does not round-trip the sample text")
    with torch.no_grad():
        logits = model(ids).logits
    if logits.shape[-1] != len(tok) or not torch.isfinite(logits).all():
        raise ResourceError(f"{name} forward is broken: logits {tuple(logits.shape)}")
    return count_parameters(model)


def build_tiny_model(out_dir: str | os.PathLike, text_path: str | os.PathLike,
                     family: str = "llama", seed: int = 0,
                     config: TinyModelConfig | None = None, force: bool = False) -> Path:
    """Build ``out_dir`` (e.g. ``resources/models/tiny-llama``) from the text at ``text_path``.

    ``text_path`` is a one-document-per-paragraph file (the wiki train text); ``family`` one
    of :data:`FAMILIES`. Output: ``save_pretrained`` model + tokenizer and a
    ``resource.json`` stamp, written atomically; a no-op when the stamp matches (same
    family, text sha256, seed and config).
    """
    from flexigpt.methods.calibration import read_documents

    if family not in FAMILIES:
        raise ValueError(f"unknown tiny-model family {family!r}; known: {sorted(FAMILIES)}")
    name = FAMILIES[family]
    cfg = config or TinyModelConfig()
    out_dir = Path(out_dir)
    key = make_key(name, {"text_sha256": sha256_file(text_path)}, {"seed": seed, **asdict(cfg)})
    if not force and is_current(out_dir, key):
        return out_dir
    started = time.time()
    documents = read_documents(text_path)
    tokenizer = train_tokenizer(documents, cfg.vocab_size)
    tokenizer.model_max_length = cfg.max_positions
    model = make_model(cfg, tokenizer, seed, family)
    with atomic_directory(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        params = check_reload(tmp, cfg, documents[0][:400], name)
        log.info("%s: %d parameters, vocab %d", name, params, len(tokenizer))
        write_stamp(tmp, key, {"parameters": params, "vocab": len(tokenizer),
                               "documents": len(documents)}, started,
                    extra={"text_path": str(text_path)})
        tmp.chmod(0o755)
    return out_dir
