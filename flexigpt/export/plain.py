"""``export_plain``: a compressed model as a stock ``*ForCausalLM`` checkpoint, where exact.

What can be written as the family's own architecture (e.g. ``LlamaForCausalLM``), so any
server that knows the family (vLLM, TGI, llama.cpp converters) takes it:

* ``dense``, ``shortgpt`` (fewer layers), ``shortgpt_lora`` (recovery LoRA merged before
  saving): already plain, copied exactly.
* ``llm_pruner`` when every layer kept the same query/KV head counts and FFN width (e.g. a
  layer range covering all layers): a stock config with those counts (``head_dim`` explicit).
* ``flexigpt`` / ``flexigpt_extend`` *without* output norm, only with ``unshare=True``: each
  shared linear becomes its own ``nn.Linear`` with ``W_base + B·A`` merged (shared norms
  copied). Exact up to the rounding of that sum, but it stores every block again, so the
  export has the *dense* model's parameter count: the compression is gone.

What cannot (:class:`NotExportable`, the CLI exits 2):

* FlexiGPT with output norm (the default): a mean-centring LayerNorm × γ on the attention
  and MLP outputs of the replacement blocks has no counterpart in a stock decoder layer.
* SliceGPT: shortcut matrices on the residual path and weight-free RMS norms over the
  original width; a stock decoder layer has an identity residual and a weighted norm.
* LLM-Pruner with per-layer head counts or FFN widths: a stock config has one of each.

Every export is checked: the written directory is reloaded with plain
``AutoModelForCausalLM.from_pretrained`` and its logits compared with
``flexigpt.load_compressed`` on random token ids; a difference above ``atol`` aborts it.
"""

from __future__ import annotations

import copy
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:  # transformers itself is imported on first use
    from transformers import PreTrainedModel

EXPORT_RECORD = "export.json"


class NotExportable(ValueError):
    """The model has no exact plain form (the message says why)."""


def _unshare(model: nn.Module) -> int:
    """Replace every ``SharedLoRALinear`` by a merged ``nn.Linear`` and give modules that
    several blocks share their own copies (in place). Returns the number merged."""
    from flexigpt.methods.sharing import OutputNorm, SharedLoRALinear
    from flexigpt.models.adapters import get_adapter

    merged = 0
    seen: set[int] = set()
    for block in get_adapter(model).layers(model):
        for parent in list(block.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, OutputNorm):
                    raise NotExportable("an output norm is present")  # checked before
                if isinstance(child, SharedLoRALinear):
                    base = child.base_layer
                    lin = nn.Linear(base.in_features, base.out_features,
                                    bias=base.bias is not None, dtype=base.weight.dtype,
                                    device=base.weight.device)
                    with torch.no_grad():
                        w = base.weight.float() + child.delta_weight().float()
                        lin.weight.copy_(w.to(base.weight.dtype))
                        if base.bias is not None:
                            lin.bias.copy_(base.bias)
                    setattr(parent, name, lin)
                    merged += 1
        for name, child in list(block.named_children()):  # shared pre-norms
            if id(child) in seen:
                setattr(block, name, copy.deepcopy(child))
            seen.add(id(child))
    return merged


def _uniform_pruner_config(config: Any, structure: dict[str, Any]) -> Any:
    heads, kvs = set(structure["num_attention_heads"]), set(structure["num_key_value_heads"])
    inters = set(structure["intermediate_size"])
    if len(heads) > 1 or len(kvs) > 1 or len(inters) > 1:
        raise NotExportable(
            "LLM-Pruner left per-layer widths (query heads "
            f"{structure['num_attention_heads']}, KV heads {structure['num_key_value_heads']}, "
            f"FFN {structure['intermediate_size']}); a stock config has one "
            "num_attention_heads / num_key_value_heads / intermediate_size for every layer")
    out = copy.deepcopy(config)
    out.num_attention_heads, out.num_key_value_heads = heads.pop(), kvs.pop()
    out.intermediate_size = inters.pop()
    out.head_dim = int(structure["head_dim"])
    try:
        out.validate()
    except Exception as err:  # huggingface_hub's StrictDataclassClassValidationError
        cause = getattr(err, "__cause__", None) or err
        raise NotExportable(f"LLM-Pruner kept {out.num_attention_heads} query heads per layer, "
                            f"which a stock {type(config).__name__} rejects: {cause}") from None
    return out


def plain_model(loaded: Any, unshare: bool = False) -> tuple[PreTrainedModel, str]:
    """A stock-architecture model computing what ``loaded.model`` computes, and how it was made.

    Raises:
        NotExportable: there is none (or ``unshare`` is needed and not given).
    """
    from flexigpt.artifacts import empty_model
    from flexigpt.export.checkpoint import plain_mismatch

    model, manifest = loaded.model, loaded.manifest
    method, s = (manifest.method, manifest.structure) if manifest else ("dense", {})
    reason = plain_mismatch(model)
    if reason is None:
        return model, "already a stock checkpoint: copied"
    if method in ("flexigpt", "flexigpt_extend"):
        if s.get("output_norm"):
            n = len(s.get("base_map") or {}) if method == "flexigpt" else \
                len(s.get("layout", [])) - int(s.get("original_layers", 0))
            raise NotExportable(
                f"{method} output norm: the attention and MLP outputs of {n} weight-shared "
                "blocks go through a mean-centring LayerNorm × γ, which a stock decoder layer "
                "does not have; no plain checkpoint computes the same function (models "
                "compressed with output_norm=false can be exported with --unshare)")
        if not unshare:
            dense = manifest.parameters.dense
            raise NotExportable(
                f"{method} blocks share their base block's linears (W_base + B·A); a plain "
                "checkpoint must store every block's merged weight, which gives up the "
                f"compression (the export would have the dense model's {dense} parameters). "
                "Pass --unshare to write it anyway")
        model = copy.deepcopy(model)
        merged = _unshare(model)
        return model, f"un-shared: {merged} shared linears merged (W_base + B·A)"
    if method == "llm_pruner":
        config = _uniform_pruner_config(model.config, s)
        out = empty_model(config)
        out.load_state_dict(model.state_dict(), strict=True)
        return out.eval(), "LLM-Pruner with uniform widths: stock config with the pruned counts"
    if method == "slicegpt":
        raise NotExportable(
            "SliceGPT blocks carry shortcut matrices on the residual path (d_in × d_out per "
            "sub-layer) and weight-free RMS norms over the original width; a stock decoder "
            "layer has an identity residual, so there is no exact plain form")
    raise NotExportable(f"{method}: not a stock architecture ({reason})")


def _probe_ids(vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(seed))


def export_plain(model_dir: str | os.PathLike, out_dir: str | os.PathLike,
                 unshare: bool = False, dtype: str = "float32",
                 atol: float = 1e-5, force: bool | None = None) -> dict[str, Any]:
    """Write ``out_dir``: a stock checkpoint (config, safetensors, tokenizer, README, export.json).

    Returns:
        The export record (also ``out_dir/export.json``).

    Raises:
        NotExportable: no exact plain form; nothing is written.
        RuntimeError: the reloaded export's logits differ by more than ``atol``.
        OutputExistsError: ``out_dir`` exists and is not a previous export (unless ``force``).
    """
    from transformers import AutoModelForCausalLM

    from flexigpt.artifacts import load_compressed
    from flexigpt.export.checkpoint import plain_mismatch
    from flexigpt.fileio import atomic_directory, check_output
    from flexigpt.manifest import manifest_hash
    from flexigpt.models.loading import parse_dtype
    from flexigpt.params import count_parameters

    model_dir = Path(model_dir)
    check_output(out_dir, "export", force)  # before loading anything
    loaded = load_compressed(model_dir, dtype=dtype)
    model, how = plain_model(loaded, unshare=unshare)
    left = plain_mismatch(model)
    if left is not None:
        raise NotExportable(f"the plain form is still not stock: {left}")
    ids = _probe_ids(model.config.vocab_size)
    with torch.no_grad():
        ref = loaded.model(input_ids=ids).logits.float()
    with atomic_directory(out_dir, force=force, kind="export") as tmp:
        model.save_pretrained(tmp)
        if loaded.tokenizer is not None:
            loaded.tokenizer.save_pretrained(tmp)
        back = AutoModelForCausalLM.from_pretrained(tmp, dtype=parse_dtype(dtype), trust_remote_code=False, use_safetensors=True).eval()
        with torch.no_grad():
            diff = float((back(input_ids=ids).logits.float() - ref).abs().max())
        if not diff <= atol:
            raise RuntimeError(f"the exported model's logits differ from load_compressed's by "
                               f"{diff:.3g} > {atol:g}; nothing written")
        manifest = loaded.manifest
        record = {"source": str(model_dir.resolve()),
                  "source_manifest_hash": manifest_hash(manifest) if manifest else None,
                  "method": manifest.method if manifest else "dense", "how": how,
                  "architecture": type(back).__name__, "dtype": dtype,
                  "parameters": count_parameters(back),
                  "source_parameters": count_parameters(loaded.model),
                  "max_abs_logit_diff": diff, "probe": list(ids.shape),
                  "created": datetime.now(UTC).isoformat(timespec="seconds")}
        (tmp / EXPORT_RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        _write_readme(tmp, record)
    return record


def _write_readme(directory: Path, record: dict[str, Any]) -> None:
    """``directory/README.md``: a short card for the plain export described by ``record``
    (the export record written beside it)."""
    (directory / "README.md").write_text(
        f"---\nlibrary_name: transformers\ntags:\n- flexigpt-bench\n- {record['method']}\n"
        f"---\n\n# Plain export of a {record['method']} model\n\n"
        f"A stock `{record['architecture']}` checkpoint (no remote code) written by "
        f"`flexigpt export` from `{record['source']}`: {record['how']}. Parameters "
        f"{record['parameters']:,} (source {record['source_parameters']:,}); max |Δ logit| "
        f"vs `flexigpt.load_compressed` on the source: {record['max_abs_logit_diff']:.3g}. "
        f"Full record: `{EXPORT_RECORD}`; the source directory's README.md and manifest.json "
        "describe the compression.\n")
