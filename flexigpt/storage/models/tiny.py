"""Tiny random causal LMs of every supported family, for tests and the benchmark checks
(``benchmarks/check_official.py``): the configuration each family needs to build is model-family
knowledge, so it lives beside the adapters."""

from __future__ import annotations

import torch


def make_model(family: str = "llama", layers: int = 4, hidden: int = 64, heads: int = 4,
               kv_heads: int = 2, intermediate: int = 128, vocab: int = 300,
               tied: bool = True, seed: int = 0):
    """A tiny random causal LM of ``family`` (llama, mistral, qwen2, qwen3, opt,
    gemma3_text), fp32, eval mode. OPT: pre-LN, multi-head (``kv_heads`` unused), biases,
    learned positions, ``intermediate`` = ``ffn_dim``, dropout off. Gemma 3: ``head_dim`` =
    hidden / heads, a sliding window of 8 tokens, five sliding layers to one global."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    if family == "opt":
        from transformers import OPTConfig, OPTForCausalLM

        return OPTForCausalLM(OPTConfig(
            vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, ffn_dim=intermediate,
            num_attention_heads=heads, max_position_embeddings=512, word_embed_proj_dim=hidden,
            do_layer_norm_before=True, dropout=0.0, attention_dropout=0.0, bos_token_id=0,
            eos_token_id=1, pad_token_id=2, tie_word_embeddings=tied)).eval()
    extra = ({"head_dim": hidden // heads, "sliding_window": 8} if family == "gemma3_text"
             else {})
    cfg = AutoConfig.for_model(
        family, vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=512, tie_word_embeddings=tied, bos_token_id=0,
        eos_token_id=1, pad_token_id=2, **extra)
    return AutoModelForCausalLM.from_config(cfg).eval()
