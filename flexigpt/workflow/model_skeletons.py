"""Empty (meta-device) models of the checkpoints a config names, for checks at DAG build
(:mod:`flexigpt.workflow.config_check`) before any job loads a weight: :func:`checkpoint_skeleton`
for a local checkpoint, :func:`resource_skeleton` for one a resource builder will write.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any


@lru_cache(maxsize=8)
def checkpoint_skeleton(path: str) -> Any:
    """An empty (meta-device) model of the local checkpoint ``path``, or None when it has no
    readable config.json or no adapter (the job's own checks then apply)."""
    if not (Path(path) / "config.json").is_file():
        return None
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from flexigpt.storage.models.adapters import get_adapter

        hf_config = AutoConfig.from_pretrained(path, trust_remote_code=False)
        get_adapter(hf_config)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(hf_config)
    except Exception:  # noqa: BLE001 (an unreadable checkpoint fails in its own job)
        return None


class _Vocabulary:
    """The token facts :func:`flexigpt.runtime.resources.tiny_models.make_model` reads of a tokenizer
    (the tiny models' special ids and vocabulary size), without training one."""

    bos_token_id, eos_token_id, pad_token_id = 0, 1, 2

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


@lru_cache(maxsize=4)
def resource_skeleton(resource: str | None) -> Any:
    """An empty (meta-device) model of the shape resource builder ``resource`` writes
    (:data:`flexigpt.workflow.config_paths.RESOURCE_MODELS`), for checks before the resource is built; None for
    an unknown name. Tiny models: ``make_model`` with the default ``TinyModelConfig``;
    ``smollm2``: the architecture its converter checks (``smollm2.EXPECTED``, tied
    embeddings); ``gemma3-270m``: a ``Gemma3ForCausalLM`` of ``gemma3.EXPECTED`` and
    ``gemma3.OTHER_CONFIG`` (both checked on the converted config, so 268,098,176 parameters
    like the built model). Parameter counts match the built models' up to the trained
    vocabulary."""
    if resource is None:
        return None
    import torch

    if resource == "smollm2":
        from transformers import AutoModelForCausalLM, LlamaConfig

        from flexigpt.runtime.resources.smollm2 import EXPECTED

        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(
                LlamaConfig(**EXPECTED, tie_word_embeddings=True))
    if resource == "gemma3-270m":
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig

        from flexigpt.runtime.resources import gemma3

        with torch.device("meta"):
            return Gemma3ForCausalLM(Gemma3TextConfig(**gemma3.EXPECTED, **gemma3.OTHER_CONFIG))
    from flexigpt.runtime.resources.tiny_models import FAMILIES, TinyModelConfig, make_model

    family = {name: fam for fam, name in FAMILIES.items()}.get(resource)
    if family is None:
        return None
    cfg = TinyModelConfig()
    with torch.random.fork_rng(devices=[]), torch.device("meta"):  # make_model seeds torch
        return make_model(cfg, _Vocabulary(cfg.vocab_size), seed=0, family=family)
